//! The bulk path of `attn translate --model DIR`: lines in (arguments, standard input or
//! `--input FILE`), one line out per line in (standard output or `--output FILE`), in input
//! order, streaming. A reader and writer around the library's
//! [`Translator::translate_each`], which batches (sorted by length, within the token budget and
//! row cap, finished rows dropped, repeats generated once).
//!
//! * **Reading** is bounded: a window of at most `window` lines (and [`WINDOW_BYTES`]) is read
//!   ahead and handed to the translator at once; a line longer than [`MAX_LINE_BYTES`] is
//!   refused without being kept; a line that is not UTF-8 is an error for that line only.
//! * **Writing** follows the input order: as results arrive, the lines whose results are all
//!   known are written, so the first lines come out long before the input ends.
//! * **Failures stay with their line**: a text the model cannot take, or whose generation
//!   fails, gets an empty line (plain text) or an object with `"error"` (JSONL) and its reason
//!   on standard error; the other lines are not touched.

use anyhow::Context;
use candle_attention::{TranslateError, TranslateOptions, Translation, Translator};
use serde_json::{Map, Value};
use std::io::{BufRead, Write};
use std::ops::ControlFlow;

/// The longest input line taken, in bytes; a longer one is an error for that line (it is
/// skipped, not kept in memory).
pub const MAX_LINE_BYTES: usize = 1 << 20;

/// The most bytes of text a window holds (with at most `window` lines).
pub const WINDOW_BYTES: usize = 16 << 20;

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
    /// Plain text or JSONL.
    pub format: Format,
    /// What to generate: beam, length, n-best (JSONL `"n_best"`), alignments (JSONL
    /// `"alignments"`).
    pub translate: TranslateOptions,
    /// The languages (source, target) for a multilingual model; `None`: the model's own pair.
    pub pair: Option<(String, String)>,
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

/// One output line, once known: the translation, or why there is none.
type Outcome = Result<Translation, String>;

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
            Ok(translation) => translation.text.clone(),
            Err(_) => String::new(),
        },
        Format::Jsonl => {
            let mut map = item.fields.clone().unwrap_or_default();
            map.remove("text");
            match outcome {
                Ok(t) => {
                    if let Some(alignment) = &t.alignments {
                        let list = alignment
                            .iter()
                            .map(|a| {
                                serde_json::json!({
                                    "target": a.target,
                                    "source": a.source,
                                    "source_index": a.source_index,
                                })
                            })
                            .collect();
                        map.insert("alignments".into(), Value::Array(list));
                    }
                    map.insert("translation".into(), Value::String(t.text.clone()));
                    map.insert("score".into(), score(t.score));
                    map.insert("log_prob".into(), score(t.log_prob));
                    if !t.alternatives.is_empty() {
                        let list = t
                            .alternatives
                            .iter()
                            .map(|h| {
                                serde_json::json!({
                                    "translation": h.text,
                                    "score": score(h.score),
                                    "log_prob": score(h.log_prob),
                                })
                            })
                            .collect();
                        map.insert("n_best".into(), Value::Array(list));
                    }
                }
                Err(reason) => {
                    map.insert("error".into(), Value::String(reason.clone()));
                }
            }
            Value::Object(map).to_string()
        }
    }
}

/// A score as JSON: a number, or `null` for a non-finite one (JSON has no infinities).
fn score(x: f32) -> Value {
    serde_json::Number::from_f64(x as f64).map_or(Value::Null, Value::Number)
}

