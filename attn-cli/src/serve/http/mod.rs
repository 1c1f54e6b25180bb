//! The HTTP layer of `attn serve`: LibreTranslate 1.9's API (`libretranslate/app.py`), to the
//! letter where a client can tell, over any [`Backend`].
//!
//! | route | what |
//! |---|---|
//! | `POST /translate` | `q` (a text, or in JSON a list), `source` (a code or `auto`), `target`, `format` (`text`, `html`), `alternatives`, `api_key` → `{"translatedText", "alternatives"?, "detectedLanguage"?}` |
//! | `POST /detect` | `q` → `[{"confidence", "language"}]` |
//! | `POST /translate_file` | multipart `file` (`.txt`), `source`, `target` → `{"translatedFileUrl"}` |
//! | `GET /download_file/{name}` | a translated file (kept 30 minutes) |
//! | `GET /languages` | `[{"code", "name", "targets"}]` |
//! | `GET /health` | `{"status": "ok"}` |
//! | `GET /frontend/settings` | the web page's settings |
//! | `GET /spec` | the API as a Swagger 2.0 (OpenAPI) document |
//! | `GET /metrics` | Prometheus text |
//! | `GET /` | the web page |
//!
//! Parameters come as JSON, `application/x-www-form-urlencoded`, `multipart/form-data` or the
//! query string ([`params`]); errors are `{"error": "..."}` with LibreTranslate's codes and
//! messages ([`error`]); limits and keys in [`limits`]; metrics in [`metrics`]. [`serve`] runs
//! the server: one tokio task per connection, a header read timeout, a connection cap, and a
//! graceful drain.

pub mod error;
pub mod limits;
pub mod metrics;
pub mod params;
mod routes;
mod spec;
pub mod translate;

use self::error::ApiError;
use self::limits::{ApiKeys, RateLimiter};
use self::params::Params;
use super::backend::Backend;
use axum::extract::{ConnectInfo, DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use metrics_exporter_prometheus::PrometheusHandle;
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tower::Service;

/// Who may call which origin: the `Access-Control-*` headers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cors {
    /// No CORS headers.
    Off,
    /// LibreTranslate's: `Access-Control-Allow-Origin: *` on every answer.
    Any,
    /// Only these origins (`https://example.org`), echoed back with `Vary: Origin`.
    Origins(Vec<String>),
}

/// What the server allows, and how long it waits. `None` is "no limit" (LibreTranslate's
/// `-1`).
#[derive(Clone, Debug)]
pub struct Settings {
    /// Characters per text (`--char-limit`; app.py 781-787).
    pub char_limit: Option<usize>,
    /// Texts per request (`--batch-limit`; app.py 764-770).
    pub batch_limit: Option<usize>,
    /// Requests per minute per client and route (`--req-limit`); a key's own limit wins.
    pub req_limit: Option<u64>,
    /// The accepted API keys (`--api-keys FILE`): a key that is not here is 403 "Invalid API
    /// key".
    pub api_keys: Option<ApiKeys>,
    /// With keys: a request without one is 400 (LibreTranslate's `--under-attack`).
    pub require_api_key: bool,
    /// Where to get a key, named in that 400 (`--get-api-key-link`).
    pub get_api_key_link: Option<String>,
    /// Most alternatives a request may ask for (`--alternatives-limit`); never more than the
    /// beam minus one.
    pub alternatives_limit: Option<usize>,
    /// How long a request may take, body included (408 while reading, 503 while translating).
    pub request_timeout: Duration,
    /// Largest body in bytes (413 beyond).
    pub body_limit: usize,
    /// CORS headers.
    pub cors: Cors,
    /// Take the client address for limits from `X-Forwarded-For` (behind a proxy).
    pub trust_forwarded_for: bool,
    /// `frontendTimeout` of `/frontend/settings` (milliseconds; LibreTranslate's 500).
    pub frontend_timeout_ms: u64,
    /// `/translate_file` answers 403.
    pub disable_files_translation: bool,
    /// `/` answers 404.
    pub disable_web_ui: bool,
    /// `/metrics` wants `Authorization: Bearer TOKEN`.
    pub metrics_auth_token: Option<String>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            char_limit: None,
            batch_limit: None,
            req_limit: None,
            api_keys: None,
            require_api_key: false,
            get_api_key_link: None,
            alternatives_limit: None,
            request_timeout: Duration::from_secs(60),
            body_limit: 10 << 20,
            cors: Cors::Any,
            trust_forwarded_for: false,
            frontend_timeout_ms: 500,
            disable_files_translation: false,
            disable_web_ui: false,
            metrics_auth_token: None,
        }
    }
}

