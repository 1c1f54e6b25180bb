//! Tokenizers for the number translation task: English words in, German morphemes out.
//!
//! Both sides share four special tokens with fixed ids: `<pad>` = [`PAD`] = 0, `<bos>` =
//! [`BOS`] = 1, `<eos>` = [`EOS`] = 2, `<unk>` = [`UNK`] = 3. `encode` returns the content ids
//! only (no `<bos>` / `<eos>`); the training loop adds the framing. `decode` skips `<pad>` and
//! `<bos>` and stops at the first `<eos>`, so it takes raw model output.
//!
//! **English** ([`EnglishTokenizer`]) is word level. Input is first *normalised*: parsed with
//! [`parse_english`] (which also validates it and names any bad word) and rewritten in
//! num2words' canonical form with [`english`], so the American form `"three hundred forty-two"`,
//! `"Three  Hundred and forty two"` and `"three hundred and forty-two"` all become the same
//! tokens. The canonical text is split at spaces, and the comma after `thousand` and the hyphen
//! between tens and units are tokens of their own: `"one thousand, two hundred and thirty-four"`
//! is `one thousand , two hundred and thirty - four`. Keeping them makes decoding a plain join
//! that reproduces num2words' text exactly, and costs at most three tokens (two hyphens and a
//! comma). 33 tokens + 4 specials = 37 ids; at most [`MAX_ENGLISH_TOKENS`] = 14 tokens per
//! number.
//!
//! **German** ([`GermanTokenizer`]) numbers are single compound words
//! (`"dreihundertzweiundvierzig"`), so a word-level vocabulary would need a million entries and
//! characters would give sequences of up to 65 tokens. Instead the compound is cut into the
//! 27 morphemes of [`GERMAN_MORPHEMES`] (`drei hundert zwei und vierzig`; teens as
//! `unit + zehn` with the stems `sech` and `sieb`; the tens `zwanzig` .. `neunzig` whole):
//! 27 + 4 = 31 ids and at most [`MAX_GERMAN_TOKENS`] = 11 tokens per number, short sequences
//! and a small softmax that train fast, and units, tens and `hundert` / `tausend` line up with
//! the English words for the attention heatmaps. Segmentation is greedy longest match over the
//! lexicon. The lexicon is a uniquely decodable code (checked with the Sardinas–Patterson test
//! in `tests/translate_data.rs`), so any text has at most one segmentation; the greedy one
//! equals [`german_morphemes`] for every number, and decoding (concatenation) reproduces the
//! exact string; both are tested over all of `0..=999_999`.
//!
//! Vocabularies are saved and loaded as JSON, `{"tokens": ["<pad>", "<bos>", ...]}`, a token's
//! id being its index. `build()` derives a vocabulary from the generators over all of
//! `0..=999_999` (so it is complete), in order of first appearance.

use std::borrow::Cow;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::path::Path;

use candle::Result;
use serde::{Deserialize, Serialize};

use super::numbers::{english, german_morphemes, parse_english, GERMAN_MORPHEMES, MAX};

/// Id of `<pad>` on both sides.
pub const PAD: u32 = 0;
/// Id of `<bos>` (begin of sequence) on both sides.
pub const BOS: u32 = 1;
/// Id of `<eos>` (end of sequence) on both sides.
pub const EOS: u32 = 2;
/// Id of `<unk>` on both sides (never produced by `encode`, which rejects unknown input).
pub const UNK: u32 = 3;
/// The special tokens, at ids 0..=3.
pub const SPECIAL_TOKENS: [&str; 4] = ["<pad>", "<bos>", "<eos>", "<unk>"];

/// The most English tokens a number in `0..=999_999` encodes to (without `<bos>` / `<eos>`):
/// 14, e.g. 777 777, `seven hundred and seventy - seven thousand , seven hundred and seventy -
/// seven`.
pub const MAX_ENGLISH_TOKENS: usize = 14;
/// The most German tokens a number in `0..=999_999` encodes to (without `<bos>` / `<eos>`):
/// 11, e.g. 777 777, `sieben hundert sieben und siebzig tausend sieben hundert sieben und
/// siebzig`.
pub const MAX_GERMAN_TOKENS: usize = 11;

/// The English tokens [`EnglishTokenizer::build`] finds, in order of first appearance over
/// `0..=999_999` (33 of them).
pub const ENGLISH_TOKENS: [&str; 33] = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
    "twenty",
    "-",
    "thirty",
    "forty",
    "fifty",
    "sixty",
    "seventy",
    "eighty",
    "ninety",
    "hundred",
    "and",
    "thousand",
    ",",
];

/// FNV-1a: token lookups hash a few short strings per number, where SipHash would dominate the
/// cost of encoding the million training pairs.
#[derive(Default)]
struct Fnv(u64);

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut h = if self.0 == 0 {
            0xcbf2_9ce4_8422_2325
        } else {
            self.0
        };
        for &b in bytes {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        self.0 = h;
    }
}

