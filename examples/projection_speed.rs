//! Times the f32 `Projection` kernels alone, at the instruction set the process runs at
//! (`ATTN_CPU_ISA` lowers it), against the machine's ceilings:
//!
//! * the packed GEMM on the shapes of `MultiHeadAttention(512, 8)` (`(N, 512) × (512, 1536)`,
//!   the fused input projection, and `(N, 512) × (512, 512)`), GFLOP/s (compare with
//!   `fma_peak`);
//! * the in-place row kernel on an opus-mt output projection (`(m, 512) × (512, 58101)`, the
//!   weight read where it lies, as a tied `lm_head` is; from 96 rows on packed once, on its
//!   second such product), for m = 1 to 96: GFLOP/s and the weight's bytes per second (compare
//!   with `mem_bandwidth`); the same weight packed up front (`Projection::new`), and quantized
//!   to int8 (`Projection::from_int8`);
//! * a decoder step's 36 matrices of an opus-mt model (88 MB) back to back, at 1 to 64 rows,
//!   and the same rows as two sequences of half of them side by side (as `attn serve` runs a
//!   step of up to 64 rows: two model calls, each reading every weight).
//!
//! `cargo run --release --example projection_speed [N...]` (default N = 128 512 1024 4096);
//! run it on rayon's pool threads the way `attn` does (it does: `ThreadPool::install`).

use anyhow::Result;
use candle::{Device, Module, Tensor};
use candle_attention::projection::Projection;
use candle_attention::weights::Int8Matrix;
use std::time::Instant;

/// Median and minimum of `iters` calls of `f`, in ms, after `iters / 4` untimed ones.
fn time(iters: usize, mut f: impl FnMut() -> Result<()>) -> Result<(f64, f64)> {
    for _ in 0..iters / 4 {
        f()?;
    }
    let mut ms = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        f()?;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    ms.sort_by(f64::total_cmp);
    Ok((ms[iters / 2], ms[0]))
}

