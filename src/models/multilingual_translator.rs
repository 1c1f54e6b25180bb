//! Text in, text out with an M2M100 / NLLB-200 or mBART-50 directory: the family's tokenizer
//! ([`crate::tokenizers::load_multilingual_tokenizer`], the source language's special tokens)
//! → [`Seq2SeqModel`] → [`generate`](crate::generation::generate()) with the target language
//! forced after the decoder start (`forced_bos_token_id`) → decode, as transformers'
//! `tokenizer.src_lang = src; tokenizer(texts, padding=True)` →
//! `model.generate(**batch, forced_bos_token_id=tokenizer.convert_tokens_to_ids(tgt))` →
//! `tokenizer.batch_decode(out, skip_special_tokens=True)`.

use super::seq2seq::Seq2SeqModel;
use super::translation::{attention_map, generate_rows};
use crate::explain::AttentionMap;
use crate::generation::{generate_hypotheses, GenerationConfig, Hypothesis};
use crate::tokenizers::{load_multilingual_tokenizer, MultilingualTokenizer};
use crate::weights::Precision;
use candle::Device;
use std::path::Path;

/// A multilingual model with its tokenizer, a language pair and generation settings.
///
/// ```no_run
/// use candle_attention::models::multilingual_translator::MultilingualTranslator;
/// # fn main() -> candle::Result<()> {
/// let t = MultilingualTranslator::from_dir(
///     "nllb-200-distilled-600M", "eng_Latn", "deu_Latn", &candle::Device::Cpu)?;
/// let ids = t.encode("Hello, world!")?;
/// for hyps in t.generate_encoded(&[ids])? {
///     println!("{}", t.decode(&hyps?[0])?);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct MultilingualTranslator {
    model: Seq2SeqModel,
    tokenizer: Box<dyn MultilingualTokenizer>,
    generation: GenerationConfig,
    src_lang: String,
    tgt_lang: String,
}

impl MultilingualTranslator {
    /// Loads a directory as the hub has it (the model, [`Seq2SeqModel::from_dir`]; the
    /// tokenizer files; `generation_config.json` or the config's generation keys) for
    /// translating from `src_lang` into `tgt_lang`, codes as the family spells them
    /// (`eng_Latn`, `en`, `en_XX`). An unknown code is an error listing close matches; the
    /// tokenizer's vocabulary must fit the model's (an error names both sizes).
    pub fn from_dir(
        dir: impl AsRef<Path>,
        src_lang: &str,
        tgt_lang: &str,
        device: &Device,
    ) -> candle::Result<Self> {
        Self::from_dir_with(dir, src_lang, tgt_lang, Precision::default(), device)
    }

    /// [`MultilingualTranslator::from_dir`] with the model in a [`Precision`]
    /// ([`Seq2SeqModel::from_dir_with`]).
    pub fn from_dir_with(
        dir: impl AsRef<Path>,
        src_lang: &str,
        tgt_lang: &str,
        precision: Precision,
        device: &Device,
    ) -> candle::Result<Self> {
        let dir = dir.as_ref();
        let model = Seq2SeqModel::from_dir_with(dir, precision, device)?;
        let tokenizer = load_multilingual_tokenizer(dir)?;
        let vocab = model.spec().vocab_size;
        if tokenizer.len() > vocab {
            candle::bail!(
                "{}: the tokenizer has {} tokens but the model's vocabulary has {vocab}: they \
                 belong to different models",
                dir.display(),
                tokenizer.len()
            )
        }
        let generation = model.config().generation_config(dir)?;
        let mut translator = Self {
            model,
            tokenizer,
            generation,
            src_lang: String::new(),
            tgt_lang: String::new(),
        };
        translator.set_languages(src_lang, tgt_lang)?;
        Ok(translator)
    }

    /// Translates from `src_lang` into `tgt_lang` from now on (both checked against the
    /// tokenizer's codes).
    pub fn set_languages(&mut self, src_lang: &str, tgt_lang: &str) -> candle::Result<()> {
        self.tokenizer.lang_id(src_lang)?;
        let target = self.tokenizer.lang_id(tgt_lang)?;
        self.src_lang = src_lang.to_string();
        self.tgt_lang = tgt_lang.to_string();
        self.generation.forced_bos_token_id = Some(target);
        Ok(())
    }

