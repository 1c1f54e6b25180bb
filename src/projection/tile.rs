//! Sizes and types the projection's drivers ([`super::gemm`], [`super::rows`]) and
//! micro-kernels share: a leaf, so that drivers and kernels read them from one place without
//! importing each other.

/// Output columns per packed panel of `Wᵀ` (the width of the micro-kernel).
pub(crate) const PANEL: usize = 64;

/// Rows per micro-tile of the packed GEMM, the packing group of `x`: 6 rows × 4 vectors = 24
/// accumulators, 4 registers of `Wᵀ` and one broadcast, within AVX-512's 32 registers.
pub(crate) const R: usize = 6;

/// Memory the micro-kernel prefetches into L2 while it computes, one 64-byte line per input
/// step: micro-tile `t < tiles` of a call fetches the lines at `base + t * per_tile + 16 * kk`.
/// [`super::gemm::gemm_rows`] points it at the next strip of a weight read in place, so that
/// the strip's transposition finds it in L2 instead of stalling on memory between products.
#[derive(Clone, Copy)]
pub(crate) struct Ahead {
    /// Any address: prefetches are hints and never fault, so it is only ever offset with
    /// wrapping arithmetic and never dereferenced.
    pub(crate) base: *const f32,
    /// Floats between the first lines of consecutive micro-tiles.
    pub(crate) per_tile: usize,
    /// The micro-tiles that prefetch.
    pub(crate) tiles: usize,
}

/// The output pointer shared by the parallel tasks of a product, each of which writes its own
/// rectangle ([`super::gemm`] and [`super::rows`]).
#[derive(Clone, Copy)]
pub(crate) struct OutPtr(pub(crate) *mut f32);

impl OutPtr {
    /// The pointer (a method, so that a closure captures the whole `Sync` wrapper, not the
    /// raw pointer in it).
    pub(crate) fn get(self) -> *mut f32 {
        self.0
    }
}
// SAFETY: tasks only write through the pointer into disjoint rectangles of the output (see
// `super::gemm` and `super::rows`), and the buffer outlives the parallel loop.
unsafe impl Send for OutPtr {}
// SAFETY: as above.
unsafe impl Sync for OutPtr {}

/// Input rows per micro-tile of the int8 kernels, at most (`super::int8`): 6 rows × 4
/// vectors of AVX-512 accumulators, as [`R`].
pub(crate) const MAX_TILE_ROWS: usize = 6;
