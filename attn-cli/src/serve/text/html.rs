//! `format: "html"`: the text of an HTML fragment translated, everything else left as it was.
//!
//! The fragment goes through `lol_html`, a streaming HTML rewriter (the HTML5 tokenizer, with the
//! tree builder's text modes: script data, RCDATA, raw text): what we do not replace comes out
//! byte for byte as it came in (tags, attributes and their quoting, comments, entities outside
//! translated text, void elements written `<br/>` or `<br>`), and nothing is added around a
//! fragment (no `<html><body>`).
//!
//! The unit of translation is the text node, as in LibreTranslate (argos-translate's
//! `translate_html` turns the BeautifulSoup tree into tags and strings and translates every
//! string on its own; for a block of depth 2 it first tries to translate it whole and to find
//! each inline child's translation again inside, keeping the split ones otherwise). So inline
//! markup splits a sentence: `<p>I <b>really</b> like it.</p>` gives three runs, `I `,
//! `really` and ` like it.`, each translated alone. Joining them with placeholders would give
//! the model one sentence, but a model that was not trained with placeholders drops or moves
//! them; one run per text node never loses markup.
//!
//! Left alone (not handed out, copied as they are): the content of `script`, `style` and the
//! other non-text elements (`textarea`, `title`, … by their text mode), of `code` (so code blocks,
//! `<pre><code>`, too), `kbd`, `samp`, `var`, `svg`, `math`, `template`, `time`, `audio`,
//! `video`, `canvas`, `object`, `iframe`, `noscript`, `select`; of every element with `translate="no"` (until a
//! descendant says `translate="yes"`, as the HTML standard inherits it); of Mastodon's and
//! Discourse's mentions, hashtags and link-shortening spans (`class` `mention`, `hashtag`,
//! `hashtag-cooked`, `u-url`, `invisible`, `ellipsis`); and any text node without a letter or
//! that is a bare URL. Attribute values (`title`, `alt`) are not translated.
//!
//! Entities: a run is handed out decoded (`Tom &amp; Jerry` → `Tom & Jerry`, `&nbsp;` → U+00A0)
//! and its translation written back escaped (`&` → `&amp;`, `<` → `&lt;`, `>` → `&gt;`, U+00A0 →
//! `&nbsp;`), so `&amp;` stays `&amp;` and `&lt;` stays escaped; other named entities of a
//! translated run come back as their characters (`&eacute;` → `é`), which is the same HTML.

use lol_html::html_content::{ContentType, TextType};
use lol_html::{doc_text, element, end_tag, rewrite_str, RewriteStrSettings};
use std::cell::RefCell;
use std::rc::Rc;

/// An HTML fragment parsed for translation.
#[derive(Clone, Debug)]
pub struct HtmlDoc {
    source: String,
    runs: Vec<String>,
}

/// Parses `html` (a fragment, as Mastodon and Discourse send) for translation. Never fails: HTML
/// has no syntax errors, and should the rewriter give up (it bounds its memory), the fragment
/// has no runs and [`HtmlDoc::render`] gives it back unchanged.
pub fn html_texts(html: &str) -> HtmlDoc {
    let mut runs = Vec::new();
    let ok = rewrite(html, &mut |raw, decoded| {
        runs.push(decoded.to_string());
        raw.to_string()
    });
    if ok.is_none() {
        runs.clear();
    }
    HtmlDoc {
        source: html.to_string(),
        runs,
    }
}

impl HtmlDoc {
    /// The translatable text runs, in document order (what goes through `segment` and the
    /// model), entities decoded.
    pub fn texts(&self) -> Vec<String> {
        self.runs.clone()
    }

    /// The fragment with each text run replaced by its translation (same order, same count as
    /// [`texts`](Self::texts); a run without a translation, should there be fewer, is kept).
    pub fn render(&self, translations: &[String]) -> String {
        if self.runs.is_empty() {
            return self.source.clone();
        }
        let mut next = translations.iter();
        rewrite(&self.source, &mut |raw, decoded| match next.next() {
            // An unchanged run keeps its bytes (`a < b` stays unescaped, `&#39;` stays).
            Some(t) if t != decoded => escape(t),
            _ => raw.to_string(),
        })
        .unwrap_or_else(|| self.source.clone())
    }
}

