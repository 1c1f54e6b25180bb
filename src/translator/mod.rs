//! One [`Translator`] for every supported family — MarianMT (opus-mt), NLLB-200, M2M100 and
//! mBART-50 — text in, text out, exactly as transformers' `tokenizer` → `generate()` →
//! `batch_decode` does it, token for token.
//!
//! ```no_run
//! use candle_attention::{TranslateOptions, Translator};
//! # fn main() -> candle::Result<()> {
//! let translator = Translator::from_dir("opus-mt-en-de")?; // the family from config.json
//! for result in translator.translate(&["How are you?", "Fine."], &TranslateOptions::default())? {
//!     println!("{}", result?.text);
//! }
//! # Ok(()) }
//! ```
//!
//! * **Languages per call**: a multilingual model translates any pair of its languages
//!   ([`Translator::translate_pair`]), named as the family spells them (`eng_Latn`, `en_XX`,
//!   `en`) or by ISO 639-1 (`en`); a MarianMT directory translates its own pair (from its
//!   `tokenizer_config.json`), and a multi-target one (`>>fra<<` tokens) into each target.
//! * **Continuous batching**: the texts of a call are encoded, sorted by length and decoded
//!   in cohorts within a token budget and a row cap ([`Continuous`]); finished rows leave the
//!   running batch at once and waiting texts take their place; texts that encode alike are
//!   generated once. Outputs do not depend on the batching (rows of a padded batch are
//!   independent).
//! * **One result per text**, typed: a text the model cannot take is an
//!   [`ErrorKind::Input`] error for that text only; a generation failure an
//!   [`ErrorKind::Model`] one.
//! * **Shared**: a `Translator` is `Send + Sync`; one loaded model serves many threads.

mod continuous;
mod core;
mod error;
mod languages;
mod types;

use continuous::Admission;
pub use continuous::Continuous;
pub use core::{DEFAULT_MAX_BATCH_TOKENS, MAX_BATCH_ROWS};
pub use error::{ErrorKind, TranslateError};
pub use languages::Language;
pub use types::{AlignedToken, Alternative, TranslateOptions, Translation};

use crate::explain::AttentionMap;
use crate::generation::GenerationConfig;
use crate::models::encoder_decoder::EncoderDecoderModel;
use crate::models::seq2seq::Family;
use crate::models::translation::attention_map;
use crate::weights::Precision;
use candle::Device;
use core::{Core, Model};
use std::collections::HashMap;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

/// A loaded translation model of any supported family, with its tokenizer and generation
/// settings (`generation_config.json`, with the builder's overrides).
#[derive(Debug)]
pub struct Translator {
    core: Core,
}

/// Settings for [`Translator::builder`]: where the model is, in what precision on which device,
/// and the defaults every call starts from.
#[derive(Clone, Debug)]
pub struct TranslatorBuilder {
    model: PathBuf,
    precision: Precision,
    device: Device,
    beam: Option<usize>,
    max_new_tokens: Option<usize>,
    max_batch_tokens: usize,
    max_batch_rows: usize,
}

impl TranslatorBuilder {
    /// The precision: [`Precision::F32`] (default, exact), [`Precision::BF16`],
    /// [`Precision::F16`] or [`Precision::INT8`] (weights quantized at load).
    pub fn precision(mut self, precision: Precision) -> Self {
        self.precision = precision;
        self
    }

    /// Where to compute (default: the CPU).
    pub fn device(mut self, device: Device) -> Self {
        self.device = device;
        self
    }

    /// The default beam width (1 = greedy); otherwise `generation_config.json`'s.
    pub fn beam(mut self, beam: usize) -> Self {
        self.beam = Some(beam);
        self
    }

    /// The default most new tokens per text; otherwise the directory's.
    pub fn max_new_tokens(mut self, max_new_tokens: usize) -> Self {
        self.max_new_tokens = Some(max_new_tokens);
        self
    }

    /// The most padded source tokens (texts × longest text, per cohort) of the texts decoding
    /// at once, all cohorts of the running batch together (default
    /// [`DEFAULT_MAX_BATCH_TOKENS`]). Memory follows it: each running text holds its encoder
    /// output and its keys and values, and its decoder caches grow with its translation,
    /// about as long. A text longer than the budget still decodes, alone.
    pub fn max_batch_tokens(mut self, max_batch_tokens: usize) -> Self {
        self.max_batch_tokens = max_batch_tokens;
        self
    }

