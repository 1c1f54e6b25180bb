//! The data side of the number translation task: the generators against num2words' own output
//! (`tests/fixtures/num2words/sample.tsv`, written by `make_sample.py`), the strict English
//! parser, the held-out split, and the tokenizers (round trips over all of `0..=999_999`).

use std::collections::BTreeSet;
use std::sync::OnceLock;

use attn_cli::number_translator::numbers::{
    fmix32, GERMAN_MORPHEMES, HELD_OUT_MODULUS, SPLIT_SEED,
};
use attn_cli::number_translator::tokenizer::{
    ENGLISH_TOKENS, MAX_ENGLISH_TOKENS, MAX_GERMAN_TOKENS, SPECIAL_TOKENS,
};
use attn_cli::number_translator::{
    english, english_american, german, german_morphemes, numbers, parse_english, split,
    EnglishTokenizer, GermanTokenizer, Split, Vocab, BOS, EOS, HELD_OUT_COUNT, MAX, PAD, UNK,
};
use proptest::prelude::*;

const SAMPLE: &str = include_str!("../../tests/fixtures/num2words/sample.tsv");

fn en_tok() -> &'static EnglishTokenizer {
    static TOK: OnceLock<EnglishTokenizer> = OnceLock::new();
    TOK.get_or_init(|| EnglishTokenizer::build().unwrap())
}

fn de_tok() -> &'static GermanTokenizer {
    static TOK: OnceLock<GermanTokenizer> = OnceLock::new();
    TOK.get_or_init(|| GermanTokenizer::build().unwrap())
}

#[test]
fn sample_tsv_matches_num2words() {
    let mut count = 0;
    let mut seen = BTreeSet::new();
    for (i, line) in SAMPLE.lines().enumerate() {
        let cols: Vec<&str> = line.split('\t').collect();
        assert_eq!(cols.len(), 3, "line {}: {line:?}", i + 1);
        let n: u32 = cols[0].parse().unwrap();
        assert_eq!(english(n).unwrap(), cols[1], "english({n})");
        assert_eq!(german(n).unwrap(), cols[2], "german({n})");
        assert_eq!(
            parse_english(cols[1]).unwrap(),
            n,
            "parse_english({:?})",
            cols[1]
        );
        assert_eq!(parse_english(&english_american(n).unwrap()).unwrap(), n);
        assert_eq!(
            de_tok().tokens(cols[2]).unwrap(),
            german_morphemes(n).unwrap()
        );
        seen.insert(n);
        count += 1;
    }
    assert!(count >= 2000, "sample.tsv has only {count} pairs");
    assert_eq!(seen.len(), count, "sample.tsv repeats numbers");
    for n in (0..=120).chain([1000, 100_000, 101_000, 999_999]) {
        assert!(seen.contains(&n), "sample.tsv lacks {n}");
    }
}

#[test]
fn known_translations() {
    let cases: &[(u32, &str, &str, &str)] = &[
        (0, "zero", "zero", "null"),
        (1, "one", "one", "eins"),
        (12, "twelve", "twelve", "zwölf"),
        (16, "sixteen", "sixteen", "sechzehn"),
        (17, "seventeen", "seventeen", "siebzehn"),
        (21, "twenty-one", "twenty-one", "einundzwanzig"),
        (30, "thirty", "thirty", "dreißig"),
        (100, "one hundred", "one hundred", "einhundert"),
        (
            101,
            "one hundred and one",
            "one hundred one",
            "einhunderteins",
        ),
        (
            342,
            "three hundred and forty-two",
            "three hundred forty-two",
            "dreihundertzweiundvierzig",
        ),
        (1000, "one thousand", "one thousand", "eintausend"),
        (
            1001,
            "one thousand and one",
            "one thousand one",
            "eintausendeins",
        ),
        (
            1100,
            "one thousand, one hundred",
            "one thousand one hundred",
            "eintausendeinhundert",
        ),
        (
            12_345,
            "twelve thousand, three hundred and forty-five",
            "twelve thousand three hundred forty-five",
            "zwölftausenddreihundertfünfundvierzig",
        ),
        (
            21_000,
            "twenty-one thousand",
            "twenty-one thousand",
            "einundzwanzigtausend",
        ),
        (
            101_000,
            "one hundred and one thousand",
            "one hundred one thousand",
            "einhunderteinstausend",
        ),
        (
            999_999,
            "nine hundred and ninety-nine thousand, nine hundred and ninety-nine",
            "nine hundred ninety-nine thousand nine hundred ninety-nine",
            "neunhundertneunundneunzigtausendneunhundertneunundneunzig",
        ),
    ];
    for &(n, en, us, de) in cases {
        assert_eq!(english(n).unwrap(), en);
        assert_eq!(english_american(n).unwrap(), us);
        assert_eq!(german(n).unwrap(), de);
    }
    assert_eq!(
        german_morphemes(342).unwrap(),
        ["drei", "hundert", "zwei", "und", "vierzig"]
    );
    assert_eq!(german_morphemes(17).unwrap(), ["sieb", "zehn"]);
}

