//! Closed-loop load on `translator::Continuous`, without HTTP: `clients` clients each keep one
//! request of 1–3 sentences in the running batch (the next one pushed as soon as the last
//! sentence of the previous one ends), as `bench/compare_serve.py`'s clients do against
//! `attn serve`. The arrivals depend only on the steps, not on the clock, so two runs decode
//! the same cohorts: a scheduling change can be measured without the noise of a server run.
//!
//! ```sh
//! cargo run --release --example continuous_load -- MODEL_DIR SENTENCES.txt \
//!     [CLIENTS] [REQUESTS] [ROWS] [TOKENS] [OUT]
//! ```
//! Warms the model up as `attn serve` does, then prints the resident set after the warm-up and
//! its peak under the load, sentences/s, CPU seconds, steps and the mean rows a step, and the
//! requests' latency percentiles (p50 / p90 / p99, from a request's push to its last
//! sentence's end) in seconds and in steps (the steps, like the arrivals, do not depend on
//! the clock: a scheduling change shows in them without noise); with
//! OUT, writes each sentence's translation there (`LINE<TAB>TRANSLATION`, LINE 0-based in
//! SENTENCES), to be compared with `attn translate --model` on the same lines.
//!
//! `attn` gives every thread one heap (`mallopt`, in `attn-cli`'s `main`); this example does
//! not, so for the resident set `attn serve` has, run it with `MALLOC_ARENA_MAX=1`.

use candle_attention::{TranslateOptions, Translator};
use std::collections::HashMap;
use std::time::Instant;

fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime: fields 14 and 15 of stat, 12 and 13 after the command name.
    (ticks(11) + ticks(12)) / 100.0
}

/// Who is waiting for what.
#[derive(Default)]
struct Book {
    /// Request -> sentences left.
    open: HashMap<usize, usize>,
    /// Tag -> request.
    owner: HashMap<u64, usize>,
    /// Tag -> corpus line.
    sentence_of: HashMap<u64, usize>,
    /// Request -> the step and the instant it was pushed at.
    sent: HashMap<usize, (u64, Instant)>,
}