    /// The most decoder rows (texts × beams) decoding at once (default [`MAX_BATCH_ROWS`]).
    /// Working memory grows with it (each row holds its attention caches and a step's
    /// log-probabilities over the vocabulary); fewer rows mean smaller matrix products.
    pub fn max_batch_rows(mut self, max_batch_rows: usize) -> Self {
        self.max_batch_rows = max_batch_rows;
        self
    }

    /// Loads the model: a directory, or (feature `hub`) a hub id `ORG/NAME[@REVISION]`
    /// resolved through the Hugging Face cache.
    pub fn build(self) -> candle::Result<Translator> {
        if self.max_batch_tokens == 0 {
            candle::bail!("max_batch_tokens must be at least 1")
        }
        if self.max_batch_rows == 0 {
            candle::bail!("max_batch_rows must be at least 1")
        }
        if self.beam == Some(0) {
            candle::bail!("the beam width must be at least 1")
        }
        if self.max_new_tokens == Some(0) {
            candle::bail!("max_new_tokens must be at least 1")
        }
        let dir = locate(&self.model)?;
        let mut core = Core::load(&dir, self.precision, &self.device)?;
        core.max_batch_tokens = self.max_batch_tokens;
        core.max_batch_rows = self.max_batch_rows;
        if let Some(beam) = self.beam {
            core.generation = core.generation.clone().with_num_beams(beam);
        }
        if let Some(n) = self.max_new_tokens {
            core.generation = core.generation.clone().with_max_new_tokens(n);
        }
        core.check_limits(&core.generation)?;
        Ok(Translator { core })
    }
}

/// `model` as a directory: an existing path, else (feature `hub`) a hub id.
fn locate(model: &Path) -> candle::Result<PathBuf> {
    #[cfg(feature = "hub")]
    if let Some(arg) = model.to_str() {
        return crate::hub::resolve_path_or_id(arg);
    }
    if model.exists() {
        return Ok(model.to_path_buf());
    }
    candle::bail!(
        "{} is not a directory (hub ids like ORG/NAME need the crate's `hub` feature)",
        model.display()
    )
}

impl Translator {
    /// Loads a model directory as the hub has it, on the CPU in f32: MarianMT (`source.spm`,
    /// `target.spm`, `vocab.json`), NLLB-200, M2M100 or mBART-50 (their tokenizer files); the
    /// family from `config.json`'s `model_type`, the weights from `model.safetensors` or
    /// `pytorch_model.bin`, generation settings from `generation_config.json`.
    pub fn from_dir(dir: impl AsRef<Path>) -> candle::Result<Self> {
        Ok(Self {
            core: Core::load(dir.as_ref(), Precision::default(), &Device::Cpu)?,
        })
    }

    /// Loads a model from the Hugging Face hub by id (`Helsinki-NLP/opus-mt-en-de`,
    /// `ORG/NAME@REVISION`): from the local cache, downloading the files the family needs when
    /// they are missing (never with `HF_HUB_OFFLINE=1`). CPU, f32; see [`Translator::builder`]
    /// for the rest.
    #[cfg(feature = "hub")]
    pub fn from_pretrained(model_id: &str) -> candle::Result<Self> {
        let Some(id) = crate::hub::ModelId::parse(model_id) else {
            candle::bail!("{model_id:?} is not a Hugging Face model id (ORG/NAME[@REVISION])")
        };
        Self::from_dir(crate::hub::resolve(&id)?)
    }

    /// A builder for a directory or (feature `hub`) a hub id: precision, device, default beam
    /// and length, batch budget.
    pub fn builder(model: impl AsRef<Path>) -> TranslatorBuilder {
        TranslatorBuilder {
            model: model.as_ref().to_path_buf(),
            precision: Precision::default(),
            device: Device::Cpu,
            beam: None,
            max_new_tokens: None,
            max_batch_tokens: DEFAULT_MAX_BATCH_TOKENS,
            max_batch_rows: MAX_BATCH_ROWS,
        }
    }

    /// The directory the model was loaded from (a hub id's cache snapshot).
    pub fn dir(&self) -> &Path {
        &self.core.dir
    }