type FnvMap<K, V> = HashMap<K, V, BuildHasherDefault<Fnv>>;

/// A vocabulary: token strings and their ids (an id is the token's index). The first four
/// tokens are always [`SPECIAL_TOKENS`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vocab {
    tokens: Vec<String>,
    index: FnvMap<String, u32>,
}

#[derive(Serialize, Deserialize)]
struct VocabFile {
    tokens: Vec<String>,
}

impl Vocab {
    /// A vocabulary of the special tokens followed by `tokens` (which must not repeat or contain
    /// a special token).
    pub fn new<S: Into<String>>(tokens: impl IntoIterator<Item = S>) -> Result<Self> {
        let all = SPECIAL_TOKENS
            .iter()
            .map(|s| s.to_string())
            .chain(tokens.into_iter().map(Into::into))
            .collect();
        Self::from_tokens(all)
    }

    /// A vocabulary from its complete token list, specials included; checks that the list
    /// starts with [`SPECIAL_TOKENS`] and has no duplicates or empty tokens.
    pub fn from_tokens(tokens: Vec<String>) -> Result<Self> {
        if tokens.len() < SPECIAL_TOKENS.len()
            || tokens[..SPECIAL_TOKENS.len()]
                .iter()
                .zip(SPECIAL_TOKENS)
                .any(|(a, b)| a != b)
        {
            candle::bail!(
                "vocabulary must start with the special tokens {SPECIAL_TOKENS:?}, got {:?}",
                &tokens[..tokens.len().min(SPECIAL_TOKENS.len())]
            )
        }
        if tokens.len() > u32::MAX as usize {
            candle::bail!("vocabulary too large: {} tokens", tokens.len())
        }
        let mut index = FnvMap::with_capacity_and_hasher(tokens.len(), Default::default());
        for (id, token) in tokens.iter().enumerate() {
            if token.is_empty() {
                candle::bail!("vocabulary has an empty token at id {id}")
            }
            if let Some(prev) = index.insert(token.clone(), id as u32) {
                candle::bail!("vocabulary has the token {token:?} twice, at ids {prev} and {id}")
            }
        }
        Ok(Self { tokens, index })
    }

    /// The id of `token`, if it is in the vocabulary.
    pub fn id(&self, token: &str) -> Option<u32> {
        self.index.get(token).copied()
    }

    /// The token with id `id`, if there is one.
    pub fn token(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// All tokens, in id order (specials first).
    pub fn tokens(&self) -> &[String] {
        &self.tokens
    }

    /// The number of tokens, specials included (the size of an embedding table).
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Always `false`: a vocabulary holds at least the special tokens.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The vocabulary as JSON: `{"tokens": ["<pad>", "<bos>", "<eos>", "<unk>", ...]}`.
    pub fn to_json(&self) -> Result<String> {
        serde_json::to_string_pretty(&VocabFile {
            tokens: self.tokens.clone(),
        })
        .map_err(|e| candle::Error::Msg(format!("cannot serialise vocabulary: {e}")))
    }

    /// A vocabulary from the JSON [`Vocab::to_json`] writes.
    pub fn from_json(json: &str) -> Result<Self> {
        let file: VocabFile = serde_json::from_str(json).map_err(|e| {
            candle::Error::Msg(format!(
                "invalid vocabulary JSON (expected {{\"tokens\": [...]}}): {e}"
            ))
        })?;
        Self::from_tokens(file.tokens)
    }

    /// Writes the vocabulary to `path` as JSON.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        std::fs::write(path, self.to_json()?).map_err(|e| {
            candle::Error::Msg(format!("cannot write vocabulary {}: {e}", path.display()))
        })
    }

    /// Reads a vocabulary written by [`Vocab::save`].
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let json = std::fs::read_to_string(path).map_err(|e| {
            candle::Error::Msg(format!("cannot read vocabulary {}: {e}", path.display()))
        })?;
        Self::from_json(&json)
            .map_err(|e| candle::Error::Msg(format!("vocabulary {}: {e}", path.display())))
    }

    /// Checks that every token in `required` is present.
    fn require(&self, side: &str, required: &[&str]) -> Result<()> {
        let missing: Vec<&str> = required
            .iter()
            .copied()
            .filter(|t| self.id(t).is_none())
            .collect();
        if !missing.is_empty() {
            candle::bail!("{side} vocabulary lacks the tokens {missing:?}")
        }
        Ok(())
    }

    fn ids(&self, side: &str, tokens: &[&str]) -> Result<Vec<u32>> {
        tokens
            .iter()
            .map(|t| {
                self.id(t).ok_or_else(|| {
                    candle::Error::Msg(format!("{side} token {t:?} is not in the vocabulary"))
                })
            })
            .collect()
    }

    /// The content tokens of `ids`: `<pad>` and `<bos>` skipped, stopping at the first `<eos>`;
    /// errors for `<unk>` and ids outside the vocabulary.
    fn content<'v>(&'v self, side: &str, ids: &[u32]) -> Result<Vec<&'v str>> {
        let mut out = Vec::with_capacity(ids.len());
        for &id in ids {
            match id {
                PAD | BOS => continue,
                EOS => break,
                UNK => candle::bail!("cannot decode {side} <unk> (id {UNK}) in {ids:?}"),
                _ => match self.token(id) {
                    Some(t) => out.push(t),
                    None => candle::bail!(
                        "{side} id {id} is outside the vocabulary of {} tokens (in {ids:?})",
                        self.len()
                    ),
                },
            }
        }
        Ok(out)
    }
}

