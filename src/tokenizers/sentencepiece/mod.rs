//! SentencePiece in pure Rust, exactly as the `sentencepiece` 0.2 library segments and decodes:
//! [`SentencePieceModel`] (load, encode, decode, as `sentencepiece_processor.cc` and
//! `model_interface.cc` do it), on the model file's protobuf ([`model_proto`]), its normaliser
//! (`normalizer.rs`, driven by the model's own `precompiled_charsmap` through a double-array
//! trie, `darts.rs`) and the two segmenters the model type selects: unigram (`unigram.rs`,
//! Marian's and mBART-50's files) and BPE (`bpe.rs`, NLLB-200's and M2M100's).

mod bpe;
pub(crate) mod darts;
pub mod model_proto;
mod normalizer;
mod trie;
mod unigram;

pub use model_proto::PieceType;

pub(crate) use normalizer::SPACE_SYMBOL;

use bpe::Bpe;
use candle::{Error, Result};
use model_proto::ModelProto;
use normalizer::Normalizer;
use std::collections::HashMap;
use std::path::Path;
use unigram::Unigram;

/// What sentencepiece decodes `<unk>` to unless the model says otherwise.
const DEFAULT_UNK_SURFACE: &str = " \u{2047} ";

/// A sentencepiece model (`.spm` / `.model` file), with sentencepiece's normaliser, segmenter
/// and decoder, giving exactly what the `sentencepiece` Python package gives. The file's
/// `trainer_spec.model_type` chooses the segmenter, whatever the file is called: unigram
/// (Viterbi over the pieces' log-probabilities; MarianMT's `source.spm`, mBART-50's
/// `sentencepiece.bpe.model`) or BPE (merges by piece score; NLLB-200's and M2M100's
/// `sentencepiece.bpe.model`). Word and char models are refused.
///
/// ```
/// use candle_attention::tokenizers::SentencePieceModel;
/// # fn main() -> candle::Result<()> {
/// # let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/marian_tokenizer/en-de");
/// // e.g. "opus-mt-en-de/source.spm"
/// let sp = SentencePieceModel::from_file(format!("{dir}/source.spm"))?;
/// let pieces = sp.encode_pieces("I am a small frog.")?;
/// assert_eq!(pieces, ["▁I", "▁am", "▁a", "▁s", "m", "all", "▁fro", "g", "."]);
/// let ids = sp.encode_ids("I am a small frog.")?;
/// assert_eq!(sp.decode_pieces(&pieces), "I am a small frog.");
/// assert_eq!(sp.decode_ids(&ids)?, "I am a small frog.");
/// # Ok(()) }
/// ```
///
/// A BPE model loads and runs the same way:
///
/// ```
/// use candle_attention::tokenizers::{SentencePieceModel, SentencePieceType};
/// # fn main() -> candle::Result<()> {
/// # let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/spm_bpe");
/// // e.g. "nllb-200-distilled-600M/sentencepiece.bpe.model"
/// let sp = SentencePieceModel::from_file(format!("{dir}/plain.model"))?;
/// assert_eq!(sp.model_type(), SentencePieceType::Bpe);
/// let pieces = sp.encode_pieces("Der Bär ist müde. السلام عليكم")?;
/// assert_eq!(pieces, ["▁D", "er", "▁Bär", "▁ist", "▁müde", ".", "▁السلام", "▁عليكم"]);
/// let ids = sp.encode_ids("Москва, спасибо!")?;
/// assert_eq!(sp.decode_ids(&ids)?, "Москва, спасибо!");
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct SentencePieceModel {
    proto: ModelProto,
    normalizer: Normalizer,
    denormalizer: Option<Normalizer>,
    segmenter: Segmenter,
    /// Control, unknown and byte pieces (looked up before the others, as `reserved_id_map_`).
    reserved: HashMap<String, u32>,
    unk_id: u32,
}