    /// The languages it reads, as the family spells them, with ISO 639-1 codes and names. A
    /// MarianMT directory says its source language in `tokenizer_config.json` (`source_lang`);
    /// one that does not has none listed (and translates with [`Translator::translate`]).
    pub fn source_languages(&self) -> &[Language] {
        &self.core.sources
    }

    /// The languages it writes: every code of a multilingual model; a MarianMT directory's
    /// `target_lang`, or its `>>xx<<` target tokens.
    pub fn target_languages(&self) -> &[Language] {
        &self.core.targets
    }

    /// The generation settings every call starts from.
    pub fn generation_config(&self) -> &GenerationConfig {
        &self.core.generation
    }

    /// The running batch's budget in padded source tokens (see
    /// [`TranslatorBuilder::max_batch_tokens`]).
    pub fn max_batch_tokens(&self) -> usize {
        self.core.max_batch_tokens
    }

    /// The most decoder rows (texts × beams) decoding at once.
    pub fn max_batch_rows(&self) -> usize {
        self.core.max_batch_rows
    }

    /// Translates `texts` with the model's own pair (a MarianMT directory; a multilingual
    /// model needs [`Translator::translate_pair`]): one result per text, in order. The outer
    /// error is the call's (options that cannot run, a model that needs languages named); a
    /// text that cannot be translated gets its own error.
    pub fn translate<S: AsRef<str> + Sync>(
        &self,
        texts: &[S],
        options: &TranslateOptions,
    ) -> Result<Vec<Result<Translation, TranslateError>>, TranslateError> {
        self.collect(texts, None, options)
    }

    /// Translates `texts` from `source` into `target`: codes as the family spells them
    /// (`eng_Latn`, `en_XX`, `en`, `>>fra<<`) or ISO 639-1 (`en`). An unknown language is the
    /// call's error ([`ErrorKind::Input`]), naming the code and close matches.
    pub fn translate_pair<S: AsRef<str> + Sync>(
        &self,
        texts: &[S],
        source: &str,
        target: &str,
        options: &TranslateOptions,
    ) -> Result<Vec<Result<Translation, TranslateError>>, TranslateError> {
        self.collect(texts, Some((source, target)), options)
    }

