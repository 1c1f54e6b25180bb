//! The handlers, in app.py's order of checks.

use super::error::{json_response, ApiError};
use super::params::{Params, Q};
use super::translate::{detect_languages, plan, translatable};
use super::{metrics, spec, AppState, Client};
use crate::serve::backend::{ApiLanguage, Job, JobError, Sentence, SubmitError};
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use serde_json::{json, Map, Value};
use std::sync::Arc;
use std::time::Instant;

type St = State<Arc<AppState>>;

/// LibreTranslate's code as its model knows it (`iso2model`, language.py): lower case, with
/// `pt-BR`, `zh-Hans`, `zh-Hant` as `pb`, `zh`, `zt`. Error messages name codes this way.
fn model_code(code: &str) -> String {
    let l = code.to_lowercase();
    match l.as_str() {
        "pt-br" => "pb".to_string(),
        "zh-hans" => "zh".to_string(),
        "zh-hant" => "zt".to_string(),
        _ => l,
    }
}

fn find<'a>(langs: &'a [ApiLanguage], code: &str) -> Option<&'a ApiLanguage> {
    let m = model_code(code);
    langs.iter().find(|l| model_code(&l.code) == m)
}

/// `get_language_with_fallback` (language.py): `pt` and `pb`, `zh` and `zt` stand in for each
/// other.
fn find_with_fallback<'a>(langs: &'a [ApiLanguage], code: &str) -> Option<&'a ApiLanguage> {
    find(langs, code).or_else(|| {
        let alt: &[&str] = match model_code(code).as_str() {
            "pt" => &["pb"],
            "pb" => &["pt"],
            "zh" => &["zt"],
            "zt" => &["zh"],
            _ => &[],
        };
        alt.iter().find_map(|a| find(langs, a))
    })
}

/// Runs CPU work (segmentation, HTML, detection) off the async workers; a panic in it is a
/// 500, not a dead connection.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| {
        tracing::error!(error = %e, "text processing failed");
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "Cannot translate text: internal error while processing the text",
        )
    })
}

fn busy(message: String, retry_after: u64) -> ApiError {
    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, message).retry_after(retry_after)
}

/// Submits one job and waits for it until its deadline; past it the receiver is dropped
/// (the engine takes the job's rows out of the batch).
async fn run_job(st: &AppState, job: Job) -> Result<Vec<Sentence>, ApiError> {
    let n = job.sentences.len();
    let deadline = job.deadline;
    let secs = st.settings.request_timeout.as_secs();
    let rx = st.backend.submit(job).map_err(|e| match e {
        SubmitError::Overloaded { retry_after_secs } => ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            format!("Slowdown: the translation queue is full, retry in {retry_after_secs} s"),
        )
        .retry_after(retry_after_secs),
        SubmitError::Unsupported(code) => ApiError::not_supported(&code),
    })?;
    let timed_out = || {
        busy(
            format!("Request timed out after {secs} s: the server is busy"),
            5,
        )
    };
    let results = match tokio::time::timeout_at(deadline.into(), rx).await {
        Err(_) => return Err(timed_out()),
        Ok(Err(_)) => {
            return Err(busy(
                "The translation engine stopped before answering".to_string(),
                5,
            ))
        }
        Ok(Ok(Err(JobError::TimedOut))) => return Err(timed_out()),
        Ok(Ok(Err(JobError::Stopped))) => {
            return Err(busy("The server is shutting down".to_string(), 5))
        }
        Ok(Ok(Ok(results))) => results,
    };
    if results.len() != n {
        return Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!(
                "Cannot translate text: the engine answered {} sentences for {n}",
                results.len()
            ),
        ));
    }
    results
        .into_iter()
        .map(|r| {
            r.map_err(|e| {
                if e.is_input() {
                    ApiError::bad_request(e.message())
                } else {
                    // app.py 879.
                    ApiError::new(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        format!("Cannot translate text: {}", e.message()),
                    )
                }
            })
        })
        .collect()
}

