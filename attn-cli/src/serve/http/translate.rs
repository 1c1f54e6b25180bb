//! What `/translate` does between the parameters and the engine, as pure functions: the texts
//! become one list of sentences ([`plan`]), the engine's sentences become texts again
//! ([`Plan::render`]), with whole-text alternatives ([`Plan::alternatives`]); and
//! LibreTranslate's language detection over several texts ([`detect_languages`]).

use super::super::backend::Sentence;
use super::super::text::{self, HtmlDoc};

/// A piece of a text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    /// Kept as it is.
    Verbatim(String),
    /// The job's sentence of this index.
    Sentence(usize),
}

/// How one text is put back together from its translated sentences.
#[derive(Debug)]
pub enum Plan {
    /// Plain text: sentences and what lies between them.
    Text(Vec<Piece>),
    /// HTML: the document and, for each of its text runs, its pieces.
    Html(HtmlDoc, Vec<Vec<Piece>>),
}

fn pieces(text: &str, sentences: &mut Vec<String>) -> Vec<Piece> {
    text::segment(text)
        .into_iter()
        .map(|s| {
            if s.translate {
                sentences.push(s.text);
                Piece::Sentence(sentences.len() - 1)
            } else {
                Piece::Verbatim(s.text)
            }
        })
        .collect()
}

/// Splits every text (HTML into its text runs first) into sentences: one list for the whole
/// request (one job), and for each text its plan.
pub fn plan(texts: &[String], html: bool) -> (Vec<Plan>, Vec<String>) {
    let mut sentences = Vec::new();
    let plans = texts
        .iter()
        .map(|t| {
            if html {
                let doc = text::html_texts(t);
                let runs = doc
                    .texts()
                    .iter()
                    .map(|r| pieces(r, &mut sentences))
                    .collect();
                Plan::Html(doc, runs)
            } else {
                Plan::Text(pieces(t, &mut sentences))
            }
        })
        .collect();
    (plans, sentences)
}

fn join(pieces: &[Piece], out: &[Sentence], k: Option<usize>) -> String {
    let mut s = String::new();
    for p in pieces {
        match p {
            Piece::Verbatim(v) => s.push_str(v),
            Piece::Sentence(i) => {
                let sent = &out[*i];
                let pick = k
                    .and_then(|k| sent.alternatives.get(k))
                    .unwrap_or(&sent.text);
                s.push_str(pick);
            }
        }
    }
    s
}

impl Plan {
    /// The translated text: each sentence's best translation (`k: None`) or its `k`-th
    /// alternative where it has one (the best elsewhere).
    pub fn render(&self, out: &[Sentence], k: Option<usize>) -> String {
        match self {
            Plan::Text(p) => join(p, out, k),
            Plan::Html(doc, runs) => {
                let texts: Vec<String> = runs.iter().map(|p| join(p, out, k)).collect();
                doc.render(&texts)
            }
        }
    }

    /// Up to `n` whole-text alternatives: the k-th puts each sentence's k-th alternative in
    /// (the best where a sentence has fewer), then, as app.py's `filter_unique` (176-179),
    /// duplicates, empty texts and copies of the best go. HTML has none (app.py 831: "Not
    /// supported for html yet").
    pub fn alternatives(&self, out: &[Sentence], best: &str, n: usize) -> Vec<String> {
        if matches!(self, Plan::Html(..)) {
            return Vec::new();
        }
        let mut seen = vec![best.to_string(), String::new()];
        let mut alts = Vec::new();
        for k in 0..n {
            let alt = self.render(out, Some(k));
            if !seen.contains(&alt) {
                seen.push(alt.clone());
                alts.push(alt);
            }
        }
        alts
    }
}

/// app.py 42-53's "rough map of emoji characters" (spaces and emoji ranges, ends excluded as
/// Python's `range` excludes them).
fn is_emoji(c: char) -> bool {
    let c = c as u32;
    c == 0x20
        || (0x1F600..0x1F64F).contains(&c)
        || (0x1F300..0x1F5FF).contains(&c)
        || (0x1F680..0x1F6FF).contains(&c)
        || (0x2600..0x26FF).contains(&c)
        || (0x2700..0x27BF).contains(&c)
        || (0xFE00..0xFE0F).contains(&c)
        || (0x1F900..0x1F9FF).contains(&c)
        || (0x1F1E6..0x1F1FF).contains(&c)
        || (0x20D0..0x20FF).contains(&c)
}

