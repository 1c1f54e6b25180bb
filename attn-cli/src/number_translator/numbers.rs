//! The integers `0..=999_999` as words: the English source side, the German target side, a
//! strict parser for English input, and the fixed train / held-out split.
//!
//! The generators reproduce the Python package `num2words` (version 0.5.14) exactly:
//! [`english`] is `num2words(n, lang='en')` and [`german`] is `num2words(n, lang='de')`
//! (checked against `tests/fixtures/num2words/sample.tsv`, and once against the full range).
//!
//! Conventions worth knowing (they are num2words', not ours):
//!
//! * English: `"and"` after `hundred` when tens or units follow (`"one hundred and one"`), and
//!   after `thousand` when only tens or units follow (`"one thousand and one"`); a comma after
//!   `thousand` when hundreds follow (`"one thousand, one hundred"`); a hyphen between tens and
//!   units (`"forty-two"`); always `"one hundred"` / `"one thousand"`, never a bare `"hundred"`.
//! * German: one word without spaces; `"eins"` alone and at the end (`"einhunderteins"`),
//!   `"ein"` before `hundert`, `tausend` and `und` (`"einhundert"`, `"eintausend"`,
//!   `"einundzwanzig"`); always `"einhundert"` / `"eintausend"`, never a bare `"hundert"`;
//!   units before tens joined by `"und"` (`"zweiundvierzig"`); `"sechzehn"`, `"siebzehn"`,
//!   `"sechzig"`, `"siebzig"`, `"dreißig"`, `"zwölf"`, `"fünf"`.
//! * A num2words quirk we keep: a thousands group *ending* in one keeps `"eins"`:
//!   101 000 is `"einhunderteinstausend"` and 201 000 `"zweihunderteinstausend"`
//!   (but 1 000 is `"eintausend"` and 21 000 `"einundzwanzigtausend"`).
//!
//! Users may also type the American form ([`english_american`]: no `"and"`, no commas);
//! [`parse_english`] accepts both and rejects everything else.

use candle::Result;

/// The largest number the task covers: `999_999`.
pub const MAX: u32 = 999_999;

const EN_SMALL: [&str; 20] = [
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
];

const EN_TENS: [&str; 10] = [
    "", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety",
];

const DE_UNITS: [&str; 10] = [
    "null", "eins", "zwei", "drei", "vier", "fünf", "sechs", "sieben", "acht", "neun",
];

/// Stems of the German teens 13..=19: `stem + "zehn"` (note `sech`, `sieb`).
const DE_TEEN_STEMS: [&str; 10] = [
    "", "", "", "drei", "vier", "fünf", "sech", "sieb", "acht", "neun",
];

const DE_TENS: [&str; 10] = [
    "", "", "zwanzig", "dreißig", "vierzig", "fünfzig", "sechzig", "siebzig", "achtzig", "neunzig",
];

/// Every German morpheme [`german_morphemes`] can emit, in order of first appearance over
/// `0..=999_999` (27 of them).
pub const GERMAN_MORPHEMES: [&str; 27] = [
    "null", "eins", "zwei", "drei", "vier", "fünf", "sechs", "sieben", "acht", "neun", "zehn",
    "elf", "zwölf", "sech", "sieb", "zwanzig", "ein", "und", "dreißig", "vierzig", "fünfzig",
    "sechzig", "siebzig", "achtzig", "neunzig", "hundert", "tausend",
];

fn check_range(n: u32) -> Result<()> {
    if n > MAX {
        candle::bail!("number {n} is out of range: only 0..={MAX} is supported")
    }
    Ok(())
}

/// `n` in `1..=99`.
fn push_en_below_100(out: &mut String, n: u32) {
    if n < 20 {
        out.push_str(EN_SMALL[n as usize]);
    } else {
        out.push_str(EN_TENS[(n / 10) as usize]);
        if !n.is_multiple_of(10) {
            out.push('-');
            out.push_str(EN_SMALL[(n % 10) as usize]);
        }
    }
}

