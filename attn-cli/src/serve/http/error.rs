//! Errors as LibreTranslate answers them: a JSON object `{"error": "..."}` with its status code
//! (and `Retry-After` where waiting helps).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

/// An answer that is an error: status, message, and optionally how long to wait.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// The message, sent as `{"error": message}`.
    pub message: String,
    /// Seconds for `Retry-After`.
    pub retry_after: Option<u64>,
}

impl ApiError {
    /// An error with this status and message.
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            retry_after: None,
        }
    }

    /// 400 with this message.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    /// 400 "Invalid request: missing NAME parameter" (app.py 740-744).
    pub fn missing(name: &str) -> Self {
        Self::bad_request(format!("Invalid request: missing {name} parameter"))
    }

    /// 400 "CODE is not supported" (app.py 806, 811).
    pub fn not_supported(code: &str) -> Self {
        Self::bad_request(format!("{code} is not supported"))
    }

    /// 400 "Invalid request: request (SIZE) exceeds text limit (LIMIT)" (app.py 769, 786).
    pub fn exceeds_limit(size: usize, limit: usize) -> Self {
        Self::bad_request(format!(
            "Invalid request: request ({size}) exceeds text limit ({limit})"
        ))
    }

    /// 413: the body is larger than the server takes.
    pub fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("Request Entity Too Large: the body exceeds the limit of {limit} bytes"),
        )
    }

    /// Adds `Retry-After: secs`.
    pub fn retry_after(mut self, secs: u64) -> Self {
        self.retry_after = Some(secs);
        self
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.status.as_u16(), self.message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = json_response(self.status, &serde_json::json!({ "error": self.message }));
        if let Some(secs) = self.retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}

/// A JSON answer (`application/json`, compact, keys sorted as Flask's `jsonify` sorts them).
pub fn json_response(status: StatusCode, value: &serde_json::Value) -> Response {
    let body = serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec());
    let mut resp = (status, body).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}
