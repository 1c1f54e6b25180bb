//! A request's parameters the way Flask hands them to LibreTranslate's `app.py`: from a JSON
//! object when the body is JSON (`request.is_json`), else from `request.values` (the query
//! string first, then the form: `application/x-www-form-urlencoded` or `multipart/form-data`).

use super::error::ApiError;
use axum::extract::{FromRequest, Multipart, Request};
use axum::http::{header, HeaderMap, StatusCode};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde_json::{Map, Value};
use std::time::Instant;

/// A file of a `multipart/form-data` body.
#[derive(Clone, Debug)]
pub struct Upload {
    /// The form field's name (`file`).
    pub field: String,
    /// The file name the client sent.
    pub filename: String,
    /// Its bytes.
    pub bytes: Vec<u8>,
}

/// The parameters of one request.
#[derive(Clone, Debug, Default)]
pub struct Params {
    json: Option<Map<String, Value>>,
    query: Vec<(String, String)>,
    form: Vec<(String, String)>,
    files: Vec<Upload>,
}

/// `q`: one text, or (JSON only) a list of texts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Q {
    /// `"q": "text"`: answered with a string.
    One(String),
    /// `"q": ["a", "b"]`: answered with a list.
    Many(Vec<String>),
}

impl Q {
    /// The texts.
    pub fn texts(&self) -> &[String] {
        match self {
            Q::One(t) => std::slice::from_ref(t),
            Q::Many(ts) => ts,
        }
    }
}

/// What LibreTranslate 1.9.6 (Flask 2.2.5, werkzeug 2.3.8) answers for a JSON body that does
/// not parse: Flask's `on_json_loading_failed` raises a bare `BadRequest()` outside debug mode.
pub const BAD_JSON: &str =
    "The browser (or proxy) sent a request that this server could not understand.";

fn is_json_mime(mime: &str) -> bool {
    // werkzeug's `is_json`: application/json or application/*+json.
    mime == "application/json" || (mime.starts_with("application/") && mime.ends_with("+json"))
}

fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn parse_pairs(bytes: &[u8]) -> Vec<(String, String)> {
    // Like werkzeug: undecodable bytes become U+FFFD.
    form_urlencoded::parse(bytes).into_owned().collect()
}

fn body_timeout() -> ApiError {
    ApiError::new(
        StatusCode::REQUEST_TIMEOUT,
        "Request Timeout: the request body did not arrive within the request timeout",
    )
}

impl Params {
    /// Reads a request's parameters: at most `limit` bytes of body (413 beyond), before
    /// `deadline` (408 after). A JSON body that does not parse (or is not UTF-8) is 400 with
    /// werkzeug's `BadRequest` message ([`BAD_JSON`]), one that is not an object 400 "Invalid
    /// JSON format" (app.py 102).
    pub async fn read(req: Request, limit: usize, deadline: Instant) -> Result<Self, ApiError> {
        let deadline = tokio::time::Instant::from_std(deadline);
        let mut params = Params {
            query: req
                .uri()
                .query()
                .map(|q| parse_pairs(q.as_bytes()))
                .unwrap_or_default(),
            ..Params::default()
        };
        if content_length(req.headers()).is_some_and(|n| n > limit as u64) {
            return Err(ApiError::too_large(limit));
        }
        let mime = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .map(|v| v.trim().to_ascii_lowercase())
            .unwrap_or_default();
        if mime == "multipart/form-data" {
            tokio::time::timeout_at(deadline, params.read_multipart(req, limit))
                .await
                .map_err(|_| body_timeout())??;
            return Ok(params);
        }
        let collected =
            tokio::time::timeout_at(deadline, Limited::new(req.into_body(), limit).collect())
                .await
                .map_err(|_| body_timeout())?;
        let bytes = match collected {
            Ok(c) => c.to_bytes(),
            Err(e) if is_length_limit(&*e) => return Err(ApiError::too_large(limit)),
            Err(e) => {
                return Err(ApiError::bad_request(format!(
                    "Invalid request: could not read the body: {e}"
                )))
            }
        };
        if is_json_mime(&mime) {
            match serde_json::from_slice::<Value>(&bytes) {
                Ok(Value::Object(map)) => params.json = Some(map),
                Ok(_) => return Err(ApiError::bad_request("Invalid JSON format")),
                Err(e) => {
                    tracing::debug!(error = %e, "undecodable JSON body");
                    return Err(ApiError::bad_request(BAD_JSON));
                }
            }
        } else if mime == "application/x-www-form-urlencoded" {
            params.form = parse_pairs(&bytes);
        }
        Ok(params)
    }

