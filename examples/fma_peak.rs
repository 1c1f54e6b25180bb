//! The machine's multiply-add peaks, the ceilings the kernels are measured against: fp32
//! (24 independent AVX-512 FMA chains per thread, in registers, no memory traffic) and bf16
//! (the same with `vdpbf16ps`, AVX-512 BF16: per 32-bit lane two bf16 products added to an
//! f32 accumulator, so 64 FLOP per instruction instead of 32; measured only where the CPU has
//! `avx512bf16`).
//!
//! ```sh
//! cargo run --release --example fma_peak            # 1 and 2 threads
//! cargo run --release --example fma_peak -- 1 2 4   # the thread counts to try
//! ```
//!
//! On the 2-core development machine (AMD EPYC, Zen 4, with AVX-512 BF16), measured idle on
//! 2026-11-30: fp32 117.3 GFLOP/s on one thread and 232.2 on two; `vdpbf16ps` 234.4 and 468.3,
//! twice the fp32 rate. (An earlier session measured fp32 189.7 / 378.7 on what was evidently a
//! faster host of the same virtual machine.)

use std::time::Instant;

#[cfg(target_arch = "x86_64")]
mod chains {
    use std::arch::x86_64::*;

    /// `iters` rounds of 24 independent `acc = acc * a + b` on 16 lanes; returns a sum so the
    /// work cannot be optimised away.
    ///
    /// # Safety
    /// The CPU has AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn run(iters: usize) -> f32 {
        let mut acc = [_mm512_set1_ps(0.0); 24];
        let a = _mm512_set1_ps(1.000_000_1);
        let b = _mm512_set1_ps(0.999_999_9);
        for _ in 0..iters {
            for x in acc.iter_mut() {
                *x = _mm512_fmadd_ps(*x, a, b);
            }
        }
        let mut s = _mm512_setzero_ps();
        for x in acc {
            s = _mm512_add_ps(s, x);
        }
        _mm512_reduce_add_ps(s)
    }

    /// `iters` rounds of 24 independent `acc += a[2i] b[2i] + a[2i+1] b[2i+1]` (`vdpbf16ps`,
    /// 16 lanes, 64 FLOP each); returns a sum so the work cannot be optimised away.
    ///
    /// # Safety
    /// The CPU has AVX-512F and AVX-512 BF16.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub unsafe fn run_bf16(iters: usize) -> f32 {
        let mut acc = [_mm512_set1_ps(0.0); 24];
        // Tiny products (2^-20) so the sums stay finite over billions of rounds.
        let a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1.0e-3), _mm512_set1_ps(1.0e-3));
        let b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1.0e-3), _mm512_set1_ps(1.0e-3));
        for _ in 0..iters {
            for x in acc.iter_mut() {
                *x = _mm512_dpbf16_ps(*x, a, b);
            }
        }
        let mut s = _mm512_setzero_ps();
        for x in acc {
            s = _mm512_add_ps(s, x);
        }
        _mm512_reduce_add_ps(s)
    }
}

/// Runs `kernel(iters)` on `threads` threads at once; returns GFLOP/s (`flop_per_iter` per
/// round per thread) and the summed checksum.
fn measure(
    threads: usize,
    iters: usize,
    flop_per_iter: usize,
    kernel: fn(usize) -> f32,
) -> anyhow::Result<(f64, f32)> {
    let start = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|_| std::thread::spawn(move || kernel(iters)))
        .collect();
    let mut checksum = 0.0;
    for h in handles {
        checksum += h
            .join()
            .map_err(|_| anyhow::anyhow!("a worker thread panicked"))?;
    }
    let secs = start.elapsed().as_secs_f64();
    Ok((
        (threads * iters * flop_per_iter) as f64 / secs / 1e9,
        checksum,
    ))
}

fn main() -> anyhow::Result<()> {
    #[cfg(target_arch = "x86_64")]
    {
        if !is_x86_feature_detected!("avx512f") {
            anyhow::bail!("this peak test needs AVX-512F, which this CPU lacks");
        }
        let counts: Vec<usize> = std::env::args()
            .skip(1)
            .map(|a| a.parse())
            .collect::<Result<_, _>>()
            .map_err(|e| anyhow::anyhow!("thread counts must be positive integers: {e}"))?;
        let counts = if counts.is_empty() {
            vec![1, 2]
        } else {
            counts
        };
        let iters = 50_000_000usize;
        let bf16 = is_x86_feature_detected!("avx512bf16");
        if !bf16 {
            println!("no AVX-512 BF16 (vdpbf16ps) on this CPU: fp32 only");
        }
        for threads in counts {
            // SAFETY: AVX-512F was detected above.
            let (gflops, checksum) =
                measure(threads, iters, 24 * 32, |n| unsafe { chains::run(n) })?;
            println!("{threads} thread(s): fp32 FMA {gflops:.1} GFLOP/s (checksum {checksum:.3e})");
            if bf16 {
                // SAFETY: AVX-512F and AVX-512 BF16 were detected above.
                let (gflops, checksum) =
                    measure(threads, iters, 24 * 64, |n| unsafe { chains::run_bf16(n) })?;
                println!(
                    "{threads} thread(s): bf16 vdpbf16ps {gflops:.1} GFLOP/s (checksum {checksum:.3e})"
                );
            }
        }
        Ok(())
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = Instant::now();
        anyhow::bail!("this peak test is written for x86-64 AVX-512")
    }
}
