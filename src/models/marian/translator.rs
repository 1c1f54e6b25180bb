//! Text in, text out with a MarianMT directory: [`MarianTokenizer`] → [`MarianMTModel`] →
//! [`generate`](crate::generation::generate()) → decode, exactly as the transformers pipeline
//! `tokenizer(texts, padding=True)` → `model.generate(**batch)` →
//! `tokenizer.batch_decode(out, skip_special_tokens=True)`.

use super::model::MarianMTModel;
use crate::explain::{AttentionMap, TeacherForcing};
use crate::generation::{generate, generate_hypotheses, GenerationConfig, Hypothesis};
use crate::models::translation::{attention_map, generate_rows};
use crate::tokenizers::MarianTokenizer;
use crate::weights::Precision;
use candle::{Device, Tensor};
use std::path::Path;

/// A MarianMT model with its tokenizer and generation settings, one text at a time: what
/// explaining a translation needs (its ids, a teacher-forced pass, the cross-attention of the
/// text's own pieces). To translate, use [`crate::Translator`], which batches for throughput
/// and serves every family.
///
/// ```no_run
/// use candle_attention::marian::MarianTranslator;
/// # fn main() -> candle::Result<()> {
/// let translator = MarianTranslator::from_dir("opus-mt-en-de", &candle::Device::Cpu)?;
/// let forced = translator.teacher_forcing("Hello, world!")?;
/// println!("{} <- {:?}", forced.translation, forced.source_tokens);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct MarianTranslator {
    model: MarianMTModel,
    tokenizer: MarianTokenizer,
    generation: GenerationConfig,
}

impl MarianTranslator {
    /// Loads a MarianMT directory as the hub has it: the model ([`MarianMTModel::from_dir`]),
    /// the tokenizer (`source.spm`, `target.spm`, `vocab.json`) and the generation settings
    /// (`generation_config.json`, else `config.json`). The tokenizer's vocabulary must match
    /// the model's (an error names both sizes).
    pub fn from_dir(dir: impl AsRef<Path>, device: &Device) -> candle::Result<Self> {
        Self::from_dir_with(dir, Precision::default(), device)
    }

    /// [`MarianTranslator::from_dir`] with the model in a [`Precision`]
    /// ([`MarianMTModel::from_dir_with`]).
    pub fn from_dir_with(
        dir: impl AsRef<Path>,
        precision: Precision,
        device: &Device,
    ) -> candle::Result<Self> {
        let dir = dir.as_ref();
        let model = MarianMTModel::from_dir_with(dir, precision, device)?;
        let tokenizer = MarianTokenizer::from_dir(dir)?;
        tokenizer.check_model_vocab_size(model.config().vocab_size)?;
        let generation = GenerationConfig::from_model_dir(dir)?;
        Ok(Self {
            model,
            tokenizer,
            generation,
        })
    }