fn detected(code: &str, confidence: f64) -> Value {
    json!({ "confidence": confidence, "language": code })
}

fn pair_unavailable(src: &ApiLanguage, tgt: &ApiLanguage) -> ApiError {
    // app.py 826/852.
    ApiError::bad_request(format!(
        "{} ({}) is not available as a target language from {} ({})",
        tgt.name, tgt.code, src.name, src.code
    ))
}

/// `POST /translate` (app.py 575-879).
pub(crate) async fn translate(
    st: St,
    Extension(client): Extension<Client>,
    req: Request,
) -> Response {
    let deadline = Instant::now() + st.settings.request_timeout;
    translate_inner(&st, &client.0, req, deadline)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn translate_inner(
    st: &Arc<AppState>,
    client: &str,
    req: Request,
    deadline: Instant,
) -> Result<Response, ApiError> {
    let s = &st.settings;
    let params = Params::read(req, s.body_limit, deadline).await?;
    let adm = st.admit(&params, "/translate", client)?;
    let q = params.q(true)?;
    let source = model_code(&params.text("source").ok_or(ApiError::missing("source"))?);
    let target = model_code(&params.text("target").ok_or(ApiError::missing("target"))?);
    let alternatives = params.alternatives()?;
    let alt_limit = st.alternatives_limit();
    if alternatives > alt_limit {
        return Err(ApiError::bad_request(format!(
            "Invalid request: alternatives parameter must be <= {alt_limit}"
        )));
    }
    let batch = matches!(q, Q::Many(_));
    let texts = q.texts().to_vec();
    if let (true, Some(limit)) = (batch, s.batch_limit) {
        if texts.len() > limit {
            return Err(ApiError::exceeds_limit(texts.len(), limit));
        }
    }
    if let Some(limit) = adm.char_limit {
        for t in &texts {
            let n = t.chars().count();
            if n > limit {
                return Err(ApiError::exceeds_limit(n, limit));
            }
        }
    }
    if batch {
        st.charge(&adm, texts.len().max(1) as u64);
    }

    let langs = st.backend.languages();
    let auto = source == "auto";
    let can_translate = translatable(&texts);
    let (detection, src) = if can_translate && auto {
        let codes: Vec<String> = langs.iter().map(|l| l.code.clone()).collect();
        let t = texts.clone();
        let best = blocking(move || detect_languages(&t, true, &codes))
            .await?
            .into_iter()
            .next()
            .unwrap_or(("en".to_string(), 0.0));
        let src = find_with_fallback(&langs, &best.0);
        (Some(best), src)
    } else if auto {
        // Nothing to translate (app.py 801-803): "en" with confidence 0.
        (Some(("en".to_string(), 0.0)), find(&langs, "en"))
    } else {
        (None, find(&langs, &source))
    };
    let src = src.ok_or_else(|| ApiError::not_supported(&source))?;
    let tgt = find(&langs, &target).ok_or_else(|| ApiError::not_supported(&target))?;
    let format = params.text("format").unwrap_or_else(|| "text".to_string());
    if format != "text" && format != "html" {
        return Err(ApiError::bad_request(format!(
            "{format} format is not supported"
        )));
    }
    if !src.targets.iter().any(|t| t == &tgt.code) {
        return Err(pair_unavailable(src, tgt));
    }

    let (translated, alts): (Vec<String>, Vec<Vec<String>>) =
        if !can_translate || src.code == tgt.code {
            // app.py 837: "Cannot translate, send the original text back"; a language to itself is
            // argos' identity translation (its alternatives are all the text, filtered away).
            (texts.clone(), vec![Vec::new(); texts.len()])
        } else {
            let html = format == "html";
            let t = texts.clone();
            let (plans, sentences) = blocking(move || plan(&t, html)).await?;
            let out = if sentences.is_empty() {
                Vec::new()
            } else {
                run_job(
                    st,
                    Job {
                        source: src.code.clone(),
                        target: tgt.code.clone(),
                        sentences,
                        alternatives: if html { 0 } else { alternatives },
                        deadline,
                    },
                )
                .await?
            };
            blocking(move || {
                plans
                    .iter()
                    .map(|p| {
                        let best = p.render(&out, None);
                        let alts = p.alternatives(&out, &best, alternatives);
                        (best, alts)
                    })
                    .unzip()
            })
            .await?
        };

    let mut body = Map::new();
    let det = detection.map(|(code, c)| detected(&code, c));
    if batch {
        if let (true, Some(d)) = (auto, &det) {
            body.insert(
                "detectedLanguage".into(),
                Value::Array(vec![d.clone(); texts.len()]),
            );
        }
        body.insert("translatedText".into(), json!(translated));
        if alternatives > 0 {
            body.insert("alternatives".into(), json!(alts));
        }
    } else {
        if let (true, Some(d)) = (auto, det) {
            body.insert("detectedLanguage".into(), d);
        }
        body.insert("translatedText".into(), json!(translated[0]));
        if alternatives > 0 {
            body.insert("alternatives".into(), json!(alts[0]));
        }
    }
    Ok(json_response(StatusCode::OK, &Value::Object(body)))
}

/// `POST /detect` (app.py 1056-1145).
pub(crate) async fn detect(st: St, Extension(client): Extension<Client>, req: Request) -> Response {
    detect_inner(&st, &client.0, req)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn detect_inner(
    st: &Arc<AppState>,
    client: &str,
    req: Request,
) -> Result<Response, ApiError> {
    let s = &st.settings;
    let deadline = Instant::now() + s.request_timeout;
    let params = Params::read(req, s.body_limit, deadline).await?;
    st.admit(&params, "/detect", client)?;
    let q = params.q(false)?;
    let batch = matches!(q, Q::Many(_));
    let texts = q.texts().to_vec();
    let codes: Vec<String> = st.backend.languages().into_iter().map(|l| l.code).collect();
    let found = blocking(move || detect_languages(&texts, batch, &codes)).await?;
    let list: Vec<Value> = found.iter().map(|(c, conf)| detected(c, *conf)).collect();
    Ok(json_response(StatusCode::OK, &Value::Array(list)))
}

/// The upload's extension as Python's `os.path.splitext` gives it (`.txt`).
fn extension(name: &str) -> &str {
    let base = name.rsplit('/').next().unwrap_or(name);
    let stem_start = base.len() - base.trim_start_matches('.').len();
    match base[stem_start..].rfind('.') {
        Some(i) => &base[stem_start + i..],
        None => "",
    }
}

/// werkzeug's `secure_filename`, roughly: ASCII letters, digits, `.`, `_`, `-`; spaces as `_`;
/// no leading dots.
fn secure_filename(name: &str) -> String {
    let base = name.rsplit(['/', '\\']).next().unwrap_or(name);
    let s: String = base
        .chars()
        .filter_map(|c| match c {
            c if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') => Some(c),
            c if c.is_whitespace() => Some('_'),
            _ => None,
        })
        .collect();
    let s = s.trim_start_matches(['.', '_']).to_string();
    if s.is_empty() {
        "file.txt".to_string()
    } else {
        s
    }
}

/// A random version-4-shaped id (std's randomly keyed SipHash; unguessable to clients).
fn random_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let state = std::collections::hash_map::RandomState::new();
    let word = |salt: u64| {
        let mut h = state.build_hasher();
        h.write_u64(salt);
        h.write_u64(COUNT.fetch_add(1, Ordering::Relaxed));
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0),
        );
        h.finish()
    };
    let v = ((word(1) as u128) << 64) | word(2) as u128;
    let v = (v & !(0xF << 76)) | (0x4 << 76);
    let v = (v & !(0x3 << 62)) | (0x2 << 62);
    let h = format!("{v:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

/// The file formats `/translate_file` takes.
pub(crate) const FILE_FORMATS: &[&str] = &[".txt"];

/// `POST /translate_file` (app.py 881-1027), for `.txt`.
pub(crate) async fn translate_file(
    st: St,
    Extension(client): Extension<Client>,
    headers: HeaderMap,
    req: Request,
) -> Response {
    let deadline = Instant::now() + st.settings.request_timeout;
    translate_file_inner(&st, &client.0, &headers, req, deadline)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn translate_file_inner(
    st: &Arc<AppState>,
    client: &str,
    headers: &HeaderMap,
    req: Request,
    deadline: Instant,
) -> Result<Response, ApiError> {
    let s = &st.settings;
    let params = Params::read(req, s.body_limit, deadline).await?;
    let adm = st.admit(&params, "/translate_file", client)?;
    if s.disable_files_translation {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "Files translation are disabled on this server.",
        ));
    }
    let source = params
        .form_get("source")
        .filter(|v| !v.is_empty())
        .map(model_code);
    let target = params
        .form_get("target")
        .filter(|v| !v.is_empty())
        .map(model_code);
    let file = params
        .file("file")
        .filter(|f| !f.filename.is_empty())
        .ok_or(ApiError::missing("file"))?;
    let source = source.ok_or(ApiError::missing("source"))?;
    let target = target.ok_or(ApiError::missing("target"))?;
    if !FILE_FORMATS.contains(&extension(&file.filename)) {
        return Err(ApiError::bad_request(
            "Invalid request: file format not supported",
        ));
    }
    let langs = st.backend.languages();
    let auto = source == "auto";
    let src = find(&langs, &source);
    if src.is_none() && !auto {
        return Err(ApiError::not_supported(&source));
    }
    let tgt = find(&langs, &target).ok_or_else(|| ApiError::not_supported(&target))?;
    if let Some(limit) = adm.char_limit.filter(|&l| l > 0) {
        // app.py 1007-1008: the cost is the size over the character limit.
        st.charge(&adm, (file.bytes.len() / limit).max(1) as u64);
    }
    let text = String::from_utf8(file.bytes.clone())
        .map_err(|_| ApiError::bad_request("Invalid request: the file is not UTF-8 text"))?;
    let src = match src {
        Some(l) if !auto => l,
        _ => {
            let codes: Vec<String> = langs.iter().map(|l| l.code.clone()).collect();
            let t = vec![text.clone()];
            let best = blocking(move || detect_languages(&t, true, &codes))
                .await?
                .into_iter()
                .next()
                .unwrap_or(("en".to_string(), 0.0));
            find_with_fallback(&langs, &best.0).ok_or_else(|| ApiError::not_supported(&best.0))?
        }
    };
    if !src.targets.iter().any(|t| t == &tgt.code) {
        return Err(pair_unavailable(src, tgt));
    }
    let t = vec![text.clone()];
    let (plans, sentences) = if src.code == tgt.code {
        // A language to itself: the file comes back as it is (argos' identity translation).
        (Vec::new(), Vec::new())
    } else {
        blocking(move || plan(&t, false)).await?
    };
    let out = if sentences.is_empty() {
        Vec::new()
    } else {
        run_job(
            st,
            Job {
                source: src.code.clone(),
                target: tgt.code.clone(),
                sentences,
                alternatives: 0,
                deadline,
            },
        )
        .await?
    };
    let translated = plans.first().map_or(text, |p| p.render(&out, None));
    let name = format!("{}.{}", random_id(), secure_filename(&file.filename));
    st.files.insert(name.clone(), translated.into_bytes());
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("localhost");
    Ok(json_response(
        StatusCode::OK,
        &json!({ "translatedFileUrl": format!("http://{host}/download_file/{name}") }),
    ))
}