/// `n` in `1..=999`.
fn push_en_below_1000(out: &mut String, n: u32, with_and: bool) {
    let (hundreds, rest) = (n / 100, n % 100);
    if hundreds > 0 {
        out.push_str(EN_SMALL[hundreds as usize]);
        out.push_str(" hundred");
        if rest > 0 {
            out.push_str(if with_and { " and " } else { " " });
        }
    }
    if rest > 0 {
        push_en_below_100(out, rest);
    }
}

fn english_impl(n: u32, british: bool) -> Result<String> {
    check_range(n)?;
    if n == 0 {
        return Ok("zero".to_string());
    }
    let mut out = String::with_capacity(72);
    let (thousands, rest) = (n / 1000, n % 1000);
    if thousands > 0 {
        push_en_below_1000(&mut out, thousands, british);
        out.push_str(" thousand");
        if rest > 0 {
            out.push_str(match (british, rest < 100) {
                (true, true) => " and ",
                (true, false) => ", ",
                (false, _) => " ",
            });
        }
    }
    if rest > 0 {
        push_en_below_1000(&mut out, rest, british);
    }
    Ok(out)
}

/// `n` in words as `num2words(n, lang='en')` writes it, e.g. 12 345 is
/// `"twelve thousand, three hundred and forty-five"`. Errors for `n > 999_999`.
pub fn english(n: u32) -> Result<String> {
    english_impl(n, true)
}

/// `n` in the American form: [`english`] without `"and"` and without commas, e.g. 12 345 is
/// `"twelve thousand three hundred forty-five"`. Errors for `n > 999_999`.
pub fn english_american(n: u32) -> Result<String> {
    english_impl(n, false)
}

/// `n` in `1..=99`.
fn push_de_below_100(out: &mut Vec<&'static str>, n: u32) {
    let (tens, units) = ((n / 10) as usize, (n % 10) as usize);
    match n {
        1..=9 => out.push(DE_UNITS[units]),
        10 => out.push("zehn"),
        11 => out.push("elf"),
        12 => out.push("zwölf"),
        13..=19 => out.extend([DE_TEEN_STEMS[units], "zehn"]),
        _ if units == 0 => out.push(DE_TENS[tens]),
        _ => out.extend([
            if units == 1 { "ein" } else { DE_UNITS[units] },
            "und",
            DE_TENS[tens],
        ]),
    }
}

/// `n` in `1..=999`.
fn push_de_below_1000(out: &mut Vec<&'static str>, n: u32) {
    let (hundreds, rest) = (n / 100, n % 100);
    if hundreds > 0 {
        out.push(if hundreds == 1 {
            "ein"
        } else {
            DE_UNITS[hundreds as usize]
        });
        out.push("hundert");
    }
    if rest > 0 {
        push_de_below_100(out, rest);
    }
}

/// The German word for `n` cut into its morphemes, the target tokens of the translation task:
/// 342 is `["drei", "hundert", "zwei", "und", "vierzig"]`, 17 is `["sieb", "zehn"]`.
/// Joining them gives [`german`]. Errors for `n > 999_999`.
///
/// The morphemes are the units (`eins`/`ein`, `zwei`, ..., `neun`), `zehn`, `elf`, `zwölf`,
/// the teen stems `sech` and `sieb` (the other teens are `unit + zehn`), the tens `zwanzig` to
/// `neunzig` as single morphemes, `und`, `hundert`, `tausend` and `null`: the 27 strings of
/// [`GERMAN_MORPHEMES`].
pub fn german_morphemes(n: u32) -> Result<Vec<&'static str>> {
    check_range(n)?;
    let mut out = Vec::with_capacity(12);
    if n == 0 {
        out.push("null");
        return Ok(out);
    }
    let (thousands, rest) = (n / 1000, n % 1000);
    if thousands == 1 {
        out.extend(["ein", "tausend"]);
    } else if thousands > 1 {
        push_de_below_1000(&mut out, thousands);
        out.push("tausend");
    }
    if rest > 0 {
        push_de_below_1000(&mut out, rest);
    }
    Ok(out)
}

/// `n` in words as `num2words(n, lang='de')` writes it, e.g. 342 is
/// `"dreihundertzweiundvierzig"`. Errors for `n > 999_999`.
pub fn german(n: u32) -> Result<String> {
    Ok(german_morphemes(n)?.concat())
}