    async fn read_multipart(&mut self, req: Request, limit: usize) -> Result<(), ApiError> {
        let mut mp = Multipart::from_request(req, &())
            .await
            .map_err(|e| ApiError::bad_request(format!("Invalid request: {}", e.body_text())))?;
        let field_error = |e: axum::extract::multipart::MultipartError| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::too_large(limit)
            } else {
                ApiError::bad_request(format!("Invalid request: {}", e.body_text()))
            }
        };
        while let Some(field) = mp.next_field().await.map_err(field_error)? {
            let name = field.name().unwrap_or("").to_string();
            match field.file_name().map(str::to_string) {
                Some(filename) => {
                    let bytes = field.bytes().await.map_err(field_error)?.to_vec();
                    self.files.push(Upload {
                        field: name,
                        filename,
                        bytes,
                    });
                }
                None => {
                    let bytes = field.bytes().await.map_err(field_error)?;
                    self.form
                        .push((name, String::from_utf8_lossy(&bytes).into_owned()));
                }
            }
        }
        Ok(())
    }

    /// Whether the body was JSON.
    pub fn is_json(&self) -> bool {
        self.json.is_some()
    }

    /// A parameter as a JSON value: the JSON object's member, or the first of the query
    /// string's and the form's values (as a string).
    pub fn get(&self, name: &str) -> Option<Value> {
        match &self.json {
            Some(map) => map.get(name).cloned(),
            None => self
                .query
                .iter()
                .chain(&self.form)
                .find(|(k, _)| k == name)
                .map(|(_, v)| Value::String(v.clone())),
        }
    }

    /// A field of the form only (`request.form`: what `/translate_file` reads).
    pub fn form_get(&self, name: &str) -> Option<&str> {
        self.form
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The first uploaded file of this field.
    pub fn file(&self, name: &str) -> Option<&Upload> {
        self.files.iter().find(|f| f.field == name)
    }

    /// A parameter as text when Python would find it true (present, not empty, not 0):
    /// strings as they are, other JSON values as JSON.
    pub fn text(&self, name: &str) -> Option<String> {
        let v = self.get(name)?;
        if !truthy(&v) {
            return None;
        }
        Some(match v {
            Value::String(s) => s,
            Value::Bool(true) => "True".to_string(),
            other => other.to_string(),
        })
    }

    /// `q` (app.py 727/733, 739): missing or empty is 400 "Invalid request: missing q
    /// parameter"; outside JSON and with `normalize_lines` (`/translate`), its line endings
    /// become `\n` the way app.py 758 does it (`"\n".join(q.splitlines())`).
    pub fn q(&self, normalize_lines: bool) -> Result<Q, ApiError> {
        let v = self.get("q").filter(truthy).ok_or(ApiError::missing("q"))?;
        let not_text = || {
            ApiError::bad_request(
                "Invalid request: q parameter must be a string or a list of strings",
            )
        };
        match v {
            Value::String(s) if self.is_json() || !normalize_lines => Ok(Q::One(s)),
            Value::String(s) => Ok(Q::One(python_splitlines_join(&s))),
            Value::Array(items) => items
                .into_iter()
                .map(|i| match i {
                    Value::String(s) => Ok(s),
                    _ => Err(not_text()),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Q::Many),
            _ => Err(not_text()),
        }
    }

    /// `alternatives` (app.py 731/737, 746-749): absent is 0, negative 0; what `int()` cannot
    /// read is 400 "Invalid request: alternatives parameter is not a number".
    pub fn alternatives(&self) -> Result<usize, ApiError> {
        let nan =
            || ApiError::bad_request("Invalid request: alternatives parameter is not a number");
        let n: i128 = match self.get("alternatives") {
            None => 0,
            Some(Value::String(s)) => python_int(&s).ok_or_else(nan)?,
            Some(Value::Bool(b)) => b as i128,
            Some(Value::Number(n)) => {
                if let Some(i) = n.as_i64() {
                    i as i128
                } else if let Some(u) = n.as_u64() {
                    u as i128
                } else {
                    // int(2.7) == 2; serde_json has no NaN or infinity.
                    n.as_f64().map(|f| f.trunc() as i128).ok_or_else(nan)?
                }
            }
            Some(_) => return Err(nan()),
        };
        Ok(n.clamp(0, usize::MAX as i128) as usize)
    }
}

fn is_length_limit(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if err.is::<LengthLimitError>() {
            return true;
        }
        cur = err.source();
    }
    false
}

