//! Times MarianMT loading and greedy decoding on a model directory (a quick profile; the
//! side-by-side benchmark against transformers is bench/compare_marian.py).
//!
//! `cargo run --release --example marian_speed -- DIR INPUTS.safetensors [STEPS] [f32|bf16|int8]`
//! (the last: the precision, `--dtype` / `--quantize` of `attn`; default f32, or int8 for a
//! directory `attn convert --quantize int8` wrote).

use anyhow::Context;
use candle::{DType, Device, Tensor};
use candle_attention::marian::MarianMTModel;
use candle_attention::weights::{Precision, Quantization};
use candle_attention::{StepDecoder, TensorFile};
use std::time::Instant;

fn main() -> anyhow::Result<()> {
    // On a thread of rayon's pool, as `attn` runs its model: the kernels' parallel loops then
    // start from a worker instead of waking the pool from outside on every call.
    let mut result = None;
    rayon::scope(|s| s.spawn(|_| result = Some(run())));
    result.expect("a rayon scope runs its spawned job before returning")
}

fn run() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (dir, inputs) = match args.as_slice() {
        [_, dir, inputs, ..] => (dir, inputs),
        _ => anyhow::bail!("usage: marian_speed DIR INPUTS.safetensors [STEPS]"),
    };
    let steps: usize = args.get(3).map_or(Ok(32), |s| s.parse()).context("STEPS")?;
    let precision = match args.get(4).map(String::as_str) {
        None | Some("f32") => Precision::default(),
        Some("bf16") => Precision::from(DType::BF16),
        Some("int8") => Precision {
            dtype: DType::F32,
            quantize: Some(Quantization::Int8),
        },
        Some(other) => anyhow::bail!("precision {other:?}: expected f32, bf16 or int8"),
    };
    let t0 = Instant::now();
    let model = MarianMTModel::from_dir_with(dir, precision, &Device::Cpu)?;
    let load = t0.elapsed();
    let file = TensorFile::open(inputs)?;
    let ids = file.load("input_ids", &Device::Cpu)?.to_dtype(DType::U32)?;
    let mask = file
        .load("attention_mask", &Device::Cpu)?
        .to_dtype(DType::U32)?;
    let t1 = Instant::now();
    let mut state = model.start(&ids, &mask)?;
    let encode = t1.elapsed();
    let rows = ids.dim(0)?;
    let start = model.config().decoder_start_token_id.unwrap_or(0);
    let mut tokens = vec![start; rows];
    let t2 = Instant::now();
    for _ in 0..steps {
        let logp: Tensor = model.step(&mut state, &tokens)?;
        tokens = logp.to_dtype(DType::F32)?.argmax(1)?.to_vec1::<u32>()?;
    }
    let decode = t2.elapsed();
    println!(
        "load {:.1} ms, encode {:.1} ms, {steps} steps {:.1} ms ({:.2} ms/step, {:.1} tok/s for {rows} rows)",
        load.as_secs_f64() * 1e3,
        encode.as_secs_f64() * 1e3,
        decode.as_secs_f64() * 1e3,
        decode.as_secs_f64() * 1e3 / steps as f64,
        (rows * steps) as f64 / (load + encode + decode).as_secs_f64()
    );
    Ok(())
}