/// app.py 182-191 `detect_translatable`: whether any text has a character outside that map.
pub fn translatable(texts: &[String]) -> bool {
    texts.iter().any(|t| t.chars().any(|c| !is_emoji(c)))
}

/// LibreTranslate's `detect_languages` (language.py): each text's guesses ([`text::detect`];
/// none is `en` with confidence 0, as its `Detector` answers), for a list the mean confidence
/// per language over the texts that name it, sorted by confidence weighted by text length.
pub fn detect_languages(texts: &[String], batch: bool, codes: &[String]) -> Vec<(String, f64)> {
    struct Cand {
        code: String,
        confidence: f64,
        length: usize,
    }
    let mut cands: Vec<Cand> = Vec::new();
    for t in texts {
        let mut d = text::detect(t, codes);
        if d.is_empty() {
            d = vec![("en".to_string(), 0.0)];
        }
        let length = t.chars().count();
        cands.extend(d.into_iter().map(|(code, confidence)| Cand {
            code,
            confidence,
            length,
        }));
    }
    let total: usize = cands.iter().map(|c| c.length).sum();
    if cands.is_empty() {
        return vec![("en".to_string(), 0.0)];
    }
    if batch {
        let mut merged = Vec::new();
        for code in codes {
            let same: Vec<&Cand> = cands.iter().filter(|c| &c.code == code).collect();
            if same.is_empty() {
                continue;
            }
            merged.push(Cand {
                code: code.clone(),
                confidence: same.iter().map(|c| c.confidence).sum::<f64>() / same.len() as f64,
                length: same.iter().map(|c| c.length).sum(),
            });
        }
        if !merged.is_empty() {
            cands = merged;
        }
    }
    let key = |c: &Cand| {
        if total == 0 {
            0.0
        } else {
            c.confidence * c.length as f64 / total as f64
        }
    };
    cands.sort_by(|a, b| key(b).total_cmp(&key(a)));
    cands.into_iter().map(|c| (c.code, c.confidence)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(text: &str, alts: &[&str]) -> Sentence {
        Sentence {
            text: text.into(),
            alternatives: alts.iter().map(|a| a.to_string()).collect(),
        }
    }

    #[test]
    fn plan_and_render() {
        let texts = vec!["Hello. World!\n\nBye".to_string(), "".to_string()];
        let (plans, sentences) = plan(&texts, false);
        assert_eq!(sentences, ["Hello.", "World!", "Bye"]);
        let out = [s("A.", &["a1.", "a2."]), s("B!", &[]), s("C", &["c1"])];
        assert_eq!(plans[0].render(&out, None), "A. B!\n\nC");
        assert_eq!(plans[1].render(&out, None), "");
        assert_eq!(plans[0].render(&out, Some(1)), "a2. B!\n\nC");
        assert_eq!(
            plans[0].alternatives(&out, "A. B!\n\nC", 3),
            ["a1. B!\n\nc1", "a2. B!\n\nC"]
        );
    }

    #[test]
    fn html_plans() {
        let texts = vec!["<p>Hello. <b>World</b></p>".to_string()];
        let (plans, sentences) = plan(&texts, true);
        assert_eq!(sentences, ["Hello.", "World"]);
        let out = [s("X.", &["y"]), s("Z", &[])];
        assert_eq!(plans[0].render(&out, None), "<p>X. <b>Z</b></p>");
        assert!(plans[0].alternatives(&out, "", 2).is_empty());
    }

    #[test]
    fn translatable_like_app_py() {
        assert!(!translatable(&[" 😀 ".to_string()]));
        assert!(!translatable(&["".to_string()]));
        assert!(translatable(&["😀".to_string(), "a".to_string()]));
    }

    #[test]
    fn detection_of_lists_averages() {
        let codes = vec!["en".to_string(), "de".to_string()];
        let d = detect_languages(&["1234".to_string()], false, &codes);
        assert_eq!(d, [("en".to_string(), 0.0)]);
        let d = detect_languages(
            &[
                "The weather is very good today and we are going to the beach.".to_string(),
                "This is another sentence, written in plain English.".to_string(),
            ],
            true,
            &codes,
        );
        assert_eq!(d[0].0, "en");
    }
}
