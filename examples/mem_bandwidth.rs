//! The machine's memory read bandwidth: the ceiling of every memory-bound kernel (a batch-1
//! decoding step reads every weight once). Each of T threads sums its own part of a buffer far
//! larger than the last-level cache (plain loads, 8 independent vector accumulators; AVX2 where
//! the CPU has it), several passes, best pass reported; also the same with the prefetch the
//! in-place row kernel issues (`prefetcht1` 4 KiB ahead, so the figure with the kernel's access
//! pattern is known too).
//!
//! ```sh
//! cargo run --release --example mem_bandwidth            # 1 and 2 threads, 512 MiB
//! cargo run --release --example mem_bandwidth -- 2 1024  # threads, MiB
//! ```

use std::time::Instant;

/// Sums `data` (8-lane partial sums, so the compiler emits vector loads and adds).
#[inline(always)]
fn sum_portable(data: &[f32]) -> f32 {
    let mut acc = [0f32; 64];
    let mut chunks = data.chunks_exact(64);
    for c in &mut chunks {
        for j in 0..64 {
            acc[j] += c[j];
        }
    }
    acc.iter().sum::<f32>() + chunks.remainder().iter().sum::<f32>()
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// Sums `data` with 8 independent 8-lane accumulators (two cache lines per step), with a
    /// `prefetcht1` `ahead` floats ahead when `ahead > 0`.
    ///
    /// # Safety
    /// The CPU has AVX2.
    #[target_feature(enable = "avx2")]
    pub unsafe fn sum(data: &[f32], ahead: usize) -> f32 {
        let mut acc = [_mm256_setzero_ps(); 8];
        let mut chunks = data.chunks_exact(64);
        for c in &mut chunks {
            let p = c.as_ptr();
            if ahead > 0 {
                // Hints: never fault, whatever the address.
                _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(ahead).cast());
                _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(ahead + 16).cast());
                _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(ahead + 32).cast());
                _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(ahead + 48).cast());
            }
            for (j, a) in acc.iter_mut().enumerate() {
                // SAFETY: 8 floats at 8 j within the 64 of the chunk.
                *a = _mm256_add_ps(*a, _mm256_loadu_ps(p.add(8 * j)));
            }
        }
        let mut s = _mm256_setzero_ps();
        for a in acc {
            s = _mm256_add_ps(s, a);
        }
        let mut out = [0f32; 8];
        _mm256_storeu_ps(out.as_mut_ptr(), s);
        out.iter().sum::<f32>() + chunks.remainder().iter().sum::<f32>()
    }
}

/// GB/s of `threads` threads each summing its part of `data` `passes` times (best pass).
fn measure(data: &[f32], threads: usize, passes: usize, ahead: usize) -> (f64, f32) {
    let part = data.len() / threads;
    let mut best = f64::MAX;
    let mut checksum = 0.0;
    for _ in 0..passes {
        let t = Instant::now();
        let sums: Vec<f32> = std::thread::scope(|s| {
            let handles: Vec<_> = data
                .chunks(part)
                .take(threads)
                .map(|c| {
                    s.spawn(move || {
                        #[cfg(target_arch = "x86_64")]
                        if is_x86_feature_detected!("avx2") {
                            // SAFETY: AVX2 was detected just above.
                            return unsafe { avx2::sum(c, ahead) };
                        }
                        let _ = ahead;
                        sum_portable(c)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        best = best.min(t.elapsed().as_secs_f64());
        checksum += sums.iter().sum::<f32>();
    }
    let bytes = (part * threads * 4) as f64;
    (bytes / best / 1e9, checksum)
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("arguments: threads MiB"))
        .collect();
    let thread_counts = match args.first() {
        Some(&t) => vec![t],
        None => vec![1, 2],
    };
    let mib = args.get(1).copied().unwrap_or(512);
    let n = mib * 1024 * 1024 / 4;
    // Touched once (first-touch page faults are not bandwidth) with values whose sum stays
    // finite.
    let data: Vec<f32> = (0..n).map(|i| (i % 7) as f32 * 1e-3).collect();
    for threads in thread_counts {
        let (plain, c1) = measure(&data, threads, 5, 0);
        let (ahead, c2) = measure(&data, threads, 5, 1024);
        println!(
            "{threads} thread(s), {mib} MiB: read {plain:.1} GB/s, with prefetcht1 4 KiB ahead \
             {ahead:.1} GB/s (checksums {c1:.3e} {c2:.3e})"
        );
    }
}
