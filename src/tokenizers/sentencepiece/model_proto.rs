//! A minimal reader of sentencepiece's `ModelProto` (the `.spm` / `.model` file).
//!
//! Only the fields the encoder and decoder need are kept; every other field is skipped by its
//! wire type, so models written by any sentencepiece version load. Field numbers follow
//! `sentencepiece_model.proto`.

use candle::{Error, Result};

/// The type of a piece (`ModelProto.SentencePiece.Type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PieceType {
    /// A normal piece, found by the segmenter.
    Normal,
    /// The unknown piece (`<unk>`); exactly one per model.
    Unknown,
    /// A control symbol (`<s>`, `</s>`): never produced from text, decodes to nothing.
    Control,
    /// A user-defined symbol: matched verbatim in the input, before normalisation.
    UserDefined,
    /// An unused piece: in the vocabulary but not produced (unigram skips it; BPE merges
    /// through it and splits it back, see `bpe.rs`).
    Unused,
    /// A byte piece `<0xXX>` (byte fallback).
    Byte,
}

impl PieceType {
    fn from_proto(v: u64) -> Result<Self> {
        Ok(match v {
            1 => Self::Normal,
            2 => Self::Unknown,
            3 => Self::Control,
            4 => Self::UserDefined,
            5 => Self::Unused,
            6 => Self::Byte,
            _ => return Err(Error::Msg(format!("unknown sentencepiece piece type {v}"))),
        })
    }
}

/// One entry of `ModelProto.pieces`.
#[derive(Debug, Clone, PartialEq)]
pub struct Piece {
    /// The piece text (whitespace escaped as `▁`).
    pub piece: String,
    /// Its log-probability (unigram) or merge rank (BPE).
    pub score: f32,
    /// Its type.
    pub kind: PieceType,
}

/// The parts of `TrainerSpec` the tokenizer needs.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainerSpec {
    /// 1 = unigram, 2 = BPE, 3 = word, 4 = char.
    pub model_type: i32,
    /// Whether unknown characters are split into `<0xXX>` byte pieces.
    pub byte_fallback: bool,
    /// `treat_whitespace_as_suffix`: the dummy whitespace goes after the text.
    pub treat_whitespace_as_suffix: bool,
    /// Id of `<unk>` as trained (the pieces' types are authoritative).
    pub unk_id: i32,
    /// Id of `<s>` (-1: none).
    pub bos_id: i32,
    /// Id of `</s>` (-1: none).
    pub eos_id: i32,
    /// Id of `<pad>` (-1: none).
    pub pad_id: i32,
    /// What `<unk>` decodes to; sentencepiece's default is `" ⁇ "`.
    pub unk_surface: Option<String>,
}

impl Default for TrainerSpec {
    fn default() -> Self {
        // The proto defaults.
        Self {
            model_type: 1,
            byte_fallback: false,
            treat_whitespace_as_suffix: false,
            unk_id: 0,
            bos_id: 1,
            eos_id: 2,
            pad_id: -1,
            unk_surface: None,
        }
    }
}

/// `NormalizerSpec` (also used for the denormaliser).
#[derive(Debug, Clone, PartialEq)]
pub struct NormalizerSpec {
    /// Rule name, e.g. `nmt_nfkc`, `nmt_nfkc_cf`, `identity`.
    pub name: String,
    /// The compiled rule: `<u32 trie size><double-array trie><NUL-separated replacements>`.
    pub precompiled_charsmap: Vec<u8>,
    /// Add a `▁` before the text.
    pub add_dummy_prefix: bool,
    /// Drop leading and trailing whitespace and collapse runs of it.
    pub remove_extra_whitespaces: bool,
    /// Replace `' '` by `▁`.
    pub escape_whitespaces: bool,
}

impl Default for NormalizerSpec {
    fn default() -> Self {
        Self {
            name: String::new(),
            precompiled_charsmap: Vec::new(),
            add_dummy_prefix: true,
            remove_extra_whitespaces: true,
            escape_whitespaces: true,
        }
    }
}

/// The parsed model file.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ModelProto {
    /// All pieces, in id order.
    pub pieces: Vec<Piece>,
    /// Training settings that affect encoding.
    pub trainer_spec: TrainerSpec,
    /// The normaliser applied before segmentation.
    pub normalizer_spec: NormalizerSpec,
    /// The optional normaliser applied to decoded text.
    pub denormalizer_spec: Option<NormalizerSpec>,
}

