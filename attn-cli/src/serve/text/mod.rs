//! STAND-IN for the `text` helper's module (segmentation, HTML, language identification): the
//! signatures the HTTP layer programs against, with just enough behaviour for its tests. The
//! real module replaces this file at merge.

/// A piece of a text: a sentence to translate, or what lies between sentences (kept verbatim).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    /// The piece, exactly as in the input.
    pub text: String,
    /// Whether it is a sentence to translate.
    pub translate: bool,
}

/// Splits a text into sentences and the separators between them; concatenating the pieces
/// gives back the input exactly.
pub fn segment(text: &str) -> Vec<Segment> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut sep = String::new();
    let mut ended = false;
    let flush = |out: &mut Vec<Segment>, s: &mut String, translate: bool| {
        if !s.is_empty() {
            out.push(Segment {
                text: std::mem::take(s),
                translate,
            });
        }
    };
    for ch in text.chars() {
        if ch.is_whitespace() && (cur.is_empty() || ended || ch == '\n') {
            if !cur.is_empty() {
                flush(&mut out, &mut cur, true);
            }
            ended = false;
            sep.push(ch);
            continue;
        }
        if !sep.is_empty() {
            flush(&mut out, &mut sep, false);
        }
        if ch.is_whitespace() {
            // Inside a sentence: keep it; trailing whitespace moves to the separator.
            cur.push(ch);
            continue;
        }
        cur.push(ch);
        ended = matches!(ch, '.' | '!' | '?');
    }
    let trimmed = cur.trim_end().len();
    let tail = cur.split_off(trimmed);
    flush(&mut out, &mut cur, true);
    sep.insert_str(0, &tail);
    flush(&mut out, &mut sep, false);
    out
}

/// An HTML document split into its translatable text runs and the markup around them.
#[derive(Clone, Debug)]
pub struct HtmlDoc {
    /// Markup and texts alternating: `(markup, Some(text))`.
    parts: Vec<(String, Option<String>)>,
}

/// Parses an HTML fragment or document.
pub fn html_texts(html: &str) -> HtmlDoc {
    let mut parts = Vec::new();
    let mut markup = String::new();
    let mut rest = html;
    while !rest.is_empty() {
        if rest.starts_with('<') {
            let end = rest.find('>').map(|i| i + 1).unwrap_or(rest.len());
            markup.push_str(&rest[..end]);
            rest = &rest[end..];
        } else {
            let end = rest.find('<').unwrap_or(rest.len());
            let text = &rest[..end];
            if text.trim().is_empty() {
                markup.push_str(text);
            } else {
                parts.push((std::mem::take(&mut markup), Some(text.to_string())));
            }
            rest = &rest[end..];
        }
    }
    parts.push((markup, None));
    HtmlDoc { parts }
}

impl HtmlDoc {
    /// The translatable text runs, in document order.
    pub fn texts(&self) -> Vec<String> {
        self.parts.iter().filter_map(|(_, t)| t.clone()).collect()
    }

    /// The document with each text run replaced by its translation (same order as `texts`).
    pub fn render(&self, translations: &[String]) -> String {
        let mut out = String::new();
        let mut it = translations.iter();
        for (markup, text) in &self.parts {
            out.push_str(markup);
            if let Some(t) = text {
                out.push_str(it.next().unwrap_or(t));
            }
        }
        out
    }
}

/// Up to three guesses of the text's language among `candidates` (API codes), best first,
/// with LibreTranslate's confidence (0 to 100); empty when the text has no letters.
pub fn detect(text: &str, candidates: &[String]) -> Vec<(String, f64)> {
    if !text.chars().any(char::is_alphabetic) || candidates.is_empty() {
        return Vec::new();
    }
    let words: &[(&str, &[&str])] = &[
        (
            "en",
            &["the", "and", "is", "hello", "world", "good", "this"],
        ),
        (
            "de",
            &["der", "die", "und", "ist", "hallo", "welt", "gut", "das"],
        ),
        (
            "fr",
            &["le", "la", "et", "est", "bonjour", "monde", "bon", "ce"],
        ),
        ("es", &["el", "los", "y", "es", "hola", "mundo", "bueno"]),
    ];
    let lower = text.to_lowercase();
    let tokens: Vec<&str> = lower
        .split(|c: char| !c.is_alphabetic())
        .filter(|t| !t.is_empty())
        .collect();
    let mut scored: Vec<(String, f64)> = candidates
        .iter()
        .map(|c| {
            let hits = words
                .iter()
                .find(|(code, _)| code == c)
                .map(|(_, ws)| tokens.iter().filter(|t| ws.contains(t)).count())
                .unwrap_or(0);
            (c.clone(), hits as f64)
        })
        .collect();
    scored.sort_by(|a, b| b.1.total_cmp(&a.1));
    let total: f64 = scored.iter().map(|s| s.1).sum::<f64>().max(1.0);
    scored.truncate(3);
    scored
        .into_iter()
        .map(|(c, s)| (c, (s * 100.0 / total).round()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_give_back_the_input() {
        for t in [
            "",
            "Hello.",
            "Hello. World!  Yes\n\nNo ",
            "  a b  ",
            "x\r\ny",
        ] {
            let s: String = segment(t).iter().map(|s| s.text.as_str()).collect();
            assert_eq!(s, t);
        }
        let s = segment("Hello world. How are you?\nFine");
        let tr: Vec<_> = s
            .iter()
            .filter(|s| s.translate)
            .map(|s| s.text.as_str())
            .collect();
        assert_eq!(tr, ["Hello world.", "How are you?", "Fine"]);
    }

    #[test]
    fn html_round_trip() {
        let d = html_texts("<p>Hello <b>world</b></p>");
        assert_eq!(d.texts(), ["Hello ", "world"]);
        assert_eq!(d.render(&["A ".into(), "B".into()]), "<p>A <b>B</b></p>");
    }
}
