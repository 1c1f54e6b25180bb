//! Linear layers `y = x Wᵀ + b` that keep their weight transposed, with a CPU GEMM of their own.
//!
//! Every projection of [`crate::MultiHeadAttention`] and of the Transformer's feed-forward
//! layers is a [`Projection`]. Two things make it faster than candle-nn's `Linear` on CPU:
//!
//! * **One GEMM for Q, K and V.** [`Projection::narrow_outputs`] cuts a projection onto some of
//!   the outputs out of a larger one without copying, so self-attention projects `x` once with
//!   the fused `(E, 3E)` weight and reads Q, K and V as strided views of the result.
//! * **A GEMM sized for these shapes.** candle's CPU matmul (the `gemm` crate) spends most of
//!   a `(128, 512) × (512, 1536)` product packing its inputs and waiting at barriers: 2.9 ms
//!   for `MultiheadAttention(512, 8)` at N = 128 where torch takes 1.2 ms (issue 4's
//!   profile). Here the weight is packed once, when the layer is built, into panels of 64
//!   output columns (`Wᵀ` `(in, 64)` each, contiguous), and a register-blocked AVX-512
//!   micro-kernel (6 rows × 64 columns) reads the input rows in place: nothing is packed or
//!   copied per call, and the bias is the initial value of the output (no second pass).
//!   Tasks of 64 rows × a group of panels run in parallel on rayon's pool.
//!
//! * **Half precision on its own kernels** (`half.rs`): a CPU `bf16` weight is packed once into
//!   bf16 *pair* panels and multiplied with AVX-512 BF16 `vdpbf16ps` (two bf16 products per
//!   `f32` lane; `bf16.rs`) where the CPU has it; a CPU `f16` weight (or a bf16 one without
//!   AVX-512 BF16) is converted once into the `f32` panels above and its inputs into the f32
//!   micro-kernel's tiles. Both accumulate in
//!   `f32` and round each output once to the input dtype, as torch's half-precision `Linear`.
//!
//! The fast paths need CPU `f32`, `f16` or `bf16` tensors that track no gradients
//! (inference). Anything else, a `Var` weight being trained, an input that needs its gradient,
//! CUDA, `f64`, takes `x.matmul(Wᵀ) + b` with candle's ops, exactly as candle-nn's `Linear`
//! computes it.
//!
//! The weight is held once: for CPU constants as the packed panels (the `(out, in)` matrix is
//! rebuilt, a copy, only if something asks for it); otherwise as a transposed view of the
//! tensor given (a `Var` stays live: an optimizer's update is seen by the next forward pass).

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod avx512_bf16;
mod bf16;
mod bf16_rows;
mod gemm;
mod half;
mod int8;
#[cfg(target_arch = "x86_64")]
mod int8_x86;
mod kernels;
mod lazy;
mod portable;
mod rows;
mod tile;

use crate::simd::{cpu_f32, Isa};
use crate::weights::{Int8Matrix, MappedBf16Matrix, MappedMatrix, WeightMatrix};
use candle::{DType, Device, Module, Tensor};
use std::sync::Arc;

use tile::PANEL;

/// From this many rows of `x` on, a product may leave the row kernel, which computes each row
/// alone, for the packed GEMM (see [`rows::PACKED_MIN_ROWS`]; the portable level leaves it
/// from [`rows::PORTABLE_PACKED_MIN_ROWS`]).
pub(crate) use rows::PACKED_MIN_ROWS;

