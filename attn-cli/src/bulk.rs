//! The bulk path of `attn translate --model DIR`: lines in (arguments, standard input or
//! `--input FILE`), one line out per line in (standard output or `--output FILE`), in input
//! order, streaming.
//!
//! * **Reading** is bounded: a window of at most `window` lines (and [`WINDOW_BYTES`]) is read
//!   ahead; a line longer than [`MAX_LINE_BYTES`] is refused without being kept; a line that
//!   is not UTF-8 is an error for that line only.
//! * **Batching** sorts the window's lines by their token count and packs them into batches
//!   whose padded size (rows × longest row) stays within `max_batch_tokens`, so a batch pads
//!   little and its sentences end at about the same step; the generation engine drops the
//!   rows that finished from the running batch.
//! * **Writing** follows the input order: after every batch the lines whose results are all
//!   known are written, so the first lines come out long before the input ends.
//! * **Failures stay with their line**: a text the model cannot take, or whose generation
//!   fails, gets an empty line (plain text) or an object with `"error"` (JSONL) and its
//!   reason on standard error; the other lines of its batch are generated again without it.
//! * **Repeats cost nothing**: lines of a window that encode to the same ids (blank lines
//!   all do) are generated once and share the result, which is exactly what each alone gives.

use anyhow::Context;
use candle_attention::explain::AttentionMap;
use candle_attention::generation::Hypothesis;
use candle_attention::marian::MarianTranslator;
use candle_attention::models::multilingual_translator::MultilingualTranslator;
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::io::{BufRead, Write};

/// The longest input line taken, in bytes; a longer one is an error for that line (it is
/// skipped, not kept in memory).
pub const MAX_LINE_BYTES: usize = 1 << 20;

/// The most bytes of text a window holds (with at most `window` lines).
pub const WINDOW_BYTES: usize = 16 << 20;

/// The most decoder rows (lines × beams) in one batch, whatever the token budget allows.
/// Every row holds its self- and cross-attention caches (and beam search copies them at each
/// step) and a step's log-probabilities (232 KB a row for a 58,101-token vocabulary): the
/// short lines of a window would otherwise make batches of a thousand rows, 1.2–1.6 GB
/// resident for a 282 MB opus-mt model at beam 4. Past a few hundred rows a step is
/// compute-bound, so the cap costs no throughput.
pub const MAX_BATCH_ROWS: usize = 256;

/// A model the bulk path can drive: text to ids, ids to hypotheses, hypotheses to text.
pub trait Engine {
    /// The ids of `text` as the model reads it, or why it cannot take it.
    fn encode(&self, text: &str) -> candle::Result<Vec<u32>>;
    /// One padded batch; one result per row, each its hypotheses best first.
    fn generate(&self, batch: &[Vec<u32>]) -> candle::Result<Vec<candle::Result<Vec<Hypothesis>>>>;
    /// Decoder rows per line: the beam width.
    fn rows_per_line(&self) -> usize;
    /// The text of a hypothesis.
    fn decode(&self, hypothesis: &Hypothesis) -> candle::Result<String>;
    /// Where a hypothesis generated from `source_ids` looked: the last decoder layer's
    /// cross-attention, one row per generated token.
    fn attention(
        &self,
        source_ids: &[u32],
        hypothesis: &Hypothesis,
    ) -> candle::Result<AttentionMap>;
}

impl Engine for MarianTranslator {
    fn encode(&self, text: &str) -> candle::Result<Vec<u32>> {
        MarianTranslator::encode(self, text)
    }

    fn generate(&self, batch: &[Vec<u32>]) -> candle::Result<Vec<candle::Result<Vec<Hypothesis>>>> {
        self.generate_encoded(batch)
    }

    fn rows_per_line(&self) -> usize {
        self.generation_config().num_beams.unwrap_or(1).max(1)
    }

    fn decode(&self, hypothesis: &Hypothesis) -> candle::Result<String> {
        MarianTranslator::decode(self, hypothesis)
    }

    fn attention(
        &self,
        source_ids: &[u32],
        hypothesis: &Hypothesis,
    ) -> candle::Result<AttentionMap> {
        self.attention_map(source_ids, hypothesis, None)
    }
}

