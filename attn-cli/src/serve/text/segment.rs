//! Sentence splitting: Unicode sentence boundaries (UAX #29, from `unicode-segmentation`) with
//! the boundaries it gets wrong in prose taken back by a few rules of ours:
//!
//! * after a title or an abbreviation that never ends a sentence before the next word (`Mr.`,
//!   `Dr.`, `e.g.`, `z.B.`, `vgl.`, …), no boundary;
//! * after `No.`, `Fig.`, `Nr.`, `S.`, `p.`, a month (`Jan.`) and the like, no boundary when a
//!   digit follows (`No. 5`, but `No. It is not.` keeps it);
//! * after an abbreviation that may end a sentence (`etc.`, `Inc.`, `Jr.`, `U.S.`, single capital
//!   initials as in `J. R. R. Tolkien`), no boundary unless the next word is a number or one that
//!   usually starts a sentence (`The`, `He`, `However`, `Der`, …);
//! * after a German ordinal (`am 3. Mai`, `der 2. Weltkrieg`), no boundary when the word before
//!   the number is an article or preposition, or the next word a month or a noun that ordinals
//!   go with;
//! * after `?` or `!` and a closing quote or bracket, no boundary when a lowercase word follows
//!   (`"Stop!" he said.`);
//! * after a period, `?` or `!` with a letter or digit right after it, no space between
//!   (`UNICODE INC.'S DATA FILES`, `https://example.org/search?q=term`), no boundary.
//!
//! Line breaks always end a sentence (as in LibreTranslate, which translates each line on its
//! own), and are never merged across. What UAX #29 already gets right is kept: decimals (`3.5`),
//! `U.S.` inside, a period before a lowercase word, `。`, `؟`, `।` and the like.

use unicode_segmentation::UnicodeSegmentation;

/// A piece of a text: a sentence to translate, or what lies between sentences, kept verbatim.
///
/// A piece without any letter (`123`, `—`, `1.` of a numbered list, an emoji) is kept verbatim
/// too (`translate: false`): a model can only garble it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    /// The text, exactly as in the input.
    pub text: String,
    /// Whether it is a sentence for the model (trimmed, with at least one letter), or the
    /// whitespace, line breaks and letterless pieces between sentences.
    pub translate: bool,
}

/// Splits `text` into sentences and separators; concatenating every segment's text gives back
/// `text` exactly.
///
/// Sentences are trimmed: the whitespace around them (spaces, line breaks, blank lines,
/// indentation) goes to the separators. Two separators are never adjacent (they are joined), two
/// sentences may be (`你好。我很好。`).
pub fn segment(text: &str) -> Vec<Segment> {
    let mut out: Vec<Segment> = Vec::new();
    let mut push = |s: &str, translate: bool| {
        if s.is_empty() {
            return;
        }
        match out.last_mut() {
            Some(last) if !translate && !last.translate => last.text.push_str(s),
            _ => out.push(Segment {
                text: s.to_string(),
                translate,
            }),
        }
    };
    for piece in pieces(text, true) {
        let core = piece.trim();
        if core.is_empty() {
            push(piece, false);
            continue;
        }
        let lead = piece.len() - piece.trim_start().len();
        push(&piece[..lead], false);
        push(core, core.chars().any(char::is_alphabetic));
        push(&piece[lead + core.len()..], false);
    }
    out
}

/// The trimmed, non-empty sentences of `text` (letterless ones included), with our rules
/// (`rules`) or with UAX #29 alone: what the tests measure boundaries on.
pub fn sentences(text: &str, rules: bool) -> Vec<&str> {
    pieces(text, rules)
        .into_iter()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect()
}

/// UAX #29 sentences (each with its trailing whitespace), merged where our rules say so.
fn pieces(text: &str, rules: bool) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    let mut start = 0;
    let bounds: Vec<&str> = text.split_sentence_bounds().collect();
    let mut end = 0;
    for (i, piece) in bounds.iter().enumerate() {
        end += piece.len();
        let next = bounds.get(i + 1);
        let keep_going = rules && next.is_some_and(|next| glue(&text[start..end], next));
        if !keep_going {
            out.push(&text[start..end]);
            start = end;
        }
    }
    out
}

fn is_line_break(c: char) -> bool {
    matches!(
        c,
        '\n' | '\r' | '\u{0B}' | '\u{0C}' | '\u{85}' | '\u{2028}' | '\u{2029}'
    )
}

/// Opening punctuation a word may start with: quotes, brackets, Spanish ¿ ¡.
fn is_opening(c: char) -> bool {
    matches!(
        c,
        '"' | '\''
            | '('
            | '['
            | '{'
            | '«'
            | '‹'
            | '“'
            | '‘'
            | '„'
            | '‚'
            | '¿'
            | '¡'
            | '»'
            | '›'
    )
}

fn is_closing(c: char) -> bool {
    matches!(
        c,
        '"' | '\''
            | ')'
            | ']'
            | '}'
            | '»'
            | '›'
            | '”'
            | '’'
            | '“'
            | '«'
            | '‹'
            | '」'
            | '』'
            | '）'
    )
}