/// How a [`Projection`] holds its weight.
#[derive(Clone, Debug)]
enum Weight {
    /// `Wᵀ` `(in, out)`, a transposed view of the weight given: a `Var` in training, a CUDA
    /// or `f16` tensor, anything the packed CPU path does not take.
    View(Tensor),
    /// A CPU `f32` constant packed for [`gemm`]: `panels` `(P, in, 64)` contiguous, panel `p`
    /// holding columns `64 p .. 64 p + 64` of `Wᵀ` (zero padded past the last); this
    /// projection is columns `col0 .. col0 + out` of them.
    Packed {
        panels: Tensor,
        col0: usize,
        out: usize,
    },
    /// A CPU `bf16`/`f16` constant packed for [`half`] (bf16 pair panels, or `f32` panels
    /// for `f16` and for bf16 without AVX-512 BF16); this projection is columns
    /// `col0 .. col0 + out` of them.
    Half {
        panels: half::HalfPanels,
        col0: usize,
        out: usize,
    },
    /// `W` `(out, in)` read in place from a memory-mapped file ([`MappedMatrix`]); `packed`
    /// its panels once it keeps being multiplied by many rows ([`lazy`]), shared by clones.
    Mapped {
        matrix: MappedMatrix,
        packed: Arc<lazy::LazyPanels>,
    },
    /// `W` `(out, in)`, a contiguous CPU `f32` tensor shared with its owner (e.g. the tied
    /// embedding table of a language model head), read row by row as [`Weight::Mapped`] is
    /// (and packed likewise).
    Rows {
        table: Tensor,
        packed: Arc<lazy::LazyPanels>,
    },
    /// `W` `(out, in)` bf16 read in place from a memory-mapped file ([`MappedBf16Matrix`]):
    /// products of a few rows read it where it lies (`bf16_rows`); a weight multiplied by
    /// [`rows::PACKED_MIN_ROWS`] rows or more a second time is packed once into bf16 pair
    /// panels ([`half`]), shared by clones.
    MappedBf16 {
        matrix: MappedBf16Matrix,
        packed: Arc<LazyHalf>,
        /// The bias `(out)` in `f32`, as the row kernel adds it (converted once, not per call).
        bias_f32: Option<Arc<[f32]>>,
    },
    /// `W` quantized to int8 with a scale per output ([`Int8Matrix`], shared by clones and
    /// with a tied embedding table), multiplied by [`int8`]; this projection is rows
    /// `col0 .. col0 + out` of it.
    Int8 {
        matrix: Int8Matrix,
        col0: usize,
        out: usize,
    },
}

/// The pair panels of a [`Weight::MappedBf16`], made on its second product of many rows.
#[derive(Debug, Default)]
struct LazyHalf {
    large_products: std::sync::atomic::AtomicUsize,
    panels: std::sync::OnceLock<half::HalfPanels>,
}

impl LazyHalf {
    /// The panels for a product of `m` rows, if it should use them (packing `matrix` on the
    /// second product of [`rows::PACKED_MIN_ROWS`] rows or more).
    fn panels(
        &self,
        m: usize,
        matrix: &MappedBf16Matrix,
    ) -> candle::Result<Option<&half::HalfPanels>> {
        if m < rows::PACKED_MIN_ROWS {
            return Ok(None);
        }
        if let Some(p) = self.panels.get() {
            return Ok(Some(p));
        }
        if self
            .large_products
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            == 0
        {
            return Ok(None);
        }
        let w = Tensor::from_vec(
            matrix
                .bits()
                .iter()
                .map(|&b| ::half::bf16::from_bits(b))
                .collect::<Vec<_>>(),
            (matrix.rows(), matrix.cols()),
            &Device::Cpu,
        )?;
        let packed = half::HalfPanels::pack(&w)?;
        Ok(Some(self.panels.get_or_init(|| packed)))
    }
}

/// `y = x Wᵀ + b`, a [`candle::Module`] over the last dimension: `x` `(..., in)` →
/// `(..., out)`.
#[derive(Clone, Debug)]
pub struct Projection {
    weight: Weight,
    /// `b` `(out)`.
    bias: Option<Tensor>,
}