    fn collect<S: AsRef<str> + Sync>(
        &self,
        texts: &[S],
        pair: Option<(&str, &str)>,
        options: &TranslateOptions,
    ) -> Result<Vec<Result<Translation, TranslateError>>, TranslateError> {
        let mut out: Vec<Option<Result<Translation, TranslateError>>> =
            (0..texts.len()).map(|_| None).collect();
        self.translate_each(texts, pair, options, |i, result| {
            out[i] = Some(result);
            ControlFlow::Continue(())
        })?;
        Ok(out
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| Err(TranslateError::model("internal: text not translated")))
            })
            .collect())
    }

    /// The streaming form of [`Translator::translate_pair`] (`pair` `None`: the model's own, as
    /// [`Translator::translate`]): `on_result(index, result)` gets each text's result as soon
    /// as it is known — failures to encode at once, translations as their batch finishes
    /// (shortest texts first) — and may stop the call with `ControlFlow::Break`. Every text
    /// gets exactly one call unless the call is stopped.
    pub fn translate_each<S: AsRef<str> + Sync>(
        &self,
        texts: &[S],
        pair: Option<(&str, &str)>,
        options: &TranslateOptions,
        mut on_result: impl FnMut(usize, Result<Translation, TranslateError>) -> ControlFlow<()> + Send,
    ) -> Result<(), TranslateError> {
        let request = self.core.request(pair, options)?;
        on_rayon_pool(|| {
            // Encode; failures are known at once, and texts with the same ids share one row.
            let mut todo: Vec<(usize, Vec<u32>)> = Vec::new();
            let mut first_of: HashMap<Vec<u32>, usize> = HashMap::new();
            let mut repeats: HashMap<usize, Vec<usize>> = HashMap::new();
            for (i, text) in texts.iter().enumerate() {
                match self.core.encode(&request, text.as_ref()) {
                    Ok(ids) => match first_of.get(&ids) {
                        Some(&first) => repeats.entry(first).or_default().push(i),
                        None => {
                            first_of.insert(ids.clone(), i);
                            todo.push((i, ids));
                        }
                    },
                    Err(e) => {
                        if on_result(i, Err(e)).is_break() {
                            return;
                        }
                    }
                }
            }
            // Shortest first: a cohort pads little and its texts end at about the same step.
            todo.sort_by_key(|(i, ids)| (ids.len(), *i));
            let mut running = Continuous::over(&self.core, Admission::SORTED);
            for (i, ids) in todo {
                running.push_ids(i as u64, ids, &request, options);
            }
            while !running.is_idle() {
                for (tag, result) in running.step() {
                    let i = tag as usize;
                    for &j in repeats.get(&i).into_iter().flatten() {
                        if on_result(j, result.clone()).is_break() {
                            return;
                        }
                    }
                    if on_result(i, result).is_break() {
                        return;
                    }
                }
            }
        });
        Ok(())
    }

    /// Translates `text` (greedy or as `options` say) and returns the encoder-decoder
    /// attention of decoder `layer` (default: the last) over the source tokens, per head, one
    /// row per generated token: what a heatmap draws.
    pub fn cross_attention(
        &self,
        text: &str,
        pair: Option<(&str, &str)>,
        options: &TranslateOptions,
        layer: Option<usize>,
    ) -> Result<AttentionMap, TranslateError> {
        let request = self.core.request(pair, options)?;
        let ids = self.core.encode(&request, text)?;
        let model_error = |e: candle::Error| TranslateError::model(e.to_string());
        let hypothesis = self
            .core
            .generate_batch(std::slice::from_ref(&ids), &request.generation)
            .map_err(model_error)?
            .swap_remove(0)
            .swap_remove(0);
        let mut map = attention_map(self.core.model(), &ids, &hypothesis, layer, |id| {
            self.core.label(id)
        })
        .map_err(|e| TranslateError::input(e.to_string()))?;
        // MarianMT: columns labelled by the text's own pieces (`</s>` last) where they line up
        // with the ids (a piece missing from vocab.json is `<unk>` as an id but keeps its text).
        if let Model::Marian { tokenizer, .. } = &self.core.model {
            if let Ok(mut pieces) = tokenizer.pieces(&request.prefixed(text)) {
                pieces.push(map.source.last().cloned().unwrap_or_default());
                if pieces.len() == ids.len() {
                    map.source = pieces;
                }
            }
        }
        Ok(map)
    }

    /// The family (`config.json`'s `model_type`; NLLB-200 is an M2M100 model).
    pub fn family(&self) -> Family {
        self.core.family()
    }

    /// The family's name for people: `MarianMT`, `NLLB-200`, `M2M100`, `mBART-50`.
    pub fn family_name(&self) -> &'static str {
        self.core.family_name()
    }

    /// The pair [`Translator::translate`] uses: a MarianMT directory's own
    /// (`source_lang`, `target_lang`), where it says them; `None` for a multilingual model,
    /// which needs the languages named ([`Translator::translate_pair`]).
    pub fn default_pair(&self) -> Option<(&str, &str)> {
        self.core.default_pair()
    }

    /// The shared encoder-decoder.
    pub fn model(&self) -> &EncoderDecoderModel {
        self.core.model()
    }

    /// A running batch over this model for texts that arrive over time (continuous batching;
    /// see [`Continuous`]).
    pub fn continuous(&self) -> Continuous<'_> {
        Continuous::over(&self.core, Admission::ARRIVING)
    }
}

/// Runs `work` on a thread of rayon's pool (the calling thread when it is one). The kernels
/// split each projection and attention call over the pool; called from a pool thread, that
/// thread takes part and no thread outside the pool waits to be woken at the end of each of
/// the ~50 parallel loops of a decoding step.
fn on_rayon_pool<T: Send>(work: impl FnOnce() -> T + Send) -> T {
    if rayon::current_thread_index().is_some() {
        return work();
    }
    let mut result = None;
    rayon::scope(|s| s.spawn(|_| result = Some(work())));
    result.expect("a rayon scope runs its spawned job before returning")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_translator_is_send_and_sync() {
        fn shared<T: Send + Sync>() {}
        shared::<Translator>();
        shared::<TranslateError>();
    }
}
