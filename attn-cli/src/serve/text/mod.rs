//! The text side of `attn serve`, pure functions the HTTP layer calls: sentences
//! ([`segment()`]), the text of HTML fragments ([`html_texts()`]) and the language of a text
//! ([`detect()`]).

mod detect;
mod html;
mod segment;

pub use detect::detect;
pub use html::{html_texts, HtmlDoc};
pub use segment::{segment, sentences, Segment};