impl Engine for MultilingualTranslator {
    fn encode(&self, text: &str) -> candle::Result<Vec<u32>> {
        MultilingualTranslator::encode(self, text)
    }

    fn generate(&self, batch: &[Vec<u32>]) -> candle::Result<Vec<candle::Result<Vec<Hypothesis>>>> {
        self.generate_encoded(batch)
    }

    fn rows_per_line(&self) -> usize {
        self.generation_config().num_beams.unwrap_or(1).max(1)
    }

    fn decode(&self, hypothesis: &Hypothesis) -> candle::Result<String> {
        MultilingualTranslator::decode(self, hypothesis)
    }

    fn attention(
        &self,
        source_ids: &[u32],
        hypothesis: &Hypothesis,
    ) -> candle::Result<AttentionMap> {
        self.attention_map(source_ids, hypothesis, None)
    }
}

/// How lines are read and written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// One text per line in, one translation per line out.
    Text,
    /// One JSON object per line in (`{"id": ..., "text": ..., ...}`), one out
    /// (`{"id", "translation", "score", ...}`, the other input fields passed through).
    Jsonl,
}

/// The knobs of the bulk path.
#[derive(Clone, Debug)]
pub struct Options {
    /// Lines read ahead and sorted together.
    pub window: usize,
    /// The most padded source tokens (rows × longest row) in one batch.
    pub max_batch_tokens: usize,
    /// Plain text or JSONL.
    pub format: Format,
    /// Hypotheses per line in JSONL (`"n_best"`); 1 writes none.
    pub n_best: usize,
    /// JSONL: for each generated token of the best hypothesis, the source token it attends to
    /// most in the last decoder layer's cross-attention (`"alignments"`).
    pub alignments: bool,
}

/// What one run did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Lines read (and written).
    pub lines: usize,
    /// Lines that got an error instead of a translation.
    pub failed: usize,
    /// Source tokens generated from (for throughput figures).
    pub source_tokens: usize,
    /// Tokens generated (best hypotheses, EOS included).
    pub generated_tokens: usize,
}

/// Reads the next line of `input` (without its `\n` or `\r\n`) into `buf`: `Ok(None)` at the
/// end, `Ok(Some(false))` for a line longer than [`MAX_LINE_BYTES`] (skipped to its end, `buf`
/// left empty).
fn read_line(input: &mut impl BufRead, buf: &mut Vec<u8>) -> std::io::Result<Option<bool>> {
    buf.clear();
    let mut too_long = false;
    let mut any = false;
    loop {
        let chunk = input.fill_buf()?;
        if chunk.is_empty() {
            break;
        }
        any = true;
        let newline = chunk.iter().position(|&b| b == b'\n');
        let part = &chunk[..newline.unwrap_or(chunk.len())];
        if !too_long {
            if buf.len() + part.len() > MAX_LINE_BYTES {
                too_long = true;
                buf.clear();
            } else {
                buf.extend_from_slice(part);
            }
        }
        let used = newline.map_or(chunk.len(), |i| i + 1);
        input.consume(used);
        if newline.is_some() {
            break;
        }
    }
    if !any {
        return Ok(None);
    }
    if buf.last() == Some(&b'\r') {
        buf.pop();
    }
    Ok(Some(!too_long))
}

/// One input line, parsed.
struct Item {
    /// The JSONL object's fields (JSONL only): echoed into the output.
    fields: Option<Map<String, Value>>,
    /// The text, or why the line cannot be translated.
    text: Result<String, String>,
}

/// One output line, once known.
#[derive(Clone)]
enum Outcome {
    Translated {
        hypotheses: Vec<(String, Hypothesis)>,
        /// With `--alignments`: (target token, source token, source position) per generated
        /// token of the best hypothesis.
        alignment: Option<Vec<(String, String, usize)>>,
    },
    Failed(String),
}

