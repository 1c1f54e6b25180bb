//! The machine's multiply-add peaks, the ceilings the kernels are measured against: fp32
//! with AVX-512 (24 independent FMA chains per thread on 16 lanes, in registers, no memory
//! traffic), fp32 with AVX2 (12 independent `vfmadd` chains on 8 lanes: the ceiling of the
//! AVX2 level, and the only fp32 figure on a CPU without AVX-512) and bf16 (the AVX-512 chains
//! with `vdpbf16ps`, AVX-512 BF16: per 32-bit lane two bf16 products added to an f32
//! accumulator, so 64 FLOP per instruction instead of 32; measured only where the CPU has
//! `avx512bf16`).
//!
//! ```sh
//! cargo run --release --example fma_peak            # 1 and 2 threads
//! cargo run --release --example fma_peak -- 1 2 4   # the thread counts to try
//! ATTN_CPU_ISA=avx2 cargo run --release --example fma_peak   # the AVX2 figures only
//! ```
//!
//! Output lines: `T thread(s): fp32 FMA G GFLOP/s` (the peak of the level the kernels run at:
//! AVX-512 where the CPU has it and `ATTN_CPU_ISA` does not lower it, else AVX2), `T
//! thread(s): fp32 FMA avx2 G GFLOP/s` and `... fp32 FMA avx512 G GFLOP/s` for each level
//! measured, and the bf16 line.
//!
//! On an AMD EPYC Zen 3 (2 cores, AVX2 + FMA, no AVX-512), 2026-12-01: see the README's AVX2
//! tables (measured in the same runs as the kernels).
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

    /// `iters` rounds of 12 independent `acc = acc * a + b` on 8 lanes (AVX2 + FMA: two FMA
    /// units of 4-cycle latency need 8 chains in flight; 12 leave room); returns a sum so the
    /// work cannot be optimised away.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn run_avx2(iters: usize) -> f32 {
        let mut acc = [_mm256_set1_ps(0.0); 12];
        let a = _mm256_set1_ps(1.000_000_1);
        let b = _mm256_set1_ps(0.999_999_9);
        for _ in 0..iters {
            for x in acc.iter_mut() {
                *x = _mm256_fmadd_ps(*x, a, b);
            }
        }
        let mut s = _mm256_setzero_ps();
        for x in acc {
            s = _mm256_add_ps(s, x);
        }
        let mut out = [0f32; 8];
        _mm256_storeu_ps(out.as_mut_ptr(), s);
        out.iter().sum()
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
        let avx2 = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
        let avx512 = is_x86_feature_detected!("avx512f");
        if !avx2 && !avx512 {
            anyhow::bail!("this peak test needs AVX2 + FMA or AVX-512F, which this CPU lacks");
        }
        // The level the kernels run at: ATTN_CPU_ISA=avx2 (or portable) leaves AVX-512 out.
        let isa = std::env::var("ATTN_CPU_ISA")
            .unwrap_or_default()
            .to_ascii_lowercase();
        let capped = matches!(
            isa.trim(),
            "avx2" | "x86-64-v3" | "portable" | "scalar" | "none"
        );
        let avx512 = avx512 && !capped;
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
        let bf16 = avx512 && is_x86_feature_detected!("avx512bf16");
        if !avx512 {
            println!("fp32 at the AVX2 level (no AVX-512 on this CPU, or ATTN_CPU_ISA={isa})");
        } else if !bf16 {
            println!("no AVX-512 BF16 (vdpbf16ps) on this CPU: fp32 only");
        }
        for threads in counts {
            let mut best = None;
            if avx2 {
                // SAFETY: AVX2 and FMA were detected above.
                let (gflops, checksum) =
                    measure(threads, iters, 12 * 16, |n| unsafe { chains::run_avx2(n) })?;
                println!(
                    "{threads} thread(s): fp32 FMA avx2 {gflops:.1} GFLOP/s (checksum {checksum:.3e})"
                );
                best = Some(gflops);
            }
            if avx512 {
                // SAFETY: AVX-512F was detected above.
                let (gflops, checksum) =
                    measure(threads, iters, 24 * 32, |n| unsafe { chains::run(n) })?;
                println!(
                    "{threads} thread(s): fp32 FMA avx512 {gflops:.1} GFLOP/s (checksum {checksum:.3e})"
                );
                best = Some(gflops);
            }
            if let Some(gflops) = best {
                println!("{threads} thread(s): fp32 FMA {gflops:.1} GFLOP/s");
            }
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
        anyhow::bail!("this peak test is written for x86-64 (AVX2 or AVX-512)")
    }
}