/// Never sentence-final before a word (compared in lowercase, without the final period).
const ALWAYS: &[&str] = &[
    // English titles and Latin abbreviations
    "mr", "mrs", "ms", "messrs", "dr", "prof", "st", "mt", "ft", "rev", "hon", "gen", "gov", "sen",
    "rep", "capt", "cpt", "col", "lt", "sgt", "cmdr", "adm", "maj", "pres", "supt", "vs", "v",
    "e.g", "i.e", "cf", "viz", "approx", "ca", "incl", "esp", "dept", "univ", "ave",
    "blvd", // German
    "z.b", "d.h", "u.a", "bzw", "vgl", "ggf", "evtl", "sog", "inkl", "exkl", "hr", "fr", "frl",
    "dipl", "ing", "hrsg", "bspw", "u.u", "o.ä", "z.t", "allg", // French, Spanish, Italian
    "mme", "mlle", "mm", "env", "sr", "sra", "srta", "dña", "ud", "uds", "sig", "sig.ra", "dott",
    "ecc", // Russian
    "ул", "им", "проф", "акад", "т.е", "т.к", "пр", "пл",
];

/// Sentence-final only at the end of a text or before a number (`No. 5`, `Fig. 3`, `S. 12`).
const BEFORE_NUMBER: &[&str] = &[
    "no", "nos", "nr", "fig", "figs", "vol", "vols", "ch", "chap", "sec", "p", "pp", "s", "art",
    "abs", "para", "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov",
    "dec", "okt", "dez", "núm", "pág", "tel", "op", "ed", "eds",
];

/// May end a sentence: glued unless a sentence starter follows.
const MAYBE: &[&str] = &[
    "etc", "usw", "jr", "inc", "ltd", "co", "corp", "bros", "llc", "plc", "a.m", "p.m", "u.s",
    "u.k", "u.n", "e.u", "u.s.a", "ph.d", "b.a", "m.a", "b.sc", "m.sc", "d.c", "n.y", "l.a",
    "gmbh", "ag", "ff", "т.д", "т.п", "г", "гг",
];

/// Words that usually start a sentence (lowercased): after a `MAYBE` abbreviation or an initial,
/// one of these means the sentence ended there.
const STARTERS: &[&str] = &[
    "the",
    "a",
    "an",
    "this",
    "that",
    "these",
    "those",
    "he",
    "she",
    "it",
    "we",
    "they",
    "i",
    "you",
    "there",
    "here",
    "but",
    "and",
    "or",
    "so",
    "then",
    "however",
    "in",
    "on",
    "at",
    "if",
    "when",
    "as",
    "after",
    "before",
    "what",
    "why",
    "how",
    "who",
    "where",
    "my",
    "our",
    "his",
    "her",
    "its",
    "their",
    "your",
    "some",
    "all",
    "no",
    "yes",
    "many",
    "most",
    "one",
    "today",
    "now",
    "also",
    "meanwhile",
    "still",
    "yet",
    "for",
    "since",
    "while",
    "although",
    "though",
    "thus",
    "therefore",
    "moreover",
    "besides",
    "instead",
    "later",
    "finally",
    "first",
    "next",
    "please",
    "thanks",
    "let",
    // German
    "der",
    "die",
    "das",
    "ein",
    "eine",
    "er",
    "es",
    "wir",
    "ihr",
    "ich",
    "du",
    "aber",
    "und",
    "dann",
    "doch",
    "auch",
    "im",
    "am",
    "wenn",
    "als",
    "wie",
    "warum",
    "wer",
    "heute",
    "danach",
    "jetzt",
    "sie", // French, Spanish
    "le",
    "la",
    "les",
    "il",
    "elle",
    "nous",
    "vous",
    "ils",
    "elles",
    "je",
    "mais",
    "et",
    "el",
    "los",
    "las",
    "ella",
    "pero",
    "y", // Russian
    "он",
    "она",
    "оно",
    "они",
    "мы",
    "я",
    "это",
    "но",
    "и",
    "в",
    "на",
];

/// German: words before an ordinal (`am 3. Mai`, `der 2. Weltkrieg`, `zum 1. Mal`).
const BEFORE_ORDINAL: &[&str] = &[
    "am", "im", "vom", "zum", "zur", "bis", "ab", "seit", "der", "die", "das", "den", "dem", "des",
    "ein", "eine", "einem", "einen", "einer", "jeden", "jede", "jedes", "jedem", "beim", "ihr",
    "ihrem", "ihren", "sein", "seinem", "seinen", "seiner", "mein", "meinem", "meinen", "unser",
    "unserem", "zu", "fürs", "ins",
];

