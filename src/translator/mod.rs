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
mod error;
mod languages;

pub use continuous::{Continuous, MAX_BATCH_ROWS};

pub use error::{ErrorKind, TranslateError};
pub use languages::Language;

use crate::explain::AttentionMap;
use crate::generation::{generate_hypotheses, GenerationConfig, Hypothesis};
use crate::models::encoder_decoder::EncoderDecoderModel;
use crate::models::marian::MarianMTModel;
use crate::models::seq2seq::{Family, Seq2SeqModel};
use crate::models::translation::attention_map;
use crate::tokenizers::{load_multilingual_tokenizer, MarianTokenizer, MultilingualTokenizer};
use crate::weights::Precision;
use candle::{Device, Tensor};
use std::collections::HashMap;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

/// Default of [`TranslatorBuilder::max_batch_tokens`]: padded source tokens per batch.
pub const DEFAULT_MAX_BATCH_TOKENS: usize = 4096;

/// A loaded translation model of any supported family, with its tokenizer and generation
/// settings (`generation_config.json`, with the builder's overrides).
#[derive(Debug)]
pub struct Translator {
    dir: PathBuf,
    model: Model,
    generation: GenerationConfig,
    max_batch_tokens: usize,
    sources: Vec<Language>,
    targets: Vec<Language>,
}

/// The family-specific half: the model and its tokenizer.
#[derive(Debug)]
enum Model {
    Marian {
        model: MarianMTModel,
        // Boxed: the tokenizer's tables are large next to the other variant.
        tokenizer: Box<MarianTokenizer>,
    },
    Multilingual {
        model: Seq2SeqModel,
        tokenizer: Box<dyn MultilingualTokenizer>,
    },
}

/// Per call: what to generate. `None` fields take the translator's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TranslateOptions {
    /// Beam width (1 = greedy); default: the builder's, else `generation_config.json`'s.
    pub beam: Option<usize>,
    /// Most tokens to generate per text; default: the builder's, else the directory's.
    pub max_new_tokens: Option<usize>,
    /// Hypotheses to return per text in [`Translation::alternatives`] (at most the beam
    /// width); 1 returns none.
    pub n_best: usize,
    /// Whether to align each generated token of the best hypothesis to the source token it
    /// attends to most in the last decoder layer ([`Translation::alignments`]); costs one
    /// teacher-forced pass per text.
    pub alignments: bool,
}

impl Default for TranslateOptions {
    fn default() -> Self {
        Self {
            beam: None,
            max_new_tokens: None,
            n_best: 1,
            alignments: false,
        }
    }
}

impl TranslateOptions {
    /// The defaults with `beam` beams.
    pub fn beam(beam: usize) -> Self {
        Self {
            beam: Some(beam),
            ..Self::default()
        }
    }
}

/// One translated text.
#[derive(Clone, Debug, PartialEq)]
pub struct Translation {
    /// The best hypothesis's text (`batch_decode(..., skip_special_tokens=True)`).
    pub text: String,
    /// Its score: `log_prob / generated_len ^ length_penalty` (transformers'
    /// `sequences_scores`).
    pub score: f32,
    /// Its log-probability: the sum of the generated tokens' log-probabilities.
    pub log_prob: f32,
    /// With [`TranslateOptions::n_best`] > 1: the `n_best` hypotheses, best first (the first
    /// is the one above); empty otherwise.
    pub alternatives: Vec<Alternative>,
    /// With [`TranslateOptions::alignments`]: per generated token of the best hypothesis, the
    /// source token it attends to most.
    pub alignments: Option<Vec<AlignedToken>>,
    /// The best hypothesis's ids as `generate()` returns them: the decoder start token first,
    /// EOS last when the model ended the text (unpadded).
    pub tokens: Vec<u32>,
    /// Source tokens read (special tokens included).
    pub source_tokens: usize,
    /// Tokens generated for the best hypothesis (EOS included, the start token not).
    pub generated_tokens: usize,
}

/// One of the n best hypotheses of a text.
#[derive(Clone, Debug, PartialEq)]
pub struct Alternative {
    /// Its text.
    pub text: String,
    /// Its score (as [`Translation::score`]).
    pub score: f32,
    /// Its log-probability.
    pub log_prob: f32,
}