impl Projection {
    /// From `weight` `(out, in)` (torch's and candle-nn's layout) and `bias` `(out)`.
    ///
    /// A CPU `f32` weight that tracks no gradient is packed once (a copy) for the CPU GEMM,
    /// likewise a `f16` one (into `f32` panels: twice its size) and a `bf16` one (into bf16
    /// pair panels, its size, where the CPU has AVX-512 BF16; else `f32` panels); any other
    /// weight (a `Var`,
    /// CUDA, `f64`, ...) is kept as a view, so training updates stay visible.
    pub fn new(weight: &Tensor, bias: Option<Tensor>) -> candle::Result<Self> {
        let (out, inp) = weight.dims2().map_err(|_| {
            candle::Error::Msg(format!(
                "a linear weight must be (out_features, in_features), got shape {:?}",
                weight.dims()
            ))
        })?;
        if let Some(b) = &bias {
            if b.dims() != [out] {
                candle::bail!(
                    "linear bias must be (out_features) = ({out}) to match the weight {:?}, got {:?}",
                    weight.dims(),
                    b.dims()
                )
            }
            if b.dtype() != weight.dtype() || !b.device().same_device(weight.device()) {
                candle::bail!(
                    "linear bias ({:?} on {:?}) must have the weight's dtype and device ({:?} on {:?})",
                    b.dtype(),
                    b.device().location(),
                    weight.dtype(),
                    weight.device().location()
                )
            }
        }
        let packable = is_cpu_constant_f32(weight) && bias.as_ref().is_none_or(is_cpu_constant_f32);
        let half_packable =
            is_cpu_constant_half(weight) && bias.as_ref().is_none_or(is_cpu_constant_half);
        // The packed paths read the bias in place on every call: make it contiguous once here
        // (its narrowings by `narrow_outputs` stay contiguous).
        let bias = match bias {
            Some(b) if packable || half_packable => Some(b.contiguous()?),
            b => b,
        };
        let weight = if half_packable {
            Weight::Half {
                panels: half::HalfPanels::pack(weight)?,
                col0: 0,
                out,
            }
        } else if packable {
            let w = weight.flatten_all()?.to_vec1::<f32>()?;
            let panels = out.div_ceil(PANEL);
            let mut packed = vec![0f32; panels * inp * PANEL];
            for (n, row) in w.chunks_exact(inp.max(1)).enumerate().take(out) {
                let base = (n / PANEL) * inp * PANEL + n % PANEL;
                for (kk, &v) in row.iter().enumerate() {
                    packed[base + kk * PANEL] = v;
                }
            }
            Weight::Packed {
                panels: Tensor::from_vec(packed, (panels, inp, PANEL), &Device::Cpu)?,
                col0: 0,
                out,
            }
        } else {
            Weight::View(weight.t()?)
        };
        Ok(Self { weight, bias })
    }

    /// From a [`WeightMatrix`] as a [`crate::weights::WeightSource`] hands it out: a tensor
    /// as [`Projection::new`] takes it, or a matrix in place in a mapped file as
    /// [`Projection::from_mapped`]; `bias` `(out)`.
    pub fn from_matrix(weight: WeightMatrix, bias: Option<Tensor>) -> candle::Result<Self> {
        match weight {
            WeightMatrix::Tensor(w) => Self::new(&w, bias),
            WeightMatrix::Mapped(m) => Self::from_mapped(m, bias),
            WeightMatrix::Int8(m) => Self::from_int8(m, bias),
            WeightMatrix::MappedBf16(m) => Self::from_mapped_bf16(m, bias),
        }
    }

    /// A projection whose bf16 weight `W` `(out, in)` stays in a memory-mapped file
    /// ([`MappedBf16Matrix`]); `bias` `(out)` must be a CPU `bf16` tensor. Inputs and outputs
    /// are bf16, accumulated in `f32`.
    pub fn from_mapped_bf16(
        weight: MappedBf16Matrix,
        bias: Option<Tensor>,
    ) -> candle::Result<Self> {
        if let Some(b) = &bias {
            if b.dims() != [weight.rows()]
                || !matches!(b.device(), Device::Cpu)
                || b.dtype() != DType::BF16
            {
                candle::bail!(
                    "bias of a mapped bf16 linear layer must be a CPU bf16 vector of {} values, got {:?} ({:?})",
                    weight.rows(),
                    b.dims(),
                    b.dtype()
                )
            }
        }
        let bias_f32 = bias
            .as_ref()
            .map(|b| b.to_dtype(DType::F32)?.to_vec1::<f32>().map(Arc::from))
            .transpose()?;
        Ok(Self {
            weight: Weight::MappedBf16 {
                matrix: weight,
                packed: Arc::default(),
                bias_f32,
            },
            bias: bias.map(|b| b.contiguous()).transpose()?,
        })
    }

