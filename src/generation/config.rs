//! [`GenerationConfig`]: the generation fields of a Hugging Face model directory, loaded and
//! merged the way `transformers` 5.24 does, and resolved into the numbers the searches use.

use serde::{Deserialize, Deserializer};
use std::collections::BTreeMap;
use std::path::Path;

/// When beam search stops extending a batch item (`early_stopping` in `transformers`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EarlyStopping {
    /// `true`: stop as soon as `num_beams` finished hypotheses exist.
    True,
    /// `false` (the default): stop when the best running beam, scored at its current length,
    /// cannot beat the worst finished hypothesis.
    #[default]
    False,
    /// `"never"`: like `false`, but with a positive length penalty the running beam is scored
    /// at `max_length` (the canonical beam search stopping rule).
    Never,
}

impl<'de> Deserialize<'de> for EarlyStopping {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        match serde_json::Value::deserialize(d)? {
            serde_json::Value::Bool(true) => Ok(Self::True),
            serde_json::Value::Bool(false) => Ok(Self::False),
            serde_json::Value::String(s) if s == "never" => Ok(Self::Never),
            other => Err(serde::de::Error::custom(format!(
                "early_stopping must be true, false or \"never\", got {other}"
            ))),
        }
    }
}

/// `eos_token_id` / `forced_eos_token_id`: an id or a list of ids (or `null`).
fn one_or_many<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<Option<Vec<u32>>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(u32),
        Many(Vec<u32>),
    }
    Ok(match Option::<OneOrMany>::deserialize(d)? {
        None => None,
        Some(OneOrMany::One(id)) => Some(vec![id]),
        Some(OneOrMany::Many(ids)) => Some(ids),
    })
}

/// Generation settings with `transformers`' names and meaning (`GenerationConfig` of
/// `transformers` 5.24). `None` means "not set": the default of `transformers` applies when the
/// search starts (`max_length` 20 new tokens capped by `max_position_embeddings`, `num_beams`
/// 1, `length_penalty` 1.0, `early_stopping` false, no `min_length`, ...).
///
/// Supported: greedy search and beam search (`num_beams > 1`), `min_length`,
/// `min_new_tokens`, `max_length`, `max_new_tokens`, `bad_words_ids` (single- and multi-token),
/// `no_repeat_ngram_size`, `forced_bos_token_id`, `forced_eos_token_id`, `renormalize_logits`,
/// `length_penalty`, `early_stopping`, `num_return_sequences` (beam search). Settings that
/// select something else (`do_sample: true`, `repetition_penalty != 1`, `num_beam_groups > 1`,
/// `suppress_tokens`, ...) are rejected with an error naming them when the search starts,
/// never silently ignored.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct GenerationConfig {
    /// First token of every decoder sequence (falls back to `bos_token_id` when unset).
    pub decoder_start_token_id: Option<u32>,
    /// Beginning-of-sequence id (only used when `decoder_start_token_id` is unset).
    pub bos_token_id: Option<u32>,
    /// End-of-sequence id(s); `null`, an id, or a list.
    #[serde(default, deserialize_with = "one_or_many")]
    pub eos_token_id: Option<Vec<u32>>,
    /// Padding id of the output (falls back to the first EOS id when unset).
    pub pad_token_id: Option<u32>,
    /// Token forced as the first generated token.
    pub forced_bos_token_id: Option<u32>,
    /// Token(s) forced when the sequence reaches `max_length - 1` tokens (the last step).
    #[serde(default, deserialize_with = "one_or_many")]
    pub forced_eos_token_id: Option<Vec<u32>>,
    /// Most tokens of an output sequence, the decoder start token included.
    pub max_length: Option<usize>,
    /// Most generated tokens (wins over `max_length`: `max_length = max_new_tokens + 1`).
    pub max_new_tokens: Option<usize>,
    /// EOS is forbidden while the sequence (decoder start token included) is shorter.
    pub min_length: Option<usize>,
    /// EOS is forbidden before this many generated tokens (wins over `min_length`).
    pub min_new_tokens: Option<usize>,
    /// Beam width; 1 is greedy search.
    pub num_beams: Option<usize>,
    /// Exponent `p` of the beam score `sum log p / generated_len^p`.
    pub length_penalty: Option<f64>,
    /// Beam search stopping rule.
    pub early_stopping: Option<EarlyStopping>,
    /// Token sequences that may never be generated (each list is one banned sequence).
    pub bad_words_ids: Option<Vec<Vec<u32>>>,
    /// Re-apply `log_softmax` after the other processors.
    pub renormalize_logits: Option<bool>,
    /// Hypotheses returned per batch item (beam search: at most `num_beams`; greedy: 1).
    pub num_return_sequences: Option<usize>,
    /// Sampling; not supported (`true` is an error).
    pub do_sample: Option<bool>,
    /// Forbid repeating any n-gram of this size (0: off).
    pub no_repeat_ngram_size: Option<usize>,
    /// Repetition penalty; not supported (anything but 1.0 is an error).
    pub repetition_penalty: Option<f64>,
    /// The model's `max_position_embeddings` (from `config.json`, not a generation field):
    /// caps the default `max_length`.
    #[serde(skip)]
    pub max_position_embeddings: Option<usize>,
    /// Every other key of the file (model settings, and generation settings this crate does
    /// not implement: those are checked, and rejected when set, when the search starts).
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// Generation keys `transformers` acts on that this crate does not implement, with the value(s)
/// meaning "off" (`null` is always "off").
const UNSUPPORTED: &[(&str, &[&str])] = &[
    ("num_beam_groups", &["1"]),
    ("diversity_penalty", &["0.0", "0"]),
    ("encoder_repetition_penalty", &["1.0", "1"]),
    ("encoder_no_repeat_ngram_size", &["0"]),
    ("suppress_tokens", &[]),
    ("begin_suppress_tokens", &[]),
    ("sequence_bias", &[]),
    ("exponential_decay_length_penalty", &[]),
    ("remove_invalid_values", &["false"]),
    ("guidance_scale", &["1.0", "1"]),
    ("constraints", &[]),
    ("force_words_ids", &[]),
    ("penalty_alpha", &[]),
    ("max_time", &[]),
    ("stop_strings", &[]),
    ("low_memory", &["false"]),
    ("token_healing", &["false"]),
    ("watermarking_config", &[]),
    ("dola_layers", &[]),
];