#[test]
fn out_of_range_is_an_error() {
    for n in [MAX + 1, 1_000_001, u32::MAX] {
        let msg = english(n).unwrap_err().to_string();
        assert!(msg.contains("out of range"), "{msg}");
        assert!(english_american(n).is_err());
        assert!(german(n).is_err());
        assert!(german_morphemes(n).is_err());
        assert!(en_tok().encode_number(n).is_err());
        assert!(de_tok().encode_number(n).is_err());
    }
}

/// Both English forms parse back to `n`, for every number (fast: ~2M parses).
#[test]
fn exhaustive_english_round_trip() {
    for n in 0..=MAX {
        let en = english(n).unwrap();
        assert_eq!(parse_english(&en).unwrap(), n, "{en:?}");
        let us = english_american(n).unwrap();
        assert_eq!(parse_english(&us).unwrap(), n, "{us:?}");
    }
}

/// Both tokenizers round-trip every number, within the documented maximum lengths.
#[test]
fn exhaustive_tokenizer_round_trip() {
    let (en, de) = (en_tok(), de_tok());
    let (mut en_max, mut de_max, mut en_sum, mut de_sum) = (0, 0, 0usize, 0usize);
    for n in 0..=MAX {
        let ids = en.encode_number(n).unwrap();
        assert_eq!(en.decode(&ids).unwrap(), english(n).unwrap());
        en_max = en_max.max(ids.len());
        en_sum += ids.len();

        let word = german(n).unwrap();
        let ids = de.encode_number(n).unwrap();
        assert_eq!(
            de.encode(&word).unwrap(),
            ids,
            "greedy segmentation of {word:?}"
        );
        assert_eq!(de.decode(&ids).unwrap(), word);
        de_max = de_max.max(ids.len());
        de_sum += ids.len();
    }
    assert_eq!(en_max, MAX_ENGLISH_TOKENS);
    assert_eq!(de_max, MAX_GERMAN_TOKENS);
    let total = (MAX + 1) as f64;
    eprintln!(
        "English: vocab {}, max {en_max}, mean {:.3} tokens; German: vocab {}, max {de_max}, \
         mean {:.3} tokens",
        en.vocab().len(),
        en_sum as f64 / total,
        de.vocab().len(),
        de_sum as f64 / total
    );
}

#[test]
fn vocabularies_are_built_from_the_generators() {
    let en: Vec<&str> = en_tok()
        .vocab()
        .tokens()
        .iter()
        .map(String::as_str)
        .collect();
    let de: Vec<&str> = de_tok()
        .vocab()
        .tokens()
        .iter()
        .map(String::as_str)
        .collect();
    assert_eq!(en[..4], SPECIAL_TOKENS);
    assert_eq!(de[..4], SPECIAL_TOKENS);
    assert_eq!(en[4..], ENGLISH_TOKENS);
    assert_eq!(de[4..], GERMAN_MORPHEMES);
    assert_eq!((en.len(), de.len()), (37, 31));
    for (id, name) in [
        (PAD, "<pad>"),
        (BOS, "<bos>"),
        (EOS, "<eos>"),
        (UNK, "<unk>"),
    ] {
        assert_eq!(en_tok().vocab().id(name), Some(id));
        assert_eq!(de_tok().vocab().token(id), Some(name));
    }
}

