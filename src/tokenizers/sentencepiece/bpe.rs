//! The BPE segmenter, as sentencepiece 0.2.3's `bpe_model.cc` (`Model::Encode`, i.e.
//! `SampleEncode` without BPE-dropout).
//!
//! The normalised text is cut into symbols: at each position the longest user-defined piece
//! that starts there is one symbol, frozen (never merged); otherwise one character is. Every
//! adjacent pair of unfrozen symbols whose concatenation is a piece of the model (normal,
//! user-defined or unused: never a control, unknown or byte piece) goes on an agenda with that
//! piece's score. The agenda pops the highest score first, scores ordered as IEEE 754's total
//! order (sentencepiece compares their bit patterns: `-0.0 < 0.0`, NaN above +inf, -NaN below
//! -inf), and among equal scores the pair whose left symbol comes first in the text; a popped
//! pair whose symbols changed since it was pushed is stale and skipped. Merging a pair pushes
//! the two new pairs around the merged symbol.
//!
//! At the end each symbol is looked up among those pieces only (a string the model lacks, or
//! one that is a control piece, is `<unk>`), and a symbol that is an *unused* piece is split
//! back into the two halves last recorded for that string when a pair making it was pushed,
//! recursively (`rev_merge`). An unused piece that cannot be split (a single character) comes
//! out as `<unk>`; one still unsplit 101 levels down (`kMaxBpeResegmentDepth`) comes out as
//! it is, with its unused id. Both as sentencepiece 0.2.3 gives them.

use super::model_proto::{Piece, PieceType};
use super::trie::Trie;
use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

/// sentencepiece's limit on the depth of the resegmentation of unused pieces.
const MAX_RESEGMENT_DEPTH: usize = 100;

/// The BPE model of a sentencepiece model.
#[derive(Debug, Clone)]
pub struct Bpe {
    /// Normal, user-defined and unused pieces (sentencepiece's `pieces_`).
    pieces: HashMap<String, u32>,
    kinds: Vec<PieceType>,
    scores: Vec<f32>,
    /// The user-defined pieces (sentencepiece's `PrefixMatcher`).
    user_defined: Trie,
    unk_id: u32,
}

/// One symbol of the text being merged: a byte range of the normalised text, linked to its
/// neighbours. A symbol merged into its left neighbour has length 0.
#[derive(Debug, Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
    freeze: bool,
}

/// A candidate merge of symbols `left` and `right` into a piece of `size` bytes.
#[derive(Debug, Clone, Copy)]
struct Pair {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

impl Ord for Pair {
    /// The agenda's order (`SymbolPairComparator`): a higher score first, then the lower left
    /// index. sentencepiece compares the scores' bit patterns, which is the total order.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Pair {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Pair {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Pair {}

impl Bpe {
    /// Builds the segmenter from the full piece list (ids are positions in `pieces`; the caller
    /// has checked that no piece is empty or defined twice).
    pub fn new(pieces: &[Piece], unk_id: u32) -> Self {
        let mut map = HashMap::new();
        let mut user_defined = Trie::new();
        for (id, p) in pieces.iter().enumerate() {
            if !matches!(
                p.kind,
                PieceType::Normal | PieceType::UserDefined | PieceType::Unused
            ) {
                continue;
            }
            map.insert(p.piece.clone(), id as u32);
            if p.kind == PieceType::UserDefined {
                user_defined.insert(p.piece.as_bytes(), id as u32);
            }
        }
        Self {
            pieces: map,
            kinds: pieces.iter().map(|p| p.kind).collect(),
            scores: pieces.iter().map(|p| p.score).collect(),
            user_defined,
            unk_id,
        }
    }

    /// The id of a normal, user-defined or unused piece spelled `piece`.
    pub fn lookup(&self, piece: &str) -> Option<u32> {
        self.pieces.get(piece).copied()
    }

    /// `PieceToIdNoReserved`: the id among normal, user-defined and unused pieces, else `<unk>`.
    fn piece_to_id(&self, piece: &str) -> u32 {
        self.lookup(piece).unwrap_or(self.unk_id)
    }

    /// The length of the symbol at the start of `text` and whether it is frozen
    /// (`PrefixMatcher::PrefixMatch`): the longest user-defined piece, else one character.
    fn prefix_match(&self, text: &str) -> (usize, bool) {
        if !self.user_defined.is_empty() {
            if let Some(len) = self.user_defined.longest_prefix(text.as_bytes()) {
                return (len, true);
            }
        }
        (text.chars().next().map_or(1, char::len_utf8), false)
    }