/// Elements whose content is never translated.
const SKIP: &[&str] = &[
    "script", "style", "code", "kbd", "samp", "var", "svg", "math", "template", "time", "audio",
    "video", "canvas", "object", "iframe", "textarea", "noscript", "select",
];

/// `class` tokens of mentions, hashtags and shortened links (Mastodon, Discourse).
const SKIP_CLASSES: &[&str] = &[
    "mention",
    "hashtag",
    "hashtag-cooked",
    "u-url",
    "invisible",
    "ellipsis",
];

/// One open element: its name and whether text directly in it is translated.
struct Open {
    name: String,
    translate: bool,
}

#[derive(Default)]
struct State {
    /// The open elements, outermost first (those that can have content).
    stack: Vec<Open>,
    /// The raw (undecoded) text of the text node being read.
    text: String,
}

impl State {
    fn translating(&self) -> bool {
        self.stack.last().is_none_or(|o| o.translate)
    }

    /// Closes what a start tag `name` closes implicitly (HTML's "p closes p", "li closes li", a
    /// block closes an open `p`), so a sibling does not inherit `translate="no"` from an element
    /// whose end tag was left out.
    fn implicit_close(&mut self, name: &str) {
        const BLOCKS: &[&str] = &[
            "address",
            "article",
            "aside",
            "blockquote",
            "details",
            "div",
            "dl",
            "fieldset",
            "figcaption",
            "figure",
            "footer",
            "form",
            "h1",
            "h2",
            "h3",
            "h4",
            "h5",
            "h6",
            "header",
            "hr",
            "main",
            "menu",
            "nav",
            "ol",
            "p",
            "pre",
            "section",
            "table",
            "ul",
        ];
        let closes: &[&str] = match name {
            "li" => &["li"],
            "dt" | "dd" => &["dt", "dd"],
            "td" | "th" => &["td", "th"],
            "tr" => &["tr", "td", "th"],
            "option" => &["option"],
            _ if BLOCKS.contains(&name) => &["p"],
            _ => &[],
        };
        while self
            .stack
            .last()
            .is_some_and(|o| closes.contains(&o.name.as_str()))
        {
            self.stack.pop();
        }
    }
}

/// Runs the rewriter over `html`, calling `replace(raw, decoded)` for each translatable text
/// node, in document order, and putting what it returns (HTML) in the node's place. `None` if
/// the rewriter gave up.
fn rewrite(html: &str, replace: &mut dyn FnMut(&str, &str) -> String) -> Option<String> {
    let state = Rc::new(RefCell::new(State::default()));
    let replace = RefCell::new(replace);
    let on_element = {
        let state = state.clone();
        element!("*", move |el| {
            let name = el.tag_name();
            let mut st = state.borrow_mut();
            st.implicit_close(&name);
            if !el.can_have_content() {
                return Ok(());
            }
            let classes = el.get_attribute("class").unwrap_or_default();
            let translate = match el
                .get_attribute("translate")
                .map(|v| v.to_ascii_lowercase())
            {
                Some(v) if v == "no" => false,
                Some(v) if v.is_empty() || v == "yes" => true,
                _ => {
                    st.translating()
                        && !SKIP.contains(&name.as_str())
                        && !classes
                            .split_ascii_whitespace()
                            .any(|c| SKIP_CLASSES.contains(&c))
                }
            };
            // Inside svg/math and other skipped subtrees a `translate="yes"` does not bring
            // translation back for foreign content; keep them skipped.
            let translate = translate && !(SKIP.contains(&name.as_str()));
            st.stack.push(Open {
                name: name.clone(),
                translate,
            });
            let depth = st.stack.len();
            drop(st);
            let state = state.clone();
            el.on_end_tag(end_tag!(move |_| {
                // Pop it and whatever was implicitly closed inside it.
                state.borrow_mut().stack.truncate(depth - 1);
                Ok(())
            }))
        })
    };
    let on_text = {
        let state = state.clone();
        doc_text!(move |chunk| {
            let mut st = state.borrow_mut();
            if chunk.text_type() != TextType::Data || !st.translating() {
                return Ok(());
            }
            st.text.push_str(chunk.as_str());
            if !chunk.last_in_text_node() {
                chunk.remove();
                return Ok(());
            }
            let raw = std::mem::take(&mut st.text);
            drop(st);
            let decoded = html_escape::decode_html_entities(&raw);
            let new = if translatable(&decoded) {
                (replace.borrow_mut())(&raw, &decoded)
            } else {
                raw
            };
            chunk.replace(&new, ContentType::Html);
            Ok(())
        })
    };
    rewrite_str(
        html,
        RewriteStrSettings {
            element_content_handlers: vec![on_element],
            document_content_handlers: vec![on_text],
            ..RewriteStrSettings::new()
        },
    )
    .ok()
}

