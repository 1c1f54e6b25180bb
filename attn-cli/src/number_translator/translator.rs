//! Loading a trained model directory and translating with it.

use super::model::{Seq2Seq, Seq2SeqConfig};
use super::numbers::parse_english;
use super::tokenizer::{EnglishTokenizer, GermanTokenizer, Vocab, BOS};
use super::train::ModelFiles;
use candle::{DType, Device, Tensor};
use candle_attention::explain::{AttentionMap, TeacherForcing};
use candle_attention::TensorFile;
use std::path::Path;

/// The longest output the search may produce, in German morphemes (the longest translation of
/// `0..=999_999` has 16).
pub const MAX_OUTPUT_TOKENS: usize = 40;

/// Texts decoded together at most by [`Translator::translate`]; longer lists are split.
pub const MAX_BATCH: usize = 256;

/// A trained English → German number translator: model, config and both vocabularies.
pub struct Translator {
    model: Seq2Seq,
    english: EnglishTokenizer,
    german: GermanTokenizer,
    device: Device,
}

impl Translator {
    /// Loads `dir`: `model.safetensors`, `config.json`, `vocab.en.json`, `vocab.de.json` (what
    /// `attn train` writes and `weights/` ships). Errors name the missing or broken file.
    pub fn load(dir: impl AsRef<Path>, device: &Device) -> candle::Result<Self> {
        let dir = dir.as_ref();
        let cfg = Seq2SeqConfig::load(dir.join(ModelFiles::CONFIG))?;
        let english = EnglishTokenizer::load(dir.join(ModelFiles::SRC_VOCAB))?;
        let german = GermanTokenizer::load(dir.join(ModelFiles::TGT_VOCAB))?;
        let weights = TensorFile::open(dir.join(ModelFiles::WEIGHTS))?;
        Self::assemble(
            cfg,
            english,
            german,
            &weights,
            &dir.display().to_string(),
            device,
        )
    }

    /// Builds a translator from a model directory's four files held in memory (for a model
    /// embedded in a binary with `include_str!`/`include_bytes!`): `config` is `config.json`,
    /// `src_vocab` and `tgt_vocab` the `vocab.en.json` and `vocab.de.json` texts, `weights` the
    /// `model.safetensors` (e.g. [`TensorFile::from_static`]). `origin` names the model in
    /// errors.
    pub fn from_parts(
        config: &str,
        src_vocab: &str,
        tgt_vocab: &str,
        weights: &TensorFile,
        origin: &str,
        device: &Device,
    ) -> candle::Result<Self> {
        let cfg: Seq2SeqConfig = serde_json::from_str(config).map_err(|e| {
            candle::Error::Msg(format!(
                "{origin}: {} is not a valid Seq2Seq config: {e}",
                ModelFiles::CONFIG
            ))
        })?;
        let vocab = |json: &str, file: &str| {
            Vocab::from_json(json).map_err(|e| candle::Error::Msg(format!("{origin}: {file}: {e}")))
        };
        let english = EnglishTokenizer::from_vocab(vocab(src_vocab, ModelFiles::SRC_VOCAB)?)?;
        let german = GermanTokenizer::from_vocab(vocab(tgt_vocab, ModelFiles::TGT_VOCAB)?)?;
        Self::assemble(cfg, english, german, weights, origin, device)
    }

    /// Checks that the vocabularies fit the config and loads the model.
    fn assemble(
        cfg: Seq2SeqConfig,
        english: EnglishTokenizer,
        german: GermanTokenizer,
        weights: &TensorFile,
        origin: &str,
        device: &Device,
    ) -> candle::Result<Self> {
        if english.vocab().len() != cfg.src_vocab_size || german.vocab().len() != cfg.tgt_vocab_size
        {
            candle::bail!(
                "{origin}: the vocabularies ({} English, {} German tokens) do not match config.json ({} and {})",
                english.vocab().len(),
                german.vocab().len(),
                cfg.src_vocab_size,
                cfg.tgt_vocab_size
            )
        }
        let model = Seq2Seq::load(cfg, weights.var_builder(DType::F32, device))?;
        Ok(Self {
            model,
            english,
            german,
            device: device.clone(),
        })
    }

    /// The model.
    pub fn model(&self) -> &Seq2Seq {
        &self.model
    }

    /// The device the model runs on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Translates each text (English number words, num2words' form or the American one without
    /// "and" and commas, any case). Valid texts are translated together in batches of at
    /// most [`MAX_BATCH`]; each invalid one (empty, an unknown or misplaced word, out of
    /// `0..=999_999`) gets its own error instead of a made-up answer. `beam` 1 is greedy.
    pub fn translate(
        &self,
        texts: &[&str],
        beam: usize,
    ) -> candle::Result<Vec<candle::Result<String>>> {
        let encoded: Vec<candle::Result<Vec<u32>>> = texts.iter().map(|t| self.encode(t)).collect();
        let valid: Vec<&Vec<u32>> = encoded.iter().filter_map(|e| e.as_ref().ok()).collect();
        // Batches of at most MAX_BATCH keep memory flat however many lines arrive.
        let mut outputs = Vec::with_capacity(valid.len());
        for batch in valid.chunks(MAX_BATCH) {
            outputs.extend(self.generate(batch, beam)?);
        }
        let mut outputs = outputs.into_iter();
        Ok(encoded
            .into_iter()
            .map(|e| match e {
                Ok(_) => outputs
                    .next()
                    .unwrap_or_else(|| Err(candle::Error::Msg("missing output".into()))),
                Err(err) => Err(err),
            })
            .collect())
    }