/// The client's address as the limits see it (`X-Forwarded-For`'s first when trusted, else
/// the peer's IP).
#[derive(Clone, Debug)]
pub(crate) struct Client(pub String);

/// Translated files, kept 30 minutes (LibreTranslate's `remove_translated_files`), 256 at
/// most.
#[derive(Debug, Default)]
pub(crate) struct FileStore {
    files: Mutex<HashMap<String, (Instant, Vec<u8>)>>,
}

const FILE_KEEP: Duration = Duration::from_secs(30 * 60);
const FILE_MAX: usize = 256;

impl FileStore {
    fn insert(&self, name: String, bytes: Vec<u8>) {
        let mut files = self.files.lock().unwrap_or_else(|e| e.into_inner());
        files.retain(|_, (t, _)| t.elapsed() < FILE_KEEP);
        while files.len() >= FILE_MAX {
            let Some(oldest) = files
                .iter()
                .min_by_key(|(_, (t, _))| *t)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            files.remove(&oldest);
        }
        files.insert(name, (Instant::now(), bytes));
    }

    fn get(&self, name: &str) -> Option<Vec<u8>> {
        let files = self.files.lock().unwrap_or_else(|e| e.into_inner());
        files
            .get(name)
            .filter(|(t, _)| t.elapsed() < FILE_KEEP)
            .map(|(_, b)| b.clone())
    }
}

pub(crate) struct AppState {
    backend: Arc<dyn Backend>,
    settings: Settings,
    limiter: RateLimiter,
    files: FileStore,
    metrics: PrometheusHandle,
}

/// A request let in: where its cost goes, and its character limit.
pub(crate) struct Admission {
    limiter_key: Option<String>,
    char_limit: Option<usize>,
}

impl AppState {
    /// app.py's limiter (282-291) then `access_check` (333-389): the request limit of the key
    /// or client (429 "Slowdown: N per 1 minute"), an unknown key (403 "Invalid API key"), a
    /// missing one where keys are required (400).
    fn admit(&self, params: &Params, route: &str, client: &str) -> Result<Admission, ApiError> {
        let s = &self.settings;
        let ak = params.text("api_key");
        let key_limits = match (&s.api_keys, &ak) {
            (Some(keys), Some(k)) => keys.lookup(k),
            _ => None,
        };
        let mut limiter_key = None;
        if s.req_limit.is_some() || s.api_keys.is_some() {
            let who = match (&s.api_keys, &ak) {
                (Some(_), Some(k)) => format!("key:{k}"),
                _ => format!("ip:{client}"),
            };
            let limit = key_limits.and_then(|k| k.req_limit).unwrap_or(s.req_limit);
            if let Some(limit) = limit {
                let key = format!("{route} {who}");
                self.limiter
                    .take(&key, limit, Instant::now())
                    .map_err(|wait| {
                        ApiError::new(
                            StatusCode::TOO_MANY_REQUESTS,
                            format!("Slowdown: {limit} per 1 minute"),
                        )
                        .retry_after(wait)
                    })?;
                limiter_key = Some(key);
            }
        }
        if s.api_keys.is_some() {
            if ak.is_some() && key_limits.is_none() {
                return Err(ApiError::new(StatusCode::FORBIDDEN, "Invalid API key"));
            }
            if s.require_api_key && key_limits.is_none() {
                return Err(ApiError::bad_request(match &s.get_api_key_link {
                    Some(url) => format!("Visit {url} to get an API key"),
                    None => "Please contact the server operator to get an API key".to_string(),
                }));
            }
        }
        Ok(Admission {
            limiter_key,
            char_limit: key_limits
                .and_then(|k| k.char_limit)
                .unwrap_or(s.char_limit),
        })
    }

