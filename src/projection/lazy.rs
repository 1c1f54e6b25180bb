//! Panels packed once for a weight that is read in place ([`super::Weight::Mapped`] and
//! [`super::Weight::Rows`]), when it keeps being used in products of many rows.
//!
//! A weight read in place costs nothing to load, and decoding a few rows reads it best where
//! it lies ([`super::rows`]). From [`super::rows::PACKED_MIN_ROWS`] rows of `x` on
//! ([`super::rows::PORTABLE_PACKED_MIN_ROWS`] at the portable level), the product runs the
//! packed GEMM instead, transposing each 64-row strip of `W` on the fly
//! ([`super::gemm::gemm_rows`]): about one shuffle per four weights, every call. In bulk
//! translation the same matrices are multiplied by hundreds of rows at every decoding step,
//! and that transposition was 5–6.5% of the CPU time (`perf`, 300 lines at beam 4, AMD EPYC
//! Zen 4). So the second large product packs the whole matrix once, in parallel, and later
//! ones read the panels ([`super::gemm::gemm`], the same micro-kernel over the same chunks:
//! the same sums, bit for bit).
//!
//! Why the second, not the first: a one-shot run (`attn generate` on one batch) multiplies
//! each encoder matrix by many rows exactly once, and packing it into fresh memory (first
//! touch: about 1 ms per MB on these machines) would cost more than the one on-the-fly
//! transposition it saves. The price of packing is memory: the panels are a copy, the size of
//! the matrix (its columns rounded up to 64), held as long as the projection.

use super::kernels::pack_strip;
use super::tile::PANEL;
use crate::simd::Isa;
use rayon::prelude::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Large products on the fly before a weight is packed (see the module's documentation).
const ON_THE_FLY_PRODUCTS: usize = 1;

/// The lazily packed panels of one `(n, k)` weight; shared by the clones of its projection.
#[derive(Default)]
pub(super) struct LazyPanels {
    /// Products of many rows so far, counted until the weight is packed (then no longer read).
    large_products: AtomicUsize,
    /// `(ceil(n / 64), k, 64)` panels of `Wᵀ` (the layout of [`super::Weight::Packed`]),
    /// zero padded past column `n`.
    panels: OnceLock<Vec<f32>>,
}

impl std::fmt::Debug for LazyPanels {
    /// Whether it is packed, not the panels (millions of floats).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LazyPanels")
            .field("packed", &self.panels.get().is_some())
            .finish()
    }
}

impl LazyPanels {
    /// The panels of `w` (`(n, k)` row-major) for a product of many rows: `None` while the
    /// weight is still multiplied on the fly, else packed (now, on the first call that decides
    /// to) and kept.
    ///
    /// Two threads that decide at once may both pack; one result is kept. No lock is held
    /// while packing, so a thread of the pool that runs other tasks while it waits for the
    /// packing's own never re-enters an initialisation in progress.
    pub(super) fn panels(&self, isa: Isa, w: &[f32], n: usize, k: usize) -> Option<&[f32]> {
        if let Some(p) = self.panels.get() {
            return Some(p);
        }
        if self.large_products.fetch_add(1, Ordering::Relaxed) < ON_THE_FLY_PRODUCTS {
            return None;
        }
        let _ = self.panels.set(pack(isa, w, n, k));
        self.panels.get().map(Vec::as_slice)
    }

    /// Whether the panels exist (for tests and memory accounting).
    #[cfg(test)]
    pub(super) fn is_packed(&self) -> bool {
        self.panels.get().is_some()
    }
}

/// `w` `(n, k)` row-major packed into `(ceil(n / 64), k, 64)` panels of `Wᵀ`, the strips
/// transposed in parallel by the kernel `gemm_rows` transposes them with.
fn pack(isa: Isa, w: &[f32], n: usize, k: usize) -> Vec<f32> {
    assert!(w.len() >= n * k);
    // Zeroed by the allocator (fresh pages), so the padding past column n is zero; the pages
    // are first touched by the tasks that fill them, in parallel.
    let mut panels = vec![0f32; n.div_ceil(PANEL) * k * PANEL];
    if k == 0 {
        return panels;
    }
    panels
        .par_chunks_mut(k * PANEL)
        .enumerate()
        .for_each(|(s, panel)| {
            let c = s * PANEL;
            let cols = PANEL.min(n - c);
            pack_strip(isa, &w[c * k..(c + cols) * k], cols, k, panel);
        });
    panels
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panels_are_made_on_the_second_large_product_and_hold_w_transposed() {
        let (n, k) = (130, 37);
        let w: Vec<f32> = (0..n * k).map(|i| i as f32).collect();
        for isa in crate::simd::isas() {
            let lazy = LazyPanels::default();
            assert!(lazy.panels(isa, &w, n, k).is_none());
            assert!(!lazy.is_packed());
            let p = lazy
                .panels(isa, &w, n, k)
                .expect("packed on the second")
                .to_vec();
            assert!(lazy.is_packed());
            assert_eq!(p.len(), 3 * k * PANEL);
            for col in 0..3 * PANEL {
                for kk in 0..k {
                    let want = if col < n { w[col * k + kk] } else { 0.0 };
                    let got = p[(col / PANEL) * k * PANEL + kk * PANEL + col % PANEL];
                    assert_eq!(got, want, "{isa:?} column {col}, input {kk}");
                }
            }
            // Later calls return the same panels.
            assert_eq!(lazy.panels(isa, &w, n, k).unwrap(), &p[..]);
        }
    }
}
