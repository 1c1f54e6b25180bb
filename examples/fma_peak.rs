//! The machine's fp32 multiply-add peak, the ceiling the kernels are measured against:
//! 24 independent AVX-512 FMA chains per thread, in registers (no memory traffic).
//!
//! ```sh
//! cargo run --release --example fma_peak            # 1 and 2 threads
//! cargo run --release --example fma_peak -- 1 2 4   # the thread counts to try
//! ```
//!
//! On the 2-core development machine: 189.7 GFLOP/s on one thread, 378.7 on two.

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
        for threads in counts {
            let start = Instant::now();
            let handles: Vec<_> = (0..threads)
                // SAFETY: AVX-512F was detected above.
                .map(|_| std::thread::spawn(move || unsafe { chains::run(iters) }))
                .collect();
            let mut checksum = 0.0;
            for h in handles {
                checksum += h
                    .join()
                    .map_err(|_| anyhow::anyhow!("a worker thread panicked"))?;
            }
            let secs = start.elapsed().as_secs_f64();
            let flops = (threads * iters * 24 * 32) as f64;
            println!(
                "{threads} thread(s): {:.1} GFLOP/s (checksum {checksum:.3e})",
                flops / secs / 1e9
            );
        }
        Ok(())
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = Instant::now();
        anyhow::bail!("this peak test is written for x86-64 AVX-512")
    }
}