/// `GET /download_file/{filename}` (app.py 1029-1054).
pub(crate) async fn download_file(st: St, Path(filename): Path<String>) -> Response {
    if st.settings.disable_files_translation {
        return ApiError::bad_request("Files translation are disabled on this server.")
            .into_response();
    }
    let Some(bytes) = st.files.get(&filename) else {
        return not_found().await;
    };
    let download = filename
        .split_once('.')
        .map(|(_, n)| n)
        .unwrap_or(&filename);
    let mut resp = bytes.into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    if let Ok(v) = HeaderValue::from_str(&format!("attachment; filename={download}")) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    resp
}

/// `GET /languages` (app.py 505-538).
pub(crate) async fn languages(st: St) -> Response {
    json_response(StatusCode::OK, &json!(st.backend.languages()))
}

/// `GET /health` (app.py 540-560).
pub(crate) async fn health() -> Response {
    json_response(StatusCode::OK, &json!({ "status": "ok" }))
}

/// `GET /frontend/settings` (app.py 1147-1226).
pub(crate) async fn frontend_settings(st: St) -> Response {
    let s = &st.settings;
    let langs = st.backend.languages();
    let target = langs.get(1).or(langs.first());
    json_response(
        StatusCode::OK,
        &json!({
            "charLimit": s.char_limit.map_or(-1, |l| l as i64),
            "frontendTimeout": s.frontend_timeout_ms,
            "apiKeys": s.api_keys.is_some(),
            "keyRequired": s.api_keys.is_some() && s.require_api_key,
            "suggestions": false,
            "filesTranslation": !s.disable_files_translation,
            "supportedFilesFormat": if s.disable_files_translation { &[][..] } else { FILE_FORMATS },
            "language": {
                "source": { "code": "auto", "name": "Auto Detect" },
                "target": {
                    "code": target.map(|l| l.code.as_str()).unwrap_or(""),
                    "name": target.map(|l| l.name.as_str()).unwrap_or(""),
                },
            },
        }),
    )
}

