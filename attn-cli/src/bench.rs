//! `attn bench attention|mha`: time the attention kernels and multi-head attention on random
//! inputs. One line per implementation; `--json` makes each line a JSON object with at least
//! `impl`, `median_ms`, `min_ms` and `gflops` (attention flops = 4·B·H·Nq·Nk·D, halved when
//! causal; for `mha` the projections are counted too).
//!
//! Threads: rayon's pool (`RAYON_NUM_THREADS`), which the tiled kernel and candle's matmul
//! both use. Timings are wall-clock medians over `--iters` runs after `--warmup` runs. Every
//! line names the instruction set the kernels ran at (`isa`, `cpu` in JSON): the CPU's best,
//! lowered by `ATTN_CPU_ISA=portable|avx2|avx512`.

use crate::pool::on_rayon_pool;
use crate::{DTypeArg, DeviceArg};
use anyhow::{bail, Result};
use candle::{DType, Device, Tensor};
use candle_attention::cpu::{active_level, describe_cpu};
use candle_attention::testing::decompose;
use candle_attention::testing::sdpa::{blocked, few_queries, naive, tiled};
use candle_attention::{
    scaled_dot_product_attention, AttentionShape, Mask, MultiHeadAttention,
    MultiHeadAttentionConfig, SdpaArgs,
};
use candle_nn::{VarBuilder, VarMap};
use std::time::Instant;

/// Which attention implementation to time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ImplArg {
    /// The reference kernel (materialises the (B, H, L, S) scores).
    Naive,
    /// The tiled online-softmax CPU kernel.
    Tiled,
    /// The decode kernel (meant for a few queries against many keys).
    Decode,
    /// The device-generic blocked kernel (candle ops, online softmax; what non-CPU devices
    /// use).
    Generic,
    /// candle-nn's CPU `attention::flash_attn` (takes (B, S, H, D); no key padding).
    CandleFlash,
    /// `scaled_dot_product_attention` without weights: what the library picks.
    Auto,
    /// FlashAttention-2 on CUDA (candle-flash-attn; feature `flash-attn`; f16/bf16): on the
    /// first GPU when the inputs are on the CPU; timed with a device synchronisation.
    #[cfg(feature = "flash-attn")]
    FlashAttn,
}

impl ImplArg {
    fn name(self) -> &'static str {
        match self {
            ImplArg::Naive => "naive",
            ImplArg::Tiled => "tiled",
            ImplArg::Decode => "decode",
            ImplArg::Generic => "generic",
            ImplArg::CandleFlash => "candle-flash",
            ImplArg::Auto => "auto",
            #[cfg(feature = "flash-attn")]
            ImplArg::FlashAttn => "flash-attn",
        }
    }
}

#[derive(clap::Args, Debug)]
pub struct AttentionBenchArgs {
    /// Batch size B (sequences per call).
    #[arg(long, default_value_t = 1, value_name = "B")]
    batch: usize,
    /// Heads H.
    #[arg(long, default_value_t = 8, value_name = "H")]
    heads: usize,
    /// Query length Nq, in tokens.
    #[arg(long, default_value_t = 1024, value_name = "NQ")]
    seq_q: usize,
    /// Key/value length Nk, in tokens.
    #[arg(long, default_value_t = 1024, value_name = "NK")]
    seq_k: usize,
    /// Head dimension D (features per head of queries, keys and values).
    #[arg(long, default_value_t = 64, value_name = "D")]
    head_dim: usize,
    /// Causal mask: query i sees keys 0..=i + Nk - Nq (the last queries of a longer sequence,
    /// as in decoding). Default: every query sees every key.
    #[arg(long)]
    causal: bool,
    /// Key padding: the number of real keys of each batch row, comma separated (B values,
    /// each at most Nk); the rest of each row is padding. Default: no padding.
    #[arg(long, value_delimiter = ',', value_name = "N,...")]
    key_lengths: Vec<usize>,
    /// Implementations to time, comma separated (one result line each).
    #[arg(
        long = "impl",
        value_enum,
        value_delimiter = ',',
        default_value = "auto"
    )]
    impls: Vec<ImplArg>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(clap::Args, Debug)]