// ---------------------------------------------------------------------------------------------
// Parsing English.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Zero,
    /// one..nine
    Unit(u32),
    /// ten..nineteen
    Teen(u32),
    /// twenty..ninety
    Tens(u32),
    Hundred,
    Thousand,
    And,
    Comma,
    Hyphen,
}

#[derive(Debug, Clone, Copy)]
struct Tok<'a> {
    kind: Kind,
    text: &'a str,
    /// 1-based character column in the input.
    column: usize,
}

fn classify(word: &str) -> Option<Kind> {
    let mut buf = [0u8; 12];
    if word.len() > buf.len() || !word.is_ascii() {
        return None;
    }
    let lower = &mut buf[..word.len()];
    lower.copy_from_slice(word.as_bytes());
    lower.make_ascii_lowercase();
    let lower: &[u8] = lower;
    Some(match lower {
        b"zero" => Kind::Zero,
        b"hundred" => Kind::Hundred,
        b"thousand" => Kind::Thousand,
        b"and" => Kind::And,
        _ => {
            if let Some(i) = EN_SMALL.iter().position(|w| w.as_bytes() == lower) {
                if i < 10 {
                    Kind::Unit(i as u32)
                } else {
                    Kind::Teen(i as u32)
                }
            } else if let Some(i) = EN_TENS[2..].iter().position(|w| w.as_bytes() == lower) {
                Kind::Tens(10 * (i as u32 + 2))
            } else {
                return None;
            }
        }
    })
}

fn describe(tok: &Tok<'_>) -> String {
    match tok.kind {
        Kind::Comma | Kind::Hyphen => format!("'{}' at column {}", tok.text, tok.column),
        _ => format!("word '{}' at column {}", tok.text, tok.column),
    }
}

/// Classifies `word` and appends it to `toks`; errors name unknown words.
fn push_word<'a>(toks: &mut Vec<Tok<'a>>, text: &str, word: &'a str, column: usize) -> Result<()> {
    let Some(kind) = classify(word) else {
        let lower = word.to_lowercase();
        let hint = match lower.as_str() {
            "million" | "millions" | "billion" | "billions" | "trillion" | "trillions" => {
                format!(": numbers above {MAX} are out of range")
            }
            "minus" | "negative" => format!(": negative numbers are out of range 0..={MAX}"),
            _ if word.chars().any(|c| c.is_ascii_digit()) => {
                ": write the number in words, e.g. \"forty-two\"".to_string()
            }
            _ => String::new(),
        };
        if hint.is_empty() {
            candle::bail!(
                "unknown word '{word}' at column {column} in {text:?}: expected English number \
                 words for 0..={MAX} (zero, one, ..., nineteen, twenty, ..., ninety, hundred, \
                 thousand, and)"
            )
        }
        candle::bail!("unknown word '{word}' at column {column} in {text:?}{hint}")
    };
    toks.push(Tok {
        kind,
        text: word,
        column,
    });
    Ok(())
}

/// Splits `text` into words, commas and hyphens (whitespace separates, and is dropped).
fn lex(text: &str) -> Result<Vec<Tok<'_>>> {
    let mut toks = Vec::with_capacity(16);
    let mut start: Option<(usize, usize)> = None; // (byte offset, column) of the current word
    for (column, (i, c)) in text.char_indices().enumerate() {
        let column = column + 1;
        let sep = match c {
            ',' => Some(Kind::Comma),
            '-' => Some(Kind::Hyphen),
            _ if c.is_whitespace() => None,
            _ => {
                if start.is_none() {
                    start = Some((i, column));
                }
                continue;
            }
        };
        if let Some((s, col)) = start.take() {
            push_word(&mut toks, text, &text[s..i], col)?;
        }
        if let Some(kind) = sep {
            toks.push(Tok {
                kind,
                text: &text[i..i + c.len_utf8()],
                column,
            });
        }
    }
    if let Some((s, col)) = start {
        push_word(&mut toks, text, &text[s..], col)?;
    }
    Ok(toks)
}

struct Parser<'a, 't> {
    text: &'a str,
    toks: &'t [Tok<'a>],
    pos: usize,
}