    /// The model.
    pub fn model(&self) -> &MarianMTModel {
        &self.model
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &MarianTokenizer {
        &self.tokenizer
    }

    /// The generation settings every call uses.
    pub fn generation_config(&self) -> &GenerationConfig {
        &self.generation
    }

    /// Replaces the generation settings (e.g. `translator.generation_config().clone()
    /// .with_num_beams(1)`).
    pub fn with_generation_config(mut self, generation: GenerationConfig) -> Self {
        self.generation = generation;
        self
    }

    /// The ids of `text` as the model reads it (`</s>` appended), or an error when the model
    /// cannot take it (longer than `max_position_embeddings`).
    pub fn encode(&self, text: &str) -> candle::Result<Vec<u32>> {
        let ids = self.tokenizer.encode(text)?;
        let max = self.model.config().max_position_embeddings;
        if ids.len() > max {
            candle::bail!(
                "the text is {} tokens long but the model takes at most max_position_embeddings = {max}",
                ids.len()
            )
        }
        Ok(ids)
    }

    /// Generates for texts already encoded ([`MarianTranslator::encode`]), as one padded batch:
    /// per text its `num_return_sequences` hypotheses, best first, with their scores. A
    /// failure of one text never takes the others' results with it: when the batch fails, each
    /// text is generated on its own and gets its own result (e.g. a translation that runs past
    /// `max_position_embeddings` is an error for that text only). Rows of a padded batch are
    /// independent, so batching does not change any output.
    pub fn generate_encoded(
        &self,
        batch: &[Vec<u32>],
    ) -> candle::Result<Vec<candle::Result<Vec<Hypothesis>>>> {
        Ok(generate_rows(batch, |rows| self.generate_batch(rows)))
    }

    /// One padded batch through the model and the generation engine.
    fn generate_batch(&self, batch: &[Vec<u32>]) -> candle::Result<Vec<Vec<Hypothesis>>> {
        let (beams, max_length) = self.generation.search_size()?;
        let source_len = batch.iter().map(Vec::len).max().unwrap_or(0);
        self.model
            .check_generation_memory(batch.len(), beams, source_len, max_length)?;
        let padded = self.tokenizer.pad(batch.to_vec());
        let (ids, mask) = padded.to_tensors(self.model.device())?;
        let state = self.model.start(&ids, &mask)?;
        generate_hypotheses(&self.model, state, batch.len(), &self.generation)
    }

    /// The text of a generated sequence, as `batch_decode(..., skip_special_tokens=True)`.
    pub fn decode(&self, hypothesis: &Hypothesis) -> candle::Result<String> {
        self.tokenizer.decode(&hypothesis.tokens, true)
    }

    /// Tokenizes `text` and translates it greedily (one beam, whatever the generation settings
    /// say; their length limits apply): the inputs of a teacher-forced pass over the model's
    /// own translation. The decoder input is the generated sequence without its last token
    /// (the end token, when the model stopped). Errors when the model cannot take the text.
    pub fn teacher_forcing(&self, text: &str) -> candle::Result<TeacherForcing> {
        let ids = self.encode(text)?;
        let device = self.model.device();
        let input = Tensor::new(ids.as_slice(), device)?.unsqueeze(0)?;
        let mask = input.ones_like()?;
        let state = self.model.start(&input, &mask)?;
        let greedy = self.generation.clone().with_num_beams(1);
        let sequence = generate(&self.model, state, 1, &greedy)?
            .into_iter()
            .next()
            .unwrap_or_default();
        if sequence.is_empty() {
            candle::bail!("generation returned no tokens for {text:?}")
        }
        let decoder_ids = sequence[..sequence.len() - 1].to_vec();
        let decoder_ids = if decoder_ids.is_empty() {
            sequence.clone()
        } else {
            decoder_ids
        };
        let label = |id: u32| {
            self.tokenizer
                .id_to_token(id)
                .map_or_else(|| format!("<{id}>"), str::to_string)
        };
        let mut source_tokens = self.tokenizer.pieces(text)?;
        source_tokens.push(label(self.tokenizer.eos_id()));
        if source_tokens.len() != ids.len() {
            source_tokens = ids.iter().map(|&id| label(id)).collect();
        }
        Ok(TeacherForcing {
            source_tokens,
            source_ids: ids,
            decoder_tokens: decoder_ids.iter().map(|&id| label(id)).collect(),
            decoder_ids,
            translation: self.tokenizer.decode(&sequence, true)?,
        })
    }

    /// Translates `text` and returns the encoder-decoder attention of decoder `layer` (default:
    /// the last) over the source pieces (`</s>` last), per head: what a heatmap draws.
    pub fn cross_attention(
        &self,
        text: &str,
        layer: Option<usize>,
    ) -> candle::Result<AttentionMap> {
        let ids = self.encode(text)?;
        let hypothesis = self
            .generate_encoded(std::slice::from_ref(&ids))?
            .swap_remove(0)?
            .swap_remove(0);
        let mut map = self.attention_map(&ids, &hypothesis, layer)?;
        // Columns labelled by the text's own pieces (`</s>` last) where they line up with the
        // ids (a piece missing from vocab.json is `<unk>` as an id but keeps its text here).
        let mut pieces = self.tokenizer.pieces(text)?;
        pieces.push(map.source.last().cloned().unwrap_or_default());
        if pieces.len() == ids.len() {
            map.source = pieces;
        }
        Ok(map)
    }

    /// Where `hypothesis` (generated from `source_ids`) looked: the encoder-decoder attention
    /// of decoder `layer` (default: the last) over the source pieces (`</s>` last), per head,
    /// one row per generated token, from a teacher-forced pass over the hypothesis (what
    /// [`AttentionMap::alignment`] turns into word alignments).
    pub fn attention_map(
        &self,
        source_ids: &[u32],
        hypothesis: &Hypothesis,
        layer: Option<usize>,
    ) -> candle::Result<AttentionMap> {
        attention_map(&self.model, source_ids, hypothesis, layer, |id| {
            self.tokenizer
                .id_to_token(id)
                .map_or_else(|| format!("<{id}>"), str::to_string)
        })
    }
}