pub struct MhaBenchArgs {
    /// Batch size B (sequences per call).
    #[arg(long, default_value_t = 1, value_name = "B")]
    batch: usize,
    /// Sequence length N, in tokens (queries, keys and values: self-attention).
    #[arg(long, default_value_t = 1024, value_name = "N")]
    seq: usize,
    /// Model size E (embed_dim; divisible by the heads).
    #[arg(long, default_value_t = 512, value_name = "E")]
    embed_dim: usize,
    /// Heads H.
    #[arg(long, default_value_t = 8, value_name = "H")]
    heads: usize,
    /// Causal mask: token i sees tokens 0..=i. Default: every token sees every token.
    #[arg(long)]
    causal: bool,
    #[command(flatten)]
    run: RunArgs,
}

/// How a benchmark runs and reports, the same for `bench attention` and `bench mha`.
#[derive(clap::Args, Debug)]
struct RunArgs {
    /// Dtype of the random inputs (and weights), which the kernels compute in.
    #[arg(long, value_enum, default_value = "f32")]
    dtype: DTypeArg,
    /// Where to compute: cpu, or cuda / metal in a build with that cargo feature (the tiled,
    /// decode and candle-flash kernels are CPU-only).
    #[arg(long, value_enum, default_value = "cpu")]
    device: DeviceArg,
    /// Timed iterations; the median and the minimum, in milliseconds, are reported.
    #[arg(long, default_value_t = 10, value_name = "N")]
    iters: usize,
    /// Untimed iterations before the timed ones.
    #[arg(long, default_value_t = 2, value_name = "N")]
    warmup: usize,
    /// Print one JSON object per line (impl, median_ms, min_ms, gflops, isa, cpu, the shape)
    /// instead of a table.
    #[arg(long)]
    json: bool,
}

/// Median and minimum of `iters` timed calls of `f`, in milliseconds. Each call ends with a
/// synchronisation of `dev`, so queued GPU work is counted. The calls run on a thread of
/// rayon's pool, as `attn generate` runs its model (see [`on_rayon_pool`]): the timing
/// includes the parallel loops' work and hand-offs, not a waiting thread outside the pool.
fn time(
    dev: &Device,
    warmup: usize,
    iters: usize,
    f: impl FnMut() -> Result<()> + Send,
) -> Result<(f64, f64)> {
    if iters == 0 {
        bail!("--iters must be at least 1")
    }
    on_rayon_pool(|| time_here(dev, warmup, iters, f))
}

/// [`time`] on the calling thread.
fn time_here(
    dev: &Device,
    warmup: usize,
    iters: usize,
    mut f: impl FnMut() -> Result<()>,
) -> Result<(f64, f64)> {
    for _ in 0..warmup {
        f()?;
        dev.synchronize()?;
    }
    let mut ms = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        f()?;
        dev.synchronize()?;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    ms.sort_by(f64::total_cmp);
    let median = if iters % 2 == 1 {
        ms[iters / 2]
    } else {
        0.5 * (ms[iters / 2 - 1] + ms[iters / 2])
    };
    Ok((median, ms[0]))
}

fn dtype_name(dt: DType) -> &'static str {
    match dt {
        DType::F32 => "f32",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        _ => "other",
    }
}

