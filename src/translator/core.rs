//! The family-specific half of a [`Translator`](super::Translator): the model and its
//! tokenizer, and what a call needs of them: its languages and generation settings resolved and
//! checked, texts encoded, padded batches started, hypotheses decoded into translations. Both
//! the one-call path and continuous batching ([`super::continuous`]) use it.

use super::error::TranslateError;
use super::languages::Language;
use super::types::{AlignedToken, Alternative, TranslateOptions, Translation};
use crate::generation::{generate_hypotheses, GenerationConfig, Hypothesis};
use crate::models::encoder_decoder::{DecodeState, EncoderDecoderModel};
use crate::models::marian::MarianMTModel;
use crate::models::seq2seq::{Family, Seq2SeqModel};
use crate::models::translation::attention_map;
use crate::tokenizers::{load_multilingual_tokenizer, MarianTokenizer, MultilingualTokenizer};
use crate::weights::Precision;
use candle::{Device, Tensor};
use std::path::{Path, PathBuf};

/// Default of the batch budget: padded source tokens of the texts decoding at once.
pub const DEFAULT_MAX_BATCH_TOKENS: usize = 4096;

/// The default most decoder rows (texts × beams) decoding at once, whatever the token budget
/// allows (`TranslatorBuilder::max_batch_rows`).
/// Every row holds its self- and cross-attention caches (beam search copies them at each step)
/// and a step's log-probabilities (232 KB a row for a 58,101-token vocabulary): the short texts
/// of a large call would otherwise make batches of a thousand rows, 1.2–1.6 GB resident for a
/// 282 MB opus-mt model at beam 4.
pub const MAX_BATCH_ROWS: usize = 256;

/// A loaded model with its tokenizer, generation settings and languages.
#[derive(Debug)]
pub(crate) struct Core {
    pub(crate) dir: PathBuf,
    pub(crate) model: Model,
    pub(crate) generation: GenerationConfig,
    pub(crate) max_batch_tokens: usize,
    pub(crate) max_batch_rows: usize,
    pub(crate) sources: Vec<Language>,
    pub(crate) targets: Vec<Language>,
}

/// The family-specific half: the model and its tokenizer.
#[derive(Debug)]
pub(crate) enum Model {
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

impl Core {
    pub(crate) fn load(dir: &Path, precision: Precision, device: &Device) -> candle::Result<Self> {
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
            max_batch_rows: MAX_BATCH_ROWS,
            sources,
            targets,
        })
    }

    /// The family (`config.json`'s `model_type`; NLLB-200 is an M2M100 model).
    pub(crate) fn family(&self) -> Family {
        match &self.model {
            Model::Marian { .. } => Family::Marian,
            Model::Multilingual { model, .. } => model.family(),
        }
    }

    /// The family's name for people: `MarianMT`, `NLLB-200`, `M2M100`, `mBART-50`.
    pub(crate) fn family_name(&self) -> &'static str {
        match &self.model {
            Model::Marian { .. } => Family::Marian.name(),
            Model::Multilingual { tokenizer, .. } => tokenizer.family().name(),
        }
    }

    /// The pair [`Translator::translate`] uses: a MarianMT directory's own
    /// (`source_lang`, `target_lang`), where it says them; `None` for a multilingual model,
    /// which needs the languages named ([`Translator::translate_pair`]).
    pub(crate) fn default_pair(&self) -> Option<(&str, &str)> {
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
    pub(crate) fn model(&self) -> &EncoderDecoderModel {
        match &self.model {
            Model::Marian { model, .. } => model,
            Model::Multilingual { model, .. } => model,
        }
    }

    /// What a call needs: the source language to encode with, a MarianMT target token to
    /// prefix, and the generation settings with the options applied and checked.
    pub(crate) fn request(
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
    pub(crate) fn check_limits(&self, generation: &GenerationConfig) -> candle::Result<()> {
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
    pub(crate) fn encode(&self, request: &Request, text: &str) -> Result<Vec<u32>, TranslateError> {
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
    pub(crate) fn generate_batch(
        &self,
        batch: &[Vec<u32>],
        generation: &GenerationConfig,
    ) -> candle::Result<Vec<Vec<Hypothesis>>> {
        let state = self.start_batch(batch, generation)?;
        generate_hypotheses(self.model(), state, batch.len(), generation)
    }

    /// Encodes a right-padded batch (after checking that its generation fits in memory): the
    /// state generation starts from.
    pub(crate) fn start_batch(
        &self,
        batch: &[Vec<u32>],
        generation: &GenerationConfig,
    ) -> candle::Result<DecodeState> {
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
    pub(crate) fn decode(&self, hypothesis: &Hypothesis) -> candle::Result<String> {
        match &self.model {
            Model::Marian { tokenizer, .. } => tokenizer.decode(&hypothesis.tokens, true),
            Model::Multilingual { tokenizer, .. } => tokenizer.decode(&hypothesis.tokens, true),
        }
    }

    /// A token's label (its piece), for alignments and attention maps.
    pub(crate) fn label(&self, id: u32) -> String {
        let token = match &self.model {
            Model::Marian { tokenizer, .. } => tokenizer.id_to_token(id).map(str::to_string),
            Model::Multilingual { tokenizer, .. } => tokenizer.id_to_token(id),
        };
        token.unwrap_or_else(|| format!("<{id}>"))
    }

    /// The [`Translation`] of generated hypotheses (best first) for source `ids`.
    pub(crate) fn translation(
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
    pub(crate) source: Option<String>,
    /// A multi-target MarianMT model's target token (`>>fra<<`), written before each text.
    pub(crate) marian_prefix: Option<String>,
    pub(crate) generation: GenerationConfig,
}

impl Request {
    /// `text` as a MarianMT model reads it: with the target token first where one is needed.
    pub(crate) fn prefixed(&self, text: &str) -> String {
        match &self.marian_prefix {
            Some(code) => format!("{code} {text}"),
            None => text.to_string(),
        }
    }
}

/// The error for a language the model does not have.
fn unsupported(role: &str, query: &str, known: &[Language], t: &Core) -> TranslateError {
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
