//! The pieces of the Hugging Face `tokenizers` library (0.23) that transformers 5.24 builds the
//! NLLB-200 and mBART-50 tokenizers from, ported step by step: the `Precompiled` normaliser,
//! the `BPE` model (with merges generated from a sentencepiece vocabulary) and the `Unigram`
//! model.
//!
//! Why not sentencepiece's own ([`super::sentencepiece`])? transformers 5 no longer runs
//! sentencepiece for these two families: it converts the `.model` file into a `tokenizers`
//! pipeline, and that pipeline segments differently at the edges:
//!
//! * `Precompiled` looks the charsmap up per extended grapheme cluster (the whole cluster when
//!   it is under 6 bytes, taking the SHORTEST matching key, else char by char), where
//!   sentencepiece takes the longest key at each byte position: a cluster such as `①` + U+0301
//!   becomes `1` (the accent is dropped);
//! * BPE merges are ranked by their position in a merges list that transformers generates from
//!   the vocabulary (`generate_merges`: by the merged piece's sentencepiece id, then by the
//!   length of its left part), not by piece score, and characters missing from the vocabulary
//!   become `<unk>` (runs fused) before any merge;
//! * Unigram scores are summed in f64 and every vocabulary entry (control pieces, language
//!   codes, `<mask>`) is a lattice candidate;
//! * text is cut into words at `▁` (Metaspace `split=True`) before the model sees it, and the
//!   whitespace rules are transformers' (a trailing space stays as a `▁` token).

use super::sentencepiece::darts::DoubleArray;
use candle::{Error, Result};
use std::collections::HashMap;
use unicode_segmentation::UnicodeSegmentation;

/// `tokenizers::normalizers::Precompiled`: the sentencepiece charsmap, applied per grapheme.
#[derive(Debug, Clone)]
pub struct Precompiled {
    trie: DoubleArray,
    normalized: Vec<u8>,
}

impl Precompiled {
    /// Parses a `precompiled_charsmap` blob (`<u32 LE trie size><trie><NUL-ended strings>`).
    pub fn new(blob: &[u8]) -> Result<Self> {
        if blob.len() <= 4 {
            return Err(Error::Msg("precompiled_charsmap is too short".into()));
        }
        let size = u32::from_le_bytes([blob[0], blob[1], blob[2], blob[3]]) as usize;
        if size > blob.len() - 4 {
            return Err(Error::Msg(format!(
                "precompiled_charsmap: trie size {size} exceeds the blob ({} bytes)",
                blob.len()
            )));
        }
        Ok(Self {
            trie: DoubleArray::new(&blob[4..4 + size])?,
            normalized: blob[4 + size..].to_vec(),
        })
    }

    /// The replacement of the shortest key prefixing `chunk` (as `spm_precompiled`'s
    /// `transform`, which does not check that the key covers the whole chunk).
    fn transform(&self, chunk: &str) -> Option<&str> {
        let &(index, _) = self.trie.common_prefix_search(chunk.as_bytes()).first()?;
        let index = index as usize;
        let rest = self.normalized.get(index..)?;
        let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        std::str::from_utf8(&rest[..end]).ok()
    }

    /// Normalises `text`.
    pub fn normalize(&self, text: &str) -> String {
        let mut out = String::with_capacity(text.len());
        for grapheme in text.graphemes(true) {
            if grapheme.len() < 6 {
                if let Some(norm) = self.transform(grapheme) {
                    out.push_str(norm);
                    continue;
                }
            }
            for (i, c) in grapheme.char_indices() {
                match self.transform(&grapheme[i..i + c.len_utf8()]) {
                    Some(norm) => out.push_str(norm),
                    None => out.push(c),
                }
            }
        }
        out
    }
}

/// `tokenizers::models::BPE` with `fuse_unk=True`, no byte fallback, no dropout, no prefixes.
#[derive(Debug, Clone)]
pub struct HfBpe {
    /// The ids of the one-character tokens (the only lookups `merge_word` makes).
    chars: HashMap<char, u32>,
    /// `(left id, right id)` to `(rank, merged id)`.
    merges: HashMap<(u32, u32), (u32, u32)>,
    unk_id: u32,
}

