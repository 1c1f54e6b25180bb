//! An exact, pure-Rust `transformers.MarianTokenizer` (MarianMT / opus-mt), on a pure-Rust
//! sentencepiece unigram model.
//!
//! A Hugging Face MarianMT directory holds `source.spm` and `target.spm` (sentencepiece models),
//! `vocab.json` (the model's token ids) and `tokenizer_config.json`. Encoding splits off special
//! tokens (`</s>`, `<unk>`, `<pad>` written in the text), strips a leading language code such
//! as `>>deu<<`, segments the rest with the SOURCE sentencepiece model (built from its full
//! piece list, not from `vocab.json`), maps each piece through `vocab.json` (`<unk>` for pieces
//! missing there) and appends `</s>`. Decoding maps ids back through `vocab.json`, joins the
//! pieces with sentencepiece's decoder and restores spaces, exactly as `decode` /
//! `batch_decode` of transformers 5.24 do (which decode with the source model unless the
//! directory has separate vocabularies, and then with the target model).
//!
//! Checked against transformers 5.24.0 and sentencepiece 0.2.3 on the fixtures written by
//! `tests/fixtures/make_marian_tokenizer_fixtures.py`.

use super::added_tokens::AddedTokenTrie;
use super::files::{TokenizerConfig, Vocab};
use super::sentencepiece::{SentencePieceModel, SPACE_SYMBOL};
use candle::{Device, Error, Result, Tensor};
use std::collections::{HashMap, HashSet};
use std::path::Path;

/// Padded ids of a batch, as `tokenizer(texts, padding=True)` returns them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchEncoding {
    /// `(batch, seq)` ids, right-padded with the pad id.
    pub input_ids: Vec<Vec<u32>>,
    /// `(batch, seq)`: 1 for a token, 0 for padding.
    pub attention_mask: Vec<Vec<u32>>,
}

impl BatchEncoding {
    /// The batch as two `(batch, seq)` `U32` tensors: `(input_ids, attention_mask)`.
    pub fn to_tensors(&self, device: &Device) -> Result<(Tensor, Tensor)> {
        let b = self.input_ids.len();
        let s = self.input_ids.first().map_or(0, Vec::len);
        let ids: Vec<u32> = self.input_ids.concat();
        let mask: Vec<u32> = self.attention_mask.concat();
        Ok((
            Tensor::from_vec(ids, (b, s), device)?,
            Tensor::from_vec(mask, (b, s), device)?,
        ))
    }
}

/// `transformers.MarianTokenizer`, without Python: same ids, same pieces, same decoded text.
///
/// ```
/// use candle_attention::marian::MarianTokenizer;
/// # fn main() -> candle::Result<()> {
/// # let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/marian_tokenizer/en-de");
/// let tok = MarianTokenizer::from_dir(dir)?; // e.g. "opus-mt-en-de"
/// let ids = tok.encode("I am a small frog.")?;
/// assert_eq!(ids, [41, 112, 12, 34, 68, 120, 93, 58, 4, tok.eos_id()]);
/// assert_eq!(tok.decode(&ids, true)?, "I am a small frog.");
/// assert_eq!(tok.decode(&ids, false)?, "I am a small frog.</s>");
///
/// // `tokenizer(texts, padding=True)`: (batch, seq) ids right-padded with <pad>, and the mask.
/// let batch = tok.encode_batch_padded(&["Hello!", "I am a small frog."])?;
/// assert_eq!(batch.input_ids[0].len(), batch.input_ids[1].len());
/// assert_eq!(*batch.input_ids[0].last().unwrap(), tok.pad_id());
/// assert_eq!(*batch.attention_mask[0].last().unwrap(), 0);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct MarianTokenizer {
    source: SentencePieceModel,
    target: SentencePieceModel,
    encoder: Vocab,
    target_encoder: Option<Vocab>,
    /// Id to token for decoding (`vocab.json`, or `target_vocab.json` with separate vocabs).
    decoder: HashMap<u32, String>,
    added_encoder: HashMap<String, u32>,
    added_decoder: HashMap<u32, String>,
    split_trie: AddedTokenTrie,
    all_special_tokens: Vec<String>,
    all_special_ids: HashSet<u32>,
    unk_token: String,
    unk_id: u32,
    eos_id: u32,
    pad_id: u32,
    config: TokenizerConfig,
    language_codes: Vec<String>,
}