    /// Segments a normalised string: `(byte start, byte end, id)` per piece, in order. Each
    /// unknown character is its own `<unk>` segment (the caller merges runs).
    pub fn encode(&self, normalized: &str) -> Vec<(usize, usize, u32)> {
        if normalized.is_empty() {
            return Vec::new();
        }
        let mut symbols: Vec<Symbol> = Vec::with_capacity(normalized.len());
        let mut pos = 0;
        while pos < normalized.len() {
            let (len, freeze) = self.prefix_match(&normalized[pos..]);
            let index = symbols.len();
            symbols.push(Symbol {
                start: pos,
                len,
                prev: index.checked_sub(1),
                next: (pos + len < normalized.len()).then_some(index + 1),
                freeze,
            });
            pos += len;
        }

        let mut agenda = BinaryHeap::new();
        // Merged string of an unused piece -> byte length of its left half, as last pushed.
        let mut rev_merge: HashMap<&str, usize> = HashMap::new();
        let mut maybe_push = |symbols: &[Symbol],
                              agenda: &mut BinaryHeap<Pair>,
                              left: Option<usize>,
                              right: Option<usize>| {
            let (Some(left), Some(right)) = (left, right) else {
                return;
            };
            let (l, r) = (symbols[left], symbols[right]);
            if l.freeze || r.freeze {
                return;
            }
            let size = l.len + r.len;
            let merged = &normalized[l.start..l.start + size];
            let Some(&id) = self.pieces.get(merged) else {
                return;
            };
            agenda.push(Pair {
                score: self.scores[id as usize],
                left,
                right,
                size,
            });
            if self.kinds[id as usize] == PieceType::Unused {
                rev_merge.insert(merged, l.len);
            }
        };

        for i in 1..symbols.len() {
            maybe_push(&symbols, &mut agenda, Some(i - 1), Some(i));
        }

        while let Some(top) = agenda.pop() {
            let (l, r) = (symbols[top.left], symbols[top.right]);
            // Stale: one side was merged away or grew since the pair was pushed.
            if l.len == 0 || r.len == 0 || l.len + r.len != top.size {
                continue;
            }
            symbols[top.left].len = top.size;
            symbols[top.left].next = r.next;
            if let Some(next) = r.next {
                symbols[next].prev = Some(top.left);
            }
            symbols[top.right].len = 0;
            let (prev, next) = (symbols[top.left].prev, symbols[top.left].next);
            maybe_push(&symbols, &mut agenda, prev, Some(top.left));
            maybe_push(&symbols, &mut agenda, Some(top.left), next);
        }

        let mut out = Vec::new();
        let mut stack: Vec<(usize, usize, usize)> = Vec::new();
        let mut index = Some(0);
        while let Some(i) = index {
            let s = symbols[i];
            stack.push((s.start, s.start + s.len, 0));
            // Resegment: an unused piece becomes its recorded halves, left first.
            while let Some((start, end, depth)) = stack.pop() {
                let w = &normalized[start..end];
                let id = self.piece_to_id(w);
                if depth > MAX_RESEGMENT_DEPTH || self.kinds[id as usize] != PieceType::Unused {
                    out.push((start, end, id));
                    continue;
                }
                match rev_merge.get(w) {
                    Some(&left_len) => {
                        stack.push((start + left_len, end, depth + 1));
                        stack.push((start, start + left_len, depth + 1));
                    }
                    // An unused piece with no recorded halves (one character) is unknown.
                    None => out.push((start, end, self.unk_id)),
                }
            }
            index = s.next;
        }
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

    fn model(extra: &[(&str, f32, PieceType)]) -> Bpe {
        let mut pieces = vec![
            piece("<unk>", 0.0, PieceType::Unknown),
            piece("<s>", 0.0, PieceType::Control),
        ];
        for &(s, score, kind) in extra {
            pieces.push(piece(s, score, kind));
        }
        Bpe::new(&pieces, 0)
    }

    fn pieces(m: &Bpe, s: &str) -> Vec<String> {
        m.encode(s)
            .into_iter()
            .map(|(a, b, _)| s[a..b].to_string())
            .collect()
    }

    use PieceType::{Normal, Unused, UserDefined};

    #[test]
    fn merges_by_score_then_leftmost() {
        let chars = [
            ("a", -10.0, Normal),
            ("b", -10.0, Normal),
            ("c", -10.0, Normal),
        ];
        // a, b, c and the two merges "ab" and "bc" with the given scores.
        let abc_model = |ab: f32, bc: f32| {
            model(&[
                chars[0],
                chars[1],
                chars[2],
                ("ab", ab, Normal),
                ("bc", bc, Normal),
            ])
        };
        // "bc" scores higher than "ab": it goes first although "ab" is further left.
        let m = abc_model(-2.0, -1.0);
        assert_eq!(pieces(&m, "abc"), ["a", "bc"]);
        // Equal scores: the leftmost pair goes first.
        let m = abc_model(-1.0, -1.0);
        assert_eq!(pieces(&m, "abc"), ["ab", "c"]);
        assert_eq!(pieces(&m, "abcabc"), ["ab", "c", "ab", "c"]);
        // The total order: -0.0 < 0.0, NaN above everything, -NaN below.
        let m = abc_model(-0.0, 0.0);
        assert_eq!(pieces(&m, "abc"), ["a", "bc"]);
        let m = abc_model(-5.0, f32::NAN);
        assert_eq!(pieces(&m, "abc"), ["a", "bc"]);
        let m = abc_model(-5.0, -f32::NAN);
        assert_eq!(pieces(&m, "abc"), ["ab", "c"]);
        // Merges build on merges.
        let m = model(&[
            chars[0],
            chars[1],
            chars[2],
            ("ab", -1.0, Normal),
            ("abc", -2.0, Normal),
        ]);
        assert_eq!(pieces(&m, "abcab"), ["abc", "ab"]);
        assert!(m.encode("").is_empty());
    }

    #[test]
    fn unknown_characters_and_ids() {
        let m = model(&[
            ("a", -1.0, Normal),
            ("b", -1.0, Normal),
            ("ab", -0.5, Normal),
        ]);
        assert_eq!(
            m.encode("a€€ab"),
            vec![(0, 1, 2), (1, 4, 0), (4, 7, 0), (7, 9, 4)]
        );
        // A character spelled like a control piece is unknown (`PieceToIdNoReserved`).
        let mut p = vec![
            piece("<unk>", 0.0, PieceType::Unknown),
            piece("¶", 0.0, PieceType::Control),
        ];
        p.push(piece("a", -1.0, Normal));
        assert_eq!(Bpe::new(&p, 0).encode("a¶"), vec![(0, 1, 2), (1, 3, 0)]);
    }

    #[test]
    fn user_defined_pieces_are_frozen_longest_first() {
        let m = model(&[
            ("a", -1.0, Normal),
            ("b", -1.0, Normal),
            ("x", -1.0, Normal),
            ("ab", -0.5, Normal),
            ("xa", -0.1, Normal),
            ("<x>", 0.0, UserDefined),
            ("<x>>", 0.0, UserDefined),
            ("bx", 0.0, UserDefined),
        ]);
        assert_eq!(pieces(&m, "a<x>b"), ["a", "<x>", "b"]);
        assert_eq!(pieces(&m, "<x>>a"), ["<x>>", "a"]);
        // "bx" is matched as a symbol before "xa" could merge; "ab" cannot merge into it.
        assert_eq!(pieces(&m, "abxa"), ["a", "bx", "a"]);
    }

    #[test]
    fn unused_pieces_are_split_back() {
        let m = model(&[
            ("a", -1.0, Normal),
            ("b", -1.0, Normal),
            ("c", -1.0, Normal),
            ("ab", -0.1, Unused),
            ("abc", -0.2, Normal),
            ("bc", -0.3, Normal),
            ("abcab", -0.4, Unused),
        ]);
        // "ab" merges (unused, best score), then "abc"; the unused "ab" alone is split back.
        assert_eq!(pieces(&m, "abc"), ["abc"]);
        assert_eq!(pieces(&m, "ab"), ["a", "b"]);
        // "abcab" (unused) splits into "abc" + "ab", and "ab" into "a" + "b".
        assert_eq!(pieces(&m, "abcab"), ["abc", "a", "b"]);
        // A single character that is unused has no halves: it is unknown.
        let m = model(&[("a", -1.0, Unused), ("b", -1.0, Normal)]);
        assert_eq!(m.encode("ab"), vec![(0, 1, 0), (1, 2, 3)]);
    }

    #[test]
    fn resegmentation_stops_at_sentencepiece_depth() {
        // Longer runs of "a" score higher, so the text merges from the left into one chain
        // "a"+"a", "aa"+"a", ...; every run is unused except the single "a", so resegmenting
        // the whole text would recurse n - 1 levels.
        let n = 110;
        let mut extra = vec![("a".to_string(), 1.0, Normal)];
        for k in 2..=n {
            extra.push(("a".repeat(k), k as f32, Unused));
        }
        let mut p = vec![piece("<unk>", 0.0, PieceType::Unknown)];
        p.extend(extra.iter().map(|(s, sc, k)| piece(s, *sc, *k)));
        let m = Bpe::new(&p, 0);
        let text = "a".repeat(n);
        let out = m.encode(&text);
        // Depths 0..=100 split off one "a" each; the run left at depth 101 stays as it is.
        assert_eq!(out.len(), 102);
        assert_eq!(out[0], (0, n - 101, (n - 101) as u32));
        assert!(out[1..].iter().all(|&(s, e, id)| e - s == 1 && id == 1));
    }
}