impl ModelProto {
    /// Parses a serialized `ModelProto`.
    pub fn parse(bytes: &[u8]) -> Result<Self> {
        let mut model = ModelProto::default();
        let mut r = Reader::new(bytes, "ModelProto");
        while let Some((field, value)) = r.next_field()? {
            match (field, value) {
                (1, Value::Bytes(b)) => model.pieces.push(parse_piece(b)?),
                (2, Value::Bytes(b)) => model.trainer_spec = parse_trainer_spec(b)?,
                (3, Value::Bytes(b)) => model.normalizer_spec = parse_normalizer_spec(b)?,
                (5, Value::Bytes(b)) => model.denormalizer_spec = Some(parse_normalizer_spec(b)?),
                (1 | 2 | 3 | 5, v) => return Err(wrong_type("ModelProto", field, &v)),
                _ => {}
            }
        }
        Ok(model)
    }
}

fn parse_piece(bytes: &[u8]) -> Result<Piece> {
    let mut piece = Piece {
        piece: String::new(),
        score: 0.0,
        kind: PieceType::Normal,
    };
    let mut r = Reader::new(bytes, "SentencePiece");
    while let Some((field, value)) = r.next_field()? {
        match (field, value) {
            (1, Value::Bytes(b)) => piece.piece = utf8(b, "SentencePiece.piece")?,
            (2, Value::Fixed32(v)) => piece.score = f32::from_bits(v),
            (3, Value::Varint(v)) => piece.kind = PieceType::from_proto(v)?,
            (1..=3, v) => return Err(wrong_type("SentencePiece", field, &v)),
            _ => {}
        }
    }
    Ok(piece)
}

fn parse_trainer_spec(bytes: &[u8]) -> Result<TrainerSpec> {
    let mut spec = TrainerSpec::default();
    let mut r = Reader::new(bytes, "TrainerSpec");
    while let Some((field, value)) = r.next_field()? {
        // int32 fields are varints holding the sign-extended 64-bit value.
        match (field, value) {
            (3, Value::Varint(v)) => spec.model_type = v as i64 as i32,
            (24, Value::Varint(v)) => spec.treat_whitespace_as_suffix = v != 0,
            (35, Value::Varint(v)) => spec.byte_fallback = v != 0,
            (40, Value::Varint(v)) => spec.unk_id = v as i64 as i32,
            (41, Value::Varint(v)) => spec.bos_id = v as i64 as i32,
            (42, Value::Varint(v)) => spec.eos_id = v as i64 as i32,
            (43, Value::Varint(v)) => spec.pad_id = v as i64 as i32,
            (44, Value::Bytes(b)) => spec.unk_surface = Some(utf8(b, "TrainerSpec.unk_surface")?),
            (3 | 24 | 35 | 40..=44, v) => return Err(wrong_type("TrainerSpec", field, &v)),
            _ => {}
        }
    }
    Ok(spec)
}

fn parse_normalizer_spec(bytes: &[u8]) -> Result<NormalizerSpec> {
    let mut spec = NormalizerSpec::default();
    let mut r = Reader::new(bytes, "NormalizerSpec");
    while let Some((field, value)) = r.next_field()? {
        match (field, value) {
            (1, Value::Bytes(b)) => spec.name = utf8(b, "NormalizerSpec.name")?,
            (2, Value::Bytes(b)) => spec.precompiled_charsmap = b.to_vec(),
            (3, Value::Varint(v)) => spec.add_dummy_prefix = v != 0,
            (4, Value::Varint(v)) => spec.remove_extra_whitespaces = v != 0,
            (5, Value::Varint(v)) => spec.escape_whitespaces = v != 0,
            (1..=5, v) => return Err(wrong_type("NormalizerSpec", field, &v)),
            _ => {}
        }
    }
    Ok(spec)
}

fn utf8(b: &[u8], what: &str) -> Result<String> {
    String::from_utf8(b.to_vec()).map_err(|e| {
        Error::Msg(format!(
            "sentencepiece model: {what} is not valid UTF-8: {e}"
        ))
    })
}

fn wrong_type(message: &str, field: u32, v: &Value) -> Error {
    Error::Msg(format!(
        "sentencepiece model: {message} field {field} has the wrong wire type ({}); \
         the file is not a sentencepiece model or is corrupt",
        v.kind()
    ))
}

/// A decoded protobuf field value.
enum Value<'a> {
    Varint(u64),
    Fixed64,
    Bytes(&'a [u8]),
    Fixed32(u32),
}

