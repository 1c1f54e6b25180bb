//! Splitting text on added (special) tokens, as transformers' `Trie.split` in
//! `tokenization_python.py`: `"a</s>b"` becomes `["a", "</s>", "b"]` before sentencepiece sees
//! the text. The algorithm is ported step by step (including its lookahead for the longest
//! match), over Unicode scalar values like Python's `str`.

use std::collections::HashMap;

#[derive(Debug, Clone, Default)]
struct Node {
    children: HashMap<char, usize>,
    terminal: bool,
}

/// A character trie of the added tokens.
#[derive(Debug, Clone)]
pub struct AddedTokenTrie {
    nodes: Vec<Node>,
}

impl AddedTokenTrie {
    /// A trie of `tokens` (empty strings are ignored, as transformers does).
    pub fn new<'a>(tokens: impl IntoIterator<Item = &'a str>) -> Self {
        let mut trie = Self {
            nodes: vec![Node::default()],
        };
        for t in tokens {
            if t.is_empty() {
                continue;
            }
            let mut node = 0;
            for c in t.chars() {
                node = match trie.nodes[node].children.get(&c) {
                    Some(&n) => n,
                    None => {
                        trie.nodes.push(Node::default());
                        let n = trie.nodes.len() - 1;
                        trie.nodes[node].children.insert(c, n);
                        n
                    }
                };
            }
            trie.nodes[node].terminal = true;
        }
        trie
    }

    fn child(&self, node: usize, c: char) -> Option<usize> {
        self.nodes[node].children.get(&c).copied()
    }

    /// Splits `text` along the added tokens it contains (the tokens are kept as pieces).
    pub fn split<'t>(&self, text: &'t str) -> Vec<&'t str> {
        let chars: Vec<(usize, char)> = text.char_indices().collect();
        let n = chars.len();
        if !chars.iter().any(|&(_, c)| self.child(0, c).is_some()) {
            return if text.is_empty() { vec![] } else { vec![text] };
        }
        // Offsets in characters.
        let mut offsets = vec![0usize];
        let mut skip = 0usize;
        // (start, trie node) in insertion order, as Python's OrderedDict.
        let mut states: Vec<(usize, usize)> = Vec::new();
        for current in 0..n {
            let current_char = chars[current].1;
            if skip > 0 && current < skip {
                continue;
            }
            let mut to_remove = Vec::new();
            let mut reset = false;
            for si in 0..states.len() {
                let (mut start, trie_pointer) = states[si];
                if self.nodes[trie_pointer].terminal {
                    // A full match: look ahead for a longer one, from this start or earlier.
                    let mut end = current;
                    for &(lookstart, lp) in &states {
                        let mut looktrie_pointer = lp;
                        let mut lookahead_index;
                        if lookstart > start {
                            break;
                        } else if lookstart < start {
                            lookahead_index = current + 1;
                            end = current + 1;
                        } else {
                            lookahead_index = current;
                            end = current;
                        }
                        let mut next_char = chars.get(lookahead_index).map(|&(_, c)| c);
                        if self.nodes[looktrie_pointer].terminal {
                            start = lookstart;
                            end = lookahead_index;
                            skip = lookahead_index;
                        }
                        while let Some(nc) = next_char {
                            let Some(next) = self.child(looktrie_pointer, nc) else {
                                break;
                            };
                            looktrie_pointer = next;
                            lookahead_index += 1;
                            if self.nodes[looktrie_pointer].terminal {
                                start = lookstart;
                                end = lookahead_index;
                                skip = lookahead_index;
                            }
                            if lookahead_index == n {
                                break;
                            }
                            next_char = chars.get(lookahead_index).map(|&(_, c)| c);
                        }
                    }
                    offsets.push(start);
                    offsets.push(end);
                    reset = true;
                    break;
                } else if let Some(next) = self.child(trie_pointer, current_char) {
                    states[si].1 = next;
                } else {
                    to_remove.push(start);
                }
            }
            if reset {
                states.clear();
            } else {
                states.retain(|(s, _)| !to_remove.contains(s));
            }
            if current >= skip {
                if let Some(next) = self.child(0, current_char) {
                    // Python: `states[current] = ...` (a new key goes last).
                    states.retain(|&(s, _)| s != current);
                    states.push((current, next));
                }
            }
        }
        for &(start, trie_pointer) in &states {
            if self.nodes[trie_pointer].terminal {
                offsets.push(start);
                offsets.push(n);
                break;
            }
        }
        // cut_text
        offsets.push(n);
        let byte = |i: usize| chars.get(i).map_or(text.len(), |&(b, _)| b);
        let mut tokens = Vec::new();
        let mut start = 0;
        for end in offsets {
            if start >= end {
                // `start > end` is logged as a bug by transformers and skipped; equal is empty.
                continue;
            }
            tokens.push(&text[byte(start)..byte(end)]);
            start = end;
        }
        tokens
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_like_transformers() {
        let t = AddedTokenTrie::new(["</s>", "<unk>", "<pad>"]);
        assert_eq!(
            t.split("a</s>b<unk>c"),
            vec!["a", "</s>", "b", "<unk>", "c"]
        );
        assert_eq!(t.split("</s>"), vec!["</s>"]);
        assert_eq!(t.split(""), Vec::<&str>::new());
        assert_eq!(t.split("no tokens"), vec!["no tokens"]);
        assert_eq!(t.split("<</s>>"), vec!["<", "</s>", ">"]);
        // The docstring examples of transformers' Trie.split.
        let t = AddedTokenTrie::new(["[CLS]", "extra_id_1", "extra_id_100"]);
        assert_eq!(
            t.split("[CLS] This is a extra_id_100"),
            vec!["[CLS]", " This is a ", "extra_id_100"]
        );
        let t = AddedTokenTrie::new(["AB", "B", "C"]);
        assert_eq!(t.split("ABC"), vec!["AB", "C"]);
    }
}