/// Parses one line of input in `format`.
fn parse(line: Result<&[u8], String>, format: Format) -> Item {
    let text = line.and_then(|bytes| {
        std::str::from_utf8(bytes)
            .map(str::to_string)
            .map_err(|e| format!("the line is not valid UTF-8 ({e})"))
    });
    match format {
        Format::Text => Item { fields: None, text },
        Format::Jsonl => {
            let parsed = text.and_then(|t| match serde_json::from_str::<Value>(&t) {
                Ok(Value::Object(map)) => Ok(map),
                Ok(other) => Err(format!(
                    "a JSONL line must be an object with \"text\", got {other}"
                )),
                Err(e) => Err(format!("not a JSON object: {e}")),
            });
            match parsed {
                Err(e) => Item {
                    fields: Some(Map::new()),
                    text: Err(e),
                },
                Ok(map) => {
                    let text = match map.get("text") {
                        Some(Value::String(s)) => Ok(s.clone()),
                        Some(other) => Err(format!("\"text\" must be a string, got {other}")),
                        None => Err("the object has no \"text\" field".to_string()),
                    };
                    Item {
                        fields: Some(map),
                        text,
                    }
                }
            }
        }
    }
}

/// The output line of `item`.
fn render(item: &Item, outcome: &Outcome, options: &Options) -> String {
    match options.format {
        Format::Text => match outcome {
            Outcome::Translated { hypotheses, .. } => hypotheses[0].0.clone(),
            Outcome::Failed(_) => String::new(),
        },
        Format::Jsonl => {
            let mut map = item.fields.clone().unwrap_or_default();
            map.remove("text");
            match outcome {
                Outcome::Translated {
                    hypotheses,
                    alignment,
                } => {
                    let (best, hyp) = &hypotheses[0];
                    if let Some(alignment) = alignment {
                        let list = alignment
                            .iter()
                            .map(|(target, source, index)| {
                                serde_json::json!({
                                    "target": target,
                                    "source": source,
                                    "source_index": index,
                                })
                            })
                            .collect();
                        map.insert("alignments".into(), Value::Array(list));
                    }
                    map.insert("translation".into(), Value::String(best.clone()));
                    map.insert("score".into(), score(hyp.score));
                    map.insert("log_prob".into(), score(hyp.log_prob));
                    if options.n_best > 1 {
                        let list = hypotheses
                            .iter()
                            .map(|(text, h)| {
                                serde_json::json!({
                                    "translation": text,
                                    "score": score(h.score),
                                    "log_prob": score(h.log_prob),
                                })
                            })
                            .collect();
                        map.insert("n_best".into(), Value::Array(list));
                    }
                }
                Outcome::Failed(reason) => {
                    map.insert("error".into(), Value::String(reason.clone()));
                }
            }
            Value::Object(map).to_string()
        }
    }
}

/// The alignment of `hypothesis` (from `source_ids`): per generated token, its label, and the
/// label and position of the source token it attends to most.
fn align(
    engine: &impl Engine,
    source_ids: &[u32],
    hypothesis: &Hypothesis,
) -> candle::Result<Vec<(String, String, usize)>> {
    let map = engine.attention(source_ids, hypothesis)?;
    Ok(map
        .alignment()
        .into_iter()
        .zip(&map.output)
        .map(|(j, target)| {
            (
                target.clone(),
                map.source.get(j).cloned().unwrap_or_default(),
                j,
            )
        })
        .collect())
}

/// A score as JSON: a number, or `null` for a non-finite one (JSON has no infinities).
fn score(x: f32) -> Value {
    serde_json::Number::from_f64(x as f64).map_or(Value::Null, Value::Number)
}