/// The settings a search runs with, after `transformers`' defaults and precedence rules.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Resolved {
    pub start: u32,
    /// Empty when no EOS is set (then sequences only stop at `max_length`).
    pub eos: Vec<u32>,
    /// What greedy search writes after EOS (`pad_token_id`, else the first EOS id).
    pub pad: Option<u32>,
    /// Most tokens per sequence, the start token included; at least 2.
    pub max_length: usize,
    /// EOS is banned while the sequence (start token included) is shorter.
    pub min_length: usize,
    pub num_beams: usize,
    pub num_return: usize,
    pub length_penalty: f64,
    pub early_stopping: EarlyStopping,
    /// Banned sequences, without the single-token ones that are an EOS id.
    pub bad_words: Vec<Vec<u32>>,
    pub no_repeat_ngram: usize,
    pub forced_bos: Option<u32>,
    pub forced_eos: Option<Vec<u32>>,
    pub renormalize: bool,
}

fn load_json(path: &Path) -> candle::Result<serde_json::Value> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| candle::Error::Msg(format!("cannot read {}: {e}", path.display())))?;
    serde_json::from_str(&text)
        .map_err(|e| candle::Error::Msg(format!("{} is not valid JSON: {e}", path.display())))
}

impl GenerationConfig {
    /// Parses a `generation_config.json` (or the generation fields of a `config.json`); keys
    /// that are not generation settings are ignored.
    pub fn from_json_str(json: &str) -> candle::Result<Self> {
        serde_json::from_str(json)
            .map_err(|e| candle::Error::Msg(format!("invalid generation config: {e}")))
    }

    fn from_value(value: serde_json::Value, path: &Path) -> candle::Result<Self> {
        serde_json::from_value(value).map_err(|e| {
            candle::Error::Msg(format!(
                "{}: invalid generation setting: {e}",
                path.display()
            ))
        })
    }