/// Python's truth of a JSON value.
pub fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64() != Some(0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// `"\n".join(text.splitlines())`: every line boundary Python knows (`\r\n`, `\r`, `\n`,
/// `\v`, `\f`, `\x1c`-`\x1e`, `\x85`, U+2028, U+2029) becomes `\n`, and one final boundary
/// goes.
pub fn python_splitlines_join(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\r' => {
                if chars.peek() == Some(&'\n') {
                    chars.next();
                }
                out.push('\n');
            }
            '\n' | '\u{0b}' | '\u{0c}' | '\u{1c}' | '\u{1d}' | '\u{1e}' | '\u{85}' | '\u{2028}'
            | '\u{2029}' => out.push('\n'),
            c => out.push(c),
        }
    }
    if out.ends_with('\n') {
        out.pop();
    }
    out
}

/// Python's `int(str)` for decimal integers (surrounding whitespace, a sign, `_` between
/// digits), saturating far beyond any limit instead of growing without bound.
pub fn python_int(s: &str) -> Option<i128> {
    let s = s.trim();
    let (neg, digits) = match s.as_bytes().first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    if digits.is_empty()
        || digits.starts_with('_')
        || digits.ends_with('_')
        || digits.contains("__")
    {
        return None;
    }
    let mut n: i128 = 0;
    for b in digits.bytes() {
        match b {
            b'0'..=b'9' => n = n.saturating_mul(10).saturating_add((b - b'0') as i128),
            b'_' => {}
            _ => return None,
        }
    }
    Some(if neg { -n } else { n })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitlines_like_python() {
        assert_eq!(python_splitlines_join("a\r\nb\rc\nd"), "a\nb\nc\nd");
        assert_eq!(python_splitlines_join("a\n\n"), "a\n");
        assert_eq!(python_splitlines_join("a\n"), "a");
        assert_eq!(python_splitlines_join("\n"), "");
        assert_eq!(python_splitlines_join("a\u{2028}b"), "a\nb");
        assert_eq!(python_splitlines_join("no breaks"), "no breaks");
    }

    #[test]
    fn int_like_python() {
        assert_eq!(python_int(" 3 "), Some(3));
        assert_eq!(python_int("-2"), Some(-2));
        assert_eq!(python_int("1_000"), Some(1000));
        assert_eq!(python_int("3.5"), None);
        assert_eq!(python_int(""), None);
        assert_eq!(python_int("abc"), None);
        assert_eq!(python_int("_1"), None);
        assert!(python_int("99999999999999999999999999999999999999999999").unwrap() > 1 << 100);
    }

    #[test]
    fn truth() {
        assert!(!truthy(&Value::Null));
        assert!(!truthy(&serde_json::json!("")));
        assert!(!truthy(&serde_json::json!([])));
        assert!(!truthy(&serde_json::json!(0)));
        assert!(truthy(&serde_json::json!(" ")));
        assert!(truthy(&serde_json::json!(["a"])));
    }
}