    /// A request of `cost` units (a batch of N texts) was charged 1 on admission: the rest.
    fn charge(&self, adm: &Admission, cost: u64) {
        if let Some(key) = &adm.limiter_key {
            self.limiter
                .charge(key, cost.saturating_sub(1), Instant::now());
        }
    }

    /// Most alternatives a request may ask for: `--alternatives-limit`, at most the beam
    /// minus one.
    fn alternatives_limit(&self) -> usize {
        let beam = self.backend.beam().saturating_sub(1);
        self.settings
            .alternatives_limit
            .map_or(beam, |l| l.min(beam))
    }
}

/// The application: every route, its limits and headers, over `backend`.
pub fn app(backend: Arc<dyn Backend>, settings: Settings) -> Router {
    let body_limit = settings.body_limit;
    let state = Arc::new(AppState {
        backend,
        settings,
        limiter: RateLimiter::default(),
        files: FileStore::default(),
        metrics: metrics::handle(),
    });
    Router::new()
        .route("/", get(routes::index))
        .route("/translate", post(routes::translate))
        .route("/translate_file", post(routes::translate_file))
        .route("/download_file/{filename}", get(routes::download_file))
        .route("/detect", post(routes::detect))
        .route("/languages", get(routes::languages))
        .route("/health", get(routes::health))
        .route("/frontend/settings", get(routes::frontend_settings))
        .route("/spec", get(routes::spec))
        .route("/metrics", get(routes::metrics))
        .fallback(routes::not_found)
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(axum::middleware::from_fn_with_state(state.clone(), edge))
        .with_state(state)
}

fn route_label(path: &str) -> &'static str {
    match path {
        "/" => "/",
        "/translate" => "/translate",
        "/translate_file" => "/translate_file",
        "/detect" => "/detect",
        "/languages" => "/languages",
        "/health" => "/health",
        "/frontend/settings" => "/frontend/settings",
        "/spec" => "/spec",
        "/metrics" => "/metrics",
        p if p.starts_with("/download_file/") => "/download_file",
        _ => "other",
    }
}

fn client_addr(req: &Request, trust_forwarded_for: bool) -> String {
    if trust_forwarded_for {
        if let Some(first) = req
            .headers()
            .get("x-forwarded-for")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(',').next())
            .map(str::trim)
            .filter(|v| !v.is_empty())
        {
            return first.to_string();
        }
    }
    req.extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip().to_string())
        .unwrap_or_else(|| "127.0.0.1".to_string())
}

/// app.py 562-573's headers (configurable origins).
fn cors_headers(cors: &Cors, origin: Option<&HeaderValue>, h: &mut HeaderMap) {
    let allow = match cors {
        Cors::Off => return,
        Cors::Any => HeaderValue::from_static("*"),
        Cors::Origins(list) => {
            h.append(header::VARY, HeaderValue::from_static("Origin"));
            match origin {
                Some(o) if list.iter().any(|x| x.as_bytes() == o.as_bytes()) => o.clone(),
                _ => return,
            }
        }
    };
    h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, allow);
    h.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_static("Authorization, Content-Type"),
    );
    h.insert(
        header::ACCESS_CONTROL_EXPOSE_HEADERS,
        HeaderValue::from_static("Authorization"),
    );
    h.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("GET, POST"),
    );
    h.insert(
        header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
        HeaderValue::from_static("true"),
    );
    h.insert(
        header::ACCESS_CONTROL_MAX_AGE,
        HeaderValue::from(60 * 60 * 24 * 20),
    );
}