impl Value<'_> {
    fn kind(&self) -> &'static str {
        match self {
            Value::Varint(_) => "varint",
            Value::Fixed64 => "64-bit",
            Value::Bytes(_) => "length-delimited",
            Value::Fixed32(_) => "32-bit",
        }
    }
}

/// Walks the fields of one protobuf message.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    message: &'static str,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8], message: &'static str) -> Self {
        Self {
            buf,
            pos: 0,
            message,
        }
    }

    fn corrupt(&self, what: &str) -> Error {
        Error::Msg(format!(
            "sentencepiece model is corrupt: {what} in {} at byte {} of {}",
            self.message,
            self.pos,
            self.buf.len()
        ))
    }

    fn varint(&mut self) -> Result<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let Some(&b) = self.buf.get(self.pos) else {
                return Err(self.corrupt("truncated varint"));
            };
            self.pos += 1;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(self.corrupt("varint longer than 10 bytes"))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| self.corrupt(&format!("field of {n} bytes runs past the end")))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn next_field(&mut self) -> Result<Option<(u32, Value<'a>)>> {
        if self.pos >= self.buf.len() {
            return Ok(None);
        }
        let key = self.varint()?;
        let field = (key >> 3) as u32;
        if field == 0 {
            return Err(self.corrupt("field number 0"));
        }
        let value = match key & 7 {
            0 => Value::Varint(self.varint()?),
            1 => {
                self.take(8)?;
                Value::Fixed64
            }
            2 => {
                let n = self.varint()?;
                let n = usize::try_from(n).map_err(|_| self.corrupt("huge length"))?;
                Value::Bytes(self.take(n)?)
            }
            5 => {
                let b = self.take(4)?;
                Value::Fixed32(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            }
            w => return Err(self.corrupt(&format!("unsupported wire type {w}"))),
        };
        Ok(Some((field, value)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn varint(mut v: u64, out: &mut Vec<u8>) {
        loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(b);
                return;
            }
            out.push(b | 0x80);
        }
    }

    fn bytes_field(field: u64, b: &[u8], out: &mut Vec<u8>) {
        varint(field << 3 | 2, out);
        varint(b.len() as u64, out);
        out.extend_from_slice(b);
    }

    #[test]
    fn parses_pieces_specs_and_skips_unknown_fields() {
        let mut piece = Vec::new();
        bytes_field(1, "▁a".as_bytes(), &mut piece);
        varint(2 << 3 | 5, &mut piece);
        piece.extend_from_slice(&(-1.5f32).to_le_bytes());
        varint(3 << 3, &mut piece);
        varint(4, &mut piece);
        let mut trainer = Vec::new();
        varint(40 << 3, &mut trainer);
        varint(3, &mut trainer);
        varint(43 << 3, &mut trainer);
        varint(u64::MAX, &mut trainer); // -1 as int32
        varint(7 << 3 | 1, &mut trainer); // unknown 64-bit field
        trainer.extend_from_slice(&[0; 8]);
        let mut norm = Vec::new();
        bytes_field(1, b"nmt_nfkc", &mut norm);
        varint(3 << 3, &mut norm);
        varint(0, &mut norm);
        let mut model = Vec::new();
        bytes_field(1, &piece, &mut model);
        bytes_field(2, &trainer, &mut model);
        bytes_field(3, &norm, &mut model);
        bytes_field(9, b"future field", &mut model);

        let m = ModelProto::parse(&model).unwrap();
        assert_eq!(m.pieces.len(), 1);
        assert_eq!(m.pieces[0].piece, "▁a");
        assert_eq!(m.pieces[0].score, -1.5);
        assert_eq!(m.pieces[0].kind, PieceType::UserDefined);
        assert_eq!(m.trainer_spec.unk_id, 3);
        assert_eq!(m.trainer_spec.pad_id, -1);
        assert_eq!(m.normalizer_spec.name, "nmt_nfkc");
        assert!(!m.normalizer_spec.add_dummy_prefix);
        assert!(m.normalizer_spec.remove_extra_whitespaces);
        assert!(m.denormalizer_spec.is_none());
    }

    #[test]
    fn truncated_input_is_an_error() {
        let mut model = Vec::new();
        bytes_field(1, b"\x0a\x05abc", &mut model);
        let err = ModelProto::parse(&model).unwrap_err().to_string();
        assert!(err.contains("corrupt"), "{err}");
        let err = ModelProto::parse(&[0x0a, 0x80]).unwrap_err().to_string();
        assert!(err.contains("truncated varint"), "{err}");
    }
}
