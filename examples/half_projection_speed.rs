//! Times `Projection` on the shapes of `MultiHeadAttention(512, 8)` (the fused `(512, 1536)`
//! input projection and the `(512, 512)` output projection) in f32, bf16 and f16:
//! `cargo run --release --example half_projection_speed [rows...]` (default 128 512 1024).

use anyhow::Result;
use candle::{DType, Device, Module, Tensor};
use candle_attention::projection::Projection;
use std::time::Instant;

fn main() -> Result<()> {
    let rows: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse())
        .collect::<Result<_, _>>()?;
    let rows = if rows.is_empty() {
        vec![128, 512, 1024]
    } else {
        rows
    };
    for (k, n) in [(512, 1536), (512, 512)] {
        let w = (Tensor::randn(0f32, 1.0, (n, k), &Device::Cpu)? / (k as f64).sqrt())?;
        let b = Tensor::randn(0f32, 0.1, n, &Device::Cpu)?;
        for &m in &rows {
            let x = Tensor::randn(0f32, 1.0, (m, k), &Device::Cpu)?;
            for dtype in [DType::F32, DType::BF16, DType::F16] {
                let p = Projection::new(&w.to_dtype(dtype)?, Some(b.to_dtype(dtype)?))?;
                let x = x.to_dtype(dtype)?;
                let iters = (200 * 128 / m).max(10);
                for _ in 0..iters / 4 {
                    p.forward(&x)?;
                }
                let mut times = Vec::with_capacity(iters);
                for _ in 0..iters {
                    let t = Instant::now();
                    p.forward(&x)?;
                    times.push(t.elapsed().as_secs_f64() * 1e3);
                }
                times.sort_by(f64::total_cmp);
                let med = times[iters / 2];
                let gflops = 2.0 * (m * n * k) as f64 / (med * 1e6);
                println!(
                    "({m}, {k}) x ({k}, {n}) {dtype:?}: median {med:.3} ms, min {:.3} ms, {gflops:.0} GFLOP/s",
                    times[0]
                );
            }
        }
    }
    Ok(())
}