/// Which side of the translation a text is tokenized for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Source,
    Target,
}

impl MarianTokenizer {
    /// Loads a MarianMT tokenizer directory: `source.spm`, `target.spm`, `vocab.json` (all
    /// required), `tokenizer_config.json` and `special_tokens_map.json` (optional), and
    /// `target_vocab.json` when the config sets `separate_vocabs`.
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        let missing: Vec<&str> = ["source.spm", "target.spm", "vocab.json"]
            .into_iter()
            .filter(|f| !dir.join(f).is_file())
            .collect();
        if !missing.is_empty() {
            return Err(Error::Msg(format!(
                "{} is not a MarianMT tokenizer directory: missing {}",
                dir.display(),
                missing.join(", ")
            )));
        }
        let config = TokenizerConfig::from_dir(dir)?;
        let source = SentencePieceModel::from_file(dir.join("source.spm"))?;
        let target = SentencePieceModel::from_file(dir.join("target.spm"))?;
        let encoder = Vocab::from_file(&dir.join("vocab.json"))?;
        let target_encoder = if config.separate_vocabs {
            let path = dir.join("target_vocab.json");
            if !path.is_file() {
                return Err(Error::Msg(format!(
                    "{}: tokenizer_config.json sets separate_vocabs but target_vocab.json is missing",
                    dir.display()
                )));
            }
            Some(Vocab::from_file(&path)?)
        } else {
            None
        };
        Self::new(source, target, encoder, target_encoder, config)
    }

    fn new(
        source: SentencePieceModel,
        target: SentencePieceModel,
        encoder: Vocab,
        target_encoder: Option<Vocab>,
        config: TokenizerConfig,
    ) -> Result<Self> {
        let unk_token = config.named("unk_token").unwrap_or("<unk>").to_string();
        if !encoder.map.contains_key(&unk_token) {
            return Err(Error::Msg(format!(
                "vocab.json has no unknown token {unk_token:?} (transformers requires it)"
            )));
        }
        if let Some(t) = &target_encoder {
            if !t.map.contains_key(&unk_token) {
                return Err(Error::Msg(format!(
                    "target_vocab.json has no unknown token {unk_token:?}"
                )));
            }
        }
        let decoder = target_encoder.as_ref().unwrap_or(&encoder).inverse();
        // Added tokens: those of the config, then every special token not among them, with its
        // vocab.json id or, when vocab.json lacks it, the next free id (`_add_tokens`).
        let mut added_encoder: HashMap<String, u32> = HashMap::new();
        let mut added_decoder: HashMap<u32, String> = HashMap::new();
        for t in &config.added_tokens {
            added_encoder.insert(t.content.clone(), t.id);
            added_decoder.insert(t.id, t.content.clone());
        }
        let all_special_tokens = config.all_special_tokens();
        let mut extra_special: Vec<String> = config
            .added_tokens
            .iter()
            .filter(|t| t.special && !all_special_tokens.contains(&t.content))
            .map(|t| t.content.clone())
            .collect();
        let to_add: Vec<&String> = all_special_tokens
            .iter()
            .filter(|t| !added_encoder.contains_key(*t))
            .collect();
        if !to_add.is_empty() {
            let mut current: HashMap<&str, u32> =
                encoder.map.iter().map(|(k, &v)| (k.as_str(), v)).collect();
            for (k, &v) in &added_encoder {
                current.insert(k.as_str(), v);
            }
            let new_idx = current.len() as u32;
            let mut added = 0;
            let mut assigned = Vec::new();
            for t in to_add {
                let id = match current.get(t.as_str()) {
                    Some(&id) => id,
                    None => {
                        added += 1;
                        new_idx + added - 1
                    }
                };
                assigned.push((t.clone(), id));
            }
            for (t, id) in assigned {
                added_encoder.insert(t.clone(), id);
                added_decoder.insert(id, t);
            }
        }
        let mut all_special = all_special_tokens;
        all_special.append(&mut extra_special);
        let token_id = |t: &str| -> u32 {
            added_encoder
                .get(t)
                .or_else(|| encoder.map.get(t))
                .copied()
                .unwrap_or(encoder.map[&unk_token])
        };
        let all_special_ids = all_special.iter().map(|t| token_id(t)).collect();
        let unk_id = token_id(&unk_token);
        let eos_token = config.named("eos_token").unwrap_or("</s>");
        let pad_token = config.named("pad_token").unwrap_or("<pad>");
        let eos_id = token_id(eos_token);
        let pad_id = token_id(pad_token);
        let mut split_tokens: Vec<&str> = added_encoder.keys().map(String::as_str).collect();
        split_tokens.sort_unstable();
        let split_trie = AddedTokenTrie::new(split_tokens);
        let language_codes = if config.separate_vocabs {
            Vec::new()
        } else {
            encoder
                .order
                .iter()
                .filter(|k| k.starts_with(">>") && k.ends_with("<<"))
                .cloned()
                .collect()
        };
        Ok(Self {
            source,
            target,
            encoder,
            target_encoder,
            decoder,
            added_encoder,
            added_decoder,
            split_trie,
            all_special_tokens: all_special,
            all_special_ids,
            unk_token,
            unk_id,
            eos_id,
            pad_id,
            config,
            language_codes,
        })
    }

    /// The source-side sentencepiece model (`source.spm`).
    pub fn source_spm(&self) -> &SentencePieceModel {
        &self.source
    }

    /// The target-side sentencepiece model (`target.spm`).
    pub fn target_spm(&self) -> &SentencePieceModel {
        &self.target
    }

    /// The settings read from `tokenizer_config.json`.
    pub fn config(&self) -> &TokenizerConfig {
        &self.config
    }

    /// Number of entries of `vocab.json` (`tokenizer.vocab_size`).
    pub fn vocab_size(&self) -> usize {
        self.encoder.len()
    }

    /// Id of `<pad>`.
    pub fn pad_id(&self) -> u32 {
        self.pad_id
    }

    /// Id of `</s>` (appended to every encoding).
    pub fn eos_id(&self) -> u32 {
        self.eos_id
    }

    /// Id of `<unk>` (pieces missing from `vocab.json`).
    pub fn unk_id(&self) -> u32 {
        self.unk_id
    }

    /// The special tokens (`all_special_tokens`): skipped by `decode(.., true)`.
    pub fn special_tokens(&self) -> &[String] {
        &self.all_special_tokens
    }

    /// The language codes of a multilingual model (`>>deu<<`, ...): the `vocab.json` entries
    /// that start with `>>` and end with `<<` (`supported_language_codes`).
    pub fn language_codes(&self) -> &[String] {
        &self.language_codes
    }

    /// The id of `token` (special tokens, then `vocab.json`), `None` if neither has it.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.added_encoder
            .get(token)
            .or_else(|| self.encoder.map.get(token))
            .copied()
    }

    /// The token of `id` as decoding sees it: special tokens, then `vocab.json` (or
    /// `target_vocab.json`), then the decoding sentencepiece model's piece; `None` if no one
    /// has the id.
    pub fn id_to_token(&self, id: u32) -> Option<&str> {
        self.added_decoder
            .get(&id)
            .or_else(|| self.decoder.get(&id))
            .map(String::as_str)
            .or_else(|| self.decode_spm().id_to_piece(id))
    }

    /// Checks `vocab.json` against the model's vocabulary size (`config.vocab_size`, the rows
    /// of the embedding): they must be equal and every id used must be below it.
    pub fn check_model_vocab_size(&self, model_vocab_size: usize) -> Result<()> {
        let max_id = self
            .encoder
            .map
            .values()
            .chain(self.added_encoder.values())
            .copied()
            .max()
            .unwrap_or(0) as usize;
        if self.vocab_size() != model_vocab_size || max_id >= model_vocab_size {
            return Err(Error::Msg(format!(
                "vocab.json has {} tokens (ids up to {max_id}) but the model's vocabulary size \
                 is {model_vocab_size}: the tokenizer and the model do not belong together",
                self.vocab_size()
            )));
        }
        Ok(())
    }

    /// The sentencepiece model decoding uses: source unless the vocabularies are separate
    /// (transformers 5's `use_source_tokenizer` default, `not separate_vocabs`).
    fn decode_spm(&self) -> &SentencePieceModel {
        if self.config.separate_vocabs {
            &self.target
        } else {
            &self.source
        }
    }

    /// The tokens of `text` (`tokenizer.tokenize(text)`): special tokens kept whole, a leading
    /// language code `>>xx<<` kept as one token, the rest sentencepiece pieces.
    pub fn pieces(&self, text: &str) -> Result<Vec<String>> {
        self.tokenize(text, Side::Source)
    }

    fn tokenize(&self, text: &str, side: Side) -> Result<Vec<String>> {
        let spm = match side {
            Side::Source => &self.source,
            Side::Target => &self.target,
        };
        let mut out = Vec::new();
        for segment in self.split_trie.split(text) {
            if self.added_encoder.contains_key(segment)
                || self.all_special_tokens.iter().any(|t| t == segment)
            {
                out.push(segment.to_string());
                continue;
            }
            // `remove_language_code`: `>>` at the start up to the first `<<`.
            let mut rest = segment;
            if segment.starts_with(">>") {
                if let Some(end) = segment.find("<<") {
                    out.push(segment[..end + 2].to_string());
                    rest = &segment[end + 2..];
                }
            }
            out.extend(spm.encode_pieces(rest)?);
        }
        Ok(out)
    }

    fn tokens_to_ids(&self, tokens: &[String], side: Side) -> Vec<u32> {
        let vocab = match (side, &self.target_encoder) {
            (Side::Target, Some(t)) => t,
            _ => &self.encoder,
        };
        let unk = vocab.map[&self.unk_token];
        tokens
            .iter()
            .map(|t| {
                self.added_encoder
                    .get(t)
                    .or_else(|| vocab.map.get(t))
                    .copied()
                    .unwrap_or(unk)
            })
            .chain(std::iter::once(self.eos_id))
            .collect()
    }

    /// The model input ids of a source text, ending with `</s>` (`tokenizer(text).input_ids`).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        Ok(self.tokens_to_ids(&self.tokenize(text, Side::Source)?, Side::Source))
    }

    /// The label ids of a target text, ending with `</s>`
    /// (`tokenizer(text_target=text).input_ids`): target sentencepiece model, and
    /// `target_vocab.json` when the vocabularies are separate.
    pub fn encode_target(&self, text: &str) -> Result<Vec<u32>> {
        Ok(self.tokens_to_ids(&self.tokenize(text, Side::Target)?, Side::Target))
    }

    /// [`encode`](Self::encode) of every text, unpadded.
    pub fn encode_batch<S: AsRef<str>>(&self, texts: &[S]) -> Result<Vec<Vec<u32>>> {
        texts.iter().map(|t| self.encode(t.as_ref())).collect()
    }

    /// Encodes a batch and right-pads it with the pad id to the longest sequence, as
    /// `tokenizer(texts, padding=True)`.
    pub fn encode_batch_padded<S: AsRef<str>>(&self, texts: &[S]) -> Result<BatchEncoding> {
        Ok(self.pad(self.encode_batch(texts)?))
    }

    /// Right-pads id sequences with the pad id; the mask is 1 for tokens and 0 for padding.
    pub fn pad(&self, sequences: Vec<Vec<u32>>) -> BatchEncoding {
        let len = sequences.iter().map(Vec::len).max().unwrap_or(0);
        let attention_mask = sequences
            .iter()
            .map(|s| {
                let mut m = vec![1u32; s.len()];
                m.resize(len, 0);
                m
            })
            .collect();
        let input_ids = sequences
            .into_iter()
            .map(|mut s| {
                s.resize(len, self.pad_id);
                s
            })
            .collect();
        BatchEncoding {
            input_ids,
            attention_mask,
        }
    }

    /// Decodes ids to text, as `tokenizer.decode(ids, skip_special_tokens=...)`. With
    /// `skip_special_tokens`, `</s>`, `<pad>` and `<unk>` are dropped; without, they are written
    /// out followed by a space. An id that neither the vocabulary nor the decoding
    /// sentencepiece model knows is an error (transformers raises too).
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        let spm = self.decode_spm();
        let mut tokens: Vec<&str> = Vec::with_capacity(ids.len());
        for &id in ids {
            if skip_special_tokens && self.all_special_ids.contains(&id) {
                continue;
            }
            let t = self.id_to_token(id).ok_or_else(|| {
                Error::Msg(format!(
                    "cannot decode id {id}: it is not in the vocabulary ({} tokens) nor in the \
                     sentencepiece model ({} pieces)",
                    self.decoder.len(),
                    spm.piece_size()
                ))
            })?;
            tokens.push(t);
        }
        // `convert_tokens_to_string`: special tokens are written as they are, the pieces
        // between them go through sentencepiece's decoder.
        let mut out = String::new();
        let mut run: Vec<&str> = Vec::new();
        for t in tokens {
            if self.all_special_tokens.iter().any(|s| s == t) {
                out.push_str(&spm.decode_pieces(&run));
                out.push_str(t);
                out.push(' ');
                run.clear();
            } else {
                run.push(t);
            }
        }
        out.push_str(&spm.decode_pieces(&run));
        let out = out.replace(SPACE_SYMBOL, " ");
        let mut out = py_strip(&out).to_string();
        if self.config.clean_up_tokenization_spaces {
            out = clean_up_tokenization(&out);
        }
        Ok(out)
    }

    /// [`decode`](Self::decode) of every sequence (`batch_decode`).
    pub fn decode_batch<S: AsRef<[u32]>>(
        &self,
        sequences: &[S],
        skip_special_tokens: bool,
    ) -> Result<Vec<String>> {
        sequences
            .iter()
            .map(|s| self.decode(s.as_ref(), skip_special_tokens))
            .collect()
    }
}

/// Python's `str.strip()`: Unicode White_Space plus the separators U+001C..U+001F.
pub(crate) fn py_strip(s: &str) -> &str {
    s.trim_matches(|c: char| c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c))
}

/// transformers' `clean_up_tokenization` (used when the config asks for it).
pub(crate) fn clean_up_tokenization(s: &str) -> String {
    s.replace(" .", ".")
        .replace(" ?", "?")
        .replace(" !", "!")
        .replace(" ,", ",")
        .replace(" ' ", "'")
        .replace(" n't", "n't")
        .replace(" 'm", "'m")
        .replace(" 's", "'s")
        .replace(" 've", "'ve")
        .replace(" 're", "'re")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strip_matches_python() {
        assert_eq!(py_strip("\u{1f} a \u{3000}\u{85}"), "a");
        assert_eq!(py_strip("\u{200b}a"), "\u{200b}a");
        assert_eq!(clean_up_tokenization("a , b ."), "a, b.");
    }
}