impl<'a> Parser<'a, '_> {
    fn peek(&self) -> Option<Kind> {
        self.toks.get(self.pos).map(|t| t.kind)
    }

    /// An error about the token at the current position (or the end of the input).
    fn unexpected<T>(&self, expected: &str) -> Result<T> {
        let text = self.text;
        match self.toks.get(self.pos) {
            Some(tok) => {
                let what = describe(tok);
                let why = match tok.kind {
                    Kind::Hundred => {
                        "'hundred' may only follow one of one..nine at the start of a group of \
                         three digits (not after 'and')"
                    }
                    Kind::Thousand
                        if self.toks[..self.pos]
                            .iter()
                            .any(|t| t.kind == Kind::Thousand) =>
                    {
                        "'thousand' may appear only once (numbers above 999999 are out of range)"
                    }
                    Kind::Thousand => {
                        "'thousand' must follow a number from one to nine hundred and ninety-nine"
                    }
                    Kind::Zero => "'zero' can only stand alone",
                    Kind::And => {
                        "'and' may only come after 'hundred' or 'thousand', before tens or units"
                    }
                    Kind::Comma => "a comma may only follow 'thousand'",
                    Kind::Hyphen => "a hyphen may only join tens and units, as in \"forty-two\"",
                    _ => "",
                };
                let sep = if why.is_empty() { "" } else { "; " };
                candle::bail!("misplaced {what} in {text:?}: expected {expected}{sep}{why}")
            }
            None => candle::bail!("unexpected end of input in {text:?}: expected {expected}"),
        }
    }

    /// one..ninety-nine.
    fn below_100(&mut self, expected: &str) -> Result<u32> {
        match self.peek() {
            Some(Kind::Unit(u)) | Some(Kind::Teen(u)) => {
                self.pos += 1;
                Ok(u)
            }
            Some(Kind::Tens(t)) => {
                self.pos += 1;
                match self.peek() {
                    Some(Kind::Hyphen) => {
                        self.pos += 1;
                        match self.peek() {
                            Some(Kind::Unit(u)) => {
                                self.pos += 1;
                                Ok(t + u)
                            }
                            _ => self.unexpected("one of one..nine after the hyphen"),
                        }
                    }
                    Some(Kind::Unit(u)) => {
                        self.pos += 1;
                        Ok(t + u)
                    }
                    _ => Ok(t),
                }
            }
            _ => self.unexpected(expected),
        }
    }

    /// one..nine hundred and ninety-nine.
    fn below_1000(&mut self, expected: &str) -> Result<u32> {
        if let (Some(Kind::Unit(u)), Some(Kind::Hundred)) =
            (self.peek(), self.toks.get(self.pos + 1).map(|t| t.kind))
        {
            self.pos += 2;
            match self.peek() {
                Some(Kind::And) => {
                    self.pos += 1;
                    Ok(100 * u + self.below_100("a number from one to ninety-nine after 'and'")?)
                }
                Some(Kind::Unit(_)) | Some(Kind::Teen(_)) | Some(Kind::Tens(_)) => {
                    Ok(100 * u + self.below_100("")?)
                }
                _ => Ok(100 * u),
            }
        } else {
            self.below_100(expected)
        }
    }

    fn number(&mut self) -> Result<u32> {
        if self.toks.is_empty() {
            candle::bail!("empty input: expected an English number from zero to {MAX} in words")
        }
        if self.peek() == Some(Kind::Zero) {
            self.pos += 1;
            return match self.peek() {
                None => Ok(0),
                Some(_) => self.unexpected("the end of the input after 'zero'"),
            };
        }
        let first = self.below_1000("a number word such as 'one', 'twelve' or 'forty'")?;
        if self.peek() != Some(Kind::Thousand) {
            let single_unit = self.pos == 1 && matches!(self.toks[0].kind, Kind::Unit(_));
            return match self.peek() {
                None => Ok(first),
                Some(_) if single_unit => {
                    self.unexpected("'hundred', 'thousand' or the end of the input")
                }
                Some(_) => self.unexpected("'thousand' or the end of the input"),
            };
        }
        self.pos += 1;
        let mut value = first * 1000;
        if self.peek().is_none() {
            return Ok(value);
        }
        if self.peek() == Some(Kind::Comma) {
            self.pos += 1;
        }
        value += if self.peek() == Some(Kind::And) {
            self.pos += 1;
            self.below_100("a number from one to ninety-nine after 'and'")?
        } else {
            self.below_1000("a number from one to nine hundred and ninety-nine after 'thousand'")?
        };
        match self.peek() {
            None => Ok(value),
            Some(_) => self.unexpected("the end of the input"),
        }
    }
}