pub fn attention(a: &AttentionBenchArgs) -> Result<()> {
    let dev = a.run.device.device()?;
    let dtype = a.run.dtype.dtype();
    let (b, h, nq, nk, d) = (a.batch, a.heads, a.seq_q, a.seq_k, a.head_dim);
    if b == 0 || h == 0 || nq == 0 || nk == 0 || d == 0 {
        bail!("batch, heads, seq-q, seq-k and head-dim must all be at least 1")
    }
    let q = Tensor::randn(0f32, 1., (b, h, nq, d), &dev)?.to_dtype(dtype)?;
    let k = Tensor::randn(0f32, 1., (b, h, nk, d), &dev)?.to_dtype(dtype)?;
    let v = Tensor::randn(0f32, 1., (b, h, nk, d), &dev)?.to_dtype(dtype)?;
    let offset = nk.saturating_sub(nq);
    let mut mask = if a.causal {
        Mask::causal_with_offset(offset)
    } else {
        Mask::none()
    };
    if !a.key_lengths.is_empty() {
        if a.key_lengths.len() != b {
            bail!(
                "--key-lengths needs {b} values (one per batch row), got {}",
                a.key_lengths.len()
            )
        }
        let mut pad = vec![0u8; b * nk];
        for (row, &len) in pad.chunks_mut(nk).zip(&a.key_lengths) {
            if len > nk {
                bail!("key length {len} exceeds --seq-k {nk}")
            }
            row[len..].fill(1);
        }
        mask = mask.and(Mask::key_padding(Tensor::from_vec(pad, (b, nk), &dev)?)?);
    }
    // Flops are those of the full problem (padding included), as torch computes it.
    let flops = {
        let full = 4.0 * (b * h * nq * nk * d) as f64;
        if a.causal {
            full / 2.0
        } else {
            full
        }
    };
    let scale = 1.0 / (d as f64).sqrt();
    let shape = AttentionShape {
        batch: b,
        heads: h,
        q_len: nq,
        k_len: nk,
    };
    for &imp in &a.impls {
        let run: Box<dyn Fn() -> Result<Tensor> + Send + Sync> = match imp {
            ImplArg::Naive => {
                let bias = mask.to_bias(shape, &dev)?;
                let (q, k, v) = (q.clone(), k.clone(), v.clone());
                Box::new(move || {
                    Ok(naive::attention(&q, &k, &v, bias.as_ref(), scale, 0.0, false)?.0)
                })
            }
            ImplArg::Tiled | ImplArg::Decode | ImplArg::CandleFlash if !dev.is_cpu() => {
                bail!(
                    "--impl {} is a CPU kernel; on {:?} use naive, generic or auto",
                    imp.name(),
                    dev.location()
                )
            }
            ImplArg::Generic => {
                let parts = decompose(&mask, shape, &dev)?;
                let (q, k, v) = (q.clone(), k.clone(), v.clone());
                Box::new(move || Ok(blocked::attention(&q, &k, &v, &parts, scale)?))
            }
            ImplArg::Tiled | ImplArg::Decode => {
                let parts = decompose(&mask, shape, &dev)?;
                let (q, k, v) = (q.clone(), k.clone(), v.clone());
                if imp == ImplArg::Tiled {
                    Box::new(move || Ok(tiled::attention(&q, &k, &v, &parts, scale)?))
                } else {
                    Box::new(move || Ok(few_queries::attention(&q, &k, &v, &parts, scale)?))
                }
            }
            ImplArg::CandleFlash => {
                if !a.key_lengths.is_empty() {
                    bail!("candle-flash has no key padding mask")
                }
                let attn_mask = if a.causal {
                    candle_nn::attention::AttnMask::Causal { kv_offset: offset }
                } else {
                    candle_nn::attention::AttnMask::None
                };
                // candle-nn takes (B, S, H, D).
                let qf = q.transpose(1, 2)?.contiguous()?;
                let kf = k.transpose(1, 2)?.contiguous()?;
                let vf = v.transpose(1, 2)?.contiguous()?;
                Box::new(move || {
                    let out = match dtype {
                        DType::F32 => candle_nn::attention::flash_attn::<f32>(
                            &qf,
                            &kf,
                            &vf,
                            scale as f32,
                            attn_mask.clone(),
                            None,
                            None,
                        )?,
                        DType::F16 => candle_nn::attention::flash_attn::<half::f16>(
                            &qf,
                            &kf,
                            &vf,
                            scale as f32,
                            attn_mask.clone(),
                            None,
                            None,
                        )?,
                        _ => candle_nn::attention::flash_attn::<half::bf16>(
                            &qf,
                            &kf,
                            &vf,
                            scale as f32,
                            attn_mask.clone(),
                            None,
                            None,
                        )?,
                    };
                    Ok(out)
                })
            }
            ImplArg::Auto => {
                let args = SdpaArgs {
                    mask: mask.clone(),
                    ..Default::default()
                };
                let (q, k, v) = (q.clone(), k.clone(), v.clone());
                Box::new(move || Ok(scaled_dot_product_attention(&q, &k, &v, &args)?.output))
            }
            #[cfg(feature = "flash-attn")]
            ImplArg::FlashAttn => flash_attn_runner(&q, &k, &v, &mask, scale)?,
        };
        let (median, min) = time(&dev, a.run.warmup, a.run.iters, || run().map(drop))?;
        let gflops = flops / (median * 1e6);
        if a.run.json {
            let line = serde_json::json!({
                "bench": "attention",
                "impl": imp.name(),
                "batch": b, "heads": h, "seq_q": nq, "seq_k": nk, "head_dim": d,
                "causal": a.causal,
                "key_lengths": a.key_lengths,
                "dtype": dtype_name(dtype),
                "device": format!("{:?}", dev.location()),
                "threads": rayon::current_num_threads(),
                "iters": a.run.iters,
                "median_ms": median,
                "min_ms": min,
                "gflops": gflops,
                "isa": active_level().name(),
                "cpu": describe_cpu(),
            });
            println!("{line}");
        } else {
            println!(
                "attention {:<12} B={b} H={h} Nq={nq} Nk={nk} D={d}{} {} [{}]: median {median:.3} ms, min {min:.3} ms, {gflops:.1} GFLOP/s",
                imp.name(),
                if a.causal { " causal" } else { "" },
                dtype_name(dtype),
                active_level()
            );
        }
    }
    Ok(())
}