impl HfBpe {
    /// A BPE model over `vocab` (token to id) with the merges of `generate_merges(spm_vocab)`:
    /// every split `(l, r)` of every piece of `spm_vocab` (piece to sentencepiece id) whose two
    /// halves are pieces too, ranked by the merged piece's sentencepiece id, then by the
    /// character lengths of `l` and `r`.
    pub fn from_spm_vocab(
        vocab: &HashMap<String, u32>,
        spm_pieces: &[String],
        unk_token: &str,
    ) -> Result<Self> {
        let spm_ids: HashMap<&str, usize> = spm_pieces
            .iter()
            .enumerate()
            .map(|(i, p)| (p.as_str(), i))
            .collect();
        // (merged spm id, len(l) in chars, l, r); the pieces are iterated in id order, so a
        // stable sort on (id, len l, len r) is this order.
        let mut ranked: Vec<(usize, usize, &str, &str)> = Vec::new();
        for (id, piece) in spm_pieces.iter().enumerate() {
            // A piece defined twice keeps its last id in Python's dict.
            if spm_ids.get(piece.as_str()) != Some(&id) {
                continue;
            }
            let mut local = Vec::new();
            for (i, _) in piece.char_indices().skip(1) {
                let (l, r) = piece.split_at(i);
                if let (Some(&li), Some(&ri)) = (spm_ids.get(l), spm_ids.get(r)) {
                    local.push((li, ri, l, r));
                }
            }
            local.sort_by_key(|&(li, ri, _, _)| (li, ri));
            for (_, _, l, r) in local {
                ranked.push((id, l.chars().count(), l, r));
            }
        }
        ranked.sort_by_key(|&(id, ll, l, r)| (id, ll, r.chars().count(), l.len()));
        let merges: Vec<(String, String)> = ranked
            .into_iter()
            .map(|(_, _, l, r)| (l.to_string(), r.to_string()))
            .collect();
        Self::from_merges(vocab, &merges, unk_token)
    }

    /// A BPE model over `vocab` with `merges` ranked by their position (a later duplicate
    /// wins, as the `tokenizers` builder's map does).
    pub fn from_merges(
        vocab: &HashMap<String, u32>,
        merges: &[(String, String)],
        unk_token: &str,
    ) -> Result<Self> {
        let mut map = HashMap::with_capacity(merges.len());
        for (rank, (l, r)) in merges.iter().enumerate() {
            let get = |t: &str| {
                vocab.get(t).copied().ok_or_else(|| {
                    Error::Msg(format!(
                        "BPE merge ({l:?}, {r:?}): {t:?} is not in the vocabulary"
                    ))
                })
            };
            let merged = format!("{l}{r}");
            map.insert((get(l)?, get(r)?), (rank as u32, get(&merged)?));
        }
        let unk_id = *vocab.get(unk_token).ok_or_else(|| {
            Error::Msg(format!(
                "the unknown token {unk_token:?} is not in the vocabulary"
            ))
        })?;
        let chars = vocab
            .iter()
            .filter_map(|(t, &id)| {
                let mut it = t.chars();
                match (it.next(), it.next()) {
                    (Some(c), None) => Some((c, id)),
                    _ => None,
                }
            })
            .collect();
        Ok(Self {
            chars,
            merges: map,
            unk_id,
        })
    }

    /// The ids of one word (`merge_word` then `merge_all`).
    pub fn encode_word(&self, word: &str) -> Vec<u32> {
        let mut symbols: Vec<u32> = Vec::new();
        let mut prev_unk = false;
        for c in word.chars() {
            match self.chars.get(&c) {
                Some(&id) => {
                    symbols.push(id);
                    prev_unk = false;
                }
                None => {
                    if !prev_unk {
                        symbols.push(self.unk_id);
                    }
                    prev_unk = true;
                }
            }
        }
        // The lowest rank first, the leftmost among equals (the heap's order).
        loop {
            let best = symbols
                .windows(2)
                .enumerate()
                .filter_map(|(pos, w)| self.merges.get(&(w[0], w[1])).map(|&m| (m, pos)))
                .min_by_key(|&((rank, _), pos)| (rank, pos));
            let Some(((_, new_id), pos)) = best else {
                break;
            };
            symbols[pos] = new_id;
            symbols.remove(pos + 1);
        }
        symbols
    }
}

/// `tokenizers::models::Unigram` (`encode_optimized`, unknowns fused, no byte fallback).
#[derive(Debug, Clone)]
pub struct HfUnigram {
    token_to_id: HashMap<String, u32>,
    /// The longest token, in bytes (prefixes longer than it are not looked up).
    max_len: usize,
    scores: Vec<f64>,
    unk_id: u32,
    min_score: f64,
}

/// The penalty of an unknown character below the lowest score (`K_UNK_PENALTY`).
const UNK_PENALTY: f64 = 10.0;