fn vary(text: &str, seed: u64) -> String {
    // A small deterministic generator, so each proptest case is reproducible from its seed.
    let mut state = seed | 1;
    let mut next = move |m: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % m
    };
    let mut text = text.to_string();
    if next(2) == 0 {
        text = text.replace(" and ", " ");
    }
    if next(2) == 0 {
        text = text.replace(',', "");
    }
    let mut out = String::new();
    for _ in 0..next(3) {
        out.push(' ');
    }
    for c in text.chars() {
        match c {
            ' ' => out.push_str(["  ", "\t", " \n ", " "][next(4) as usize]),
            '-' => out.push_str(["-", " ", " - ", "   "][next(4) as usize]),
            ',' => out.push_str([",", " ,", ", "][next(3) as usize]),
            _ if next(4) == 0 => out.push(c.to_ascii_uppercase()),
            _ => out.push(c),
        }
    }
    for _ in 0..next(3) {
        out.push('\t');
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn parse_round_trips(n in 0..=MAX, seed in any::<u64>()) {
        let en = english(n).unwrap();
        let us = english_american(n).unwrap();
        prop_assert_eq!(parse_english(&en).unwrap(), n);
        prop_assert_eq!(parse_english(&us).unwrap(), n);
        let varied = vary(&en, seed);
        prop_assert_eq!(parse_english(&varied).unwrap(), n, "{:?}", varied);
        // Any accepted spelling normalises to the same tokens as num2words' own.
        prop_assert_eq!(en_tok().encode(&varied).unwrap(), en_tok().encode_number(n).unwrap());
        prop_assert_eq!(en_tok().encode(&us).unwrap(), en_tok().encode_number(n).unwrap());
    }

    #[test]
    fn split_is_a_function_of_n(n in 0..=MAX) {
        let held = split(n) == Split::HeldOut;
        prop_assert_eq!(held, fmix32(n ^ SPLIT_SEED).is_multiple_of(HELD_OUT_MODULUS));
    }
}

#[test]
fn parser_accepts_variants() {
    let cases: &[(&str, u32)] = &[
        ("zero", 0),
        ("  ZERO ", 0),
        ("Forty Two", 42),
        ("forty - two", 42),
        ("forty-two", 42),
        ("three hundred forty-two", 342),
        ("three hundred and forty two", 342),
        ("One Thousand, Two Hundred and Thirty-Four", 1234),
        ("one thousand two hundred thirty four", 1234),
        ("one thousand two hundred and thirty-four", 1234),
        ("one thousand,two hundred", 1200),
        ("one thousand , two hundred", 1200),
        ("one thousand one", 1001),
        ("one thousand and one", 1001),
        ("one hundred thousand", 100_000),
        ("one hundred and one thousand", 101_000),
        ("one hundred one thousand one hundred one", 101_101),
        ("twelve thousand", 12_000),
        ("\tninety-nine\n", 99),
    ];
    for &(text, n) in cases {
        assert_eq!(parse_english(text).unwrap(), n, "{text:?}");
    }
}

#[test]
fn parser_rejects_bad_input() {
    let cases: &[(&str, &str)] = &[
        ("", "empty input"),
        ("   \t ", "empty input"),
        ("two two", "misplaced word 'two' at column 5"),
        (
            "hundred three hundred",
            "misplaced word 'hundred' at column 1",
        ),
        ("thousand thousand", "misplaced word 'thousand' at column 1"),
        ("one thousand thousand", "'thousand' may appear only once"),
        (
            "two thousand three thousand",
            "misplaced word 'thousand' at column 20",
        ),
        ("hundred", "'hundred' may only follow one of one..nine"),
        ("twelve hundred", "misplaced word 'hundred'"),
        ("twenty hundred", "misplaced word 'hundred'"),
        (
            "one hundred hundred",
            "misplaced word 'hundred' at column 13",
        ),
        ("zero zero", "'zero' can only stand alone"),
        ("one hundred and zero", "misplaced word 'zero'"),
        ("zero thousand", "misplaced word 'thousand'"),
        ("fourty-two", "unknown word 'fourty'"),
        ("42", "unknown word '42'"),
        ("one million", "unknown word 'million'"),
        ("minus five", "unknown word 'minus'"),
        ("two and forty", "misplaced word 'and'"),
        ("and one", "misplaced word 'and'"),
        ("one hundred and", "unexpected end of input"),
        ("one thousand and two hundred", "misplaced word 'hundred'"),
        ("one thousand,", "unexpected end of input"),
        ("one, thousand", "misplaced ','"),
        ("one hundred, one", "misplaced ','"),
        ("forty-", "unexpected end of input"),
        ("-forty", "misplaced '-'"),
        ("forty-twelve", "misplaced word 'twelve'"),
        ("two-hundred", "misplaced '-'"),
        ("twenty thirty", "misplaced word 'thirty'"),
        ("forty two three", "misplaced word 'three'"),
        ("nineteen five", "misplaced word 'five'"),
        ("one hundred and twenty-one and", "misplaced word 'and'"),
        (
            "one thousand one hundred one thousand",
            "'thousand' may appear only once",
        ),
        ("dreihundert", "unknown word 'dreihundert'"),
        ("two. ", "unknown word 'two.'"),
    ];
    for &(text, expected) in cases {
        let msg = match parse_english(text) {
            Ok(n) => panic!("{text:?} parsed as {n}"),
            Err(e) => e.to_string(),
        };
        assert!(
            msg.contains(expected),
            "{text:?}: {msg:?} lacks {expected:?}"
        );
    }
}