/// A `/proc/self/status` field in MB (`VmRSS`, `VmHWM`).
fn status_mb(field: &str) -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// What `attn serve` does before it says it is ready (`serve::engine::warm_up`): two batches
/// of 24 distinct short texts, 4 new tokens each, so that the panels of the products of many
/// rows are packed and the resident set is the server's at rest.
fn warm_up(translator: &Translator) -> anyhow::Result<()> {
    let text = "The committee will publish its annual report on the state of the national \
                parks, with figures for every region, early next year.";
    let texts: Vec<String> = (1..=24).map(|i| format!("{text} Part {i}.")).collect();
    let options = TranslateOptions {
        max_new_tokens: Some(4),
        ..TranslateOptions::default()
    };
    for _ in 0..2 {
        for result in translator.translate(&texts, &options)? {
            result?;
        }
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let arg =
        |i: usize, default: usize| args.get(i).and_then(|v| v.parse().ok()).unwrap_or(default);
    let (model, corpus) = (&args[1], &args[2]);
    let (clients, requests, rows, tokens) = (arg(3, 32), arg(4, 200), arg(5, 64), arg(6, 1024));
    let sentences: Vec<String> = std::fs::read_to_string(corpus)?
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_string)
        .collect();
    let translator = Translator::builder(model)
        .beam(4)
        .max_new_tokens(256)
        .max_batch_rows(rows)
        .max_batch_tokens(tokens)
        .build()?;
    let options = TranslateOptions::default();
    warm_up(&translator)?;
    let idle_mb = status_mb("VmRSS");
    // Writing 5 to clear_refs resets the peak resident set (VmHWM) to the current one.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let mut running = translator.continuous();
    // Request r: sentences from `next`, 1 + r % 3 of them.
    let mut next_sentence = 0usize;
    let mut book = Book::default();
    let mut outputs: Vec<(usize, String)> = Vec::new();
    let mut tag = 0u64;
    let mut push = |running: &mut candle_attention::translator::Continuous<'_>,
                    book: &mut Book,
                    r: usize,
                    step: u64| {
        let Book {
            open,
            owner,
            sentence_of,
            sent,
        } = book;
        let n = 1 + r % 3;
        for _ in 0..n {
            let line = next_sentence % sentences.len();
            let s = &sentences[line];
            sentence_of.insert(tag, line);
            next_sentence += 1;
            running
                .push(tag, s, None, &options)
                .expect("a corpus sentence");
            owner.insert(tag, r);
            tag += 1;
        }
        open.insert(r, n);
        sent.insert(r, (step, Instant::now()));
    };
    let mut next_request = 0usize;
    while next_request < clients.min(requests) {
        push(&mut running, &mut book, next_request, 0);
        next_request += 1;
    }
    // Per request: steps and seconds from its push to its last sentence's end.
    let mut latencies: Vec<(u64, f64)> = Vec::new();
    let (t0, c0) = (Instant::now(), cpu_seconds());
    let (mut steps, mut row_steps, mut done_requests, mut done_sentences) = (0u64, 0u64, 0, 0);
    // As `attn serve`: on a thread of rayon's pool (the kernels' parallel loops then need no
    // hand-over to the pool and back), the texts pushed before the clock starts.
    let mut body = || -> anyhow::Result<()> {
        while !running.is_idle() {
            let ended = running.step();
            steps += 1;
            row_steps += running.running_rows() as u64;
            for (t, result) in ended {
                let translation = result?;
                outputs.push((book.sentence_of[&t], translation.text));
                done_sentences += 1;
                let r = book.owner.remove(&t).expect("a tag pushed");
                let left = book.open.get_mut(&r).expect("an open request");
                *left -= 1;
                if *left == 0 {
                    book.open.remove(&r);
                    let (at, when) = book.sent.remove(&r).expect("a request pushed");
                    latencies.push((steps - at, when.elapsed().as_secs_f64()));
                    done_requests += 1;
                    if next_request < requests {
                        push(&mut running, &mut book, next_request, steps);
                        next_request += 1;
                    }
                }
            }
        }
        Ok(())
    };
    rayon::scope(|_| body())?;
    let (wall, cpu) = (t0.elapsed().as_secs_f64(), cpu_seconds() - c0);
    if let Some(path) = args.get(7) {
        // Corpus line (0-based) and translation, tab-separated, in the order they ended.
        let text: String = outputs
            .iter()
            .map(|(line, t)| format!("{line}\t{t}\n"))
            .collect();
        std::fs::write(path, text)?;
    }
    let peak_mb = status_mb("VmHWM");
    // p50, p90 and p99 of each series, each sorted once.
    let percentiles = |mut v: Vec<f64>| -> [f64; 3] {
        v.sort_by(f64::total_cmp);
        [0.5, 0.9, 0.99].map(|q| {
            v.get(((v.len() as f64 - 1.0) * q).round() as usize)
                .copied()
                .unwrap_or(0.0)
        })
    };
    let [s50, s90, s99] = percentiles(latencies.iter().map(|l| l.1).collect());
    let [t50, t90, t99] = percentiles(latencies.iter().map(|l| l.0 as f64).collect());
    println!(
        "request latency p50 / p90 / p99: {s50:.2} / {s90:.2} / {s99:.2} s, \
         {t50:.0} / {t90:.0} / {t99:.0} steps"
    );
    println!(
        "resident set: {idle_mb:.0} MB after the warm-up, peak {peak_mb:.0} MB under load ({:.2}x)",
        peak_mb / idle_mb
    );
    println!(
        "clients {clients} rows {rows} tokens {tokens}: {done_requests} requests, {done_sentences} sentences in {wall:.2} s ({:.2} sentences/s), CPU {cpu:.1} s ({:.3} CPU-s a sentence), {steps} steps, {:.1} rows a step",
        done_sentences as f64 / wall,
        cpu / done_sentences as f64,
        row_steps as f64 / steps.max(1) as f64
    );
    Ok(())
}
