//! sentencepiece's normaliser (`normalizer.cc`), driven by the model's own `precompiled_charsmap`.
//!
//! The charsmap is `<u32 LE trie size><Darts double-array trie><NUL-terminated replacements>`.
//! At each position the longest key of the trie that prefixes the input is replaced by its
//! string; without a match one character is copied. User-defined pieces are matched first and
//! copied verbatim. Then the whitespace rules: leading spaces dropped, runs of spaces collapsed,
//! trailing spaces dropped (`remove_extra_whitespaces`), `' '` written as `▁`
//! (`escape_whitespaces`), and a `▁` added in front (`add_dummy_prefix`; after the text when
//! the model treats whitespace as a suffix).

use super::darts::DoubleArray;
use super::model_proto::NormalizerSpec;
use candle::{Error, Result};

/// The whitespace symbol U+2581.
pub const SPACE_SYMBOL: &str = "\u{2581}";

/// A normaliser for one `NormalizerSpec`.
#[derive(Debug, Clone)]
pub struct Normalizer {
    spec: NormalizerSpec,
    treat_whitespace_as_suffix: bool,
    trie: Option<DoubleArray>,
    /// The replacement strings, each ended by NUL; trie values are offsets into it.
    replacements: Vec<u8>,
    /// User-defined pieces, matched before the charsmap (longest first).
    user_defined: Vec<String>,
}

impl Normalizer {
    /// Builds the normaliser of `spec`; `user_defined` are the model's user-defined pieces.
    pub fn new(
        spec: &NormalizerSpec,
        treat_whitespace_as_suffix: bool,
        user_defined: Vec<String>,
    ) -> Result<Self> {
        let (trie, replacements) = if spec.precompiled_charsmap.is_empty() {
            (None, Vec::new())
        } else {
            let blob = &spec.precompiled_charsmap;
            if blob.len() <= 4 {
                return Err(Error::Msg(
                    "precompiled_charsmap: blob for normalization rule is broken (too short)"
                        .into(),
                ));
            }
            let size = u32::from_le_bytes([blob[0], blob[1], blob[2], blob[3]]) as usize;
            if size >= blob.len() || size > blob.len() - 4 {
                return Err(Error::Msg(format!(
                    "precompiled_charsmap: trie size {size} exceeds the blob ({} bytes)",
                    blob.len()
                )));
            }
            let trie = DoubleArray::new(&blob[4..4 + size])?;
            (Some(trie), blob[4 + size..].to_vec())
        };
        let mut user_defined = user_defined;
        // Longest first, so the first match is the longest one.
        user_defined.sort_by_key(|s| std::cmp::Reverse(s.len()));
        Ok(Self {
            spec: spec.clone(),
            treat_whitespace_as_suffix,
            trie,
            replacements,
            user_defined,
        })
    }