impl SentencePieceModel {
    /// Loads a model file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let bytes = std::fs::read(path)
            .map_err(|e| Error::Msg(format!("cannot read {}: {e}", path.display())))?;
        Self::from_bytes(&bytes).map_err(|e| Error::Msg(format!("{}: {e}", path.display())))
    }

    /// Loads a serialized `ModelProto`, with sentencepiece's checks on the pieces.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let proto = ModelProto::parse(bytes)?;
        Self::from_proto(proto)
    }

    /// Builds the model from a parsed `ModelProto`.
    pub fn from_proto(proto: ModelProto) -> Result<Self> {
        let model_type = SentencePieceType::from_proto(proto.trainer_spec.model_type)?;
        if proto.pieces.is_empty() {
            return Err(Error::Msg(
                "sentencepiece model has no pieces (empty or not a sentencepiece file)".into(),
            ));
        }
        let mut reserved = HashMap::new();
        let mut normal = HashMap::new();
        let mut unk_id = None;
        let mut user_defined = Vec::new();
        let mut bytes_found = [false; 256];
        for (i, p) in proto.pieces.iter().enumerate() {
            let id = i as u32;
            if p.piece.is_empty() {
                return Err(Error::Msg(format!("sentencepiece piece {i} is empty")));
            }
            let is_normal = matches!(
                p.kind,
                PieceType::Normal | PieceType::UserDefined | PieceType::Unused
            );
            let map = if is_normal {
                &mut normal
            } else {
                &mut reserved
            };
            if map.insert(p.piece.clone(), id).is_some() {
                return Err(Error::Msg(format!(
                    "sentencepiece piece {:?} is defined twice",
                    p.piece
                )));
            }
            match p.kind {
                PieceType::UserDefined => user_defined.push(p.piece.clone()),
                PieceType::Unknown => {
                    if unk_id.is_some() {
                        return Err(Error::Msg(
                            "sentencepiece model defines more than one unknown piece".into(),
                        ));
                    }
                    unk_id = Some(id);
                }
                PieceType::Byte => {
                    if !proto.trainer_spec.byte_fallback {
                        return Err(Error::Msg(format!(
                            "byte piece {} found although byte_fallback is false",
                            p.piece
                        )));
                    }
                    let b = piece_to_byte(&p.piece)
                        .ok_or_else(|| Error::Msg(format!("byte piece {} is invalid", p.piece)))?;
                    bytes_found[b as usize] = true;
                }
                _ => {}
            }
        }
        let unk_id = unk_id
            .ok_or_else(|| Error::Msg("sentencepiece model has no unknown piece (<unk>)".into()))?;
        if proto.trainer_spec.byte_fallback && bytes_found.iter().any(|f| !f) {
            return Err(Error::Msg(
                "byte_fallback is true but the model does not have all 256 byte pieces".into(),
            ));
        }
        let normalizer = Normalizer::new(
            &proto.normalizer_spec,
            proto.trainer_spec.treat_whitespace_as_suffix,
            user_defined,
        )?;
        let denormalizer = match &proto.denormalizer_spec {
            Some(spec) if !spec.precompiled_charsmap.is_empty() => {
                Some(Normalizer::new(spec, false, Vec::new())?)
            }
            _ => None,
        };
        let segmenter = match model_type {
            SentencePieceType::Unigram => Segmenter::Unigram(Unigram::new(&proto.pieces, unk_id)),
            SentencePieceType::Bpe => Segmenter::Bpe(Bpe::new(&proto.pieces, unk_id)),
        };
        Ok(Self {
            proto,
            normalizer,
            denormalizer,
            segmenter,
            reserved,
            unk_id,
        })
    }

    /// The parsed model file.
    pub fn proto(&self) -> &ModelProto {
        &self.proto
    }

    /// The segmentation algorithm (the file's `trainer_spec.model_type`).
    pub fn model_type(&self) -> SentencePieceType {
        match self.segmenter {
            Segmenter::Unigram(_) => SentencePieceType::Unigram,
            Segmenter::Bpe(_) => SentencePieceType::Bpe,
        }
    }

    /// Number of pieces (`GetPieceSize`); ids are `0..piece_size()`.
    pub fn piece_size(&self) -> usize {
        self.proto.pieces.len()
    }

    /// Id of the unknown piece.
    pub fn unk_id(&self) -> u32 {
        self.unk_id
    }

    /// The piece of `id`, or `None` when out of range (`IdToPiece`).
    pub fn id_to_piece(&self, id: u32) -> Option<&str> {
        self.proto.pieces.get(id as usize).map(|p| p.piece.as_str())
    }

    /// The type of piece `id`, or `None` when out of range.
    pub fn piece_type(&self, id: u32) -> Option<PieceType> {
        self.proto.pieces.get(id as usize).map(|p| p.kind)
    }

    /// The id of `piece`; the unknown id for a piece the model does not have (`PieceToId`).
    pub fn piece_to_id(&self, piece: &str) -> u32 {
        if let Some(&id) = self.reserved.get(piece) {
            return id;
        }
        let id = match &self.segmenter {
            Segmenter::Unigram(u) => u.lookup(piece),
            Segmenter::Bpe(b) => b.lookup(piece),
        };
        id.unwrap_or(self.unk_id)
    }

    fn is(&self, id: u32, kind: PieceType) -> bool {
        self.piece_type(id) == Some(kind)
    }

    /// The text after the model's normaliser (`▁` for spaces, with the dummy prefix).
    pub fn normalize(&self, text: &str) -> Result<String> {
        self.normalizer.normalize(text)
    }

    /// Segments `text` into `(piece, id)` pairs, as `SentencePieceProcessor::Encode`: runs of
    /// unknown characters come out as one piece (the run's text) with the unknown id, or as
    /// `<0xXX>` byte pieces when the model has byte fallback.
    pub fn encode(&self, text: &str) -> Result<Vec<(String, u32)>> {
        let normalized = self.normalizer.normalize(text)?;
        let segments = match &self.segmenter {
            Segmenter::Unigram(u) => u.encode(&normalized),
            Segmenter::Bpe(b) => b.encode(&normalized),
        };
        let mut out: Vec<(String, u32)> = Vec::new();
        let mut is_prev_unk = false;
        for (start, end, id) in segments {
            let w = &normalized[start..end];
            let is_unk = id == self.unk_id;
            if is_unk && self.proto.trainer_spec.byte_fallback {
                for b in w.bytes() {
                    let piece = byte_to_piece(b);
                    let id = self.piece_to_id(&piece);
                    out.push((piece, id));
                }
            } else if is_unk && is_prev_unk {
                // Merged runs of unknowns (still unknown: no piece contains them).
                if let Some(last) = out.last_mut() {
                    last.0.push_str(w);
                }
            } else {
                out.push((w.to_string(), id));
            }
            is_prev_unk = is_unk;
        }
        Ok(out)
    }

    /// The pieces of `text` (`encode(text, out_type=str)`).
    pub fn encode_pieces(&self, text: &str) -> Result<Vec<String>> {
        Ok(self.encode(text)?.into_iter().map(|(p, _)| p).collect())
    }

    /// The ids of `text` (`encode(text)`).
    pub fn encode_ids(&self, text: &str) -> Result<Vec<u32>> {
        Ok(self.encode(text)?.into_iter().map(|(_, id)| id).collect())
    }

    /// Decodes ids (`decode(ids)`); an id outside `0..piece_size()` is an error.
    pub fn decode_ids(&self, ids: &[u32]) -> Result<String> {
        let pieces = ids
            .iter()
            .map(|&id| {
                self.id_to_piece(id).ok_or_else(|| {
                    Error::Msg(format!(
                        "invalid id {id}: the sentencepiece model has {} pieces",
                        self.piece_size()
                    ))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(self.decode_pieces(&pieces))
    }

    /// Decodes pieces (`decode_pieces(pieces)`): `▁` becomes a space, the leading one(s) of the
    /// text are dropped, control pieces vanish, `<unk>` becomes `" ⁇ "` (the model's
    /// `unk_surface`), other pieces the model lacks are copied as they are, and byte pieces are
    /// joined into UTF-8 (U+FFFD for invalid bytes).
    pub fn decode_pieces<S: AsRef<str>>(&self, pieces: &[S]) -> String {
        let spec = &self.proto.normalizer_spec;
        let unk_surface = self
            .proto
            .trainer_spec
            .unk_surface
            .as_deref()
            .unwrap_or(DEFAULT_UNK_SURFACE);
        let mut text = String::new();
        let mut byte_run: Vec<u8> = Vec::new();
        let mut is_bos_ws = true;
        let mut bos_ws_seen = false;
        for piece in pieces {
            let piece = piece.as_ref();
            let id = self.piece_to_id(piece);
            if self.is(id, PieceType::Byte) {
                byte_run.push(piece_to_byte(piece).unwrap_or(0));
                continue;
            }
            flush_bytes(&mut byte_run, &mut text);
            if bos_ws_seen || !text.is_empty() {
                is_bos_ws = false;
            }
            let decoded: String;
            (decoded, bos_ws_seen) = if self.is(id, PieceType::Control) {
                (String::new(), false)
            } else if self.is(id, PieceType::Unknown) {
                if self.id_to_piece(id) == Some(piece) {
                    (unk_surface.to_string(), false)
                } else {
                    (piece.to_string(), false)
                }
            } else {
                let mut piece = piece;
                let mut has_bos_ws = false;
                if is_bos_ws && (spec.add_dummy_prefix || spec.remove_extra_whitespaces) {
                    if let Some(rest) = piece.strip_prefix(SPACE_SYMBOL) {
                        piece = rest;
                        has_bos_ws = true;
                    }
                    if spec.remove_extra_whitespaces {
                        // All leading whitespace goes, not only the dummy prefix.
                        has_bos_ws = false;
                    }
                }
                (piece.replace(SPACE_SYMBOL, " "), has_bos_ws)
            };
            text.push_str(&decoded);
        }
        flush_bytes(&mut byte_run, &mut text);
        match &self.denormalizer {
            // The denormaliser never fails on text it produced itself; keep the text if it does.
            Some(d) => d.normalize(&text).unwrap_or(text),
            None => text,
        }
    }
}

/// The segmentation algorithm of a sentencepiece model (`TrainerSpec.model_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SentencePieceType {
    /// Unigram language model (type 1): Viterbi over the pieces' log-probabilities.
    Unigram,
    /// Byte-pair encoding (type 2): merges by piece score.
    Bpe,
}

impl SentencePieceType {
    /// The type of `model_type`; word (3), char (4) and unknown types are errors naming them.
    fn from_proto(model_type: i32) -> Result<Self> {
        let name = match model_type {
            1 => return Ok(Self::Unigram),
            2 => return Ok(Self::Bpe),
            3 => "WORD",
            4 => "CHAR",
            _ => "not a model type sentencepiece knows",
        };
        Err(Error::Msg(format!(
            "sentencepiece model type {model_type} ({name}) is not supported: only UNIGRAM (1) \
             and BPE (2) models are"
        )))
    }
}

/// The segmenter of the model's type.
#[derive(Debug, Clone)]
enum Segmenter {
    Unigram(Unigram),
    Bpe(Bpe),
}

/// `<0xXX>`, as sentencepiece's `ByteToPiece`.
fn byte_to_piece(b: u8) -> String {
    format!("<0x{b:02X}>")
}

/// The byte of a `<0xXX>` piece (upper-case hex, as sentencepiece writes them).
fn piece_to_byte(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2
        || !hex
            .bytes()
            .all(|c| c.is_ascii_digit() || (b'A'..=b'F').contains(&c))
    {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// Appends a run of byte pieces as UTF-8, one U+FFFD per byte that starts no valid character.
fn flush_bytes(run: &mut Vec<u8>, text: &mut String) {
    let mut rest: &[u8] = run;
    while !rest.is_empty() {
        let want = match rest[0] {
            0x00..=0x7f => 1,
            0xc0..=0xdf => 2,
            0xe0..=0xef => 3,
            0xf0..=0xf7 => 4,
            _ => 0,
        };
        match rest
            .get(..want)
            .filter(|_| want > 0)
            .map(std::str::from_utf8)
        {
            Some(Ok(c)) => {
                text.push_str(c);
                rest = &rest[want..];
            }
            _ => {
                text.push('\u{FFFD}');
                rest = &rest[1..];
            }
        }
    }
    run.clear();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_pieces_round_trip() {
        for b in [0u8, 0x41, 0xe2, 0xff] {
            assert_eq!(piece_to_byte(&byte_to_piece(b)), Some(b));
        }
        assert_eq!(piece_to_byte("<0xff>"), None);
        assert_eq!(piece_to_byte("<0x1>"), None);
        let mut text = String::new();
        let mut run = "é".as_bytes().to_vec();
        run.push(0xff);
        run.push(b'a');
        flush_bytes(&mut run, &mut text);
        assert_eq!(text, "é\u{FFFD}a");
    }
}