/// Distinct tokens in order of first appearance.
#[derive(Default)]
struct FirstSeen {
    set: FnvMap<String, ()>,
    order: Vec<String>,
}

impl FirstSeen {
    fn extend<'a>(&mut self, tokens: impl IntoIterator<Item = &'a str>) {
        for t in tokens {
            if !self.set.contains_key(t) {
                self.set.insert(t.to_string(), ());
                self.order.push(t.to_string());
            }
        }
    }
}

/// Splits num2words' canonical English text into tokens: words at spaces, with the comma and
/// the hyphen as tokens of their own.
fn english_tokens(canonical: &str) -> Vec<&str> {
    let mut out = Vec::with_capacity(MAX_ENGLISH_TOKENS);
    for word in canonical.split(' ') {
        let (word, comma) = match word.strip_suffix(',') {
            Some(w) => (w, true),
            None => (word, false),
        };
        match word.split_once('-') {
            Some((tens, unit)) => out.extend([tens, "-", unit]),
            None => out.push(word),
        }
        if comma {
            out.push(",");
        }
    }
    out
}

/// The English (source) tokenizer; see the [module docs](self).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnglishTokenizer {
    vocab: Vocab,
}

impl EnglishTokenizer {
    /// Builds the vocabulary from [`english`] over all of `0..=999_999`: the specials, then the
    /// 33 tokens of [`ENGLISH_TOKENS`] in order of first appearance (37 ids).
    pub fn build() -> Result<Self> {
        let mut seen = FirstSeen::default();
        for n in 0..=MAX {
            seen.extend(english_tokens(&english(n)?));
        }
        Self::from_vocab(Vocab::new(seen.order)?)
    }

    /// A tokenizer over a loaded vocabulary; errors if a token of [`ENGLISH_TOKENS`] is missing.
    pub fn from_vocab(vocab: Vocab) -> Result<Self> {
        vocab.require("English", &ENGLISH_TOKENS)?;
        Ok(Self { vocab })
    }

    /// Loads a vocabulary saved by [`EnglishTokenizer::save`].
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        Self::from_vocab(Vocab::load(path)?)
    }

    /// Saves the vocabulary as JSON.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        self.vocab.save(path)
    }

    /// The vocabulary.
    pub fn vocab(&self) -> &Vocab {
        &self.vocab
    }

    /// Validates `text` with [`parse_english`] and rewrites it in num2words' canonical form:
    /// `"Three hundred forty two"` becomes `"three hundred and forty-two"`.
    pub fn normalize(&self, text: &str) -> Result<String> {
        english(parse_english(text)?)
    }

    /// The token strings of `text` after [normalisation](Self::normalize), e.g. for heatmap
    /// labels: `"three hundred forty-two"` gives `three hundred and forty - two`.
    pub fn tokens(&self, text: &str) -> Result<Vec<String>> {
        let canonical = self.normalize(text)?;
        Ok(english_tokens(&canonical)
            .into_iter()
            .map(str::to_string)
            .collect())
    }

    /// The ids of `text` after [normalisation](Self::normalize), without `<bos>` / `<eos>`.
    /// Errors (naming the word) for anything [`parse_english`] rejects: unknown or misplaced
    /// words, numbers out of range, empty input.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let canonical = self.normalize(text)?;
        self.vocab.ids("English", &english_tokens(&canonical))
    }

    /// The ids of `english(n)`, without `<bos>` / `<eos>` (the fast path for training data).
    pub fn encode_number(&self, n: u32) -> Result<Vec<u32>> {
        let canonical = english(n)?;
        self.vocab.ids("English", &english_tokens(&canonical))
    }

    /// Joins tokens back into text: words separated by spaces, the comma attached to the word
    /// before it, the hyphen to both neighbours (the inverse of the tokenization, so
    /// `decode(encode_number(n)) == english(n)`). `<pad>` and `<bos>` are skipped, decoding
    /// stops at the first `<eos>`; `<unk>` and unknown ids are errors.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        let tokens = self.vocab.content("English", ids)?;
        let mut out = String::with_capacity(8 * tokens.len());
        let mut glue = true;
        for t in tokens {
            match t {
                "," => out.push(','),
                "-" => {
                    out.push('-');
                    glue = true;
                    continue;
                }
                _ => {
                    if !glue {
                        out.push(' ');
                    }
                    out.push_str(t);
                }
            }
            glue = false;
        }
        Ok(out)
    }
}

