//! Times int8 quantization of weights (issue "quantizing at load"), in milliseconds per 100 M
//! weights, and the read rate it implies (4 bytes a weight):
//!
//! ```sh
//! cargo run --release --example quantize_speed [MODEL_DIR [ROUNDS]]
//! ```
//! 1. `Int8Matrix::quantize` on the matrices of an opus-mt model (six 512 x 512 and two
//!    512 x 2048 / 2048 x 512 per layer, 12 layers, and the 58,101 x 512 embedding: 70 M
//!    weights), from memory the process already touched: the quantizer alone.
//! 2. With MODEL_DIR (an f32 directory): building a `Translator` on it in f32, with
//!    `Precision::INT8` (quantized while loading, from the memory map) and `Precision::BF16`
//!    (rounded while loading), alternating, medians of ROUNDS (default 5): the differences are
//!    what quantizing and rounding at load cost. The file's pages
//!    are in the page cache after the first round, as on a server that restarts.
//! 3. With MODEL_DIR: the floor under loading it quantized, what mapping its weight file costs
//!    alone: a fresh read-only mapping of `model.safetensors`, one byte of every 4 KiB page read
//!    on rayon's pool, the mapping dropped (medians of ROUNDS), in ms and ms per 100 M f32
//!    weights (400 MB).

use anyhow::{Context, Result};
use candle_attention::weights::{Int8Matrix, Precision};
use candle_attention::Translator;
use rayon::prelude::*;
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn opus_mt_shapes() -> Vec<(usize, usize)> {
    let mut shapes = vec![(58_101, 512)];
    for _ in 0..12 {
        shapes.extend([(512, 512); 6]);
        shapes.extend([(2048, 512), (512, 2048)]);
    }
    shapes
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let rounds: usize = args.get(2).and_then(|v| v.parse().ok()).unwrap_or(5);

    let shapes = opus_mt_shapes();
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let matrices: Vec<(Vec<f32>, usize, usize)> = shapes
        .iter()
        .map(|&(r, c)| {
            let w = (0..r * c)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5
                })
                .collect();
            (w, r, c)
        })
        .collect();
    let weights: usize = shapes.iter().map(|(r, c)| r * c).sum();
    let mut times = Vec::new();
    for _ in 0..rounds.max(3) {
        let t = Instant::now();
        for (w, r, c) in &matrices {
            std::hint::black_box(Int8Matrix::quantize(w, *r, *c)?);
        }
        times.push(t.elapsed().as_secs_f64());
    }
    let t = median(times);
    println!(
        "Int8Matrix::quantize, {:.1} M weights of opus-mt shapes: {:.1} ms ({:.1} ms per 100 M weights, {:.1} GB/s of f32 read)",
        weights as f64 / 1e6,
        t * 1e3,
        t * 1e3 * 1e8 / weights as f64,
        weights as f64 * 4.0 / t / 1e9
    );

    if let Some(dir) = args.get(1) {
        let precisions = [Precision::F32, Precision::INT8, Precision::BF16];
        let mut times = vec![Vec::new(); precisions.len()];
        for _ in 0..rounds {
            for (precision, t) in precisions.iter().zip(&mut times) {
                let start = Instant::now();
                std::hint::black_box(Translator::builder(dir).precision(*precision).build()?);
                t.push(start.elapsed().as_secs_f64());
            }
        }
        let [f, q, b] = [0, 1, 2].map(|i| median(times[i].clone()));
        let path = std::path::Path::new(dir).join("model.safetensors");
        let file = std::fs::File::open(&path).with_context(|| path.display().to_string())?;
        let mut maps = Vec::new();
        for _ in 0..rounds.max(3) {
            let start = Instant::now();
            // SAFETY: a read-only private mapping of a file nobody writes while this runs.
            let map = unsafe { memmap2::Mmap::map(&file)? };
            let touched: u64 = map.par_chunks(4096).map(|page| page[0] as u64).sum();
            std::hint::black_box(touched);
            drop(map);
            maps.push(start.elapsed().as_secs_f64());
        }
        let bytes = file.metadata()?.len() as f64;
        let map = median(maps);
        println!(
            "mapping {} ({:.0} MB) and reading a byte of each page: {:.1} ms ({:.1} ms per 100 M f32 weights)",
            path.display(),
            bytes / 1e6,
            map * 1e3,
            map * 1e3 * 400e6 / bytes
        );
        println!(
            "Translator::build on {dir}: f32 {:.1} ms, int8 quantized at load {:.1} ms (+{:.1} ms), \
             bf16 rounded at load {:.1} ms (+{:.1} ms)",
            f * 1e3,
            q * 1e3,
            (q - f) * 1e3,
            b * 1e3,
            (b - f) * 1e3
        );
    }
    Ok(())
}
