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