#[test]
fn split_is_fixed() {
    let held: Vec<u32> = numbers(Split::HeldOut).collect();
    assert_eq!(held.len(), HELD_OUT_COUNT);
    assert_eq!(
        numbers(Split::Train).count(),
        (MAX + 1) as usize - HELD_OUT_COUNT
    );
    // Pinned: changing the rule would silently leak held-out numbers into training.
    assert_eq!(held[..8], [34, 68, 97, 100, 195, 209, 291, 374]);
    assert_eq!(held.iter().filter(|&&n| n < 1000).count(), 21);
    assert_eq!(split(0), Split::Train);
    for n in &held {
        assert_eq!(split(*n), Split::HeldOut);
    }
    // Every token of both vocabularies occurs in the training data.
    let (en, de) = (en_tok(), de_tok());
    let mut en_seen = vec![false; en.vocab().len()];
    let mut de_seen = vec![false; de.vocab().len()];
    for n in numbers(Split::Train).take(20_000) {
        for id in en.encode_number(n).unwrap() {
            en_seen[id as usize] = true;
        }
        for id in de.encode_number(n).unwrap() {
            de_seen[id as usize] = true;
        }
    }
    assert!(en_seen[4..].iter().all(|&s| s), "{en_seen:?}");
    assert!(de_seen[4..].iter().all(|&s| s), "{de_seen:?}");
}

#[test]
fn vocab_json_round_trip_and_errors() {
    let dir = tempfile::tempdir().unwrap();
    for (side, vocab) in [("en", en_tok().vocab()), ("de", de_tok().vocab())] {
        let path = dir.path().join(format!("{side}.json"));
        vocab.save(&path).unwrap();
        assert_eq!(&Vocab::load(&path).unwrap(), vocab);
    }
    let en = EnglishTokenizer::load(dir.path().join("en.json")).unwrap();
    assert_eq!(&en, en_tok());
    let de = GermanTokenizer::load(dir.path().join("de.json")).unwrap();
    assert_eq!(&de, de_tok());
    let json = std::fs::read_to_string(dir.path().join("de.json")).unwrap();
    assert!(
        json.contains("\"zwölf\"") && json.contains("\"tokens\""),
        "{json}"
    );

    let missing = dir.path().join("missing.json");
    let msg = Vocab::load(&missing).unwrap_err().to_string();
    assert!(msg.contains("missing.json"), "{msg}");
    let msg = Vocab::from_json("[1, 2]").unwrap_err().to_string();
    assert!(msg.contains("invalid vocabulary JSON"), "{msg}");
    let msg = Vocab::from_json(r#"{"tokens": ["a", "b"]}"#)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("special tokens"), "{msg}");
    let msg = Vocab::new(["one", "one"]).unwrap_err().to_string();
    assert!(msg.contains("twice"), "{msg}");
    // A vocabulary of the wrong side is rejected, naming what is missing.
    let msg = GermanTokenizer::from_vocab(en_tok().vocab().clone())
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("German vocabulary lacks") && msg.contains("null"),
        "{msg}"
    );
    let msg = EnglishTokenizer::from_vocab(Vocab::new(["zero"]).unwrap())
        .unwrap_err()
        .to_string();
    assert!(msg.contains("English vocabulary lacks"), "{msg}");
}