/// Whether a decoded text node is handed to the model: it has a letter and is not a bare URL.
fn translatable(text: &str) -> bool {
    let t = text.trim();
    if !t.chars().any(char::is_alphabetic) {
        return false;
    }
    let url = !t.contains(char::is_whitespace)
        && (t.contains("://") || t.starts_with("www.") || t.starts_with("mailto:"));
    !url
}

/// Text as HTML: `&`, `<`, `>` and the no-break space escaped.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '\u{a0}' => out.push_str("&nbsp;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Translates by upper-casing, as the fake engine does.
    fn upper(html: &str) -> String {
        let doc = html_texts(html);
        let t: Vec<String> = doc.texts().iter().map(|s| s.to_uppercase()).collect();
        doc.render(&t)
    }

    #[test]
    fn text_nodes_are_the_runs_and_markup_stays() {
        let html = r#"<p class="x" data-a='1'>Hello <b>bold</b> world.</p><br/><img src="a.png" alt="An image"><!-- note --><p>Two</p>"#;
        let doc = html_texts(html);
        assert_eq!(doc.texts(), vec!["Hello ", "bold", " world.", "Two"]);
        assert_eq!(
            upper(html),
            r#"<p class="x" data-a='1'>HELLO <b>BOLD</b> WORLD.</p><br/><img src="a.png" alt="An image"><!-- note --><p>TWO</p>"#
        );
        // Unchanged translations give back the input byte for byte.
        assert_eq!(doc.render(&doc.texts()), html);
    }

    #[test]
    fn entities_round_trip() {
        let html = "<p>Tom &amp; Jerry &lt;3 caf&eacute;&nbsp;ok it&#39;s</p>";
        let doc = html_texts(html);
        assert_eq!(doc.texts(), vec!["Tom & Jerry <3 café\u{a0}ok it's"]);
        assert_eq!(
            upper(html),
            "<p>TOM &amp; JERRY &lt;3 CAFÉ&nbsp;OK IT'S</p>"
        );
        // A translation with markup characters cannot inject tags.
        assert_eq!(
            doc.render(&["<script>x</script> & co".to_string()]),
            "<p>&lt;script&gt;x&lt;/script&gt; &amp; co</p>"
        );
    }

    #[test]
    fn script_style_code_and_translate_no_are_left_alone() {
        let html = concat!(
            "<p>Run <code>ls &amp;&amp; pwd</code> now.</p>",
            "<script>var s = \"<b>hi</b>\";</script><style>p { color: red }</style>",
            "<pre><code>let x = 1;</code></pre>",
            "<div translate=\"no\">Brand <span>Name</span> <em translate=\"yes\">but this</em></div>",
            "<p translate=no>Keep</p>",
            "<kbd>Ctrl</kbd> <textarea>raw text</textarea>"
        );
        let doc = html_texts(html);
        assert_eq!(doc.texts(), vec!["Run ", " now.", "but this"]);
        let out = upper(html);
        assert!(
            out.starts_with("<p>RUN <code>ls &amp;&amp; pwd</code> NOW.</p>"),
            "{out}"
        );
        assert!(out.contains("<em translate=\"yes\">BUT THIS</em>"), "{out}");
        assert!(out.contains("Brand <span>Name</span>"), "{out}");
        assert!(out.contains("<p translate=no>Keep</p>"), "{out}");
        assert!(out.contains("var s = \"<b>hi</b>\";"), "{out}");
    }

    #[test]
    fn mastodon_status_keeps_mentions_hashtags_and_links() {
        let html = concat!(
            r#"<p><span class="h-card" translate="no"><a href="https://m.example/@alice" class="u-url mention">@<span>alice</span></a></span> "#,
            r#"Good morning! See <a href="https://example.com/page" rel="nofollow noopener" target="_blank"><span class="invisible">https://</span><span class="ellipsis">example.com/pa</span><span class="invisible">ge</span></a> "#,
            r##"<a href="https://m.example/tags/rust" class="mention hashtag" rel="tag">#<span>rust</span></a></p>"##
        );
        let doc = html_texts(html);
        assert_eq!(doc.texts(), vec![" Good morning! See "]);
        let out = upper(html);
        assert_eq!(
            out,
            html.replace(" Good morning! See ", " GOOD MORNING! SEE ")
        );
    }

    #[test]
    fn discourse_post_and_lists() {
        let html = "<p>Hi <a class=\"mention\" href=\"/u/bob\">@bob</a>, try this:</p>\n<ul>\n<li>First item\n<li>Second item</li>\n</ul>\n<p>Link: <a href=\"https://x.org\">https://x.org</a></p>";
        let doc = html_texts(html);
        assert_eq!(
            doc.texts(),
            vec![
                "Hi ",
                ", try this:",
                "First item\n",
                "Second item",
                "Link: "
            ]
        );
        assert_eq!(upper(html).matches("https://x.org").count(), 2);
    }

    #[test]
    fn an_unclosed_translate_no_does_not_leak_to_its_siblings() {
        let html = "<ul><li translate=\"no\">Keep<li>Translate</ul><p translate=\"no\">Keep too<p>And this";
        assert_eq!(html_texts(html).texts(), vec!["Translate", "And this"]);
    }

    #[test]
    fn fragments_get_no_document_around_them_and_odd_input_is_kept() {
        for html in [
            "",
            "plain text, no tags",
            "<b>unclosed",
            "</p>stray end tag",
            "a < b and c > d",
            "<svg><text>Label</text><path d=\"M0 0\"/></svg>After",
            "<math><mi>x</mi></math>",
            "<table><tr><td>Cell<td>Other</table>",
            "<!doctype html><html><body><p>Full</p></body></html>",
            "<p>Emoji only 🙂</p><p>🙂</p><p>123</p>",
        ] {
            let doc = html_texts(html);
            assert_eq!(doc.render(&doc.texts()), html, "{html}");
            let out = upper(html);
            assert!(!out.contains("<html") || html.contains("<html"), "{out}");
        }
        assert_eq!(upper("plain text, no tags"), "PLAIN TEXT, NO TAGS");
        assert_eq!(upper("a < b and c > d"), "A &lt; B AND C &gt; D");
        assert_eq!(
            upper("<svg><text>Label</text></svg>After"),
            "<svg><text>Label</text></svg>AFTER"
        );
        assert_eq!(
            html_texts("<p>🙂</p><p>123</p>").texts(),
            Vec::<String>::new()
        );
    }

    #[test]
    fn fewer_translations_keep_the_rest() {
        let doc = html_texts("<p>One</p><p>Two</p>");
        assert_eq!(doc.render(&["Eins".to_string()]), "<p>Eins</p><p>Two</p>");
    }
}