/// Translates every line of `input` with `engine`, writing one line per input line to
/// `output` in input order; `on_line` sees each failure (line number from 1, reason) and is
/// told about progress (`bytes` read so far) after every batch.
pub fn translate(
    engine: &impl Engine,
    mut input: impl BufRead,
    mut output: impl Write,
    options: &Options,
    mut on_failure: impl FnMut(usize, &str),
    mut on_progress: impl FnMut(&Summary, u64),
) -> anyhow::Result<Summary> {
    let mut summary = Summary::default();
    let mut buf = Vec::new();
    let mut bytes_read = 0u64;
    let mut eof = false;
    while !eof {
        // Read a window.
        let mut items: Vec<Item> = Vec::new();
        let mut window_bytes = 0;
        while items.len() < options.window.max(1) && window_bytes < WINDOW_BYTES {
            let line = match read_line(&mut input, &mut buf).context("reading the input")? {
                None => {
                    eof = true;
                    break;
                }
                Some(true) => Ok(buf.as_slice()),
                Some(false) => Err(format!(
                    "the line is longer than {MAX_LINE_BYTES} bytes; it was skipped"
                )),
            };
            bytes_read += buf.len() as u64 + 1;
            window_bytes += buf.len();
            items.push(parse(line, options.format));
        }
        if items.is_empty() {
            break;
        }
        let first = summary.lines;
        summary.lines += items.len();
        // Encode; failures are known at once, and lines with the same ids share one row.
        let mut outcomes: Vec<Option<Outcome>> = (0..items.len()).map(|_| None).collect();
        let mut todo: Vec<(usize, Vec<u32>)> = Vec::new();
        let mut first_of: HashMap<Vec<u32>, usize> = HashMap::new();
        let mut repeats: Vec<(usize, usize)> = Vec::new();
        for (i, item) in items.iter().enumerate() {
            match &item.text {
                Err(reason) => outcomes[i] = Some(Outcome::Failed(reason.clone())),
                Ok(text) => match engine.encode(text) {
                    Ok(ids) => match first_of.get(&ids) {
                        Some(&first) => repeats.push((i, first)),
                        None => {
                            first_of.insert(ids.clone(), i);
                            todo.push((i, ids));
                        }
                    },
                    Err(e) => outcomes[i] = Some(Outcome::Failed(e.to_string())),
                },
            }
        }
        // Shortest first; batches within the token budget and the row cap (at least one line).
        let rows_per_line = engine.rows_per_line();
        todo.sort_by_key(|(i, ids)| (ids.len(), *i));
        let mut written = 0;
        let mut start = 0;
        while start < todo.len() || written < items.len() {
            if start < todo.len() {
                let mut end = start + 1;
                while end < todo.len()
                    && (end + 1 - start) * rows_per_line <= MAX_BATCH_ROWS
                    && (end + 1 - start) * todo[end].1.len() <= options.max_batch_tokens
                {
                    end += 1;
                }
                let batch: Vec<Vec<u32>> = todo[start..end]
                    .iter()
                    .map(|(_, ids)| ids.clone())
                    .collect();
                let results = engine.generate(&batch)?;
                for ((i, ids), result) in todo[start..end].iter().zip(results) {
                    summary.source_tokens += ids.len();
                    outcomes[*i] = Some(
                        match result.and_then(|hyps| {
                            hyps.into_iter()
                                .map(|h| Ok((engine.decode(&h)?, h)))
                                .collect::<candle::Result<Vec<_>>>()
                        }) {
                            Ok(hypotheses) if !hypotheses.is_empty() => {
                                summary.generated_tokens += hypotheses[0].1.tokens.len() - 1;
                                let alignment = options
                                    .alignments
                                    .then(|| align(engine, ids, &hypotheses[0].1))
                                    .transpose();
                                match alignment {
                                    Ok(alignment) => Outcome::Translated {
                                        hypotheses,
                                        alignment,
                                    },
                                    Err(e) => Outcome::Failed(e.to_string()),
                                }
                            }
                            Ok(_) => Outcome::Failed("generation returned no hypothesis".into()),
                            Err(e) => Outcome::Failed(e.to_string()),
                        },
                    );
                }
                start = end;
                for &(i, first) in &repeats {
                    if outcomes[i].is_none() {
                        outcomes[i] = outcomes[first].clone();
                    }
                }
            }
            // Write the lines whose results are all known, in order.
            while written < items.len() {
                let Some(outcome) = &outcomes[written] else {
                    break;
                };
                if let Outcome::Failed(reason) = outcome {
                    summary.failed += 1;
                    on_failure(first + written + 1, reason);
                }
                writeln!(output, "{}", render(&items[written], outcome, options))
                    .context("writing the output")?;
                written += 1;
            }
            output.flush().context("writing the output")?;
            on_progress(&summary, bytes_read);
            if start >= todo.len() && written < items.len() {
                anyhow::bail!(
                    "internal: line {} of the window got no result",
                    first + written + 1
                )
            }
        }
    }
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// "Translates" by reversing the ids; fails on texts that say "fail", and fails a whole
    /// batch that holds one, as a model error would. Decodes `beams` rows per line and
    /// records the largest batch it was given.
    #[derive(Default)]
    struct Reverse {
        beams: usize,
        largest_batch: std::cell::Cell<usize>,
    }

    impl Engine for Reverse {
        fn encode(&self, text: &str) -> candle::Result<Vec<u32>> {
            if text.contains("too long") {
                candle::bail!("too long for the model")
            }
            Ok(text.bytes().map(u32::from).collect())
        }
        fn generate(
            &self,
            batch: &[Vec<u32>],
        ) -> candle::Result<Vec<candle::Result<Vec<Hypothesis>>>> {
            self.largest_batch
                .set(self.largest_batch.get().max(batch.len()));
            let bad = |ids: &Vec<u32>| {
                String::from_utf8_lossy(&ids.iter().map(|&b| b as u8).collect::<Vec<_>>())
                    .contains("fail")
            };
            if batch.len() > 1 && batch.iter().any(bad) {
                // The real engine retries each row alone when the batch fails.
                return Ok(batch
                    .iter()
                    .map(|ids| {
                        self.generate(std::slice::from_ref(ids))
                            .map(|mut v| v.swap_remove(0))
                            .and_then(|r| r)
                    })
                    .collect());
            }
            Ok(batch
                .iter()
                .map(|ids| {
                    if bad(ids) {
                        candle::bail!("the translation ran past the positions")
                    }
                    let mut tokens = vec![0];
                    tokens.extend(ids.iter().rev());
                    Ok(vec![Hypothesis {
                        tokens,
                        log_prob: -(ids.len() as f32),
                        score: -1.0,
                        ended_with_eos: false,
                    }])
                })
                .collect())
        }
        fn rows_per_line(&self) -> usize {
            self.beams.max(1)
        }
        fn decode(&self, h: &Hypothesis) -> candle::Result<String> {
            Ok(h.tokens[1..].iter().map(|&b| b as u8 as char).collect())
        }
        /// Output token `i` attends to source token `len - 1 - i` (it reverses).
        fn attention(&self, ids: &[u32], h: &Hypothesis) -> candle::Result<AttentionMap> {
            let n = ids.len();
            let weights = (0..h.tokens.len() - 1)
                .map(|i| (0..n).map(|j| f32::from(j + i + 1 == n)).collect())
                .collect();
            Ok(AttentionMap {
                source: ids.iter().map(|&b| (b as u8 as char).to_string()).collect(),
                output: h.tokens[1..]
                    .iter()
                    .map(|&b| (b as u8 as char).to_string())
                    .collect(),
                weights: vec![weights],
                layer: 0,
                num_layers: 1,
            })
        }
    }

    fn run(input: &[u8], options: &Options) -> (String, Vec<(usize, String)>, Summary) {
        run_with(&Reverse::default(), input, options)
    }

    fn run_with(
        engine: &Reverse,
        input: &[u8],
        options: &Options,
    ) -> (String, Vec<(usize, String)>, Summary) {
        let mut out = Vec::new();
        let mut failures = Vec::new();
        let summary = translate(
            engine,
            input,
            &mut out,
            options,
            |n, r| failures.push((n, r.to_string())),
            |_, _| {},
        )
        .unwrap();
        (String::from_utf8(out).unwrap(), failures, summary)
    }

    fn text(window: usize, budget: usize) -> Options {
        Options {
            window,
            max_batch_tokens: budget,
            format: Format::Text,
            n_best: 1,
            alignments: false,
        }
    }

    #[test]
    fn one_line_out_per_line_in_in_order_whatever_fails() {
        let mut input = b"abc\n\nxyz too long\nfail here\n   \r\nhello\n".to_vec();
        input.extend_from_slice(&[0xff, 0xfe, b'\n']);
        input.extend_from_slice(b"last");
        for (window, budget) in [(1, 1), (2, 8), (3, 100), (100, 4), (100, 1000)] {
            let (out, failures, summary) = run(&input, &text(window, budget));
            assert_eq!(
                out, "cba\n\n\n\n   \nolleh\n\ntsal\n",
                "window {window}, budget {budget}"
            );
            let lines: Vec<usize> = failures.iter().map(|f| f.0).collect();
            assert_eq!(lines, vec![3, 4, 7], "{failures:?}");
            assert!(failures[0].1.contains("too long"));
            assert!(failures[1].1.contains("ran past"));
            assert!(failures[2].1.contains("UTF-8"));
            assert_eq!((summary.lines, summary.failed), (8, 3));
        }
    }

    /// However many short lines the token budget would take, a batch holds at most
    /// MAX_BATCH_ROWS decoder rows (lines × beams), and every line still comes back in order.
    #[test]
    fn batches_hold_at_most_max_batch_rows_rows() {
        let lines: Vec<String> = (0..1000).map(|i| format!("{i}")).collect();
        let input = lines.join("\n");
        let want: String = lines
            .iter()
            .map(|l| format!("{}\n", l.chars().rev().collect::<String>()))
            .collect();
        for beams in [1, 4, 300] {
            let engine = Reverse {
                beams,
                ..Reverse::default()
            };
            let (out, failures, _) = run_with(&engine, input.as_bytes(), &text(1000, 1 << 30));
            assert_eq!(out, want, "beams {beams}");
            assert!(failures.is_empty());
            let largest = engine.largest_batch.get();
            assert_eq!(largest, (MAX_BATCH_ROWS / beams).max(1), "beams {beams}");
        }
    }

    #[test]
    fn long_lines_are_refused_without_being_kept() {
        let mut input = vec![b'a'; MAX_LINE_BYTES + 10];
        input.extend_from_slice(b"\nok\n");
        let (out, failures, _) = run(&input, &text(4, 100));
        assert_eq!(out, "\nko\n");
        assert_eq!(failures.len(), 1);
        assert!(failures[0].1.contains("longer than"), "{failures:?}");
    }

    #[test]
    fn jsonl_passes_fields_through_and_reports_errors_in_place() {
        let input = br#"{"id": 7, "text": "abc", "lang": "en"}
{"id": "x", "text": "fail"}
[1, 2]
{"id": 9}
{"id": 10, "text": ""}
"#;
        let options = Options {
            format: Format::Jsonl,
            alignments: true,
            ..text(10, 100)
        };
        let (out, failures, summary) = run(input, &options);
        let lines: Vec<Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 5);
        assert_eq!(lines[0]["id"], 7);
        assert_eq!(lines[0]["translation"], "cba");
        assert_eq!(lines[0]["lang"], "en");
        assert_eq!(lines[0]["score"], -1.0);
        assert!(lines[0].get("text").is_none());
        let alignment: Vec<(String, String, u64)> = lines[0]["alignments"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| {
                (
                    a["target"].as_str().unwrap().to_string(),
                    a["source"].as_str().unwrap().to_string(),
                    a["source_index"].as_u64().unwrap(),
                )
            })
            .collect();
        let pair = |t: &str, s: &str, i| (t.to_string(), s.to_string(), i);
        assert_eq!(
            alignment,
            vec![pair("c", "c", 2), pair("b", "b", 1), pair("a", "a", 0)]
        );
        assert_eq!(lines[1]["id"], "x");
        assert!(lines[1]["error"].as_str().unwrap().contains("ran past"));
        assert!(lines[2]["error"].as_str().unwrap().contains("object"));
        assert_eq!(lines[3]["id"], 9);
        assert!(lines[3]["error"].as_str().unwrap().contains("\"text\""));
        assert_eq!(lines[4]["translation"], "");
        assert_eq!((summary.failed, failures.len()), (3, 3));
    }
}