/// The German (target) tokenizer: greedy longest-match morpheme segmentation; see the
/// [module docs](self).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GermanTokenizer {
    vocab: Vocab,
    /// Non-special tokens bucketed by first byte, each bucket longest first (ties by id): the
    /// greedy match order.
    lexicon: Vec<Vec<(String, u32)>>,
}

impl GermanTokenizer {
    /// Builds the vocabulary from [`german_morphemes`] over all of `0..=999_999`: the
    /// specials, then the 27 morphemes of [`GERMAN_MORPHEMES`] in order of first appearance
    /// (31 ids).
    pub fn build() -> Result<Self> {
        let mut seen = FirstSeen::default();
        for n in 0..=MAX {
            seen.extend(german_morphemes(n)?);
        }
        Self::from_vocab(Vocab::new(seen.order)?)
    }

    /// A tokenizer over a loaded vocabulary; errors if a morpheme of [`GERMAN_MORPHEMES`] is
    /// missing.
    pub fn from_vocab(vocab: Vocab) -> Result<Self> {
        vocab.require("German", &GERMAN_MORPHEMES)?;
        let mut lexicon: Vec<Vec<(String, u32)>> = vec![Vec::new(); 256];
        for (id, t) in vocab.tokens().iter().enumerate().skip(SPECIAL_TOKENS.len()) {
            lexicon[usize::from(t.as_bytes()[0])].push((t.clone(), id as u32));
        }
        for bucket in &mut lexicon {
            bucket.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
        }
        Ok(Self { vocab, lexicon })
    }

    /// Loads a vocabulary saved by [`GermanTokenizer::save`].
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        Self::from_vocab(Vocab::load(path)?)
    }

    /// Saves the vocabulary as JSON.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        self.vocab.save(path)
    }

    /// The vocabulary.
    pub fn vocab(&self) -> &Vocab {
        &self.vocab
    }

    /// Greedy longest-match segmentation of `text` (trimmed, lower-cased) into token ids.
    fn segment(&self, text: &str) -> Result<Vec<u32>> {
        let trimmed = text.trim();
        let lower: Cow<str> = if trimmed.chars().any(char::is_uppercase) {
            Cow::Owned(trimmed.to_lowercase())
        } else {
            Cow::Borrowed(trimmed)
        };
        if lower.is_empty() {
            candle::bail!("empty input: expected a German number word such as \"zweiundvierzig\"")
        }
        let mut ids = Vec::with_capacity(MAX_GERMAN_TOKENS);
        let mut rest: &str = &lower;
        while let Some(&first) = rest.as_bytes().first() {
            match self.lexicon[usize::from(first)]
                .iter()
                .find(|(t, _)| rest.starts_with(t.as_str()))
            {
                Some((t, id)) => {
                    ids.push(*id);
                    rest = &rest[t.len()..];
                }
                None => {
                    let at = lower.chars().count() - rest.chars().count() + 1;
                    candle::bail!(
                        "cannot segment {text:?}: no German number morpheme matches {rest:?} \
                         (character {at}); expected morphemes such as \"drei\", \"hundert\", \
                         \"und\", \"vierzig\""
                    )
                }
            }
        }
        Ok(ids)
    }

    /// The morphemes of `text`, e.g. for heatmap labels: `"dreihundertzweiundvierzig"` gives
    /// `drei hundert zwei und vierzig`.
    pub fn tokens(&self, text: &str) -> Result<Vec<String>> {
        Ok(self
            .segment(text)?
            .into_iter()
            .filter_map(|id| self.vocab.token(id).map(str::to_string))
            .collect())
    }

    /// The ids of `text`'s morphemes, without `<bos>` / `<eos>`. Errors for empty input and for
    /// text that is not made of German number morphemes.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        self.segment(text)
    }

    /// The ids of `german_morphemes(n)`, without `<bos>` / `<eos>` (the fast path for
    /// training data; equal to `encode(&german(n))`).
    pub fn encode_number(&self, n: u32) -> Result<Vec<u32>> {
        self.vocab.ids("German", &german_morphemes(n)?)
    }

    /// Concatenates the morphemes, reproducing the German word exactly. `<pad>` and `<bos>`
    /// are skipped, decoding stops at the first `<eos>`; `<unk>` and unknown ids are errors.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        Ok(self.vocab.content("German", ids)?.concat())
    }
}