/// `GET /spec`.
pub(crate) async fn spec() -> Response {
    json_response(StatusCode::OK, &spec::document())
}

/// `GET /metrics`.
pub(crate) async fn metrics(st: St, headers: HeaderMap) -> Response {
    if let Some(token) = &st.settings.metrics_auth_token {
        let ok = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v == format!("Bearer {token}"));
        if !ok {
            return ApiError::new(StatusCode::UNAUTHORIZED, "Unauthorized").into_response();
        }
    }
    let text = metrics::render(&st.metrics, st.backend.stats());
    let mut resp = text.into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    resp
}

/// `GET /`: the web page.
pub(crate) async fn index(st: St) -> Response {
    if st.settings.disable_web_ui {
        return not_found().await;
    }
    let mut resp = include_str!("../page.html").into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    resp
}

/// Any other path.
pub(crate) async fn not_found() -> Response {
    ApiError::new(StatusCode::NOT_FOUND, "Not Found").into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_like_iso2model() {
        assert_eq!(model_code("EN"), "en");
        assert_eq!(model_code("zh-Hans"), "zh");
        assert_eq!(model_code("pt-BR"), "pb");
        let langs = vec![ApiLanguage {
            code: "zh-Hans".into(),
            name: "Chinese".into(),
            targets: vec![],
        }];
        assert!(find(&langs, "zh").is_some());
        assert!(find(&langs, "ZH-HANS").is_some());
        assert!(find_with_fallback(&langs, "zt").is_some());
        assert!(find(&langs, "zt").is_none());
    }

    #[test]
    fn file_names() {
        assert_eq!(extension("a.txt"), ".txt");
        assert_eq!(extension("a.tar.gz"), ".gz");
        assert_eq!(extension(".bashrc"), "");
        assert_eq!(extension("noext"), "");
        assert_eq!(secure_filename("../../etc/pass wd.txt"), "pass_wd.txt");
        assert_eq!(secure_filename("ü.txt"), "txt");
        let id = random_id();
        assert_eq!(id.len(), 36);
        assert_ne!(id, random_id());
    }
}