    /// A projection whose weight `W` `(out, in)` is quantized to int8 ([`Int8Matrix`]);
    /// `bias` `(out)` must be a CPU `f32` tensor. Inputs and outputs are `f32`; each input row
    /// is quantized at run time with a scale of its own and the products are exact integer
    /// sums (see the `int8` kernels), which costs accuracy (about 1 % of each output's
    /// magnitude) for a quarter of the weight's `f32` bytes.
    pub fn from_int8(weight: Int8Matrix, bias: Option<Tensor>) -> candle::Result<Self> {
        if let Some(b) = &bias {
            if b.dims() != [weight.rows()] || !is_cpu_constant_f32(b) {
                candle::bail!(
                    "bias of an int8 linear layer must be a CPU f32 vector of {} values, got {:?} ({:?})",
                    weight.rows(),
                    b.dims(),
                    b.dtype()
                )
            }
        }
        let out = weight.rows();
        Ok(Self {
            weight: Weight::Int8 {
                matrix: weight,
                col0: 0,
                out,
            },
            bias: bias.map(|b| b.contiguous()).transpose()?,
        })
    }

    /// A projection whose weight `W` `(out, in)` stays in a memory-mapped file (see
    /// [`MappedMatrix`]); `bias` `(out)` must be a CPU `f32` tensor.
    ///
    /// Memory: nothing is copied at load, and products of a few rows read `W` where it lies.
    /// A weight that is multiplied by 96 rows or more a second time (bulk translation, the
    /// encoder over many batches, beam search over many sentences) is then packed once for
    /// the GEMM and the copy kept with the projection: the size of `W` again, against 5–6.5%
    /// of the CPU time of such runs for transposing it on every call.
    pub fn from_mapped(weight: MappedMatrix, bias: Option<Tensor>) -> candle::Result<Self> {
        if let Some(b) = &bias {
            if b.dims() != [weight.rows()] || !is_cpu_constant_f32(b) {
                candle::bail!(
                    "bias of a mapped linear layer must be a CPU f32 vector of {} values, got {:?} ({:?})",
                    weight.rows(),
                    b.dims(),
                    b.dtype()
                )
            }
        }
        Ok(Self {
            weight: Weight::Mapped {
                matrix: weight,
                packed: Arc::default(),
            },
            bias: bias.map(|b| b.contiguous()).transpose()?,
        })
    }

    /// A projection that shares `weight` `(out, in)` with its owner instead of packing a copy of
    /// it: a tied output projection and the embedding table it is tied to stay one tensor.
    /// For a CPU `f32` constant the product reads `W`'s rows in place (the kernel of
    /// [`MappedMatrix`], packed once as [`Projection::from_mapped`] says when it keeps being
    /// multiplied by many rows). A CPU half-precision table is packed as [`Projection::new`]
    /// packs it, a copy (the table's size again): candle's half-precision matmul on a view
    /// transposes the whole table at every call, 10x slower at a decoding step of an opus-mt
    /// model. Anything else is kept as a view.
    pub fn shared(weight: &Tensor, bias: Option<Tensor>) -> candle::Result<Self> {
        if !(is_cpu_constant_f32(weight) && weight.rank() == 2) {
            // Half precision packed, anything else a view of it (`Projection::new`).
            return Self::new(weight, bias);
        }
        if let Some(b) = &bias {
            if b.dims() != [weight.dim(0)?] || !is_cpu_constant_f32(b) {
                candle::bail!(
                    "bias of a linear layer must be a CPU f32 vector of {} values, got {:?} ({:?})",
                    weight.dim(0)?,
                    b.dims(),
                    b.dtype()
                )
            }
        }
        Ok(Self {
            weight: Weight::Rows {
                table: weight.contiguous()?,
                packed: Arc::default(),
            },
            bias: bias.map(|b| b.contiguous()).transpose()?,
        })
    }