    /// Loads the generation settings of a model directory as `transformers`'
    /// `from_pretrained` does: `generation_config.json` alone when it exists (nothing of
    /// `config.json` is merged in), otherwise the generation keys written in `config.json`
    /// (only the keys present in the file: the model class defaults, e.g. `MarianConfig`'s
    /// `decoder_start_token_id` 58100, are *not* applied). `max_position_embeddings` is read
    /// from `config.json` (`MarianConfig`'s default 1024 when absent) in both cases.
    pub fn from_model_dir(dir: impl AsRef<Path>) -> candle::Result<Self> {
        let dir = dir.as_ref();
        let config_path = dir.join("config.json");
        let gen_path = dir.join("generation_config.json");
        let model_config = if config_path.is_file() {
            Some(load_json(&config_path)?)
        } else {
            None
        };
        let mut cfg = if gen_path.is_file() {
            Self::from_value(load_json(&gen_path)?, &gen_path)?
        } else {
            match &model_config {
                Some(value) => Self::from_value(value.clone(), &config_path)?,
                None => candle::bail!(
                    "{} has neither generation_config.json nor config.json",
                    dir.display()
                ),
            }
        };
        cfg.max_position_embeddings = match model_config
            .as_ref()
            .and_then(|c| c.get("max_position_embeddings"))
        {
            Some(v) => Some(v.as_u64().map(|n| n as usize).ok_or_else(|| {
                candle::Error::Msg(format!(
                    "{}: max_position_embeddings must be a non-negative integer, got {v}",
                    config_path.display()
                ))
            })?),
            None => Some(1024),
        };
        Ok(cfg)
    }

    /// Per-call override of `num_beams` (like `generate(num_beams=...)`).
    pub fn with_num_beams(mut self, num_beams: usize) -> Self {
        self.num_beams = Some(num_beams);
        self
    }

    /// Per-call override of `max_new_tokens` (wins over any `max_length`).
    pub fn with_max_new_tokens(mut self, max_new_tokens: usize) -> Self {
        self.max_new_tokens = Some(max_new_tokens);
        self
    }

    /// Per-call override of `min_new_tokens` (wins over any `min_length`).
    pub fn with_min_new_tokens(mut self, min_new_tokens: usize) -> Self {
        self.min_new_tokens = Some(min_new_tokens);
        self
    }

    /// Per-call override of `max_length` (ignored when `max_new_tokens` is set, as in
    /// `transformers`).
    pub fn with_max_length(mut self, max_length: usize) -> Self {
        self.max_length = Some(max_length);
        self
    }

    /// Per-call override of `min_length`.
    pub fn with_min_length(mut self, min_length: usize) -> Self {
        self.min_length = Some(min_length);
        self
    }

    /// Per-call override of `length_penalty`.
    pub fn with_length_penalty(mut self, length_penalty: f64) -> Self {
        self.length_penalty = Some(length_penalty);
        self
    }

    /// Per-call override of `early_stopping`.
    pub fn with_early_stopping(mut self, early_stopping: EarlyStopping) -> Self {
        self.early_stopping = Some(early_stopping);
        self
    }

    /// Per-call override of `num_return_sequences`.
    pub fn with_num_return_sequences(mut self, n: usize) -> Self {
        self.num_return_sequences = Some(n);
        self
    }

    /// The token `generate()` pads its output with: greedy search writes `pad_token_id` (the
    /// first EOS id when unset) after EOS; beam search fills with
    /// `pad_token_id or eos_token_id[0]`, a Python truth test, so a `pad_token_id` of **0**
    /// is replaced by the first EOS id. `None` when neither exists (then every sequence has
    /// the same length and no padding is needed).
    pub fn output_pad_token_id(&self) -> Option<u32> {
        let eos0 = self.eos_token_id.as_ref().and_then(|e| e.first().copied());
        let beams = self.num_beams.unwrap_or(1);
        match self.pad_token_id {
            Some(pad) if beams == 1 || pad != 0 => Some(pad),
            _ => eos0,
        }
    }

    fn check_supported(&self) -> candle::Result<()> {
        if self.do_sample == Some(true) {
            candle::bail!(
                "generation config: do_sample=true asks for sampling, which is not supported (only greedy and beam search)"
            )
        }
        if let Some(p) = self.repetition_penalty {
            if p != 1.0 {
                candle::bail!(
                    "generation config: repetition_penalty={p} is not supported (only 1.0, no penalty)"
                )
            }
        }
        for (key, off) in UNSUPPORTED {
            if let Some(value) = self.extra.get(*key) {
                let text = value.to_string();
                if !value.is_null() && !off.contains(&text.as_str()) {
                    candle::bail!("generation config: {key}={text} is not supported")
                }
            }
        }
        Ok(())
    }

    /// What a search with these settings will hold at most, after `transformers`' defaults
    /// and precedence: `(num_beams, max_length)` (`max_length` counts the decoder start
    /// token). Errors as the search would.
    pub fn search_size(&self) -> candle::Result<(usize, usize)> {
        let r = self.resolve()?;
        Ok((r.num_beams, r.max_length))
    }

