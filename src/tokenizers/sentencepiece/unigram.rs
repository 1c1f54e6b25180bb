//! The unigram segmenter: Viterbi over the lattice of pieces, as `unigram_model.cc`'s
//! `EncodeOptimized` (sentencepiece's default encoder).
//!
//! Every piece of the model that prefixes the text at a character boundary is a lattice edge
//! with the piece's score (user-defined pieces get `length * max_score - 0.1` so that they always
//! win; unused pieces are skipped). A character that starts no one-character piece also gets an
//! `<unk>` edge of score `min_score - 10`. The best path ending at each byte keeps the first
//! candidate among equal scores (a later start must be strictly better), which fixes ties the
//! way sentencepiece does.

use super::model_proto::{Piece, PieceType};
use super::trie::Trie;

/// sentencepiece's penalty of an unknown character below the lowest piece score.
const UNK_PENALTY: f32 = 10.0;

/// The unigram language model of a sentencepiece model.
#[derive(Debug, Clone)]
pub struct Unigram {
    trie: Trie,
    kinds: Vec<PieceType>,
    scores: Vec<f32>,
    unk_id: u32,
    min_score: f32,
    max_score: f32,
}

impl Unigram {
    /// Builds the segmenter from the full piece list (ids are positions in `pieces`).
    pub fn new(pieces: &[Piece], unk_id: u32) -> Self {
        let mut trie = Trie::new();
        // sentencepiece starts from FLT_MAX / FLT_MIN (the smallest positive float).
        let mut min_score = f32::MAX;
        let mut max_score = f32::MIN_POSITIVE;
        for (id, p) in pieces.iter().enumerate() {
            if p.kind == PieceType::Normal {
                min_score = min_score.min(p.score);
                max_score = max_score.max(p.score);
            }
            if matches!(
                p.kind,
                PieceType::Normal | PieceType::UserDefined | PieceType::Unused
            ) {
                trie.insert(p.piece.as_bytes(), id as u32);
            }
        }
        Self {
            trie,
            kinds: pieces.iter().map(|p| p.kind).collect(),
            scores: pieces.iter().map(|p| p.score).collect(),
            unk_id,
            min_score,
            max_score,
        }
    }

    /// The id of a normal, user-defined or unused piece spelled `piece`.
    pub fn lookup(&self, piece: &str) -> Option<u32> {
        self.trie.get(piece.as_bytes())
    }

    /// Segments a normalised string: `(byte start, byte end, id)` per piece, in order.
    /// Unknown characters come out one per `<unk>` segment (the caller merges runs).
    pub fn encode(&self, normalized: &str) -> Vec<(usize, usize, u32)> {
        #[derive(Clone, Copy)]
        struct Best {
            id: u32,
            score: f32,
            starts_at: Option<usize>,
        }
        let bytes = normalized.as_bytes();
        let size = bytes.len();
        if size == 0 {
            return Vec::new();
        }
        let unk_score = self.min_score - UNK_PENALTY;
        let mut best = vec![
            Best {
                id: 0,
                score: 0.0,
                starts_at: None,
            };
            size + 1
        ];
        let mut starts_at = 0;
        while starts_at < size {
            let here = best[starts_at].score;
            let mblen = normalized[starts_at..]
                .chars()
                .next()
                .map_or(1, char::len_utf8);
            let mut has_single_node = false;
            for (id, length) in self.trie.common_prefixes(&bytes[starts_at..]) {
                let kind = self.kinds[id as usize];
                if kind == PieceType::Unused {
                    continue;
                }
                let target = &mut best[starts_at + length];
                if kind == PieceType::UserDefined {
                    // C++: `length * max_score_ - 0.1` is a double, added to the float path
                    // score in double, then stored back as float.
                    let score = f64::from(length as f32 * self.max_score) - 0.1;
                    let candidate = score + f64::from(here);
                    if target.starts_at.is_none() || candidate > f64::from(target.score) {
                        *target = Best {
                            id,
                            score: candidate as f32,
                            starts_at: Some(starts_at),
                        };
                    }
                } else {
                    let candidate = self.scores[id as usize] + here;
                    if target.starts_at.is_none() || candidate > target.score {
                        *target = Best {
                            id,
                            score: candidate,
                            starts_at: Some(starts_at),
                        };
                    }
                }
                if length == mblen {
                    has_single_node = true;
                }
            }
            if !has_single_node {
                let target = &mut best[starts_at + mblen];
                let candidate = unk_score + here;
                if target.starts_at.is_none() || candidate > target.score {
                    *target = Best {
                        id: self.unk_id,
                        score: candidate,
                        starts_at: Some(starts_at),
                    };
                }
            }
            starts_at += mblen;
        }
        let mut out = Vec::new();
        let mut end = size;
        while end > 0 {
            let node = best[end];
            // Every character boundary is reachable (the unk edge), so this is always set.
            let start = node.starts_at.unwrap_or(0);
            out.push((start, end, node.id));
            end = start;
        }
        out.reverse();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(s: &str, score: f32, kind: PieceType) -> Piece {
        Piece {
            piece: s.into(),
            score,
            kind,
        }
    }

    fn model() -> Unigram {
        Unigram::new(
            &[
                piece("<unk>", 0.0, PieceType::Unknown),
                piece("▁a", -1.0, PieceType::Normal),
                piece("b", -2.0, PieceType::Normal),
                piece("▁ab", -2.5, PieceType::Normal),
                piece("a", -1.5, PieceType::Normal),
                piece("<x>", 0.0, PieceType::UserDefined),
                piece("bb", -0.1, PieceType::Unused),
            ],
            0,
        )
    }

    fn ids(m: &Unigram, s: &str) -> Vec<u32> {
        m.encode(s).into_iter().map(|(_, _, id)| id).collect()
    }

    #[test]
    fn best_path_and_unknowns() {
        let m = model();
        assert_eq!(ids(&m, "▁ab"), vec![3]);
        assert_eq!(ids(&m, "▁abb"), vec![3, 2]); // "bb" is unused
        assert_eq!(ids(&m, "▁a€€b"), vec![1, 0, 0, 2]);
        assert_eq!(ids(&m, "a<x>a"), vec![4, 5, 4]);
        assert!(m.encode("").is_empty());
        assert_eq!(m.encode("▁a€"), vec![(0, 4, 1), (4, 7, 0)]);
    }
}