    /// Normalises the start of `input`: returns the replacement and how many bytes it consumes.
    fn normalize_prefix<'a>(&'a self, input: &'a str) -> Result<(&'a [u8], usize)> {
        if let Some(u) = self
            .user_defined
            .iter()
            .find(|u| input.starts_with(u.as_str()))
        {
            return Ok((u.as_bytes(), u.len()));
        }
        if let Some(trie) = &self.trie {
            if let Some(&(value, len)) = trie.common_prefix_search(input.as_bytes()).last() {
                // A rule's key is a whole UTF-8 string, so it ends where a character does; a
                // trie that matches part of a character is corrupt (sentencepiece would go on
                // from the middle of the character and emit invalid UTF-8).
                if !input.is_char_boundary(len) {
                    let c = input.chars().next().unwrap_or_default();
                    return Err(Error::Msg(format!(
                        "precompiled_charsmap: a rule matches {len} bytes, which ends inside the \
                         character {c:?} (corrupt model)"
                    )));
                }
                let start = value as usize;
                let tail = self.replacements.get(start..).ok_or_else(|| {
                    Error::Msg(format!(
                        "precompiled_charsmap: replacement offset {start} outside the {} bytes of strings",
                        self.replacements.len()
                    ))
                })?;
                let end = tail.iter().position(|&b| b == 0).unwrap_or(tail.len());
                return Ok((&tail[..end], len));
            }
        }
        // No rule: copy one character (the input is valid UTF-8).
        let len = input.chars().next().map_or(0, char::len_utf8);
        Ok((&input.as_bytes()[..len], len))
    }

    /// Normalises `input` exactly as sentencepiece's `Normalizer::Normalize`.
    pub fn normalize(&self, input: &str) -> Result<String> {
        let mut input = input;
        if input.is_empty() {
            return Ok(String::new());
        }
        let remove_extra = self.spec.remove_extra_whitespaces;
        let escape = self.spec.escape_whitespaces;
        // Leading whitespace (after normalisation) is dropped.
        if remove_extra {
            while !input.is_empty() {
                let (sp, n) = self.normalize_prefix(input)?;
                if sp != b" " {
                    break;
                }
                input = &input[n..];
            }
        }
        if input.is_empty() {
            return Ok(String::new());
        }
        let space: &[u8] = if escape {
            SPACE_SYMBOL.as_bytes()
        } else {
            b" "
        };
        let mut out: Vec<u8> = Vec::with_capacity(input.len() * 3);
        if !self.treat_whitespace_as_suffix && self.spec.add_dummy_prefix {
            out.extend_from_slice(space);
        }
        let mut is_prev_space = remove_extra;
        while !input.is_empty() {
            let (mut sp, n) = self.normalize_prefix(input)?;
            // Spaces at the start of this replacement are dropped after a space.
            while is_prev_space && sp.first() == Some(&b' ') {
                sp = &sp[1..];
            }
            if !sp.is_empty() {
                for &b in sp {
                    if escape && b == b' ' {
                        out.extend_from_slice(SPACE_SYMBOL.as_bytes());
                    } else {
                        out.push(b);
                    }
                }
                is_prev_space = sp.last() == Some(&b' ');
            }
            input = &input[n..];
            if !remove_extra {
                is_prev_space = false;
            }
        }
        if remove_extra {
            while out.ends_with(space) {
                out.truncate(out.len() - space.len());
            }
        }
        if self.treat_whitespace_as_suffix && self.spec.add_dummy_prefix {
            out.extend_from_slice(space);
        }
        String::from_utf8(out).map_err(|e| {
            Error::Msg(format!(
                "precompiled_charsmap produced invalid UTF-8 (corrupt model): {e}"
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(add_dummy_prefix: bool, remove_extra: bool, escape: bool) -> Normalizer {
        let spec = NormalizerSpec {
            name: "identity".into(),
            precompiled_charsmap: Vec::new(),
            add_dummy_prefix,
            remove_extra_whitespaces: remove_extra,
            escape_whitespaces: escape,
        };
        Normalizer::new(&spec, false, vec!["<sep>".into()]).unwrap()
    }

    #[test]
    fn whitespace_rules_follow_normalizer_cc() {
        let n = identity(true, true, true);
        assert_eq!(n.normalize("  a   b  ").unwrap(), "▁a▁b");
        assert_eq!(n.normalize("   ").unwrap(), "");
        assert_eq!(n.normalize("").unwrap(), "");
        // A literal `▁` at the end is removed as trailing whitespace too.
        assert_eq!(n.normalize("x▁").unwrap(), "▁x");
        let n = identity(false, false, false);
        assert_eq!(n.normalize("  a   b ").unwrap(), "  a   b ");
        let n = identity(true, false, true);
        assert_eq!(n.normalize(" a  b").unwrap(), "▁▁a▁▁b");
    }

    #[test]
    fn user_defined_symbols_pass_verbatim() {
        let n = identity(true, true, true);
        assert_eq!(n.normalize("a<sep>b").unwrap(), "▁a<sep>b");
    }

    #[test]
    fn broken_charsmap_is_an_error() {
        let spec = NormalizerSpec {
            precompiled_charsmap: vec![200, 0, 0, 0, 1, 2, 3, 4],
            ..NormalizerSpec::default()
        };
        let err = Normalizer::new(&spec, false, vec![])
            .unwrap_err()
            .to_string();
        assert!(err.contains("exceeds"), "{err}");
    }
}