    fn encode(&self, text: &str) -> candle::Result<Vec<u32>> {
        if text.trim().is_empty() {
            candle::bail!(
                "empty input: type a number in English words, e.g. \"three hundred and forty-two\""
            )
        }
        parse_english(text)?;
        self.english.encode(text)
    }

    fn generate(
        &self,
        sources: &[&Vec<u32>],
        beam: usize,
    ) -> candle::Result<Vec<candle::Result<String>>> {
        let src = pad_rows(sources, self.model.config().pad_id, &self.device)?;
        let hyps = self.model.generate(&src, MAX_OUTPUT_TOKENS, beam, 1.0)?;
        Ok(hyps
            .into_iter()
            .map(|h| {
                if !h.ended_with_eos {
                    candle::bail!(
                        "the model did not finish a translation within {MAX_OUTPUT_TOKENS} tokens"
                    )
                }
                self.german.decode(h.generated())
            })
            .collect())
    }

    /// Translates `text` greedily and returns where each output token looked: the
    /// cross-attention of decoder `layer` (default: the last), per head.
    pub fn attention(
        &self,
        text: &str,
        layer: Option<usize>,
        beam: usize,
    ) -> candle::Result<AttentionMap> {
        let src_ids = self.encode(text)?;
        let src = pad_rows(&[&src_ids], self.model.config().pad_id, &self.device)?;
        let hyp = self
            .model
            .generate(&src, MAX_OUTPUT_TOKENS, beam, 1.0)?
            .remove(0);
        let mut tgt_ids = vec![BOS];
        tgt_ids.extend(hyp.generated());
        let mut output: Vec<String> = hyp
            .generated()
            .iter()
            .map(|&id| self.german_token(id))
            .collect();
        if hyp.ended_with_eos {
            output.push("</s>".to_string());
        } else {
            tgt_ids.pop();
        }
        let tgt = Tensor::new(tgt_ids.as_slice(), &self.device)?.unsqueeze(0)?;
        let all = self.model.cross_attention(&src, &tgt)?;
        let num_layers = all.len();
        let layer = layer.unwrap_or(num_layers - 1);
        let weights = all.get(layer).ok_or_else(|| {
            candle::Error::Msg(format!("layer {layer} does not exist: the model has {num_layers} decoder layers (0..{num_layers})"))
        })?;
        let weights: Vec<Vec<Vec<f32>>> = weights.squeeze(0)?.to_dtype(DType::F32)?.to_vec3()?;
        let source = self.english.tokens(text)?;
        Ok(AttentionMap {
            source,
            output,
            weights,
            layer,
            num_layers,
        })
    }

    /// Tokenizes `text` and translates it greedily: the inputs of a teacher-forced pass over
    /// the model's own translation. Errors as [`Translator::translate`] does for a text it
    /// cannot take, and when the model does not finish within [`MAX_OUTPUT_TOKENS`].
    pub fn teacher_forcing(&self, text: &str) -> candle::Result<TeacherForcing> {
        let source_ids = self.encode(text)?;
        let src = pad_rows(&[&source_ids], self.model.config().pad_id, &self.device)?;
        let hyp = self
            .model
            .generate(&src, MAX_OUTPUT_TOKENS, 1, 1.0)?
            .remove(0);
        if !hyp.ended_with_eos {
            candle::bail!(
                "the model did not finish a translation of {text:?} within {MAX_OUTPUT_TOKENS} tokens"
            )
        }
        let mut decoder_ids = vec![self.model.config().bos_id];
        decoder_ids.extend(hyp.generated());
        Ok(TeacherForcing {
            source_tokens: self.english.tokens(text)?,
            source_ids,
            decoder_tokens: decoder_ids
                .iter()
                .map(|&id| self.german_token(id))
                .collect(),
            decoder_ids,
            translation: self.german.decode(hyp.generated())?,
        })
    }

    fn german_token(&self, id: u32) -> String {
        self.german.vocab().token(id).unwrap_or("<unk>").to_string()
    }
}

/// Right-pads id rows into a `(rows, max_len)` `U32` tensor.
fn pad_rows(rows: &[&Vec<u32>], pad: u32, device: &Device) -> candle::Result<Tensor> {
    let len = rows.iter().map(|r| r.len()).max().unwrap_or(0);
    let flat: Vec<u32> = rows
        .iter()
        .flat_map(|r| r.iter().copied().chain(std::iter::repeat(pad)).take(len))
        .collect();
    Tensor::from_vec(flat, (rows.len(), len), device)
}
