//! The tile sizes and knobs the CPU attention kernels share: a leaf, so that the scheduling code and
//! every micro-kernel read them from one place without importing each other.

use crate::simd::{Isa, IsaLevel};

/// Queries per block (the width of the score tile; fixed by the micro-kernels).
pub const BQ: usize = 64;

/// Query blocks of at most this many rows take the row-wise score kernel (`scores_few`: the
/// rows read in place, keys reduced over the head dimension) instead of the block kernel,
/// which computes 16 query lanes per key whatever the block's size: the decoding shape, one
/// new token per sequence and head.
pub(crate) const FEW_QUERIES: usize = 4;

/// Where a micro-kernel finds the rows of keys or values (`f32`, the head dimension
/// contiguous in each row): one after the other at a fixed stride ([`ByStride`]), or each at an
/// address of its own ([`ByTable`]: a paged cache's slots, read where they lie instead of
/// copied together first). Kernels generic over it do the same arithmetic either way.
pub(crate) trait RowAddr: Copy {
    /// Row `j`'s first float (from the current column).
    ///
    /// # Safety
    /// Row `j` exists (the caller's contract with the kernel).
    unsafe fn row(self, j: usize) -> *const f32;
    /// The rows from row `j` on.
    ///
    /// # Safety
    /// As [`RowAddr::row`].
    unsafe fn skip(self, j: usize) -> Self;
    /// The same rows from column `c` on.
    ///
    /// # Safety
    /// Column `c` lies inside every row the kernel reads.
    unsafe fn cols(self, c: usize) -> Self;
}

/// Rows `stride` floats apart from `ptr`.
#[derive(Clone, Copy)]
pub(crate) struct ByStride {
    pub ptr: *const f32,
    pub stride: usize,
}

impl RowAddr for ByStride {
    #[inline(always)]
    unsafe fn row(self, j: usize) -> *const f32 {
        self.ptr.add(j * self.stride)
    }
    #[inline(always)]
    unsafe fn skip(self, j: usize) -> Self {
        Self {
            ptr: self.ptr.add(j * self.stride),
            stride: self.stride,
        }
    }
    #[inline(always)]
    unsafe fn cols(self, c: usize) -> Self {
        Self {
            ptr: self.ptr.add(c),
            stride: self.stride,
        }
    }
}

/// Row `j` at `rows[j]`, from column `col`.
#[derive(Clone, Copy)]
pub(crate) struct ByTable {
    pub rows: *const *const f32,
    pub col: usize,
}

impl RowAddr for ByTable {
    #[inline(always)]
    unsafe fn row(self, j: usize) -> *const f32 {
        (*self.rows.add(j)).add(self.col)
    }
    #[inline(always)]
    unsafe fn skip(self, j: usize) -> Self {
        Self {
            rows: self.rows.add(j),
            col: self.col,
        }
    }
    #[inline(always)]
    unsafe fn cols(self, c: usize) -> Self {
        Self {
            rows: self.rows,
            col: self.col + c,
        }
    }
}

/// Keys per block when [`TiledConfig::block_k`] is `None`, by instruction set. AVX2 takes
/// fewer: its key block, value block and score tile (`block_k × 64` floats each) then fit
/// Zen 3's 32 KiB L1 two at a time (64 keys ran 2–4% faster than 128 there, N = 512–4096);
/// the AVX-512 and portable levels keep the 128 they were tuned with.
fn default_block_k(isa: Isa) -> usize {
    match isa {
        Isa::Avx2 => 64,
        _ => 128,
    }
}

/// Knobs of the CPU kernels; `Default` is what [`crate::scaled_dot_product_attention`] uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TiledConfig {
    /// Keys per block (`>= 1`); the score tile holds `block_k × 64` floats. `None`: the
    /// instruction set's default (64 keys at AVX2, 128 at the other levels).
    pub block_k: Option<usize>,
    /// Run the kernels at most at this instruction set (tests and benchmarks run each level
    /// the host supports: `testing::available_isas()`); `None` is the process's level
    /// (the best the CPU has, lowered by `ATTN_CPU_ISA`). A level above that one runs at that
    /// one.
    pub isa: Option<IsaLevel>,
    /// Query blocks of [`BQ`] per task (1 to 4); `None` chooses from the shape and the thread
    /// count.
    pub blocks_per_task: Option<usize>,
    /// bf16 inputs: use the AVX-512 BF16 dot-product kernels where the CPU has them (`true`,
    /// the default); `false` converts bf16 tiles to `f32` instead, as on CPUs without them.
    pub half_dot: bool,
}

impl TiledConfig {
    /// The keys per block a kernel running at `isa` uses: [`TiledConfig::block_k`], or the
    /// level's default.
    pub(crate) fn block_k_at(&self, isa: Isa) -> usize {
        self.block_k.unwrap_or_else(|| default_block_k(isa))
    }
}

impl Default for TiledConfig {
    fn default() -> Self {
        Self {
            block_k: None,
            isa: None,
            blocks_per_task: None,
            half_dot: true,
        }
    }
}