    /// Applies `transformers`' defaults and precedence (`_prepare_special_tokens`,
    /// `_prepare_generated_length`) for an encoder-decoder model, whose decoder prompt is the
    /// single start token.
    pub(crate) fn resolve(&self) -> candle::Result<Resolved> {
        self.check_supported()?;
        let eos = self.eos_token_id.clone().unwrap_or_default();
        let start = match self.decoder_start_token_id.or(self.bos_token_id) {
            Some(id) => id,
            None => candle::bail!(
                "generation config: decoder_start_token_id or bos_token_id has to be set for encoder-decoder generation"
            ),
        };
        let pad = self.pad_token_id.or(eos.first().copied());
        let max_length = match (self.max_new_tokens, self.max_length) {
            (Some(0), _) => {
                candle::bail!("generation config: max_new_tokens must be greater than 0, got 0")
            }
            (Some(n), _) => n + 1,
            (None, Some(m)) => m,
            // transformers' default: 20 new tokens, capped by the model's positions.
            (None, None) => match self.max_position_embeddings {
                Some(p) => 21.min(p),
                None => 21,
            },
        };
        if max_length <= 1 {
            candle::bail!(
                "generation config: max_length is {max_length}, but the decoder input already has 1 token (the decoder start token); increase max_length or set max_new_tokens"
            )
        }
        let min_length = match self.min_new_tokens {
            Some(n) => n + 1,
            None => self.min_length.unwrap_or(0),
        };
        let num_beams = self.num_beams.unwrap_or(1);
        if num_beams == 0 {
            candle::bail!("generation config: num_beams must be at least 1, got 0")
        }
        let num_return = self.num_return_sequences.unwrap_or(1);
        if num_return == 0 {
            candle::bail!("generation config: num_return_sequences must be at least 1, got 0")
        }
        if num_beams == 1 && num_return > 1 {
            candle::bail!(
                "generation config: greedy search (num_beams=1) cannot return num_return_sequences={num_return} sequences"
            )
        }
        if num_return > num_beams {
            candle::bail!(
                "generation config: num_return_sequences ({num_return}) has to be smaller or equal to num_beams ({num_beams})"
            )
        }
        let length_penalty = self.length_penalty.unwrap_or(1.0);
        if !length_penalty.is_finite() {
            candle::bail!("generation config: length_penalty must be finite, got {length_penalty}")
        }
        let bad_words = match &self.bad_words_ids {
            None => Vec::new(),
            Some(list) => {
                if list.is_empty() || list.iter().any(|w| w.is_empty()) {
                    candle::bail!(
                        "generation config: bad_words_ids has to be a non-empty list of non-empty lists, got {list:?}"
                    )
                }
                // NoBadWordsLogitsProcessor drops the single-token sequences that are an EOS id.
                list.iter()
                    .filter(|w| !(w.len() == 1 && eos.contains(&w[0])))
                    .cloned()
                    .collect()
            }
        };
        if let Some(ids) = &self.forced_eos_token_id {
            if ids.is_empty() {
                candle::bail!("generation config: forced_eos_token_id is an empty list")
            }
        }
        Ok(Resolved {
            start,
            eos,
            pad,
            max_length,
            min_length,
            num_beams,
            num_return,
            length_penalty,
            early_stopping: self.early_stopping.unwrap_or_default(),
            bad_words,
            no_repeat_ngram: self.no_repeat_ngram_size.unwrap_or(0),
            forced_bos: self.forced_bos_token_id,
            forced_eos: self.forced_eos_token_id.clone(),
            renormalize: self.renormalize_logits.unwrap_or(false),
        })
    }
}

