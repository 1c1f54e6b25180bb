//! Reading a tokenizer directory's JSON files: `vocab.json` (in file order, as Python's
//! `json.load` keeps it), `tokenizer_config.json` and the legacy `special_tokens_map.json`.

use candle::{Error, Result};
use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::Value;
use std::collections::HashMap;
use std::path::Path;

/// A `{token: id}` map that remembers the order of the file (the first position of a key,
/// the last value of a repeated key: what a Python dict built by `json.load` holds).
#[derive(Debug, Clone, Default)]
pub struct Vocab {
    /// Tokens in first-appearance order.
    pub order: Vec<String>,
    /// Token to id.
    pub map: HashMap<String, u32>,
}

impl Vocab {
    /// Reads a vocab JSON file; every value must be an integer id in `0..2^32`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Msg(format!("cannot read {}: {e}", path.display())))?;
        Self::from_json(&text).map_err(|e| Error::Msg(format!("{}: {e}", path.display())))
    }

    /// Parses the JSON text of a vocab file.
    pub fn from_json(text: &str) -> Result<Self> {
        let mut de = serde_json::Deserializer::from_str(text);
        let entries = de
            .deserialize_map(EntriesVisitor)
            .map_err(|e| Error::Msg(format!("not a JSON object of token ids: {e}")))?;
        de.end()
            .map_err(|e| Error::Msg(format!("trailing data after the JSON object: {e}")))?;
        let mut vocab = Vocab::default();
        for (token, value) in entries {
            let id = value
                .as_u64()
                .and_then(|v| u32::try_from(v).ok())
                .ok_or_else(|| {
                    Error::Msg(format!(
                        "token {token:?} has id {value}, not a non-negative integer below 2^32"
                    ))
                })?;
            if vocab.map.insert(token.clone(), id).is_none() {
                vocab.order.push(token);
            }
        }
        Ok(vocab)
    }

    /// Number of distinct tokens (`len(vocab)` in Python).
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Id to token; for an id held by several tokens the last one in file order wins
    /// (`{v: k for k, v in vocab.items()}`).
    pub fn inverse(&self) -> HashMap<u32, String> {
        self.order
            .iter()
            .map(|t| (self.map[t], t.clone()))
            .collect()
    }
}

struct EntriesVisitor;

impl<'de> Visitor<'de> for EntriesVisitor {
    type Value = Vec<(String, Value)>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON object mapping tokens to ids")
    }

    fn visit_map<A: MapAccess<'de>>(
        self,
        mut map: A,
    ) -> std::result::Result<Self::Value, A::Error> {
        let mut out = Vec::new();
        while let Some((k, v)) = map.next_entry::<String, Value>()? {
            out.push((k, v));
        }
        Ok(out)
    }
}

/// An added token of `added_tokens_decoder`.
#[derive(Debug, Clone, PartialEq)]
pub struct AddedTokenSpec {
    /// Its id.
    pub id: u32,
    /// Its text.
    pub content: String,
    /// Whether it is special (skipped by `skip_special_tokens`).
    pub special: bool,
}

/// The settings of `tokenizer_config.json` (and `special_tokens_map.json`) the tokenizer uses.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenizerConfig {
    /// `source_lang`.
    pub source_lang: Option<String>,
    /// `target_lang`.
    pub target_lang: Option<String>,
    /// `separate_vocabs`: the target side has its own `target_vocab.json`.
    pub separate_vocabs: bool,
    /// `clean_up_tokenization_spaces` (transformers 5 default: false).
    pub clean_up_tokenization_spaces: bool,
    /// Named special tokens in transformers' order (bos, eos, unk, sep, pad, cls, mask).
    pub named_special: Vec<(&'static str, String)>,
    /// `additional_special_tokens` / `extra_special_tokens`.
    pub extra_special: Vec<String>,
    /// `added_tokens_decoder`, when the config has it.
    pub added_tokens: Vec<AddedTokenSpec>,
}

const NAMED: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

fn read_json(path: &Path) -> Result<Option<serde_json::Map<String, Value>>> {
    if !path.exists() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::Msg(format!("cannot read {}: {e}", path.display())))?;
    match serde_json::from_str::<Value>(&text) {
        Ok(Value::Object(m)) => Ok(Some(m)),
        Ok(_) => Err(Error::Msg(format!("{}: not a JSON object", path.display()))),
        Err(e) => Err(Error::Msg(format!("{}: invalid JSON: {e}", path.display()))),
    }
}