/// Translates every line of `input` with `translator`, writing one line per input line to
/// `output` in input order; `on_failure` sees each failure (line number from 1, reason) and
/// `on_progress` is told about progress (`bytes` read so far) as lines are written.
pub fn translate(
    translator: &Translator,
    mut input: impl BufRead,
    mut output: impl Write + Send,
    options: &Options,
    mut on_failure: impl FnMut(usize, &str) + Send,
    mut on_progress: impl FnMut(&Summary, u64) + Send,
) -> anyhow::Result<Summary> {
    let mut summary = Summary::default();
    let mut buf = Vec::new();
    let mut bytes_read = 0u64;
    let mut eof = false;
    let pair = options.pair.as_ref().map(|(s, t)| (s.as_str(), t.as_str()));
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
        // Lines that parsed go to the translator; the others have their outcome already.
        let mut outcomes: Vec<Option<Outcome>> = (0..items.len()).map(|_| None).collect();
        let mut texts: Vec<&str> = Vec::new();
        let mut line_of: Vec<usize> = Vec::new();
        for (i, item) in items.iter().enumerate() {
            match &item.text {
                Ok(text) => {
                    texts.push(text);
                    line_of.push(i);
                }
                Err(reason) => outcomes[i] = Some(Err(reason.clone())),
            }
        }
        let mut written = 0;
        let mut write_error = None;
        // Writes the lines whose results are all known, in order.
        let mut write_ready = |outcomes: &[Option<Outcome>],
                               summary: &mut Summary,
                               written: &mut usize|
         -> std::io::Result<()> {
            while *written < items.len() {
                let Some(outcome) = &outcomes[*written] else {
                    break;
                };
                match outcome {
                    Ok(t) => {
                        summary.source_tokens += t.source_tokens;
                        summary.generated_tokens += t.generated_tokens;
                    }
                    Err(reason) => {
                        summary.failed += 1;
                        on_failure(first + *written + 1, reason);
                    }
                }
                writeln!(output, "{}", render(&items[*written], outcome, options))?;
                *written += 1;
            }
            output.flush()?;
            on_progress(summary, bytes_read);
            Ok(())
        };
        let done = translator.translate_each(
            &texts,
            pair,
            &options.translate,
            |k, result: Result<Translation, TranslateError>| {
                outcomes[line_of[k]] = Some(result.map_err(|e| e.to_string()));
                match write_ready(&outcomes, &mut summary, &mut written) {
                    Ok(()) => ControlFlow::Continue(()),
                    Err(e) => {
                        write_error = Some(e);
                        ControlFlow::Break(())
                    }
                }
            },
        );
        if let Some(e) = write_error {
            return Err(e).context("writing the output");
        }
        done?;
        // Lines with nothing to translate (every line failed to parse, or none were left).
        write_ready(&outcomes, &mut summary, &mut written).context("writing the output")?;
        if written < items.len() {
            anyhow::bail!(
                "internal: line {} of the window got no result",
                first + written + 1
            )
        }
    }
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The small English → German MarianMT fixture of the repository.
    fn translator() -> Translator {
        Translator::from_dir(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/marian_e2e"
        ))
        .unwrap()
    }

    fn run(
        t: &Translator,
        input: &[u8],
        options: &Options,
    ) -> (String, Vec<(usize, String)>, Summary) {
        let mut out = Vec::new();
        let mut failures = Vec::new();
        let summary = translate(
            t,
            input,
            &mut out,
            options,
            |n, r| failures.push((n, r.to_string())),
            |_, _| {},
        )
        .unwrap();
        (String::from_utf8(out).unwrap(), failures, summary)
    }

    fn text(window: usize) -> Options {
        Options {
            window,
            format: Format::Text,
            translate: TranslateOptions::default(),
            pair: None,
        }
    }

    /// What the translator gives for `text` alone.
    fn alone(t: &Translator, text: &str) -> String {
        t.translate(&[text], &TranslateOptions::default()).unwrap()[0]
            .as_ref()
            .unwrap()
            .text
            .clone()
    }

    #[test]
    fn one_line_out_per_line_in_in_order_whatever_fails() {
        let t = translator();
        let long = "nine hundred ninety-nine ".repeat(200);
        let mut input =
            format!("Is it forty-two?\n\n{long}\nStreet seven, please.\r\n").into_bytes();
        input.extend_from_slice(&[0xff, 0xfe, b'\n']);
        input.extend_from_slice(b"nine hundred ninety-nine");
        let want = format!(
            "{}\n{}\n\n{}\n\n{}\n",
            alone(&t, "Is it forty-two?"),
            alone(&t, ""),
            alone(&t, "Street seven, please."),
            alone(&t, "nine hundred ninety-nine")
        );
        for window in [1, 2, 3, 100] {
            let (out, failures, summary) = run(&t, &input, &text(window));
            assert_eq!(out, want, "window {window}");
            let lines: Vec<usize> = failures.iter().map(|f| f.0).collect();
            assert_eq!(lines, vec![3, 5], "{failures:?}");
            assert!(failures[0].1.contains("max_position_embeddings"));
            assert!(failures[1].1.contains("UTF-8"));
            assert_eq!((summary.lines, summary.failed), (6, 2));
        }
    }

    #[test]
    fn long_lines_are_refused_without_being_kept() {
        let t = translator();
        let mut input = vec![b'a'; MAX_LINE_BYTES + 10];
        input.extend_from_slice(b"\nIs it forty-two?\n");
        let (out, failures, _) = run(&t, &input, &text(4));
        assert_eq!(out, format!("\n{}\n", alone(&t, "Is it forty-two?")));
        assert_eq!(failures.len(), 1);
        assert!(failures[0].1.contains("longer than"), "{failures:?}");
    }

    #[test]
    fn jsonl_passes_fields_through_and_reports_errors_in_place() {
        let t = translator();
        let input = br#"{"id": 7, "text": "Is it forty-two?", "lang": "en"}
[1, 2]
{"id": 9}
{"id": 10, "text": ""}
"#;
        let options = Options {
            format: Format::Jsonl,
            translate: TranslateOptions {
                alignments: true,
                n_best: 2,
                ..TranslateOptions::beam(2)
            },
            ..text(10)
        };
        let (out, failures, summary) = run(&t, input, &options);
        let lines: Vec<Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 4);
        assert_eq!(lines[0]["id"], 7);
        assert_eq!(lines[0]["lang"], "en");
        assert!(lines[0].get("text").is_none());
        assert_eq!(lines[0]["n_best"].as_array().unwrap().len(), 2);
        assert_eq!(
            lines[0]["n_best"][0]["translation"],
            lines[0]["translation"]
        );
        assert!(!lines[0]["alignments"].as_array().unwrap().is_empty());
        assert!(lines[1]["error"].as_str().unwrap().contains("object"));
        assert_eq!(lines[2]["id"], 9);
        assert!(lines[2]["error"].as_str().unwrap().contains("\"text\""));
        assert!(lines[3]["translation"].is_string());
        assert_eq!((summary.failed, failures.len()), (2, 2));
    }
}
