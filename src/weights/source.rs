//! [`WeightSource`]: where a layer's constructor takes its tensors from, said in its signature.
//!
//! Every constructor of this crate that builds [`crate::Projection`]s (multi-head attention,
//! the feed-forward layers, the model families) takes one, and has one construction path
//! whatever the source:
//!
//! * [`WeightSource::load`]: a checkpoint behind a [`VarBuilder`] (a [`TensorFile`], candle's
//!   own safetensors or pickle builders, ...); projection weights are copied out and packed
//!   for the CPU kernels;
//! * [`WeightSource::in_place`]: the same, except that `f32` projection weights of a
//!   memory-mapped [`TensorFile`] are used where they lie ([`MappedMatrix`]), so that loading
//!   copies nothing and the resident memory holds each weight once;
//! * [`WeightSource::init`]: fresh tensors created with torch's initialisation (a `VarMap`
//!   behind the builder makes them trainable).
//!
//! A source hands out plain tensors ([`WeightSource::tensor`]: biases, norms) and weight
//! matrices ([`WeightSource::matrix`], a [`WeightMatrix`]: projection weights, embedding
//! tables), which [`crate::Projection::from_matrix`] turns into a projection. Quantized and
//! other stored forms of a weight matrix are new [`WeightMatrix`] kinds: the constructors do
//! not change.

use super::mapped::MappedMatrix;
use super::tensor_file::{join_name, TensorFile};
use candle::{DType, Tensor};
use candle_nn::{Init, VarBuilder};

/// A weight matrix `(rows, cols)` (a projection's `W` `(out, in)`, an embedding table
/// `(vocab, d_model)`), as a [`WeightSource`] hands it out.
#[derive(Clone, Debug)]
pub enum WeightMatrix {
    /// A tensor (a copy out of a checkpoint, or a trainable variable).
    Tensor(Tensor),
    /// `f32` values read in place from a memory-mapped file.
    Mapped(MappedMatrix),
}

/// Where the tensors of a layer come from: a checkpoint, a checkpoint whose `f32` projection
/// weights stay in place in its mapped file, or fresh initialisation. Cheap to clone; `pp`
/// moves to a sub-prefix as [`VarBuilder::pp`] does.
#[derive(Clone)]
pub struct WeightSource<'a> {
    vb: VarBuilder<'a>,
    /// Fresh tensors with torch's initialisation rather than stored ones.
    creates: bool,
    /// The mapped file the `f32` projection weights are read from in place.
    in_place: Option<TensorFile>,
}

impl std::fmt::Debug for WeightSource<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WeightSource")
            .field("prefix", &self.vb.prefix())
            .field("creates", &self.creates)
            .field("in_place", &self.in_place.as_ref().map(|t| t.origin()))
            .finish()
    }
}

impl<'a> WeightSource<'a> {
    /// Stored tensors, read through `vb` (its dtype and device are the layer's).
    pub fn load(vb: VarBuilder<'a>) -> Self {
        Self {
            vb,
            creates: false,
            in_place: None,
        }
    }

    /// Stored tensors through `vb`, with the `f32` projection weights of `file` used in place
    /// (see [`MappedMatrix`]) when `vb` computes in `f32` on the CPU; weights that cannot be
    /// (another dtype, misaligned, absent) and everything else are read through `vb`. For any
    /// other dtype or device this is [`WeightSource::load`].
    pub fn in_place(vb: VarBuilder<'a>, file: &TensorFile) -> Self {
        let usable = vb.dtype() == DType::F32 && vb.device().is_cpu();
        Self {
            in_place: usable.then(|| file.clone()),
            ..Self::load(vb)
        }
    }

    /// Fresh tensors created through `vb` with torch's initialisation (over a `VarMap`, they
    /// become trainable variables).
    pub fn init(vb: VarBuilder<'a>) -> Self {
        Self {
            vb,
            creates: true,
            in_place: None,
        }
    }

    /// The source under `prefix.s`.
    pub fn pp<S: ToString>(&self, s: S) -> Self {
        Self {
            vb: self.vb.pp(s),
            creates: self.creates,
            in_place: self.in_place.clone(),
        }
    }

    /// The current prefix (`""` at the root).
    pub fn prefix(&self) -> String {
        self.vb.prefix()
    }

    /// Whether this source creates fresh tensors ([`WeightSource::init`]).
    pub fn creates(&self) -> bool {
        self.creates
    }

    /// Whether `name` (under the prefix) exists: stored in the checkpoint, or, for a fresh
    /// source, created already.
    pub fn contains(&self, name: &str) -> bool {
        self.vb.contains_tensor(name)
    }

    /// The builder behind the source (its dtype and device are the layer's).
    pub fn var_builder(&self) -> &VarBuilder<'a> {
        &self.vb
    }

    /// The tensor `name` of `shape`: stored (its shape checked; errors name the tensor and
    /// what exists), or created with `init` by a fresh source.
    pub fn tensor<S: Into<candle::Shape>>(
        &self,
        shape: S,
        name: &str,
        init: Init,
    ) -> candle::Result<Tensor> {
        if self.creates {
            self.vb.get_with_hints(shape, name, init)
        } else {
            self.vb.get(shape, name)
        }
    }

    /// The weight matrix `name` `(rows, cols)`: in place from the mapped file where this source
    /// has one and the tensor is `f32` there, else as [`WeightSource::tensor`] gives it.
    pub fn matrix(
        &self,
        (out, inp): (usize, usize),
        name: &str,
        init: Init,
    ) -> candle::Result<WeightMatrix> {
        if let Some(file) = &self.in_place {
            let full = join_name(&self.vb.prefix(), name);
            if let Some(m) = MappedMatrix::in_file(file, &full, out, inp) {
                return Ok(WeightMatrix::Mapped(m));
            }
        }
        self.tensor((out, inp), name, init)
            .map(WeightMatrix::Tensor)
    }
}