impl HfUnigram {
    /// A unigram model over `(token, score)` entries (ids are positions).
    pub fn new(vocab: &[(String, f64)], unk_id: u32) -> Self {
        // Python builds `token_to_ids` from the list: the last id of a duplicate wins.
        let mut token_to_id = HashMap::new();
        let mut min_score = f64::INFINITY;
        for (id, (token, score)) in vocab.iter().enumerate() {
            token_to_id.insert(token.clone(), id as u32);
            if *score < min_score {
                min_score = *score;
            }
        }
        let max_len = vocab.iter().map(|(t, _)| t.len()).max().unwrap_or(0);
        Self {
            token_to_id,
            max_len,
            scores: vocab.iter().map(|(_, s)| *s).collect(),
            unk_id,
            min_score,
        }
    }

    /// The ids of one word.
    pub fn encode_word(&self, word: &str) -> Vec<u32> {
        #[derive(Clone, Copy)]
        struct Node {
            id: u32,
            score: f64,
            starts_at: Option<usize>,
        }
        let size = word.len();
        let unk_score = self.min_score - UNK_PENALTY;
        let mut best = vec![
            Node {
                id: 0,
                score: 0.0,
                starts_at: None,
            };
            size + 1
        ];
        let mut starts_at = 0;
        while starts_at < size {
            let here = best[starts_at].score;
            let mblen = word[starts_at..].chars().next().map_or(1, char::len_utf8);
            let mut has_single = false;
            // Every token that prefixes the rest, shortest first (the trie's order).
            let rest = &word[starts_at..];
            for (k, c) in rest.char_indices() {
                let end = k + c.len_utf8();
                if end > self.max_len {
                    break;
                }
                let Some(&id) = self.token_to_id.get(&rest[..end]) else {
                    continue;
                };
                let key_pos = starts_at + end;
                let candidate = self.scores[id as usize] + here;
                let target = &mut best[key_pos];
                if target.starts_at.is_none() || candidate > target.score {
                    *target = Node {
                        id,
                        score: candidate,
                        starts_at: Some(starts_at),
                    };
                }
                if end == mblen {
                    has_single = true;
                }
            }
            if !has_single {
                let target = &mut best[starts_at + mblen];
                let candidate = unk_score + here;
                if target.starts_at.is_none() || candidate > target.score {
                    *target = Node {
                        id: self.unk_id,
                        score: candidate,
                        starts_at: Some(starts_at),
                    };
                }
            }
            starts_at += mblen;
        }
        // Backtrack; runs of unknowns become one string, looked up again (unknown: <unk>).
        let mut pieces: Vec<&str> = Vec::new();
        let mut ends_at = size;
        let mut unk_end: Option<usize> = None;
        while ends_at > 0 {
            let node = best[ends_at];
            let start = node.starts_at.unwrap_or(0);
            if node.id == self.unk_id {
                unk_end.get_or_insert(ends_at);
            } else {
                if let Some(e) = unk_end.take() {
                    pieces.push(&word[ends_at..e]);
                }
                pieces.push(&word[start..ends_at]);
            }
            ends_at = start;
        }
        if let Some(e) = unk_end {
            pieces.push(&word[..e]);
        }
        pieces.reverse();
        pieces
            .into_iter()
            .map(|p| self.token_to_id.get(p).copied().unwrap_or(self.unk_id))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bpe_merges_by_generated_rank() {
        let spm: Vec<String> = ["<unk>", "a", "b", "c", "ab", "bc", "abc"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let vocab: HashMap<String, u32> = spm
            .iter()
            .enumerate()
            .map(|(i, p)| (p.clone(), i as u32))
            .collect();
        let bpe = HfBpe::from_spm_vocab(&vocab, &spm, "<unk>").unwrap();
        // "ab" (id 4) ranks before "bc" (id 5); then "abc" from (ab, c).
        assert_eq!(bpe.encode_word("abc"), [6]);
        assert_eq!(bpe.encode_word("bcx"), [5, 0]);
        assert_eq!(bpe.encode_word("xyz"), [0]);
    }

    #[test]
    fn unigram_fuses_unknowns() {
        let vocab: Vec<(String, f64)> = [("<unk>", 0.0), ("a", -1.0), ("ab", -1.5), ("b", -1.0)]
            .iter()
            .map(|&(t, s)| (t.to_string(), s))
            .collect();
        let u = HfUnigram::new(&vocab, 0);
        assert_eq!(u.encode_word("ab"), [2]);
        assert_eq!(u.encode_word("xyab"), [0, 2]);
    }
}