/// `--impl flash-attn`: candle-flash-attn on CUDA through the library's flash path (packing
/// key padding on the way), moving CPU inputs to the first GPU. Each timed call waits for the
/// GPU, since CUDA kernels are launched asynchronously.
#[cfg(feature = "flash-attn")]
fn flash_attn_runner(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: &Mask,
    scale: f64,
) -> Result<Box<dyn Fn() -> Result<Tensor> + Send + Sync>> {
    use anyhow::Context;
    use candle_attention::testing::sdpa::flash as flash_cuda;
    let dev = if q.device().is_cuda() {
        q.device().clone()
    } else {
        Device::new_cuda(0).context("--impl flash-attn needs a CUDA device")?
    };
    let (q, k, v) = (q.to_device(&dev)?, k.to_device(&dev)?, v.to_device(&dev)?);
    let mask = mask.clone();
    // Unsupported dtypes and masks fail here, with the reason, not in the timing loop.
    flash_cuda::attention(&q, &k, &v, &mask, scale).context("--impl flash-attn")?;
    Ok(Box::new(move || {
        let out = flash_cuda::attention(&q, &k, &v, &mask, scale)?;
        dev.synchronize()?;
        Ok(out)
    }))
}

pub fn mha(a: &MhaBenchArgs) -> Result<()> {
    let dev = a.run.device.device()?;
    let dtype = a.run.dtype.dtype();
    let (b, n, e, h) = (a.batch, a.seq, a.embed_dim, a.heads);
    if b == 0 || n == 0 {
        bail!("batch and seq must be at least 1")
    }
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, dtype, &dev);
    let mha = MultiHeadAttention::new(MultiHeadAttentionConfig::new(e, h), vb)?;
    // Detach the weights from the VarMap so that no gradient is tracked (eval, as in torch's
    // `torch.no_grad()`), then rebuild through a plain VarBuilder.
    let tensors: std::collections::HashMap<String, Tensor> = varmap
        .data()
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned var map"))?
        .iter()
        .map(|(k, v)| (k.clone(), v.as_tensor().detach()))
        .collect();
    let vb = VarBuilder::from_tensors(tensors, dtype, &dev);
    let mha = MultiHeadAttention::load(mha.config().clone(), vb)?;
    let x = Tensor::randn(0f32, 1., (b, n, e), &dev)?.to_dtype(dtype)?;
    let args = candle_attention::AttentionArgs {
        mask: if a.causal {
            Mask::causal()
        } else {
            Mask::none()
        },
        ..Default::default()
    };
    let (median, min) = time(&dev, a.run.warmup, a.run.iters, || {
        if a.causal {
            mha.attend(&x, &x, &x, &args)?;
        } else {
            mha.forward(&x)?;
        }
        Ok(())
    })?;
    let hd = e / h.max(1);
    let attn_flops = 4.0 * (b * h * n * n * hd) as f64 * if a.causal { 0.5 } else { 1.0 };
    let proj_flops = 4.0 * 2.0 * (b * n * e * e) as f64;
    let gflops = (attn_flops + proj_flops) / (median * 1e6);
    if a.run.json {
        let line = serde_json::json!({
            "bench": "mha",
            "impl": "candle-attention",
            "batch": b, "seq": n, "embed_dim": e, "heads": h,
            "causal": a.causal,
            "dtype": dtype_name(dtype),
            "threads": rayon::current_num_threads(),
            "iters": a.run.iters,
            "median_ms": median,
            "min_ms": min,
            "gflops": gflops,
            "isa": active_level().name(),
            "cpu": describe_cpu(),
        });
        println!("{line}");
    } else {
        println!(
            "mha E={e} H={h} B={b} N={n}{} {} [{}]: median {median:.3} ms, min {min:.3} ms, {gflops:.1} GFLOP/s",
            if a.causal { " causal" } else { "" },
            dtype_name(dtype),
            active_level()
        );
    }
    Ok(())
}
