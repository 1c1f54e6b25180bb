//! CPU building blocks shared by the attention kernels ([`crate::sdpa`]) and the projection
//! GEMM ([`crate::projection`]): which instruction set to run ([`Isa`]), the per-thread
//! [scratch](with_scratch) buffer, borrowing a CPU tensor's floats ([`cpu_f32`]), the portable
//! [`fma`], the `2^x` polynomial, row operations over long score vectors ([`rows`]: the
//! generation loops' `log_softmax`, argmax, top-k scan), and (x86-64) the AVX2 and AVX-512
//! helpers of the micro-kernels.
//!
//! **Which instruction set runs** is decided in one place, [`Isa::get`]: the best level the
//! CPU has, detected once (`is_x86_feature_detected!`; AVX2 means AVX2 + FMA + F16C, AVX-512
//! means AVX-512F on top), lowered by the environment variable `ATTN_CPU_ISA` (`portable`,
//! `avx2` or `avx512`, read once). A level above the CPU's runs the CPU's best; an unknown
//! value is ignored (the best level runs) with one warning on stderr. Every kernel dispatch
//! takes its [`Isa`] from there, or from [`Isa::at_most`] for a per-call request (the
//! kernels' knobs, the tests), which can only lower it.
//!
//! Nothing here is attention- or GEMM-specific; the kernels themselves stay with their module.

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;
pub(crate) mod elementwise;
mod isa;
pub(crate) mod rows;
mod scalar;
mod scratch;
mod storage;

#[cfg(test)]
pub(crate) use isa::isas;
pub(crate) use isa::Isa;
pub use isa::{active_level, available_levels, cpu_level, describe_cpu, IsaLevel, ISA_ENV};
pub(crate) use scalar::{exp2, fma, round_bf16};
pub(crate) use scratch::with_scratch;
pub(crate) use storage::{cpu_f32, cpu_half_bits};

/// The cache a [`prefetch_lines`] asks for.
#[derive(Clone, Copy)]
pub(crate) enum NearCache {
    /// `_MM_HINT_T0`: data about to be read.
    L1,
    /// `_MM_HINT_T1`: data streamed a little ahead of its use.
    L2,
}

/// Asks the CPU to bring the cache lines of the `bytes` bytes from `start` into `cache`
/// (x86-64; nothing elsewhere). A hint: `start` is never dereferenced, and addresses outside
/// any allocation do nothing.
#[inline(always)]
pub(crate) fn prefetch_lines(start: *const u8, bytes: usize, cache: NearCache) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0, _MM_HINT_T1};
        let base = start.cast::<i8>();
        let mut line = 0;
        while line < bytes {
            let p = base.wrapping_add(line);
            // SAFETY: a prefetch is a hint that never faults, whatever the address.
            unsafe {
                match cache {
                    NearCache::L1 => _mm_prefetch::<_MM_HINT_T0>(p),
                    NearCache::L2 => _mm_prefetch::<_MM_HINT_T1>(p),
                }
            }
            line += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (start, bytes, cache);
}