/// A generated token and the source token it attends to most.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AlignedToken {
    /// The generated token.
    pub target: String,
    /// The source token.
    pub source: String,
    /// The source token's position (0-based, special tokens counted).
    pub source_index: usize,
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

    /// The most padded source tokens (rows × longest row) in one batch (default
    /// [`DEFAULT_MAX_BATCH_TOKENS`]); memory follows it. A text longer than the budget still
    /// gets a batch of its own.
    pub fn max_batch_tokens(mut self, max_batch_tokens: usize) -> Self {
        self.max_batch_tokens = max_batch_tokens;
        self
    }

    /// Loads the model: a directory, or (feature `hub`) a hub id `ORG/NAME[@REVISION]`
    /// resolved through the Hugging Face cache.
    pub fn build(self) -> candle::Result<Translator> {
        if self.max_batch_tokens == 0 {
            candle::bail!("max_batch_tokens must be at least 1")
        }
        if self.beam == Some(0) {
            candle::bail!("the beam width must be at least 1")
        }
        if self.max_new_tokens == Some(0) {
            candle::bail!("max_new_tokens must be at least 1")
        }
        let dir = locate(&self.model)?;
        let mut translator = Translator::load(&dir, self.precision, &self.device)?;
        translator.max_batch_tokens = self.max_batch_tokens;
        if let Some(beam) = self.beam {
            translator.generation = translator.generation.clone().with_num_beams(beam);
        }
        if let Some(n) = self.max_new_tokens {
            translator.generation = translator.generation.clone().with_max_new_tokens(n);
        }
        translator.check_limits(&translator.generation)?;
        Ok(translator)
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
        Self::load(dir.as_ref(), Precision::default(), &Device::Cpu)
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
        }
    }

    fn load(dir: &Path, precision: Precision, device: &Device) -> candle::Result<Self> {
        let family = Family::of_dir(dir)?;
        let context = |e: candle::Error| {
            candle::Error::Msg(format!(
                "loading the {} model in {}: {e}",
                family.name(),
                dir.display()
            ))
        };
        let (model, generation) = match family {
            Family::Marian => {
                let model =
                    MarianMTModel::from_dir_with(dir, precision, device).map_err(context)?;
                let tokenizer = MarianTokenizer::from_dir(dir).map_err(context)?;
                tokenizer.check_model_vocab_size(model.config().vocab_size)?;
                let generation = GenerationConfig::from_model_dir(dir)?;
                let tokenizer = Box::new(tokenizer);
                (Model::Marian { model, tokenizer }, generation)
            }
            Family::M2M100 | Family::MBart => {
                let model = Seq2SeqModel::from_dir_with(dir, precision, device).map_err(context)?;
                let tokenizer = load_multilingual_tokenizer(dir).map_err(context)?;
                let vocab = model.spec().vocab_size;
                if tokenizer.len() > vocab {
                    candle::bail!(
                        "{}: the tokenizer has {} tokens but the model's vocabulary has {vocab}: \
                         they belong to different models",
                        dir.display(),
                        tokenizer.len()
                    )
                }
                let generation = model.config().generation_config(dir)?;
                (Model::Multilingual { model, tokenizer }, generation)
            }
        };
        let (sources, targets) = model.languages();
        Ok(Self {
            dir: dir.to_path_buf(),
            model,
            generation,
            max_batch_tokens: DEFAULT_MAX_BATCH_TOKENS,
            sources,
            targets,
        })
    }

    /// The directory the model was loaded from (a hub id's cache snapshot).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The family (`config.json`'s `model_type`; NLLB-200 is an M2M100 model).
    pub fn family(&self) -> Family {
        match &self.model {
            Model::Marian { .. } => Family::Marian,
            Model::Multilingual { model, .. } => model.family(),
        }
    }

    /// The family's name for people: `MarianMT`, `NLLB-200`, `M2M100`, `mBART-50`.
    pub fn family_name(&self) -> &'static str {
        match &self.model {
            Model::Marian { .. } => Family::Marian.name(),
            Model::Multilingual { tokenizer, .. } => tokenizer.family().name(),
        }
    }

    /// The languages it reads, as the family spells them, with ISO 639-1 codes and names. A
    /// MarianMT directory says its source language in `tokenizer_config.json` (`source_lang`);
    /// one that does not has none listed (and translates with [`Translator::translate`]).
    pub fn source_languages(&self) -> &[Language] {
        &self.sources
    }

    /// The languages it writes: every code of a multilingual model; a MarianMT directory's
    /// `target_lang`, or its `>>xx<<` target tokens.
    pub fn target_languages(&self) -> &[Language] {
        &self.targets
    }

    /// The pair [`Translator::translate`] uses: a MarianMT directory's own
    /// (`source_lang`, `target_lang`), where it says them; `None` for a multilingual model,
    /// which needs the languages named ([`Translator::translate_pair`]).
    pub fn default_pair(&self) -> Option<(&str, &str)> {
        match (
            &self.model,
            self.sources.as_slice(),
            self.targets.as_slice(),
        ) {
            (Model::Marian { .. }, [source], [target]) => {
                Some((source.code.as_str(), target.code.as_str()))
            }
            _ => None,
        }
    }

    /// The shared encoder-decoder.
    pub fn model(&self) -> &EncoderDecoderModel {
        match &self.model {
            Model::Marian { model, .. } => model,
            Model::Multilingual { model, .. } => model,
        }
    }

    /// The generation settings every call starts from.
    pub fn generation_config(&self) -> &GenerationConfig {
        &self.generation
    }

    /// The batch budget in padded source tokens.
    pub fn max_batch_tokens(&self) -> usize {
        self.max_batch_tokens
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
        let request = self.request(pair, options)?;
        on_rayon_pool(|| {
            // Encode; failures are known at once, and texts with the same ids share one row.
            let mut todo: Vec<(usize, Vec<u32>)> = Vec::new();
            let mut first_of: HashMap<Vec<u32>, usize> = HashMap::new();
            let mut repeats: HashMap<usize, Vec<usize>> = HashMap::new();
            for (i, text) in texts.iter().enumerate() {
                match self.encode(&request, text.as_ref()) {
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
            let mut running = Continuous::new(self);
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
        let request = self.request(pair, options)?;
        let ids = self.encode(&request, text)?;
        let model_error = |e: candle::Error| TranslateError::model(e.to_string());
        let hypothesis = self
            .generate_batch(std::slice::from_ref(&ids), &request.generation)
            .map_err(model_error)?
            .swap_remove(0)
            .swap_remove(0);
        let mut map = attention_map(self.model(), &ids, &hypothesis, layer, |id| self.label(id))
            .map_err(|e| TranslateError::input(e.to_string()))?;
        // MarianMT: columns labelled by the text's own pieces (`</s>` last) where they line up
        // with the ids (a piece missing from vocab.json is `<unk>` as an id but keeps its text).
        if let Model::Marian { tokenizer, .. } = &self.model {
            if let Ok(mut pieces) = tokenizer.pieces(&request.prefixed(text)) {
                pieces.push(map.source.last().cloned().unwrap_or_default());
                if pieces.len() == ids.len() {
                    map.source = pieces;
                }
            }
        }
        Ok(map)
    }

    /// What a call needs: the source language to encode with, a MarianMT target token to
    /// prefix, and the generation settings with the options applied and checked.
    fn request(
        &self,
        pair: Option<(&str, &str)>,
        options: &TranslateOptions,
    ) -> Result<Request, TranslateError> {
        let mut generation = self.generation.clone();
        if let Some(beam) = options.beam {
            if beam == 0 {
                return Err(TranslateError::input("the beam width must be at least 1"));
            }
            generation = generation.with_num_beams(beam);
        }
        if let Some(n) = options.max_new_tokens {
            if n == 0 {
                return Err(TranslateError::input("max_new_tokens must be at least 1"));
            }
            generation = generation.with_max_new_tokens(n);
        }
        let beams = generation.num_beams.unwrap_or(1).max(1);
        if options.n_best == 0 {
            return Err(TranslateError::input("n_best must be at least 1"));
        }
        if options.n_best > beams {
            return Err(TranslateError::input(format!(
                "{} best hypotheses need at least as many beams, got {beams}",
                options.n_best
            )));
        }
        if options.n_best > 1 {
            generation = generation.with_num_return_sequences(options.n_best);
        }
        let mut request = Request {
            source: None,
            marian_prefix: None,
            generation,
        };
        match (&self.model, pair) {
            (Model::Marian { .. }, None) => {}
            (Model::Marian { tokenizer, .. }, Some((source, target))) => {
                if !self.sources.is_empty() && !self.sources.iter().any(|l| l.is_named(source)) {
                    return Err(unsupported("source", source, &self.sources, self));
                }
                let Some(language) = self.targets.iter().find(|l| l.is_named(target)) else {
                    return Err(unsupported("target", target, &self.targets, self));
                };
                if tokenizer.language_codes().contains(&language.code) {
                    request.marian_prefix = Some(language.code.clone());
                }
            }
            (Model::Multilingual { tokenizer, .. }, None) => {
                return Err(TranslateError::input(format!(
                    "{} is a multilingual {} model: name the source and target languages \
                     (translate_pair; e.g. {})",
                    self.dir.display(),
                    tokenizer.family().name(),
                    self.targets
                        .iter()
                        .take(3)
                        .map(|l| l.code.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )))
            }
            (Model::Multilingual { tokenizer, .. }, Some((source, target))) => {
                let code = |query: &str, role: &str| -> Result<String, TranslateError> {
                    match self.sources.iter().find(|l| l.is_named(query)) {
                        Some(l) => Ok(l.code.clone()),
                        // The tokenizer's own error lists close matches.
                        None => match tokenizer.lang_id(query) {
                            Ok(_) => Ok(query.to_string()),
                            Err(e) => Err(TranslateError::input(format!("{role} language: {e}"))),
                        },
                    }
                };
                let source = code(source, "source")?;
                let target = code(target, "target")?;
                let id = tokenizer
                    .lang_id(&target)
                    .map_err(|e| TranslateError::input(e.to_string()))?;
                request.source = Some(source);
                request.generation.forced_bos_token_id = Some(id);
            }
        }
        self.check_limits(&request.generation)
            .map_err(|e| TranslateError::input(e.to_string()))?;
        Ok(request)
    }

    /// Refuses at once what the model cannot do with `generation` (instead of minutes of work
    /// and an error at the end): more beams than tokens, more new tokens than positions.
    fn check_limits(&self, generation: &GenerationConfig) -> candle::Result<()> {
        let (beams, _) = generation.search_size()?;
        let spec = self.model().spec();
        let vocab = spec.target_vocab_size;
        if beams > vocab {
            candle::bail!("{beams} beams are more than the model's {vocab} tokens")
        }
        if let Some(id) = generation.forced_bos_token_id {
            if id as usize >= vocab {
                candle::bail!(
                    "forced_bos_token_id {id} is outside the model's vocabulary of {vocab} tokens"
                )
            }
        }
        let positions = spec.max_position_embeddings;
        if let Some(n) = generation.max_new_tokens {
            if n + 1 > positions {
                candle::bail!(
                    "max_new_tokens {n} runs past the model's max_position_embeddings \
                     ({positions}): at most {} new tokens",
                    positions.saturating_sub(1)
                )
            }
        }
        Ok(())
    }

    /// The ids of `text` as the model reads it, or why it cannot take it.
    fn encode(&self, request: &Request, text: &str) -> Result<Vec<u32>, TranslateError> {
        let ids = match (&self.model, &request.source) {
            (Model::Marian { tokenizer, .. }, _) => tokenizer.encode(&request.prefixed(text)),
            (Model::Multilingual { tokenizer, .. }, Some(source)) => tokenizer.encode(text, source),
            (Model::Multilingual { .. }, None) => {
                return Err(TranslateError::input("no source language"));
            }
        }
        .map_err(|e| TranslateError::input(e.to_string()))?;
        let max = self.model().spec().max_position_embeddings;
        if ids.len() > max {
            return Err(TranslateError::input(format!(
                "the text is {} tokens long but the model takes at most \
                 max_position_embeddings = {max}",
                ids.len()
            )));
        }
        Ok(ids)
    }

    /// One right-padded batch through the model and the generation engine.
    fn generate_batch(
        &self,
        batch: &[Vec<u32>],
        generation: &GenerationConfig,
    ) -> candle::Result<Vec<Vec<Hypothesis>>> {
        let state = self.start_batch(batch, generation)?;
        generate_hypotheses(self.model(), state, batch.len(), generation)
    }

    /// Encodes a right-padded batch (after checking that its generation fits in memory): the
    /// state generation starts from.
    fn start_batch(
        &self,
        batch: &[Vec<u32>],
        generation: &GenerationConfig,
    ) -> candle::Result<crate::models::encoder_decoder::DecodeState> {
        let model = self.model();
        let (beams, max_length) = generation.search_size()?;
        let source_len = batch.iter().map(Vec::len).max().unwrap_or(0);
        model.check_generation_memory(batch.len(), beams, source_len, max_length)?;
        let pad = match &self.model {
            Model::Marian { tokenizer, .. } => tokenizer.pad_id(),
            Model::Multilingual { tokenizer, .. } => tokenizer.pad_id(),
        };
        let (mut ids, mut mask) = (Vec::new(), Vec::new());
        for row in batch {
            ids.extend(
                row.iter()
                    .copied()
                    .chain(std::iter::repeat_n(pad, source_len - row.len())),
            );
            mask.extend((0..source_len).map(|i| u32::from(i < row.len())));
        }
        let device = model.device();
        let ids = Tensor::from_vec(ids, (batch.len(), source_len), device)?;
        let mask = Tensor::from_vec(mask, (batch.len(), source_len), device)?;
        model.start(&ids, &mask)
    }

    /// The text of a generated sequence, as `batch_decode(..., skip_special_tokens=True)`.
    fn decode(&self, hypothesis: &Hypothesis) -> candle::Result<String> {
        match &self.model {
            Model::Marian { tokenizer, .. } => tokenizer.decode(&hypothesis.tokens, true),
            Model::Multilingual { tokenizer, .. } => tokenizer.decode(&hypothesis.tokens, true),
        }
    }

    /// A token's label (its piece), for alignments and attention maps.
    fn label(&self, id: u32) -> String {
        let token = match &self.model {
            Model::Marian { tokenizer, .. } => tokenizer.id_to_token(id).map(str::to_string),
            Model::Multilingual { tokenizer, .. } => tokenizer.id_to_token(id),
        };
        token.unwrap_or_else(|| format!("<{id}>"))
    }

    /// The [`Translation`] of generated hypotheses (best first) for source `ids`.
    fn translation(
        &self,
        ids: &[u32],
        hypotheses: Vec<Hypothesis>,
        options: &TranslateOptions,
    ) -> Result<Translation, TranslateError> {
        let model_error = |e: candle::Error| TranslateError::model(e.to_string());
        let Some(best) = hypotheses.first() else {
            return Err(TranslateError::model("generation returned no hypothesis"));
        };
        let alignments = if options.alignments {
            let map = attention_map(self.model(), ids, best, None, |id| self.label(id))
                .map_err(model_error)?;
            Some(
                map.alignment()
                    .into_iter()
                    .zip(&map.output)
                    .map(|(j, target)| AlignedToken {
                        target: target.clone(),
                        source: map.source.get(j).cloned().unwrap_or_default(),
                        source_index: j,
                    })
                    .collect(),
            )
        } else {
            None
        };
        let alternatives = if options.n_best > 1 {
            hypotheses
                .iter()
                .map(|h| {
                    Ok(Alternative {
                        text: self.decode(h)?,
                        score: h.score,
                        log_prob: h.log_prob,
                    })
                })
                .collect::<candle::Result<Vec<_>>>()
                .map_err(model_error)?
        } else {
            Vec::new()
        };
        Ok(Translation {
            text: self.decode(best).map_err(model_error)?,
            score: best.score,
            log_prob: best.log_prob,
            alternatives,
            alignments,
            tokens: best.tokens.clone(),
            source_tokens: ids.len(),
            generated_tokens: best.tokens.len().saturating_sub(1),
        })
    }
}

impl Model {
    /// The languages read and written (see [`Translator::source_languages`]).
    fn languages(&self) -> (Vec<Language>, Vec<Language>) {
        match self {
            Model::Marian { tokenizer, .. } => {
                let config = tokenizer.config();
                let one = |code: &Option<String>| {
                    code.iter()
                        .map(|c| Language::from_code(c))
                        .collect::<Vec<_>>()
                };
                let sources = one(&config.source_lang);
                let targets = if tokenizer.language_codes().is_empty() {
                    one(&config.target_lang)
                } else {
                    tokenizer
                        .language_codes()
                        .iter()
                        .map(|c| Language::from_code(c))
                        .collect()
                };
                (sources, targets)
            }
            Model::Multilingual { tokenizer, .. } => {
                let all: Vec<Language> = tokenizer
                    .language_codes()
                    .iter()
                    .map(|c| Language::from_code(c))
                    .collect();
                (all.clone(), all)
            }
        }
    }
}

/// A call's resolved languages and generation settings.
pub(crate) struct Request {
    /// A multilingual model's source code (as the family spells it).
    source: Option<String>,
    /// A multi-target MarianMT model's target token (`>>fra<<`), written before each text.
    marian_prefix: Option<String>,
    generation: GenerationConfig,
}

impl Request {
    /// `text` as a MarianMT model reads it: with the target token first where one is needed.
    fn prefixed(&self, text: &str) -> String {
        match &self.marian_prefix {
            Some(code) => format!("{code} {text}"),
            None => text.to_string(),
        }
    }
}

/// The error for a language the model does not have.
fn unsupported(role: &str, query: &str, known: &[Language], t: &Translator) -> TranslateError {
    let listed: Vec<String> = known
        .iter()
        .map(|l| match &l.iso639_1 {
            Some(iso) if *iso != l.code => format!("{} ({iso})", l.code),
            _ => l.code.clone(),
        })
        .collect();
    TranslateError::input(format!(
        "{query} is not a {role} language of {} ({}): it has {}",
        t.dir.display(),
        t.family_name(),
        if listed.is_empty() {
            "none listed (its tokenizer_config.json names no languages)".to_string()
        } else {
            listed.join(", ")
        }
    ))
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