    /// The source and target languages.
    pub fn languages(&self) -> (&str, &str) {
        (&self.src_lang, &self.tgt_lang)
    }

    /// The model.
    pub fn model(&self) -> &Seq2SeqModel {
        &self.model
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &dyn MultilingualTokenizer {
        self.tokenizer.as_ref()
    }

    /// The generation settings every call uses (the target language forced first).
    pub fn generation_config(&self) -> &GenerationConfig {
        &self.generation
    }

    /// Replaces the generation settings, keeping the target language as `forced_bos_token_id`.
    pub fn with_generation_config(mut self, generation: GenerationConfig) -> Self {
        let forced = self.generation.forced_bos_token_id;
        self.generation = generation;
        self.generation.forced_bos_token_id = forced;
        self
    }

    /// The ids of `text` as the model reads it (`[src_lang] pieces </s>`, or the family's own
    /// order), or an error when the model cannot take it (longer than its positions).
    pub fn encode(&self, text: &str) -> candle::Result<Vec<u32>> {
        let ids = self.tokenizer.encode(text, &self.src_lang)?;
        let max = self.model.spec().max_position_embeddings;
        if ids.len() > max {
            candle::bail!(
                "the text is {} tokens long but the model takes at most max_position_embeddings = {max}",
                ids.len()
            )
        }
        Ok(ids)
    }

    /// Generates for texts already encoded ([`MultilingualTranslator::encode`]), as one
    /// padded batch: per text its `num_return_sequences` hypotheses, best first. A failure of
    /// one text never takes the others' results with it (each is then generated alone).
    pub fn generate_encoded(
        &self,
        batch: &[Vec<u32>],
    ) -> candle::Result<Vec<candle::Result<Vec<Hypothesis>>>> {
        Ok(generate_rows(batch, |rows| self.generate_batch(rows)))
    }

    /// One right-padded batch through the model and the generation engine.
    fn generate_batch(&self, batch: &[Vec<u32>]) -> candle::Result<Vec<Vec<Hypothesis>>> {
        let (beams, max_length) = self.generation.search_size()?;
        let source_len = batch.iter().map(Vec::len).max().unwrap_or(0);
        self.model
            .check_generation_memory(batch.len(), beams, source_len, max_length)?;
        let pad = self.tokenizer.pad_id();
        let (mut ids, mut mask) = (Vec::new(), Vec::new());
        for row in batch {
            ids.extend(
                row.iter()
                    .copied()
                    .chain(std::iter::repeat_n(pad, source_len - row.len())),
            );
            mask.extend((0..source_len).map(|i| u32::from(i < row.len())));
        }
        let device = self.model.device();
        let ids = candle::Tensor::from_vec(ids, (batch.len(), source_len), device)?;
        let mask = candle::Tensor::from_vec(mask, (batch.len(), source_len), device)?;
        let state = self.model.start(&ids, &mask)?;
        generate_hypotheses(&*self.model, state, batch.len(), &self.generation)
    }

    /// The text of a generated sequence, as `batch_decode(..., skip_special_tokens=True)`
    /// (the language codes dropped).
    pub fn decode(&self, hypothesis: &Hypothesis) -> candle::Result<String> {
        self.tokenizer.decode(&hypothesis.tokens, true)
    }

    /// Where `hypothesis` (generated from `source_ids`) looked: the encoder-decoder attention
    /// of decoder `layer` (default: the last), per head, one row per generated token.
    pub fn attention_map(
        &self,
        source_ids: &[u32],
        hypothesis: &Hypothesis,
        layer: Option<usize>,
    ) -> candle::Result<AttentionMap> {
        attention_map(&self.model, source_ids, hypothesis, layer, |id| {
            self.tokenizer
                .id_to_token(id)
                .unwrap_or_else(|| format!("<{id}>"))
        })
    }
}
