//! Read-only Darts-clone double-array trie, as stored in sentencepiece's `precompiled_charsmap`.
//!
//! Each unit is a little-endian `u32`; the bit layout follows `darts.h` (`DoubleArrayUnit`):
//! bit 8 = has a leaf, bit 31 = is a leaf, low 8 bits (and bit 31) = label, bits 10.. = offset
//! (shifted by 8 more when bit 9 is set), low 31 bits of a leaf = value.

use candle::{Error, Result};

/// A double-array trie borrowed from a model's bytes.
#[derive(Debug, Clone)]
pub struct DoubleArray {
    units: Vec<u32>,
}

impl DoubleArray {
    /// Reads the units of a trie blob (its length must be a multiple of 4).
    pub fn new(blob: &[u8]) -> Result<Self> {
        if !blob.len().is_multiple_of(4) || blob.is_empty() {
            return Err(Error::Msg(format!(
                "precompiled_charsmap: the double-array trie has {} bytes, not a positive multiple of 4",
                blob.len()
            )));
        }
        let units = blob
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        Ok(Self { units })
    }

    /// All keys that are prefixes of `key`, as `(value, length in bytes)`, shortest first
    /// (darts' `commonPrefixSearch`). A trie that points outside itself ends the search.
    pub fn common_prefix_search(&self, key: &[u8]) -> Vec<(u32, usize)> {
        let mut results = Vec::new();
        let Some(&root) = self.units.first() else {
            return results;
        };
        let mut node_pos = offset(root);
        for (i, &b) in key.iter().enumerate() {
            node_pos ^= b as usize;
            let Some(&unit) = self.units.get(node_pos) else {
                return results;
            };
            if label(unit) != b as u32 {
                return results;
            }
            node_pos ^= offset(unit);
            if has_leaf(unit) {
                let Some(&leaf) = self.units.get(node_pos) else {
                    return results;
                };
                results.push((value(leaf), i + 1));
            }
        }
        results
    }
}

fn has_leaf(unit: u32) -> bool {
    (unit >> 8) & 1 == 1
}

fn value(unit: u32) -> u32 {
    unit & ((1 << 31) - 1)
}

fn label(unit: u32) -> u32 {
    unit & ((1 << 31) | 0xFF)
}

fn offset(unit: u32) -> usize {
    ((unit >> 10) << ((unit & (1 << 9)) >> 6)) as usize
}