    /// The projection onto outputs `start .. start + len` only (rows `start .. start + len`
    /// of `W` and of `b`), sharing this projection's storage: how the fused Q/K/V projection
    /// of [`crate::MultiHeadAttention`] provides each one.
    pub fn narrow_outputs(&self, start: usize, len: usize) -> candle::Result<Self> {
        let out = self.out_features();
        if start.checked_add(len).is_none_or(|end| end > out) {
            candle::bail!(
                "cannot take outputs {start}..{} of a projection with {out} outputs",
                start.saturating_add(len)
            )
        }
        let weight = match &self.weight {
            Weight::View(wt) => Weight::View(wt.narrow(1, start, len)?),
            Weight::Packed { panels, col0, .. } => Weight::Packed {
                panels: panels.clone(),
                col0: col0 + start,
                out: len,
            },
            Weight::Half { panels, col0, .. } => Weight::Half {
                panels: panels.clone(),
                col0: col0 + start,
                out: len,
            },
            // The rows taken pack on their own when they are used that way. A fused Q/K/V
            // projection is used whole in self-attention and in parts in cross-attention (one
            // `MultiHeadAttention` each in this crate's models); one used both ways would hold
            // the narrowed rows packed twice: memory, not wrong answers.
            Weight::Mapped { matrix, .. } => Weight::Mapped {
                matrix: matrix.narrow_rows(start, len).ok_or_else(|| {
                    candle::Error::Msg("internal: mapped rows out of range".into())
                })?,
                packed: Arc::default(),
            },
            Weight::Rows { table, .. } => Weight::Rows {
                table: table.narrow(0, start, len)?,
                packed: Arc::default(),
            },
            Weight::Int8 { matrix, col0, .. } => Weight::Int8 {
                matrix: matrix.clone(),
                col0: col0 + start,
                out: len,
            },
            Weight::MappedBf16 {
                matrix, bias_f32, ..
            } => Weight::MappedBf16 {
                matrix: matrix.narrow_rows(start, len).ok_or_else(|| {
                    candle::Error::Msg("internal: mapped rows out of range".into())
                })?,
                packed: Arc::default(),
                bias_f32: bias_f32.as_ref().map(|b| Arc::from(&b[start..start + len])),
            },
        };
        Ok(Self {
            weight,
            bias: self
                .bias
                .as_ref()
                .map(|b| b.narrow(0, start, len))
                .transpose()?,
        })
    }

    /// `Wᵀ` `(in, out)`: a view, or for a packed weight a fresh copy.
    fn transposed_weight(&self) -> candle::Result<Tensor> {
        match &self.weight {
            Weight::View(wt) => Ok(wt.clone()),
            Weight::Packed { panels, col0, out } => {
                let (p, k, _) = panels.dims3()?;
                panels
                    .permute((1, 0, 2))?
                    .reshape((k, p * PANEL))?
                    .narrow(1, *col0, *out)?
                    .contiguous()
            }
            Weight::Half { panels, col0, out } => panels.transposed(*col0, *out),
            Weight::Mapped { matrix: w, .. } => {
                Tensor::from_slice(w.data(), (w.rows(), w.cols()), &Device::Cpu)?.t()
            }
            Weight::Rows { table, .. } => table.t(),
            Weight::MappedBf16 { matrix: w, .. } => Tensor::from_vec(
                w.bits()
                    .iter()
                    .map(|&b| ::half::bf16::from_bits(b))
                    .collect::<Vec<_>>(),
                (w.rows(), w.cols()),
                &Device::Cpu,
            )?
            .t(),
            Weight::Int8 { matrix, col0, out } => {
                let k = matrix.cols();
                let rows = matrix.dequantize();
                Tensor::from_slice(&rows[col0 * k..(col0 + out) * k], (*out, k), &Device::Cpu)?.t()
            }
        }
    }

    /// The weight `W` `(out, in)`, as given to [`Projection::new`] (for a packed CPU weight,
    /// rebuilt from the panels: a copy; for an int8 one, dequantized).
    pub fn weight(&self) -> candle::Result<Tensor> {
        self.transposed_weight()?.t()
    }

    /// The bias `(out)`, if any.
    pub fn bias(&self) -> Option<&Tensor> {
        self.bias.as_ref()
    }

    /// `in_features`, the size of the last input dimension.
    pub fn in_features(&self) -> usize {
        match &self.weight {
            Weight::View(wt) => wt.dims()[0],
            Weight::Packed { panels, .. } => panels.dims()[1],
            Weight::Half { panels, .. } => panels.in_features(),
            Weight::Mapped { matrix, .. } => matrix.cols(),
            Weight::Rows { table, .. } => table.dims()[1],
            Weight::Int8 { matrix, .. } => matrix.cols(),
            Weight::MappedBf16 { matrix, .. } => matrix.cols(),
        }
    }

    /// `out_features`, the size of the last output dimension.
    pub fn out_features(&self) -> usize {
        match &self.weight {
            Weight::View(wt) => wt.dims()[1],
            Weight::Packed { out, .. } | Weight::Half { out, .. } | Weight::Int8 { out, .. } => {
                *out
            }
            Weight::Mapped { matrix, .. } => matrix.rows(),
            Weight::MappedBf16 { matrix, .. } => matrix.rows(),
            Weight::Rows { table, .. } => table.dims()[0],
        }
    }