/// Around every request: the client address, JSON for bare 404/405, `OPTIONS` answered as
/// Flask answers it (200 with `Allow`), CORS, metrics, one log line.
async fn edge(State(st): State<Arc<AppState>>, mut req: Request, next: Next) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let route = route_label(&path);
    let client = client_addr(&req, st.settings.trust_forwarded_for);
    let origin = req.headers().get(header::ORIGIN).cloned();
    req.extensions_mut().insert(Client(client.clone()));
    let flight = metrics::InFlight::start(route);
    let mut resp = next.run(req).await;
    let bare = resp.headers().get(header::CONTENT_TYPE).is_none();
    if method == Method::OPTIONS && resp.status() == StatusCode::METHOD_NOT_ALLOWED {
        let allow = resp
            .headers()
            .get(header::ALLOW)
            .and_then(|v| v.to_str().ok())
            .map(|a| format!("{a}, OPTIONS"))
            .unwrap_or_else(|| "OPTIONS".to_string());
        resp = StatusCode::OK.into_response();
        if let Ok(v) = HeaderValue::from_str(&allow) {
            resp.headers_mut().insert(header::ALLOW, v);
        }
    } else if bare && resp.status() == StatusCode::METHOD_NOT_ALLOWED {
        let allow = resp.headers().get(header::ALLOW).cloned();
        resp = ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed").into_response();
        if let Some(a) = allow {
            resp.headers_mut().insert(header::ALLOW, a);
        }
    }
    cors_headers(&st.settings.cors, origin.as_ref(), resp.headers_mut());
    let status = resp.status().as_u16();
    let secs = flight.done(status);
    tracing::info!(
        method = %method,
        path = %path,
        status,
        ms = (secs * 1000.0).round() as u64,
        client = %client,
        "request"
    );
    resp
}

/// How the server treats connections.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// A connection that does not send a request's headers in this time (idle keep-alive
    /// ones included) is closed: slow clients hold no more than a task and a socket.
    pub header_read_timeout: Duration,
    /// Connections open at once; beyond, new ones wait in the listen backlog.
    pub max_connections: usize,
    /// On shutdown, how long requests in flight may still take (then connections are
    /// dropped); `None`: as long as they take.
    pub drain_timeout: Option<Duration>,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            max_connections: 1024,
            drain_timeout: None,
        }
    }
}

/// Serves `app` on `listener` until `shutdown` completes, then stops accepting, lets the
/// requests in flight finish and returns.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    serve_with(listener, app, shutdown, ServeOptions::default()).await
}

fn is_connection_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        ConnectionRefused | ConnectionAborted | ConnectionReset
    )
}

/// [`serve`] with these options.
pub async fn serve_with(
    listener: tokio::net::TcpListener,
    app: Router,
    shutdown: impl Future<Output = ()> + Send,
    options: ServeOptions,
) -> std::io::Result<()> {
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(options.header_read_timeout)
        .keep_alive(true);
    let slots = Arc::new(tokio::sync::Semaphore::new(options.max_connections.max(1)));
    let upkeep = tokio::spawn(metrics::upkeep(metrics::handle()));
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
            _ = &mut shutdown => break,
        };
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) if is_connection_error(&e) => continue,
                Err(e) => {
                    // Out of file descriptors and the like: wait instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let service =
            hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let mut req = req.map(axum::body::Body::new);
                req.extensions_mut().insert(ConnectInfo(peer));
                let mut app = app.clone();
                async move { app.call(req).await }
            });
        let conn = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            let _permit = permit;
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, peer = %peer, "connection ended with an error");
            }
        });
    }
    drop(listener);
    tracing::info!("shutting down: no new connections, finishing the requests in flight");
    match options.drain_timeout {
        Some(t) => {
            if tokio::time::timeout(t, graceful.shutdown()).await.is_err() {
                tracing::warn!(
                    seconds = t.as_secs(),
                    "requests still in flight after the drain timeout"
                );
            }
        }
        None => graceful.shutdown().await,
    }
    upkeep.abort();
    Ok(())
}