/// German: words after an ordinal (months and the nouns ordinals go with).
const AFTER_ORDINAL: &[&str] = &[
    "januar",
    "jänner",
    "februar",
    "märz",
    "april",
    "mai",
    "juni",
    "juli",
    "august",
    "september",
    "oktober",
    "november",
    "dezember",
    "jahrhundert",
    "jahrhunderts",
    "jahrtausend",
    "mal",
    "klasse",
    "liga",
    "platz",
    "stock",
    "stockwerk",
    "etage",
    "weltkrieg",
    "weltkriegs",
    "auflage",
    "kapitel",
    "geburtstag",
    "jahrestag",
    "tag",
    "woche",
    "monat",
    "runde",
    "spieltag",
    "bundesliga",
    "parteitag",
    "symphonie",
    "sinfonie",
    "satz",
    "grades",
    "grad",
    "ordnung",
];

/// Whether the boundary between `before` (everything since the last boundary kept) and `next`
/// (the following UAX #29 sentence) should be dropped.
fn glue(before: &str, next: &str) -> bool {
    let body = before.trim_end();
    if body.is_empty() || before[body.len()..].contains(is_line_break) {
        // A line break between the two: always a boundary.
        return false;
    }
    let next_word = first_word(next);
    if next_word.is_empty() {
        return false;
    }
    // `"Stop!" he said.`, `「はい。」と言った。`: ?, ! or 。 then a closing quote, then a
    // lowercase word, or (without a space) a letter of a script without case.
    let mut tail = body.chars().rev();
    if let (Some(c), Some(p)) = (tail.next(), tail.next()) {
        if is_closing(c) && matches!(p, '?' | '!' | '？' | '！' | '。') {
            let spaced = before.len() > body.len();
            return next_word.chars().next().is_some_and(|c| {
                c.is_lowercase() || !spaced && c.is_alphabetic() && !c.is_uppercase()
            });
        }
    }
    // A period, `?` or `!` (and closing quotes or brackets) with a letter or digit right after
    // it, no space between: inside a word or an address (`INC.'S`, `.NET's`,
    // `search?q=term`, `Yahoo!Mail`), never the end of a sentence in a script that separates
    // words. (`。`, `？` and the other marks of scripts without spaces are not these:
    // `你好。我很好。` keeps its boundary.)
    let spaced = before.len() > body.len();
    if !spaced
        && body.trim_end_matches(is_closing).ends_with(['.', '?', '!'])
        && next.chars().next().is_some_and(char::is_alphanumeric)
    {
        return true;
    }
    if !body.ends_with('.') {
        return false;
    }
    let token = last_token(body);
    let word = &token[..token.len() - 1]; // without the final '.'
    if word.is_empty() || word.ends_with('.') {
        // An ellipsis ("wait...", "..."): UAX #29 decides.
        return false;
    }
    let lower = word.to_lowercase();
    let next_lower = next_word.to_lowercase();
    let next_starts_digit = next_word.chars().next().is_some_and(|c| c.is_ascii_digit());
    if ALWAYS.contains(&lower.as_str()) {
        return true;
    }
    if BEFORE_NUMBER.contains(&lower.as_str()) {
        return next_starts_digit;
    }
    let starter = STARTERS.contains(&next_lower.as_str());
    if MAYBE.contains(&lower.as_str()) {
        // "Acme Inc. 2001 was good", "Novell, Inc. 2001, Ximian, Inc.": a number starts anew.
        return !starter && !next_starts_digit;
    }
    // Initials: "J." "J.R.R." "A.B." (uppercase letters each followed by a period).
    let mut letters = 0;
    let initials = word.split('.').all(|part| {
        letters += 1;
        let mut cs = part.chars();
        matches!((cs.next(), cs.next()), (Some(c), None) if c.is_uppercase())
    });
    if initials && letters <= 4 {
        return !starter && next_word.chars().next().is_some_and(|c| c.is_uppercase());
    }
    // German ordinals: 1-3 digits and a period.
    if word.len() <= 3 && word.bytes().all(|b| b.is_ascii_digit()) {
        let prev = body[..body.len() - token.len()]
            .split_whitespace()
            .next_back()
            .unwrap_or("")
            .to_lowercase();
        return BEFORE_ORDINAL.contains(&prev.as_str())
            || AFTER_ORDINAL.contains(&next_lower.as_str());
    }
    false
}

/// The last whitespace-separated token of `body`, without opening punctuation (`(e.g.` → `e.g.`).
fn last_token(body: &str) -> &str {
    let start = body
        .char_indices()
        .rev()
        .find(|&(_, c)| c.is_whitespace())
        .map_or(0, |(i, c)| i + c.len_utf8());
    body[start..].trim_start_matches(is_opening)
}

/// The first word of `next`, without opening punctuation and without what follows the word's
/// letters and digits (`"The` → `The`, `Mai,` → `Mai`).
fn first_word(next: &str) -> &str {
    let s = next.trim_start().trim_start_matches(is_opening);
    let end = s
        .char_indices()
        .find(|&(_, c)| !c.is_alphanumeric())
        .map_or(s.len(), |(i, _)| i);
    &s[..end]
}

#[cfg(test)]
#[path = "segment_tests.rs"]
mod tests;