    /// The dtype of the weight (inputs must have it).
    pub fn dtype(&self) -> DType {
        match &self.weight {
            Weight::View(wt) => wt.dtype(),
            Weight::Half { panels, .. } => panels.dtype(),
            Weight::MappedBf16 { .. } => DType::BF16,
            Weight::Packed { .. }
            | Weight::Mapped { .. }
            | Weight::Rows { .. }
            | Weight::Int8 { .. } => DType::F32,
        }
    }

    /// The device of the weight (inputs must be on it).
    pub fn device(&self) -> &Device {
        match &self.weight {
            Weight::View(wt) => wt.device(),
            Weight::Packed { panels, .. } => panels.device(),
            Weight::Half { .. }
            | Weight::MappedBf16 { .. }
            | Weight::Mapped { .. }
            | Weight::Rows { .. }
            | Weight::Int8 { .. } => &Device::Cpu,
        }
    }
}

impl Module for Projection {
    /// `x` `(..., in)` → `(..., out)`; also for inputs without elements (a zero-length
    /// sequence gives an empty output, zero input features give `b`).
    fn forward(&self, x: &Tensor) -> candle::Result<Tensor> {
        self.forward_at(x, Isa::get())
    }
}

impl Projection {
    /// [`Module::forward`] with the CPU kernels of `isa` (the tests run every level).
    pub(crate) fn forward_at(&self, x: &Tensor, isa: Isa) -> candle::Result<Tensor> {
        let (k, n) = (self.in_features(), self.out_features());
        let Some(&last) = x.dims().last() else {
            candle::bail!("a linear layer needs an input with at least one dimension, got a scalar")
        };
        if last != k {
            candle::bail!(
                "linear layer expects {k} input features, got an input of shape {:?}",
                x.dims()
            )
        }
        if x.dtype() != self.dtype() {
            candle::bail!(
                "linear layer input has dtype {:?} but its weight is {:?}; convert one of them with to_dtype",
                x.dtype(),
                self.dtype()
            )
        }
        let mut out_dims = x.dims().to_vec();
        out_dims[x.rank() - 1] = n;
        let m = x.dims()[..x.rank() - 1].iter().product::<usize>();
        if m == 0 || n == 0 {
            return Tensor::zeros(out_dims, x.dtype(), x.device());
        }
        if k == 0 {
            let zeros = Tensor::zeros(out_dims, x.dtype(), x.device())?;
            return match &self.bias {
                Some(b) => zeros.broadcast_add(b),
                None => Ok(zeros),
            };
        }
        if let Weight::Packed { panels, col0, .. } = &self.weight {
            if is_cpu_constant_f32(x) {
                let y = cpu_linear(
                    isa,
                    &x.contiguous()?,
                    m,
                    panels,
                    *col0,
                    n,
                    self.bias.as_ref(),
                )?;
                return y.reshape(out_dims);
            }
        }
        if let Weight::Half { panels, col0, .. } = &self.weight {
            if is_cpu_constant_half(x) {
                let y = panels.linear(isa, &x.contiguous()?, m, *col0, n, self.bias.as_ref())?;
                return y.reshape(out_dims);
            }
        }
        if let Weight::MappedBf16 {
            matrix,
            packed,
            bias_f32,
        } = &self.weight
        {
            if !is_cpu_constant_half(x) {
                candle::bail!(
                    "a mapped bf16 linear layer takes CPU bf16 inputs that track no gradient, got {:?} on {:?}",
                    x.dtype(),
                    x.device().location()
                )
            }
            if let Some(panels) = packed.panels(m, matrix)? {
                let y = panels.linear(isa, &x.contiguous()?, m, 0, n, self.bias.as_ref())?;
                return y.reshape(out_dims);
            }
            let x = x.contiguous()?;
            let (xs, xl) = x.storage_and_layout();
            let xv = &crate::simd::cpu_half_bits(&xs)?[xl.start_offset()..][..m * k];
            let y = bf16_rows::linear_nt(isa, xv, m, matrix.bits(), n, k, bias_f32.as_deref());
            let y: Vec<::half::bf16> = y.into_iter().map(::half::bf16::from_bits).collect();
            return Tensor::from_vec(y, out_dims, &Device::Cpu);
        }
        if let Weight::Int8 { matrix, col0, .. } = &self.weight {
            if !is_cpu_constant_f32(x) {
                candle::bail!(
                    "an int8 linear layer takes CPU f32 inputs that track no gradient, got {:?} on {:?}",
                    x.dtype(),
                    x.device().location()
                )
            }
            let x = x.contiguous()?;
            let (xs, xl) = x.storage_and_layout();
            let xv = &cpu_f32(&xs)?[xl.start_offset()..][..m * k];
            let bias_guard = self.bias.as_ref().map(|b| b.storage_and_layout());
            let bias = match &bias_guard {
                Some((bs, bl)) => Some(&cpu_f32(bs)?[bl.start_offset()..][..n]),
                None => None,
            };
            let y = int8::linear(isa, xv, m, matrix, *col0, n, bias);
            return Tensor::from_vec(y, out_dims, &Device::Cpu);
        }
        // `W` read row by row where it lies: a mapped file or a shared tensor.
        let rows_guard = match &self.weight {
            Weight::Rows { table, .. } => Some(table.storage_and_layout()),
            _ => None,
        };
        let rows: Option<(&[f32], &lazy::LazyPanels)> = match (&self.weight, &rows_guard) {
            (Weight::Mapped { matrix, packed }, _) => Some((matrix.data(), packed)),
            (Weight::Rows { packed, .. }, Some((ws, wl))) => {
                Some((&cpu_f32(ws)?[wl.start_offset()..][..n * k], packed))
            }
            _ => None,
        };
        if let (Some((wv, packed)), true) = (rows, is_cpu_constant_f32(x)) {
            let x = x.contiguous()?;
            let (xs, xl) = x.storage_and_layout();
            let xv = &cpu_f32(&xs)?[xl.start_offset()..][..m * k];
            let bias_guard = self.bias.as_ref().map(|b| b.storage_and_layout());
            let bias = match &bias_guard {
                Some((bs, bl)) => Some(&cpu_f32(bs)?[bl.start_offset()..][..n]),
                None => None,
            };
            let y = rows::linear_nt(isa, xv, m, wv, n, k, bias, Some(packed));
            return Tensor::from_vec(y, out_dims, &Device::Cpu);
        }
        // Autograd, CUDA, other dtypes: candle's ops, as candle-nn's `Linear`.
        let y = x.reshape((m, k))?.matmul(&self.transposed_weight()?)?;
        let y = match &self.bias {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        };
        y.reshape(out_dims)
    }
}