#[test]
fn tokenizers_encode_decode() {
    let (en, de) = (en_tok(), de_tok());
    let canonical = en.encode("three hundred and forty-two").unwrap();
    assert_eq!(en.encode("Three  hundred forty two").unwrap(), canonical);
    assert_eq!(
        en.tokens("three hundred forty-two").unwrap(),
        ["three", "hundred", "and", "forty", "-", "two"]
    );
    assert_eq!(
        en.tokens("one thousand two hundred").unwrap(),
        ["one", "thousand", ",", "two", "hundred"]
    );
    assert_eq!(
        en.normalize("TWELVE thousand three hundred forty five")
            .unwrap(),
        english(12_345).unwrap()
    );
    let msg = en.encode("").unwrap_err().to_string();
    assert!(msg.contains("empty input"), "{msg}");
    let msg = en
        .encode("three hundred and fourty-two")
        .unwrap_err()
        .to_string();
    assert!(msg.contains("'fourty'"), "{msg}");

    let mut framed = vec![BOS];
    framed.extend(&canonical);
    framed.extend([EOS, 7, PAD, PAD]);
    assert_eq!(en.decode(&framed).unwrap(), "three hundred and forty-two");
    assert_eq!(en.decode(&[BOS, EOS]).unwrap(), "");
    assert!(en.decode(&[UNK]).unwrap_err().to_string().contains("<unk>"));
    assert!(en
        .decode(&[99])
        .unwrap_err()
        .to_string()
        .contains("outside the vocabulary"));

    let ids = de.encode("dreihundertzweiundvierzig").unwrap();
    assert_eq!(ids, de.encode_number(342).unwrap());
    assert_eq!(de.encode("  Dreihundertzweiundvierzig ").unwrap(), ids);
    assert_eq!(
        de.tokens("zwölftausendsiebzehn").unwrap(),
        ["zwölf", "tausend", "sieb", "zehn"]
    );
    assert_eq!(
        de.decode(&[BOS, ids[0], ids[1], EOS, ids[2]]).unwrap(),
        "dreihundert"
    );
    let msg = de.encode("").unwrap_err().to_string();
    assert!(msg.contains("empty input"), "{msg}");
    let msg = de.encode("dreihundertx").unwrap_err().to_string();
    assert!(
        msg.contains("\"x\"") && msg.contains("character 12"),
        "{msg}"
    );
    let msg = de.encode("drei hundert").unwrap_err().to_string();
    assert!(msg.contains("cannot segment"), "{msg}");
    assert!(de.decode(&[UNK]).is_err());
    assert!(de.decode(&[31]).is_err());
}

/// Sardinas–Patterson: the German morphemes form a uniquely decodable code, so a German
/// number has exactly one segmentation into them.
#[test]
fn german_lexicon_is_uniquely_decodable() {
    let code: BTreeSet<&str> = GERMAN_MORPHEMES.iter().copied().collect();
    assert_eq!(code.len(), GERMAN_MORPHEMES.len());
    let dangling = |a: &BTreeSet<String>, b: &BTreeSet<&str>| -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        for x in a {
            for y in b {
                if let Some(rest) = y.strip_prefix(x.as_str()) {
                    if !rest.is_empty() {
                        out.insert(rest.to_string());
                    }
                }
                if let Some(rest) = x.strip_prefix(y) {
                    if !rest.is_empty() {
                        out.insert(rest.to_string());
                    }
                }
            }
        }
        out
    };
    let mut current: BTreeSet<String> = BTreeSet::new();
    for x in &code {
        for y in &code {
            if x != y {
                if let Some(rest) = y.strip_prefix(x) {
                    current.insert(rest.to_string());
                }
            }
        }
    }
    let mut seen: BTreeSet<String> = BTreeSet::new();
    while !current.is_empty() {
        for s in &current {
            assert!(
                !code.contains(s.as_str()),
                "ambiguous: dangling suffix {s:?} is a morpheme"
            );
        }
        seen.extend(current.iter().cloned());
        current = dangling(&current, &code)
            .into_iter()
            .filter(|s| !seen.contains(s))
            .collect();
    }
}