impl Resolved {
    /// Checks every configured token id against the model's vocabulary (at the first step,
    /// when the vocabulary size is known), as `transformers` fails on them.
    pub fn check_vocab(&self, vocab: usize) -> candle::Result<()> {
        let mut named: Vec<(&str, u32)> = vec![("decoder_start_token_id", self.start)];
        named.extend(self.forced_bos.map(|id| ("forced_bos_token_id", id)));
        for &id in self.forced_eos.iter().flatten() {
            named.push(("forced_eos_token_id", id));
        }
        for &id in self.bad_words.iter().flatten() {
            named.push(("bad_words_ids", id));
        }
        for (name, id) in named {
            if id as usize >= vocab {
                candle::bail!(
                    "generation config: {name} {id} is outside the model's vocabulary of {vocab} tokens"
                )
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn marian() -> GenerationConfig {
        GenerationConfig::from_json_str(
            r#"{"decoder_start_token_id": 58100, "eos_token_id": 0, "pad_token_id": 58100,
                "forced_eos_token_id": 0, "bad_words_ids": [[58100]], "max_length": 512,
                "num_beams": 4, "renormalize_logits": true, "vocab_size": 58101,
                "architectures": ["MarianMTModel"], "transformers_version": "4.27.0.dev0"}"#,
        )
        .unwrap()
    }

    #[test]
    fn parses_a_hub_generation_config() {
        let cfg = marian();
        assert_eq!(cfg.eos_token_id, Some(vec![0]));
        assert_eq!(cfg.forced_eos_token_id, Some(vec![0]));
        let r = cfg.resolve().unwrap();
        assert_eq!(
            (r.start, r.pad, r.max_length, r.num_beams),
            (58100, Some(58100), 512, 4)
        );
        // The bad word [[58100]] is not an EOS id, so it stays.
        assert_eq!(r.bad_words, vec![vec![58100]]);
        assert!(r.renormalize);
        assert_eq!(r.early_stopping, EarlyStopping::False);
    }

    #[test]
    fn eos_lists_and_early_stopping_values_parse() {
        let cfg = GenerationConfig::from_json_str(
            r#"{"eos_token_id": [0, 7], "early_stopping": "never", "forced_eos_token_id": null}"#,
        )
        .unwrap();
        assert_eq!(cfg.eos_token_id, Some(vec![0, 7]));
        assert_eq!(cfg.early_stopping, Some(EarlyStopping::Never));
        assert_eq!(cfg.forced_eos_token_id, None);
        let err = GenerationConfig::from_json_str(r#"{"early_stopping": "sometimes"}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("early_stopping"), "{err}");
    }

    #[test]
    fn length_precedence_follows_transformers() {
        let base = GenerationConfig {
            decoder_start_token_id: Some(5),
            eos_token_id: Some(vec![0]),
            ..Default::default()
        };
        // Default: 20 new tokens, i.e. max_length 21 with the start token ...
        assert_eq!(base.resolve().unwrap().max_length, 21);
        // ... capped by the model's positions.
        let capped = GenerationConfig {
            max_position_embeddings: Some(7),
            ..base.clone()
        };
        assert_eq!(capped.resolve().unwrap().max_length, 7);
        // An explicit max_length is not capped and counts the start token.
        assert_eq!(
            capped
                .clone()
                .with_max_length(30)
                .resolve()
                .unwrap()
                .max_length,
            30
        );
        // max_new_tokens wins over max_length, whichever was set last.
        let both = base.clone().with_max_new_tokens(4).with_max_length(30);
        assert_eq!(both.resolve().unwrap().max_length, 5);
        // min_new_tokens wins over min_length and counts the start token too.
        let min = base.clone().with_min_length(9).with_min_new_tokens(3);
        assert_eq!(min.resolve().unwrap().min_length, 4);
        assert_eq!(
            base.clone()
                .with_min_length(9)
                .resolve()
                .unwrap()
                .min_length,
            9
        );
        // pad falls back to the first EOS id.
        assert_eq!(base.resolve().unwrap().pad, Some(0));
    }

    #[test]
    fn bad_settings_are_named() {
        let base = marian();
        let cases: Vec<(GenerationConfig, &str)> = vec![
            (base.clone().with_max_new_tokens(0), "max_new_tokens"),
            (base.clone().with_max_length(1), "max_length"),
            (base.clone().with_num_beams(0), "num_beams"),
            (
                base.clone().with_num_return_sequences(5),
                "num_return_sequences",
            ),
            (
                base.clone().with_num_beams(1).with_num_return_sequences(2),
                "greedy",
            ),
            (
                GenerationConfig::from_json_str(
                    r#"{"decoder_start_token_id": 1, "do_sample": true}"#,
                )
                .unwrap(),
                "sampling",
            ),
            (
                GenerationConfig::from_json_str(
                    r#"{"decoder_start_token_id": 1, "repetition_penalty": 1.2}"#,
                )
                .unwrap(),
                "repetition_penalty",
            ),
            (
                GenerationConfig::from_json_str(
                    r#"{"decoder_start_token_id": 1, "num_beam_groups": 2}"#,
                )
                .unwrap(),
                "num_beam_groups",
            ),
            (
                GenerationConfig::from_json_str(
                    r#"{"decoder_start_token_id": 1, "suppress_tokens": [3]}"#,
                )
                .unwrap(),
                "suppress_tokens",
            ),
            (GenerationConfig::default(), "decoder_start_token_id"),
        ];
        for (cfg, needle) in cases {
            let err = cfg.resolve().unwrap_err().to_string();
            assert!(err.contains(needle), "expected {needle:?} in {err:?}");
        }
        // The "off" values of unsupported settings are accepted.
        GenerationConfig::from_json_str(
            r#"{"decoder_start_token_id": 1, "num_beam_groups": 1, "diversity_penalty": 0.0,
                "repetition_penalty": 1.0, "do_sample": false, "suppress_tokens": null}"#,
        )
        .unwrap()
        .resolve()
        .unwrap();
    }

    #[test]
    fn bad_words_that_are_eos_are_dropped() {
        let cfg = GenerationConfig::from_json_str(
            r#"{"decoder_start_token_id": 1, "eos_token_id": [0, 7],
                "bad_words_ids": [[0], [7], [3], [0, 4]]}"#,
        )
        .unwrap();
        assert_eq!(cfg.resolve().unwrap().bad_words, vec![vec![3], vec![0, 4]]);
    }

    #[test]
    fn output_pad_token_follows_generate() {
        let mut cfg = GenerationConfig::from_json_str(
            r#"{"decoder_start_token_id": 2, "eos_token_id": 1, "pad_token_id": 0}"#,
        )
        .unwrap();
        assert_eq!(cfg.output_pad_token_id(), Some(0));
        cfg = cfg.with_num_beams(4);
        // `pad_token_id or eos_token_id[0]`: 0 is falsy in Python.
        assert_eq!(cfg.output_pad_token_id(), Some(1));
        cfg.pad_token_id = None;
        assert_eq!(cfg.output_pad_token_id(), Some(1));
        cfg.eos_token_id = None;
        assert_eq!(cfg.output_pad_token_id(), None);
    }

    fn write(dir: &Path, name: &str, text: &str) {
        std::fs::write(dir.join(name), text).unwrap();
    }

    #[test]
    fn model_dir_prefers_generation_config_json_without_merging() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "config.json",
            r#"{"model_type": "marian", "decoder_start_token_id": 19, "pad_token_id": 19,
                "eos_token_id": 0, "num_beams": 4, "max_length": 30, "max_position_embeddings": 64}"#,
        );
        let cfg = GenerationConfig::from_model_dir(dir.path()).unwrap();
        assert_eq!((cfg.num_beams, cfg.max_length), (Some(4), Some(30)));
        assert_eq!(cfg.max_position_embeddings, Some(64));

        write(
            dir.path(),
            "generation_config.json",
            r#"{"decoder_start_token_id": 19, "eos_token_id": 0, "max_length": 12}"#,
        );
        let cfg = GenerationConfig::from_model_dir(dir.path()).unwrap();
        // Only generation_config.json counts: num_beams and pad_token_id of config.json are gone.
        assert_eq!(
            (cfg.num_beams, cfg.max_length, cfg.pad_token_id),
            (None, Some(12), None)
        );
        assert_eq!(cfg.max_position_embeddings, Some(64));
        assert_eq!(cfg.resolve().unwrap().pad, Some(0));
    }

    #[test]
    fn model_dir_does_not_apply_marian_defaults() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "config.json",
            r#"{"model_type": "marian", "pad_token_id": 19}"#,
        );
        let cfg = GenerationConfig::from_model_dir(dir.path()).unwrap();
        assert_eq!(cfg.decoder_start_token_id, None);
        assert_eq!(cfg.max_position_embeddings, Some(1024));
        let err = cfg.resolve().unwrap_err().to_string();
        assert!(err.contains("decoder_start_token_id"), "{err}");

        let empty = tempfile::tempdir().unwrap();
        let err = GenerationConfig::from_model_dir(empty.path())
            .unwrap_err()
            .to_string();
        assert!(err.contains("config.json"), "{err}");
        write(empty.path(), "config.json", "{not json");
        let err = GenerationConfig::from_model_dir(empty.path())
            .unwrap_err()
            .to_string();
        assert!(err.contains("not valid JSON"), "{err}");
    }
}
