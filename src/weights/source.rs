//! [`WeightSource`]: where a layer's constructor takes its tensors from, said in its signature.
//!
//! Every constructor of this crate that builds [`crate::projection::Projection`]s (multi-head attention,
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
//! tables), which [`crate::projection::Projection::from_matrix`] turns into a projection. Quantized and
//! other stored forms of a weight matrix are new [`WeightMatrix`] kinds: the constructors do
//! not change.

use super::int8::Int8Matrix;
use super::mapped::{MappedBf16Matrix, MappedMatrix};
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
    /// Quantized to int8, a scale per row.
    Int8(Int8Matrix),
    /// `bf16` values read in place from a memory-mapped file (a bf16 checkpoint computed in
    /// bf16).
    MappedBf16(MappedBf16Matrix),
}

/// A storage form for weight matrices other than their dtype.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Quantization {
    /// int8 with one symmetric scale per row ([`Int8Matrix`]), inputs quantized per row at
    /// run time: a quarter of the `f32` bytes, CPU only, computing in `f32`.
    Int8,
}

impl Quantization {
    /// The name the CLI and the model directories use: `int8`.
    pub fn name(self) -> &'static str {
        match self {
            Quantization::Int8 => "int8",
        }
    }
}

/// How a model's weights are held and what it computes in: a dtype (`F32`, `BF16`, `F16`),
/// and optionally its weight matrices quantized ([`Quantization`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Precision {
    /// What activations (and unquantized weights) are computed in.
    pub dtype: DType,
    /// The weight matrices' quantization, if any.
    pub quantize: Option<Quantization>,
}

impl Default for Precision {
    fn default() -> Self {
        Self::from(DType::F32)
    }
}

impl From<DType> for Precision {
    fn from(dtype: DType) -> Self {
        Self {
            dtype,
            quantize: None,
        }
    }
}

impl Precision {
    /// `f32` throughout: exact (the parity suites' precision).
    pub const F32: Precision = Precision {
        dtype: DType::F32,
        quantize: None,
    };
    /// `bf16` weights and activations: half the weight bytes, outputs differing from `f32` in
    /// about 1 % of tokens.
    pub const BF16: Precision = Precision {
        dtype: DType::BF16,
        quantize: None,
    };
    /// `f16` weights and activations.
    pub const F16: Precision = Precision {
        dtype: DType::F16,
        quantize: None,
    };
    /// `int8` weight matrices (one scale per output row, inputs quantized per row at run time),
    /// computing in `f32` on the CPU: a quarter of the `f32` weight bytes.
    pub const INT8: Precision = Precision {
        dtype: DType::F32,
        quantize: Some(Quantization::Int8),
    };

    /// Refuses what cannot run: a quantized model computes in `f32` on the CPU.
    pub fn check(&self, device: &candle::Device) -> candle::Result<()> {
        if let Some(q) = self.quantize {
            if self.dtype != DType::F32 {
                candle::bail!(
                    "{} weights compute in f32: they cannot be combined with dtype {:?}",
                    q.name(),
                    self.dtype
                )
            }
            if !device.is_cpu() {
                candle::bail!(
                    "{} weights run on the CPU only, not on {:?}",
                    q.name(),
                    device.location()
                )
            }
        }
        Ok(())
    }
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
    /// How weight matrices are quantized as they are handed out.
    quantize: Option<Quantization>,
    /// Where the matrices quantized here are recorded (for writing them to a file).
    log: Option<MatrixLog>,
}

/// The matrices a quantizing [`WeightSource`] produced, by full name (`attn convert` writes
/// them out).
pub(crate) type MatrixLog = std::sync::Arc<std::sync::Mutex<Vec<(String, Int8Matrix)>>>;