/// The text of a token given as a string or as an `AddedToken` object.
fn token_text(v: &Value, what: &str, path: &Path) -> Result<String> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Object(o) => {
            for flag in ["lstrip", "rstrip", "single_word"] {
                if o.get(flag).and_then(Value::as_bool) == Some(true) {
                    return Err(Error::Msg(format!(
                        "{}: {what} sets {flag}=true, which this tokenizer does not implement",
                        path.display()
                    )));
                }
            }
            o.get("content")
                .and_then(Value::as_str)
                .map(str::to_string)
                .ok_or_else(|| {
                    Error::Msg(format!(
                        "{}: {what} has no string \"content\"",
                        path.display()
                    ))
                })
        }
        _ => Err(Error::Msg(format!(
            "{}: {what} is neither a string nor a token object",
            path.display()
        ))),
    }
}

impl TokenizerConfig {
    /// Reads `tokenizer_config.json` and `special_tokens_map.json` in `dir` (both optional).
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let config_path = dir.join("tokenizer_config.json");
        let config = read_json(&config_path)?.unwrap_or_default();
        let mut cfg = TokenizerConfig {
            source_lang: config
                .get("source_lang")
                .and_then(Value::as_str)
                .map(Into::into),
            target_lang: config
                .get("target_lang")
                .and_then(Value::as_str)
                .map(Into::into),
            separate_vocabs: config
                .get("separate_vocabs")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            clean_up_tokenization_spaces: config
                .get("clean_up_tokenization_spaces")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            named_special: Vec::new(),
            extra_special: Vec::new(),
            added_tokens: Vec::new(),
        };
        let mut named: HashMap<&'static str, String> = HashMap::from([
            ("unk_token", "<unk>".to_string()),
            ("eos_token", "</s>".to_string()),
            ("pad_token", "<pad>".to_string()),
        ]);
        let mut extra_values: Vec<(Value, std::path::PathBuf)> = Vec::new();
        if let Some(Value::Object(decoder)) = config.get("added_tokens_decoder") {
            for (id, tok) in decoder {
                let id: u32 = id.parse().map_err(|_| {
                    Error::Msg(format!(
                        "{}: added_tokens_decoder key {id:?} is not an id",
                        config_path.display()
                    ))
                })?;
                let content = token_text(tok, "an added token", &config_path)?;
                let special = tok.get("special").and_then(Value::as_bool).unwrap_or(false);
                cfg.added_tokens.push(AddedTokenSpec {
                    id,
                    content,
                    special,
                });
            }
            cfg.added_tokens.sort_by_key(|t| t.id);
        } else {
            // Legacy: special_tokens_map.json is read only without added_tokens_decoder.
            let map_path = dir.join("special_tokens_map.json");
            if let Some(map) = read_json(&map_path)? {
                for name in NAMED {
                    if let Some(v) = map.get(name) {
                        named.insert(name, token_text(v, name, &map_path)?);
                    }
                }
                for key in ["additional_special_tokens", "extra_special_tokens"] {
                    if let Some(v) = map.get(key) {
                        extra_values.push((v.clone(), map_path.clone()));
                    }
                }
            }
        }
        for name in NAMED {
            match config.get(name) {
                Some(Value::Null) | None => {}
                Some(v) => {
                    named.insert(name, token_text(v, name, &config_path)?);
                }
            }
        }
        for key in ["extra_special_tokens", "additional_special_tokens"] {
            if let Some(v) = config.get(key) {
                extra_values.insert(0, (v.clone(), config_path.clone()));
                break;
            }
        }
        for (v, path) in extra_values {
            let Value::Array(items) = v else {
                return Err(Error::Msg(format!(
                    "{}: additional/extra special tokens must be a list",
                    path.display()
                )));
            };
            for item in &items {
                let t = token_text(item, "an extra special token", &path)?;
                if !cfg.extra_special.contains(&t) {
                    cfg.extra_special.push(t);
                }
            }
        }
        cfg.named_special = NAMED
            .iter()
            .filter_map(|&n| named.get(n).map(|t| (n, t.clone())))
            .collect();
        Ok(cfg)
    }

    /// The named special token `name` (`"unk_token"`, ...), if set.
    pub fn named(&self, name: &str) -> Option<&str> {
        self.named_special
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, t)| t.as_str())
    }

    /// All special tokens, deduplicated, in transformers' `all_special_tokens` order.
    pub fn all_special_tokens(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for t in self
            .named_special
            .iter()
            .map(|(_, t)| t)
            .chain(self.extra_special.iter())
        {
            if !out.contains(t) {
                out.push(t.clone());
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vocab_keeps_file_order_and_last_value() {
        let v = Vocab::from_json(r#"{"b": 1, "a": 0, "b": 2, "c": 2}"#).unwrap();
        assert_eq!(v.order, vec!["b", "a", "c"]);
        assert_eq!(v.map["b"], 2);
        assert_eq!(v.inverse()[&2], "c");
        let err = Vocab::from_json(r#"{"a": -1}"#).unwrap_err().to_string();
        assert!(err.contains("\"a\""), "{err}");
        assert!(Vocab::from_json("[1, 2]").is_err());
    }
}
