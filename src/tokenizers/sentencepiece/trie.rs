//! A byte trie over piece strings: the unigram lattice's piece lookup and the user-defined
//! symbols' prefix matcher (sentencepiece's `PrefixMatcher`, longest match first).

use std::collections::HashMap;

/// A byte trie mapping keys to ids.
#[derive(Debug, Clone)]
pub struct Trie {
    /// Node 0 is the root.
    nodes: Vec<TrieNode>,
}

impl Default for Trie {
    fn default() -> Self {
        Self::new()
    }
}

#[derive(Debug, Clone, Default)]
struct TrieNode {
    children: HashMap<u8, u32>,
    value: Option<u32>,
}

impl Trie {
    /// An empty trie.
    pub fn new() -> Self {
        Self {
            nodes: vec![TrieNode::default()],
        }
    }

    /// Adds `key` with `value` (a later value for the same key replaces the earlier one).
    pub fn insert(&mut self, key: &[u8], value: u32) {
        let mut node = 0usize;
        for &b in key {
            node = match self.nodes[node].children.get(&b) {
                Some(&next) => next as usize,
                None => {
                    self.nodes.push(TrieNode::default());
                    let next = self.nodes.len() - 1;
                    self.nodes[node].children.insert(b, next as u32);
                    next
                }
            };
        }
        self.nodes[node].value = Some(value);
    }

    /// The ids of all keys that prefix `key`, with their byte lengths, shortest first.
    pub fn common_prefixes(&self, key: &[u8]) -> Vec<(u32, usize)> {
        let mut out = Vec::new();
        let mut node = 0usize;
        for (i, b) in key.iter().enumerate() {
            match self.nodes[node].children.get(b) {
                Some(&next) => node = next as usize,
                None => break,
            }
            if let Some(v) = self.nodes[node].value {
                out.push((v, i + 1));
            }
        }
        out
    }

    /// The byte length of the longest key that prefixes `key`, if any.
    pub fn longest_prefix(&self, key: &[u8]) -> Option<usize> {
        let mut node = 0usize;
        let mut longest = None;
        for (i, b) in key.iter().enumerate() {
            match self.nodes[node].children.get(b) {
                Some(&next) => node = next as usize,
                None => break,
            }
            if self.nodes[node].value.is_some() {
                longest = Some(i + 1);
            }
        }
        longest
    }

    /// Whether the trie holds no key.
    pub fn is_empty(&self) -> bool {
        self.nodes.len() == 1 && self.nodes[0].value.is_none()
    }

    /// The value of exactly `key`.
    pub fn get(&self, key: &[u8]) -> Option<u32> {
        let mut node = 0usize;
        for b in key {
            node = *self.nodes[node].children.get(b)? as usize;
        }
        self.nodes[node].value
    }
}