/// A CPU `f32` tensor outside any autograd graph.
fn is_cpu_constant_f32(t: &Tensor) -> bool {
    matches!(t.device(), Device::Cpu) && t.dtype() == DType::F32 && !t.track_op()
}

/// A CPU `bf16` or `f16` tensor outside any autograd graph.
fn is_cpu_constant_half(t: &Tensor) -> bool {
    matches!(t.device(), Device::Cpu)
        && matches!(t.dtype(), DType::BF16 | DType::F16)
        && !t.track_op()
}

/// The packed path: contiguous `x` with `m` rows of `k` features → `(m, n)`.
fn cpu_linear(
    isa: Isa,
    x: &Tensor,
    m: usize,
    panels: &Tensor,
    col0: usize,
    n: usize,
    bias: Option<&Tensor>,
) -> candle::Result<Tensor> {
    let (_, k, _) = panels.dims3()?;
    // Borrowed in place (contiguous since `Projection::new`), not copied per call.
    let bias_guard = bias.map(|b| (b.storage_and_layout(), b.is_contiguous()));
    let bias = match &bias_guard {
        Some(((bs, bl), true)) => Some(&cpu_f32(bs)?[bl.start_offset()..][..n]),
        Some((_, false)) => candle::bail!("internal: a packed projection's bias is not contiguous"),
        None => None,
    };
    let (xs, xl) = x.storage_and_layout();
    let x = &cpu_f32(&xs)?[xl.start_offset()..][..m * k];
    let (ps, pl) = panels.storage_and_layout();
    let panels = &cpu_f32(&ps)?[pl.start_offset()..][..panels.elem_count()];
    let y = gemm::gemm(
        isa,
        gemm::Operands {
            x,
            m,
            k,
            panels,
            col0,
            n,
            bias,
        },
    );
    Tensor::from_vec(y, (m, n), &Device::Cpu)
}