fn main() -> Result<()> {
    let rows: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse())
        .collect::<Result<_, _>>()?;
    let rows = if rows.is_empty() {
        vec![128, 512, 1024, 4096]
    } else {
        rows
    };
    let pool = rayon::ThreadPoolBuilder::new().build()?;
    println!(
        "# {}; {} threads",
        candle_attention::cpu::describe_cpu(),
        pool.current_num_threads()
    );
    pool.install(|| -> Result<()> {
        for (k, n) in [(512, 1536), (512, 512)] {
            let w = (Tensor::randn(0f32, 1.0, (n, k), &Device::Cpu)? / (k as f64).sqrt())?;
            let b = Tensor::randn(0f32, 0.1, n, &Device::Cpu)?;
            let p = Projection::new(&w, Some(b))?;
            for &m in &rows {
                let x = Tensor::randn(0f32, 1.0, (m, k), &Device::Cpu)?;
                let iters = (400 * 128 / m).clamp(10, 400);
                let (med, min) = time(iters, || {
                    p.forward(&x)?;
                    Ok(())
                })?;
                let gflops = 2.0 * (m * n * k) as f64 / (med * 1e6);
                println!(
                    "gemm ({m}, {k}) x ({k}, {n}): median {med:.3} ms, min {min:.3} ms, {gflops:.1} GFLOP/s"
                );
            }
        }
        let (k, n) = (512, 58101);
        let w = (Tensor::randn(0f32, 1.0, (n, k), &Device::Cpu)? / (k as f64).sqrt())?;
        let b = Tensor::randn(0f32, 0.1, n, &Device::Cpu)?;
        // In place (a shared table, as a tied `lm_head` is: from 96 rows on it is packed once,
        // on its second such product), and from panels packed up front (`Projection::new`).
        let in_place = Projection::shared(&w, Some(b.clone()))?;
        let packed = Projection::new(&w, Some(b.clone()))?;
        // int8 (`--quantize int8`): a quarter of the bytes, integer products (GOP/s counts a
        // byte multiply-add as 2 operations, as the f32 figures count an FMA).
        let int8 = Projection::from_int8(
            Int8Matrix::quantize(&w.flatten_all()?.to_vec1::<f32>()?, n, k)?,
            Some(b.clone()),
        )?;
        for (label, p, bytes) in [("rows", &in_place, 4), ("packed", &packed, 4), ("int8", &int8, 1)] {
            for m in [1usize, 8, 16, 32, 64, 96] {
                let x = Tensor::randn(0f32, 1.0, (m, k), &Device::Cpu)?;
                let (med, min) = time(30, || {
                    p.forward(&x)?;
                    Ok(())
                })?;
                let gflops = 2.0 * (m * n * k) as f64 / (med * 1e6);
                let gbs = (n * k * bytes) as f64 / (med * 1e6);
                println!(
                    "{label} ({m}, {k}) x ({k}, {n}): median {med:.3} ms, min {min:.3} ms, \
                     {gflops:.1} GFLOP/s, weight read at {gbs:.1} GB/s"
                );
            }
        }
        // A decoder step's weights at one row: the projections of 6 opus-mt decoder layers
        // (self-attention q/k/v and output, cross-attention query and output, the two
        // feed-forward matrices), 88 MB, back to back: what the row kernel loses between
        // calls (start-up of each stream, the thread hand-over) against one large matrix.
        let shapes = [(1536, 512), (512, 512), (512, 512), (512, 512), (2048, 512), (512, 2048)];
        let layers: Vec<Projection> = (0..6)
            .flat_map(|_| shapes)
            .map(|(n, k)| {
                let w = (Tensor::randn(0f32, 1.0, (n, k), &Device::Cpu)? / (k as f64).sqrt())?;
                Projection::shared(&w, Some(Tensor::zeros(n, candle::DType::F32, &Device::Cpu)?))
            })
            .collect::<candle::Result<_>>()?;
        let bytes: usize = 6 * shapes.iter().map(|(n, k)| n * k * 4).sum::<usize>();
        // The 36 products of one step at the rows of `x512` and `x2048`, and such inputs.
        let run_step = |x512: &Tensor, x2048: &Tensor| -> Result<()> {
            for (p, (_, k)) in layers.iter().zip(shapes.iter().cycle()) {
                p.forward(if *k == 512 { x512 } else { x2048 })?;
            }
            Ok(())
        };
        let inputs = |m: usize| -> Result<(Tensor, Tensor)> {
            Ok((
                Tensor::randn(0f32, 1.0, (m, 512), &Device::Cpu)?,
                Tensor::randn(0f32, 1.0, (m, 2048), &Device::Cpu)?,
            ))
        };
        // At more rows (continuous batching's steps), the same sequence: where the time per row
        // stops falling, the step is bound by the products, not by reading the weights.
        for m in [1usize, 4, 16, 32, 48, 64] {
            let (x512, x2048) = inputs(m)?;
            let (med, min) = time(30, || run_step(&x512, &x2048))?;
            println!(
                "rows ({m}, k) x 36 decoder matrices ({:.0} MB) in place: median {med:.3} ms, \
                 min {min:.3} ms, weight read at {:.1} GB/s, {:.1} GFLOP/s",
                bytes as f64 / 1e6,
                bytes as f64 / (med * 1e6),
                (m * bytes / 2) as f64 / (med * 1e6)
            );
        }
        // The same rows as two sequences of m / 2 side by side (`rayon::join`), as a serving
        // step split into two model calls runs them: each reads every weight.
        for m in [16usize, 32, 48, 64] {
            let h = m / 2;
            let (x512, x2048) = inputs(h)?;
            let (med, min) = time(30, || {
                let (a, b) = rayon::join(|| run_step(&x512, &x2048), || run_step(&x512, &x2048));
                a.and(b)
            })?;
            println!(
                "rows 2 x ({h}, k) x 36 decoder matrices side by side: median {med:.3} ms, \
                 min {min:.3} ms, {:.1} GFLOP/s",
                (m * bytes / 2) as f64 / (med * 1e6)
            );
        }
        Ok(())
    })
}
