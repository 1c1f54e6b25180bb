//! Runs the tiled attention kernel on half-precision inputs from a safetensors file and writes
//! the outputs, for `bench/half_accuracy.py`, which compares them with torch's own bf16/f16
//! SDPA and an f64 reference on the same inputs.
//!
//! ```text
//! cargo run --release --example sdpa_accuracy -- IN.safetensors OUT.safetensors [--causal]
//! ```
//!
//! `IN` holds `q` `(B, H, L, D)`, `k`, `v` `(B, H, S, D)` (one dtype: f16 or bf16) and
//! optionally `key_padding` `(B, S)` (u8, 1 = padding). `OUT` gets `out` (the default path:
//! for bf16 the AVX-512 BF16 dot-product kernels where the CPU has them) and `out_converted`
//! (tiles converted to f32, `TiledConfig::half_dot = false`), both in the input dtype.

use anyhow::{bail, Context, Result};
use candle::{Device, Tensor};
use candle_attention::testing::decompose;
use candle_attention::testing::sdpa::tiled::{self, TiledConfig};
use candle_attention::{AttentionShape, Mask};
use std::collections::HashMap;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(input), Some(output)) = (args.first(), args.get(1)) else {
        bail!("usage: sdpa_accuracy IN.safetensors OUT.safetensors [--causal]");
    };
    let causal = args.iter().skip(2).any(|a| a == "--causal");
    let dev = Device::Cpu;
    let tensors =
        candle::safetensors::load(input, &dev).with_context(|| format!("reading {input}"))?;
    let get = |name: &str| -> Result<Tensor> {
        tensors.get(name).cloned().with_context(|| {
            let mut names: Vec<_> = tensors.keys().collect();
            names.sort();
            format!("{input} has no tensor {name:?} (it has {names:?})")
        })
    };
    let (q, k, v) = (get("q")?, get("k")?, get("v")?);
    let (b, h, l, d) = q.dims4().context("q must be (B, H, L, D)")?;
    let s = k.dim(2).context("k must be (B, H, S, D)")?;
    let mut mask = if causal { Mask::causal() } else { Mask::none() };
    if let Some(pad) = tensors.get("key_padding") {
        mask = mask.and(Mask::key_padding(pad.clone())?);
    }
    let shape = AttentionShape {
        batch: b,
        heads: h,
        q_len: l,
        k_len: s,
    };
    let parts = decompose(&mask, shape, &dev)?;
    let scale = 1.0 / (d as f64).sqrt();
    let mut out = HashMap::new();
    for (name, half_dot) in [("out", true), ("out_converted", false)] {
        let cfg = TiledConfig {
            half_dot,
            ..Default::default()
        };
        let o = tiled::attention_with(&q, &k, &v, &parts, scale, &cfg)?.contiguous()?;
        out.insert(name.to_string(), o);
    }
    candle::safetensors::save(&out, output).with_context(|| format!("writing {output}"))?;
    Ok(())
}