impl std::fmt::Debug for WeightSource<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WeightSource")
            .field("prefix", &self.vb.prefix())
            .field("creates", &self.creates)
            .field("in_place", &self.in_place.as_ref().map(|t| t.origin()))
            .field("quantize", &self.quantize)
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
            quantize: None,
            log: None,
        }
    }

    /// Stored tensors through `vb`, with the `f32` projection weights of `file` used in place
    /// (see [`MappedMatrix`]) when `vb` computes in `f32` on the CPU, and its `bf16` ones
    /// ([`MappedBf16Matrix`]) when `vb` computes in `bf16` on the CPU; weights that cannot be
    /// (another dtype, misaligned, absent) and everything else are read through `vb`. For any
    /// other dtype or device this is [`WeightSource::load`].
    pub fn in_place(vb: VarBuilder<'a>, file: &TensorFile) -> Self {
        let usable = matches!(vb.dtype(), DType::F32 | DType::BF16) && vb.device().is_cpu();
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
            quantize: None,
            log: None,
        }
    }

    /// This source with its weight matrices ([`WeightSource::matrix`]) quantized as `quantize`
    /// says (stored tensors only; `None` hands them out as stored). Refused unless the source
    /// computes in `f32` on the CPU ([`Precision::check`]) and reads stored tensors.
    pub fn quantized(self, quantize: Option<Quantization>) -> candle::Result<Self> {
        if let Some(q) = quantize {
            Precision {
                dtype: self.vb.dtype(),
                quantize,
            }
            .check(self.vb.device())?;
            if self.creates {
                candle::bail!(
                    "{} quantization applies to stored weights, not fresh ones",
                    q.name()
                )
            }
        }
        Ok(Self { quantize, ..self })
    }

    /// This source recording every matrix it quantizes into `log`.
    pub(crate) fn logging(self, log: Option<MatrixLog>) -> Self {
        Self { log, ..self }
    }

    /// The source under `prefix.s`.
    pub fn pp<S: ToString>(&self, s: S) -> Self {
        Self {
            vb: self.vb.pp(s),
            creates: self.creates,
            in_place: self.in_place.clone(),
            quantize: self.quantize,
            log: self.log.clone(),
        }
    }

    /// `n` items built from the sources `name.0 .. name.{n-1}` under this one (the layers of a
    /// stack), in order. Stored tensors are read on rayon's pool, the layers side by side
    /// (quantizing or rounding at load is then one parallel pass over the whole stack, not
    /// a fork and join per matrix); fresh ones are created one after the other (torch's
    /// initialisation draws from one generator: the order fixes the values). An error is
    /// the first layer's that fails.
    pub fn stack<T: Send>(
        &self,
        name: &str,
        n: usize,
        build: impl Fn(&WeightSource<'a>) -> candle::Result<T> + Sync,
    ) -> candle::Result<Vec<T>> {
        use rayon::prelude::*;
        let layer = |i: usize| build(&self.pp(format!("{name}.{i}")));
        if self.creates {
            (0..n).map(layer).collect()
        } else {
            let built: Vec<candle::Result<T>> = (0..n).into_par_iter().map(layer).collect();
            built.into_iter().collect()
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

    /// The weight matrix `name` `(rows, cols)`: quantized when this source quantizes
    /// ([`WeightSource::quantized`]); else in place from the mapped file where this source
    /// has one and the tensor is `f32` there, else as [`WeightSource::tensor`] gives it.
    pub fn matrix(
        &self,
        (out, inp): (usize, usize),
        name: &str,
        init: Init,
    ) -> candle::Result<WeightMatrix> {
        if let Some(Quantization::Int8) = self.quantize {
            let full = join_name(&self.vb.prefix(), name);
            let stored = self
                .in_place
                .as_ref()
                .and_then(|file| Int8Matrix::in_file(file, &full, out, inp));
            if let Some(matrix) = stored {
                return matrix.map(WeightMatrix::Int8);
            }
            let mapped = self
                .in_place
                .as_ref()
                .and_then(|file| MappedMatrix::in_file(file, &full, out, inp));
            let quantized = match mapped {
                Some(m) => {
                    let q = Int8Matrix::quantize(m.data(), out, inp);
                    // The f32 pages are not read again (unless a tied embedding gathers a
                    // few rows of them): out of the resident set before the next matrix.
                    m.release_pages();
                    q
                }
                None => {
                    let w = self.tensor((out, inp), name, init)?;
                    Int8Matrix::quantize(&w.flatten_all()?.to_vec1::<f32>()?, out, inp)
                }
            };
            let quantized = quantized
                .map_err(|e| candle::Error::Msg(format!("quantizing '{full}' to int8: {e}")))?;
            if let Some(log) = &self.log {
                log.lock()
                    .map_err(|_| candle::Error::Msg("internal: the matrix log is poisoned".into()))?
                    .push((full, quantized.clone()));
            }
            return Ok(WeightMatrix::Int8(quantized));
        }
        if let Some(file) = &self.in_place {
            let full = join_name(&self.vb.prefix(), name);
            if self.vb.dtype() == DType::BF16 {
                if let Some(m) = MappedBf16Matrix::in_file(file, &full, out, inp) {
                    return Ok(WeightMatrix::MappedBf16(m));
                }
                // An `f32` checkpoint computed in bf16: each matrix rounded once into an owned
                // bf16 copy read as a bf16 file's, instead of a bf16 tensor packed into panels
                // (`f32` panels on CPUs without AVX-512 BF16: twice the f32 run's memory and a
                // third of its decoding speed at the AVX2 level).
                if let Some(m) = MappedMatrix::in_file(file, &full, out, inp) {
                    let rounded = MappedBf16Matrix::rounded_from_f32(m.data(), out, inp, &full);
                    m.release_pages();
                    return rounded.map(WeightMatrix::MappedBf16);
                }
            } else if let Some(m) = MappedMatrix::in_file(file, &full, out, inp) {
                return Ok(WeightMatrix::Mapped(m));
            }
        }
        self.tensor((out, inp), name, init)
            .map(WeightMatrix::Tensor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle::{Device, Tensor};
    use std::collections::HashMap;

    /// A stack's layers come back in order whether they are read on the pool or created one
    /// by one, and a failing read reports the first layer that fails, every time.
    #[test]
    fn a_stack_is_in_order_and_reports_its_first_failing_layer() {
        let dev = Device::Cpu;
        let mut stored = HashMap::new();
        for i in [0usize, 2, 4, 5] {
            let t = Tensor::full(i as f32, (2, 3), &dev).unwrap();
            stored.insert(format!("layers.{i}.w"), t);
        }
        let source = WeightSource::load(VarBuilder::from_tensors(stored, DType::F32, &dev));
        let read = |n: usize| {
            source.stack("layers", n, |layer| {
                layer
                    .tensor((2, 3), "w", candle_nn::Init::Const(0.0))?
                    .to_vec2::<f32>()
            })
        };
        let err = read(6).unwrap_err().to_string();
        assert!(err.contains("layers.1.w"), "{err}");
        for _ in 0..20 {
            assert_eq!(read(6).unwrap_err().to_string(), err);
        }
        let mut more = HashMap::new();
        for i in 0..8usize {
            more.insert(
                format!("layers.{i}.w"),
                Tensor::full(i as f32, (2, 3), &dev).unwrap(),
            );
        }
        let source = WeightSource::load(VarBuilder::from_tensors(more, DType::F32, &dev));
        let layers = source
            .stack("layers", 8, |layer| {
                layer
                    .tensor((2, 3), "w", candle_nn::Init::Const(0.0))?
                    .to_vec2::<f32>()
            })
            .unwrap();
        let firsts: Vec<f32> = layers.iter().map(|l| l[0][0]).collect();
        assert_eq!(firsts, (0..8).map(|i| i as f32).collect::<Vec<_>>());
    }
}