/// Parses English number words for `0..=999_999` back into the number.
///
/// Accepts what [`english`] (num2words) and [`english_american`] write, and mixtures of the
/// two: case-insensitive, any amount of whitespace, tens and units joined by a hyphen or by
/// whitespace (`"forty-two"`, `"forty two"`), the `"and"` after `hundred` / `thousand`
/// optional (only before tens or units, as num2words places it), the comma after `thousand`
/// optional. Everything else is an error that names the offending word and its column:
/// unknown words (`"fourty"`, `"42"`, `"million"`), misplaced words (`"two two"`,
/// `"hundred three hundred"`, `"thousand thousand"`, `"twelve hundred"`, `"one hundred and"`),
/// out of range, empty input.
pub fn parse_english(text: &str) -> Result<u32> {
    let toks = lex(text)?;
    Parser {
        text,
        toks: &toks,
        pos: 0,
    }
    .number()
}

// ---------------------------------------------------------------------------------------------
// The train / held-out split.

/// Which part of the data a number belongs to, see [`split`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Split {
    /// Used for training.
    Train,
    /// Never seen in training; used to measure generalisation.
    HeldOut,
}

/// One in [`HELD_OUT_MODULUS`] hashes is held out.
pub const HELD_OUT_MODULUS: u32 = 50;

/// The fixed seed xor-ed into `n` before hashing (the 32-bit golden ratio). Without it
/// `fmix32(0) == 0` would hold out 0, the only number with the words `zero` / `null`.
pub const SPLIT_SEED: u32 = 0x9e37_79b9;

/// How many of the 1 000 000 numbers `0..=999_999` [`split`] holds out: 19 900 (1.99 %).
pub const HELD_OUT_COUNT: usize = 19_900;

/// The 32-bit finaliser of MurmurHash3 (`fmix32`): a fixed bijection on `u32` that mixes
/// every input bit into every output bit.
pub fn fmix32(mut h: u32) -> u32 {
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^= h >> 16;
    h
}

/// The fixed, deterministic split of the numbers into training and held-out data.
///
/// Rule: `n` is held out exactly when `fmix32(n ^ 0x9e3779b9) % 50 == 0` ([`fmix32`] is
/// MurmurHash3's 32-bit finaliser with wrapping `u32` arithmetic, `0x9e3779b9` is
/// [`SPLIT_SEED`]). That holds out [`HELD_OUT_COUNT`] = 19 900 (1.99 %) of the 1 000 000
/// numbers `0..=999_999`, spread evenly over magnitudes (21 of `0..=999`). The
/// rule depends on nothing but `n`, so the held-out numbers are never seen in training, on any
/// machine, in any run; every token of both vocabularies occurs in training (0 is a training
/// number). In Python:
///
/// ```text
/// def fmix32(h):
///     h ^= h >> 16; h = (h * 0x85EBCA6B) & 0xFFFFFFFF
///     h ^= h >> 13; h = (h * 0xC2B2AE35) & 0xFFFFFFFF
///     return h ^ (h >> 16)
/// held_out = fmix32(n ^ 0x9E3779B9) % 50 == 0
/// ```
pub fn split(n: u32) -> Split {
    if fmix32(n ^ SPLIT_SEED).is_multiple_of(HELD_OUT_MODULUS) {
        Split::HeldOut
    } else {
        Split::Train
    }
}

/// The numbers of `0..=999_999` in `part`, ascending.
pub fn numbers(part: Split) -> impl Iterator<Item = u32> {
    (0..=MAX).filter(move |&n| split(n) == part)
}
