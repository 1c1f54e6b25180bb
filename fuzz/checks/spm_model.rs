//! Arbitrary bytes as a SentencePiece model file (`.spm` / `sentencepiece.bpe.model`): the
//! protobuf reader, the normaliser's charsmap (its double-array trie) and the segmenter built
//! from whatever loads.
//!
//! Invariants: no panic; a model that loads encodes every text of a fixed set (and the input
//! itself read as text) to ids it knows, and decodes them, and any id list, without panicking.

use candle_attention::tokenizers::SentencePieceModel;

const TEXTS: &[&str] = &[
    "Hello, world!",
    "  leading and trailing  ",
    "Grüße aus Köln: 123 ½ ﬁ",
    "中文字符 と かな",
    "مرحبا بالعالم",
    "Привет, мир",
    "emoji 🙂 and \t tabs \n newlines",
    "",
];

/// Runs one input; panics on a finding.
pub fn check(data: &[u8]) {
    let Ok(sp) = SentencePieceModel::from_bytes(data) else {
        return;
    };
    let n = sp.piece_size() as u32;
    let lossy = String::from_utf8_lossy(&data[..data.len().min(256)]).to_string();
    for text in TEXTS.iter().copied().chain([lossy.as_str()]) {
        if let Ok(ids) = sp.encode_ids(text) {
            assert!(ids.iter().all(|&id| id < n), "an id outside the {n} pieces");
            let _ = sp.decode_ids(&ids);
        }
        let _ = sp.encode_pieces(text).map(|p| sp.decode_pieces(&p));
        let _ = sp.normalize(text);
    }
    // Arbitrary ids, in and out of range.
    let ids: Vec<u32> = data
        .iter()
        .take(64)
        .map(|&b| b as u32 * 7 % (n + 3))
        .collect();
    let _ = sp.decode_ids(&ids);
    for id in [0, n.saturating_sub(1), n, u32::MAX] {
        let _ = sp.id_to_piece(id);
        let _ = sp.piece_type(id);
    }
}
