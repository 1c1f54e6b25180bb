//! `attn serve`'s HTTP layer against LibreTranslate 1.9's `app.py`: every route and body form,
//! its error messages and codes, limits, keys, CORS, timeouts, disconnects, concurrency and
//! graceful shutdown — over an in-process fake engine, on 127.0.0.1 (port 0).

use attn_cli::serve::backend::{
    ApiLanguage, Backend, Job, JobError, JobResult, Sentence, Stats, SubmitError,
};
use attn_cli::serve::http::limits::ApiKeys;
use attn_cli::serve::http::params::BAD_JSON;
use attn_cli::serve::http::{app, serve_with, Cors, ServeOptions, Settings};
use candle_attention::TranslateError;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;

/// "Translates" by upper-casing; knows en -> de, fr and de, fr -> en; alternatives are
/// "UPPER #k". "FAILINPUT" and "FAILMODEL" fail as the text's or the model's fault.
struct Fake {
    delay: Duration,
    honor_deadline: bool,
    max_queue: usize,
    queued: AtomicUsize,
    cancelled: AtomicUsize,
    jobs: Mutex<Vec<Job>>,
}

impl Fake {
    fn new() -> Self {
        Self {
            delay: Duration::ZERO,
            honor_deadline: true,
            max_queue: usize::MAX,
            queued: AtomicUsize::new(0),
            cancelled: AtomicUsize::new(0),
            jobs: Mutex::new(Vec::new()),
        }
    }
    fn delay(mut self, d: Duration) -> Self {
        self.delay = d;
        self
    }
    fn ignore_deadline(mut self) -> Self {
        self.honor_deadline = false;
        self
    }
    fn max_queue(mut self, n: usize) -> Self {
        self.max_queue = n;
        self
    }
    fn jobs(&self) -> Vec<Job> {
        self.jobs.lock().unwrap().clone()
    }
}

fn lang(code: &str, name: &str, targets: &[&str]) -> ApiLanguage {
    ApiLanguage {
        code: code.into(),
        name: name.into(),
        targets: targets.iter().map(|t| t.to_string()).collect(),
    }
}

fn fake_translate(s: &str, alternatives: usize) -> Result<Sentence, TranslateError> {
    if s.contains("FAILINPUT") {
        return Err(TranslateError::input(
            "the text is longer than the model's 512 positions",
        ));
    }
    if s.contains("FAILMODEL") {
        return Err(TranslateError::model("out of memory"));
    }
    let up = s.to_uppercase();
    Ok(Sentence {
        alternatives: (1..=alternatives).map(|k| format!("{up} #{k}")).collect(),
        text: up,
    })
}

struct Server {
    addr: SocketAddr,
    fake: &'static Fake,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Server {
    async fn start(fake: Fake, settings: Settings) -> Self {
        Self::start_with(fake, settings, ServeOptions::default()).await
    }
    async fn start_with(fake: Fake, settings: Settings, options: ServeOptions) -> Self {
        // Leaked so the fake's tasks can outlive a test's server; a few per test binary.
        let fake: &'static Fake = Box::leak(Box::new(fake));
        let backend: Arc<dyn Backend> = Arc::new(Shared(fake));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(serve_with(
            listener,
            app(backend, settings),
            async move {
                let _ = rx.await;
            },
            options,
        ));
        Server {
            addr,
            fake,
            stop: Some(stop),
            task,
        }
    }
    fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }
    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        tokio::time::timeout(Duration::from_secs(10), &mut self.task)
            .await
            .expect("the server stops")
            .unwrap()
            .unwrap();
    }
}

struct Shared(&'static Fake);

impl Backend for Shared {
    fn languages(&self) -> Vec<ApiLanguage> {
        vec![
            lang("en", "English", &["de", "fr"]),
            lang("de", "German", &["en"]),
            lang("fr", "French", &["en"]),
        ]
    }
    fn beam(&self) -> usize {
        4
    }
    fn submit(&self, job: Job) -> Result<oneshot::Receiver<JobResult>, SubmitError> {
        let me = self.0;
        let n = job.sentences.len();
        if me.queued.load(Ordering::SeqCst) + n > me.max_queue {
            return Err(SubmitError::Overloaded {
                retry_after_secs: 2,
            });
        }
        me.queued.fetch_add(n, Ordering::SeqCst);
        me.jobs.lock().unwrap().push(job.clone());
        let (mut tx, rx) = oneshot::channel();
        tokio::spawn(async move {
            let done = tokio::time::Instant::now() + me.delay;
            let wake = if me.honor_deadline {
                done.min(job.deadline.into())
            } else {
                done
            };
            tokio::select! {
                _ = tokio::time::sleep_until(wake) => {
                    let result = if wake < done {
                        Err(JobError::TimedOut)
                    } else {
                        Ok(job.sentences.iter().map(|s| fake_translate(s, job.alternatives)).collect())
                    };
                    let _ = tx.send(result);
                }
                _ = tx.closed() => { me.cancelled.fetch_add(1, Ordering::SeqCst); }
            }
            me.queued.fetch_sub(n, Ordering::SeqCst);
        });
        Ok(rx)
    }
    fn stats(&self) -> Stats {
        Stats {
            queued_sentences: self.0.queued.load(Ordering::SeqCst),
            running_rows: 0,
            tokens_generated: 42,
        }
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

async fn post_json(
    s: &Server,
    path: &str,
    body: Value,
) -> (u16, reqwest::header::HeaderMap, Value) {
    let r = client().post(s.url(path)).json(&body).send().await.unwrap();
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    let v = r.json::<Value>().await.unwrap();
    (status, headers, v)
}

async fn post_form(s: &Server, path: &str, form: &[(&str, &str)]) -> (u16, Value) {
    let r = client().post(s.url(path)).form(form).send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json::<Value>().await.unwrap())
}

fn err(msg: &str) -> Value {
    json!({ "error": msg })
}

/// A request by hand on a raw socket; returns the whole answer as text.
async fn raw(addr: SocketAddr, request: &[u8]) -> String {
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    sock.write_all(request).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), sock.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_routes() {
    let s = Server::start(Fake::new(), Settings::default()).await;
    let c = client();
    let langs: Value = c
        .get(s.url("/languages"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        langs,
        json!([
            {"code": "en", "name": "English", "targets": ["de", "fr"]},
            {"code": "de", "name": "German", "targets": ["en"]},
            {"code": "fr", "name": "French", "targets": ["en"]},
        ])
    );
    let r = c.get(s.url("/health")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/json");
    assert_eq!(r.json::<Value>().await.unwrap(), json!({"status": "ok"}));
    let fs: Value = c
        .get(s.url("/frontend/settings"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        fs,
        json!({
            "charLimit": -1, "frontendTimeout": 500, "apiKeys": false, "keyRequired": false,
            "suggestions": false, "filesTranslation": true, "supportedFilesFormat": [".txt"],
            "language": {"source": {"code": "auto", "name": "Auto Detect"},
                         "target": {"code": "de", "name": "German"}}
        })
    );
    let spec: Value = c
        .get(s.url("/spec"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(spec["swagger"], "2.0");
    for p in [
        "/translate",
        "/detect",
        "/languages",
        "/health",
        "/frontend/settings",
        "/translate_file",
    ] {
        assert!(spec["paths"].get(p).is_some(), "{p} in /spec");
    }
    let page = c.get(s.url("/")).send().await.unwrap();
    assert!(page.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/html"));
    assert!(page.text().await.unwrap().contains("<html"));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn translate_in_every_body_form() {
    let s = Server::start(Fake::new(), Settings::default()).await;
    let want = json!({"translatedText": "HELLO WORLD."});
    // LibreTranslate's own test (test_api_translate): a form.
    let (st, v) = post_form(
        &s,
        "/translate",
        &[
            ("q", "Hello world."),
            ("source", "en"),
            ("target", "de"),
            ("format", "text"),
        ],
    )
    .await;
    assert_eq!((st, v), (200, want.clone()));
    let (st, _, v) = post_json(
        &s,
        "/translate",
        json!({"q": "Hello world.", "source": "en", "target": "de"}),
    )
    .await;
    assert_eq!((st, v), (200, want.clone()));
    let form = reqwest::multipart::Form::new()
        .text("q", "Hello world.")
        .text("source", "en")
        .text("target", "de");
    let r = client()
        .post(s.url("/translate"))
        .multipart(form)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap(), want);
    let r = client()
        .post(s.url("/translate?q=Hello%20world.&source=en&target=de"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap(), want);
    // The query string comes before the form (werkzeug's request.values).
    let r = client()
        .post(s.url("/translate?target=fr"))
        .form(&[("q", "x"), ("source", "en"), ("target", "zz")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // application/*+json is JSON too; codes in any case.
    let r = client()
        .post(s.url("/translate"))
        .header("content-type", "application/vnd.api+json; charset=utf-8")
        .body(r#"{"q": "a", "source": "EN", "target": "De"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"translatedText": "A"})
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentences_lists_html_and_line_endings() {
    let s = Server::start(Fake::new(), Settings::default()).await;
    // Sentences go to the engine; what lies between them stays as it was.
    let (_, _, v) = post_json(
        &s,
        "/translate",
        json!({"q": "Hello world. How are you?\n\n  Fine ", "source": "en", "target": "de"}),
    )
    .await;
    assert_eq!(
        v,
        json!({"translatedText": "HELLO WORLD. HOW ARE YOU?\n\n  FINE "})
    );
    assert_eq!(
        s.fake.jobs().last().unwrap().sentences,
        ["Hello world.", "How are you?", "Fine"]
    );
    // A list is one job, answered with a list in order (LibreTranslate's test_api_translate_batch).
    let (st, _, v) = post_json(&s, "/translate", json!({"q": ["Hello", "World", "", "Yes. No"], "source": "en", "target": "de", "format": "text"})).await;
    assert_eq!(st, 200);
    assert_eq!(
        v,
        json!({"translatedText": ["HELLO", "WORLD", "", "YES. NO"]})
    );
    let job = s.fake.jobs().last().unwrap().clone();
    assert_eq!(job.sentences, ["Hello", "World", "Yes.", "No"]);
    assert_eq!(
        (job.source.as_str(), job.target.as_str(), job.alternatives),
        ("en", "de", 0)
    );
    // Outside JSON, line endings become \n and one final one goes (app.py 758).
    let (_, v) = post_form(
        &s,
        "/translate",
        &[
            ("q", "one\r\ntwo\rthree\n"),
            ("source", "en"),
            ("target", "de"),
        ],
    )
    .await;
    assert_eq!(v, json!({"translatedText": "ONE\nTWO\nTHREE"}));
    // HTML: only the text runs are translated.
    let (_, _, v) = post_json(&s, "/translate", json!({"q": "<p class=\"x\">Hello <b>world</b></p>", "source": "en", "target": "de", "format": "html"})).await;
    assert_eq!(
        v,
        json!({"translatedText": "<p class=\"x\">HELLO <b>WORLD</b></p>"})
    );
    // Nothing to translate (emoji and spaces, app.py 182-191): sent back, no job.
    let before = s.fake.jobs().len();
    let (_, _, v) = post_json(
        &s,
        "/translate",
        json!({"q": "😀 😀", "source": "en", "target": "de"}),
    )
    .await;
    assert_eq!(v, json!({"translatedText": "😀 😀"}));
    assert_eq!(s.fake.jobs().len(), before);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alternatives_and_auto() {
    let s = Server::start(Fake::new(), Settings::default()).await;
    let (_, _, v) = post_json(
        &s,
        "/translate",
        json!({"q": "Hi. Yo", "source": "en", "target": "de", "alternatives": 2}),
    )
    .await;
    assert_eq!(
        v,
        json!({"translatedText": "HI. YO", "alternatives": ["HI. #1 YO #1", "HI. #2 YO #2"]})
    );
    assert_eq!(s.fake.jobs().last().unwrap().alternatives, 2);
    // As a string in a form; a list gets a list per text.
    let (_, v) = post_form(
        &s,
        "/translate",
        &[
            ("q", "Hi"),
            ("source", "en"),
            ("target", "de"),
            ("alternatives", "1"),
        ],
    )
    .await;
    assert_eq!(
        v,
        json!({"translatedText": "HI", "alternatives": ["HI #1"]})
    );
    let (_, _, v) = post_json(
        &s,
        "/translate",
        json!({"q": ["a", "b"], "source": "en", "target": "de", "alternatives": "1"}),
    )
    .await;
    assert_eq!(
        v,
        json!({"translatedText": ["A", "B"], "alternatives": [["A #1"], ["B #1"]]})
    );
    // Negative is 0 (no "alternatives" member); html has none.
    let (_, _, v) = post_json(
        &s,
        "/translate",
        json!({"q": "a", "source": "en", "target": "de", "alternatives": -3}),
    )
    .await;
    assert_eq!(v, json!({"translatedText": "A"}));
    let (_, _, v) = post_json(&s, "/translate", json!({"q": "<i>a</i>", "source": "en", "target": "de", "format": "html", "alternatives": 2})).await;
    assert_eq!(v, json!({"translatedText": "<i>A</i>", "alternatives": []}));
    // At most the beam minus one; what int() cannot read.
    for (alt, msg) in [
        (
            json!(100000),
            "Invalid request: alternatives parameter must be <= 3",
        ),
        (
            json!("abc"),
            "Invalid request: alternatives parameter is not a number",
        ),
        (
            json!(null),
            "Invalid request: alternatives parameter is not a number",
        ),
    ] {
        let (st, _, v) = post_json(
            &s,
            "/translate",
            json!({"q": "a", "source": "en", "target": "de", "alternatives": alt}),
        )
        .await;
        assert_eq!((st, v), (400, err(msg)));
    }
    // source auto: detectedLanguage, for a list one per text.
    let (st, _, v) = post_json(
        &s,
        "/translate",
        json!({"q": "Das Wetter ist heute sehr schön, und wir gehen an den Strand", "source": "auto", "target": "en"}),
    )
    .await;
    assert_eq!(st, 200);
    assert_eq!(v["detectedLanguage"]["language"], "de");
    assert!(v["detectedLanguage"]["confidence"].as_f64().unwrap() > 0.0);
    assert_eq!(s.fake.jobs().last().unwrap().source, "de");
    let (_, _, v) = post_json(
        &s,
        "/translate",
        json!({"q": ["Das Wetter ist heute sehr schön, und wir gehen an den Strand", "Ich habe keine Zeit, weil ich noch arbeiten muss"], "source": "auto", "target": "en"}),
    )
    .await;
    assert_eq!(v["detectedLanguage"].as_array().unwrap().len(), 2);
    assert_eq!(v["detectedLanguage"][1]["language"], "de");
    assert_eq!(
        v["translatedText"],
        json!([
            "DAS WETTER IST HEUTE SEHR SCHÖN, UND WIR GEHEN AN DEN STRAND",
            "ICH HABE KEINE ZEIT, WEIL ICH NOCH ARBEITEN MUSS"
        ])
    );
    // Nothing to detect: en with confidence 0 (app.py 802).
    let (_, _, v) = post_json(
        &s,
        "/translate",
        json!({"q": "😀", "source": "auto", "target": "de"}),
    )
    .await;
    assert_eq!(
        v,
        json!({"translatedText": "😀", "detectedLanguage": {"confidence": 0.0, "language": "en"}})
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detect_route() {
    let s = Server::start(Fake::new(), Settings::default()).await;
    // LibreTranslate's test_api_detect_language.
    let (st, v) = post_form(&s, "/detect", &[("q", "Hello")]).await;
    assert_eq!(st, 200);
    assert!(v[0].get("confidence").is_some() && v[0].get("language").is_some());
    let (_, _, v) = post_json(&s, "/detect", json!({"q": "Bonjour le monde, c'est bon"})).await;
    assert_eq!(v[0]["language"], "fr");
    assert!(v.as_array().unwrap().len() <= 3);
    let (_, _, v) = post_json(&s, "/detect", json!({"q": ["Das Wetter ist heute sehr schön, und wir gehen an den Strand", "Ich habe keine Zeit, weil ich noch arbeiten muss"]})).await;
    assert_eq!(v[0]["language"], "de");
    let (st, v) = post_form(&s, "/detect", &[]).await;
    assert_eq!((st, v), (400, err("Invalid request: missing q parameter")));
    let r = client().get(s.url("/detect")).send().await.unwrap();
    assert_eq!(r.status(), 405);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_as_app_py_words_them() {
    let settings = Settings {
        char_limit: Some(20),
        batch_limit: Some(3),
        ..Settings::default()
    };
    let s = Server::start(Fake::new(), settings).await;
    let cases: Vec<(Value, u16, &str)> = vec![
        (
            json!({"source": "en", "target": "de"}),
            400,
            "Invalid request: missing q parameter",
        ),
        (
            json!({"q": "", "source": "en", "target": "de"}),
            400,
            "Invalid request: missing q parameter",
        ),
        (
            json!({"q": [], "source": "en", "target": "de"}),
            400,
            "Invalid request: missing q parameter",
        ),
        (
            json!({"q": "a", "target": "de"}),
            400,
            "Invalid request: missing source parameter",
        ),
        (
            json!({"q": "a", "source": "en"}),
            400,
            "Invalid request: missing target parameter",
        ),
        (
            json!({"q": "a", "source": "en", "target": "zz"}),
            400,
            "zz is not supported",
        ),
        (
            json!({"q": "a", "source": "ZZ", "target": "de"}),
            400,
            "zz is not supported",
        ),
        (
            json!({"q": "a", "source": "zh-Hans", "target": "de"}),
            400,
            "zh is not supported",
        ),
        (
            json!({"q": "a", "source": "en", "target": "de", "format": "xml"}),
            400,
            "xml format is not supported",
        ),
        (
            json!({"q": "a", "source": "de", "target": "fr"}),
            400,
            "French (fr) is not available as a target language from German (de)",
        ),
        (
            json!({"q": "x".repeat(21), "source": "en", "target": "de"}),
            400,
            "Invalid request: request (21) exceeds text limit (20)",
        ),
        (
            json!({"q": ["a", "b", "c", "d"], "source": "en", "target": "de"}),
            400,
            "Invalid request: request (4) exceeds text limit (3)",
        ),
        (
            json!({"q": 5, "source": "en", "target": "de"}),
            400,
            "Invalid request: q parameter must be a string or a list of strings",
        ),
        (
            json!({"q": ["a", 1], "source": "en", "target": "de"}),
            400,
            "Invalid request: q parameter must be a string or a list of strings",
        ),
        (
            json!({"q": "FAILINPUT", "source": "en", "target": "de"}),
            400,
            "the text is longer than the model's 512 positions",
        ),
        (
            json!({"q": "FAILMODEL", "source": "en", "target": "de"}),
            500,
            "Cannot translate text: out of memory",
        ),
    ];
    for (body, status, msg) in cases {
        let (st, h, v) = post_json(&s, "/translate", body.clone()).await;
        assert_eq!((st, v), (status, err(msg)), "{body}");
        assert_eq!(h["content-type"], "application/json");
    }
    // LibreTranslate's own: a form.
    let (st, v) = post_form(
        &s,
        "/translate",
        &[
            ("q", "Hello"),
            ("source", "en"),
            ("target", "zz"),
            ("format", "text"),
        ],
    )
    .await;
    assert_eq!((st, v), (400, err("zz is not supported")));
    // 10,000 texts against the batch limit.
    let many: Vec<String> = (0..10_000).map(|i| format!("t{i}")).collect();
    let (st, _, v) = post_json(
        &s,
        "/translate",
        json!({"q": many, "source": "en", "target": "de"}),
    )
    .await;
    assert_eq!(
        (st, v),
        (
            400,
            err("Invalid request: request (10000) exceeds text limit (3)")
        )
    );
    // Bodies that are not JSON objects, or not JSON at all, or not UTF-8.
    let c = client();
    for (body, prefix) in [
        (b"[1, 2]".to_vec(), "Invalid JSON format"),
        (b"{\"q\": ".to_vec(), BAD_JSON),
        (b"".to_vec(), BAD_JSON),
        (
            b"{\"q\": \"\xff\xfe\", \"source\": \"en\", \"target\": \"de\"}".to_vec(),
            BAD_JSON,
        ),
    ] {
        let r = c
            .post(s.url("/translate"))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400);
        let v: Value = r.json().await.unwrap();
        assert_eq!(v, err(prefix));
    }
    // A form that is not UTF-8 is read as werkzeug reads it (U+FFFD).
    let r = c
        .post(s.url("/translate"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(&b"q=%FF%FEab&source=en&target=de"[..])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"translatedText": "\u{FFFD}\u{FFFD}AB"})
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn methods_paths_and_cors() {
    let s = Server::start(Fake::new(), Settings::default()).await;
    let c = client();
    for (method, path) in [
        ("GET", "/translate"),
        ("GET", "/detect"),
        ("POST", "/languages"),
        ("POST", "/health"),
        ("POST", "/spec"),
        ("POST", "/frontend/settings"),
        ("GET", "/translate_file"),
    ] {
        let r = c
            .request(method.parse().unwrap(), s.url(path))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 405, "{method} {path}");
        assert!(r.headers().get("allow").is_some(), "{method} {path}");
        assert_eq!(r.json::<Value>().await.unwrap(), err("Method Not Allowed"));
    }
    let r = c.get(s.url("/nope")).send().await.unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(r.json::<Value>().await.unwrap(), err("Not Found"));
    // app.py 562-573 on every answer, errors included; OPTIONS as Flask answers it.
    for r in [
        c.get(s.url("/languages")).send().await.unwrap(),
        c.post(s.url("/translate"))
            .form(&[("q", "")])
            .send()
            .await
            .unwrap(),
        c.request(reqwest::Method::OPTIONS, s.url("/translate"))
            .header("origin", "https://example.org")
            .header("access-control-request-method", "POST")
            .send()
            .await
            .unwrap(),
    ] {
        let h = r.headers();
        assert_eq!(h["access-control-allow-origin"], "*");
        assert_eq!(
            h["access-control-allow-headers"],
            "Authorization, Content-Type"
        );
        assert_eq!(h["access-control-expose-headers"], "Authorization");
        assert_eq!(h["access-control-allow-methods"], "GET, POST");
        assert_eq!(h["access-control-allow-credentials"], "true");
        assert_eq!(h["access-control-max-age"], "1728000");
        assert!(r.status() == 200 || r.status() == 400);
    }
    s.stop().await;

    let s = Server::start(
        Fake::new(),
        Settings {
            cors: Cors::Origins(vec!["https://ok.example".into()]),
            ..Settings::default()
        },
    )
    .await;
    let r = c
        .get(s.url("/health"))
        .header("origin", "https://ok.example")
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "https://ok.example"
    );
    assert_eq!(r.headers()["vary"], "Origin");
    let r = c
        .get(s.url("/health"))
        .header("origin", "https://evil.example")
        .send()
        .await
        .unwrap();
    assert!(r.headers().get("access-control-allow-origin").is_none());
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_too_large() {
    let s = Server::start(
        Fake::new(),
        Settings {
            body_limit: 1 << 20,
            ..Settings::default()
        },
    )
    .await;
    let c = client();
    // 50 MB, announced.
    let big = vec![b'a'; 50 << 20];
    let r = c
        .post(s.url("/translate"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(big)
        .send()
        .await;
    if let Ok(r) = r {
        // The server answers before reading it all; the client may see the answer or a reset.
        assert_eq!(r.status(), 413);
        assert!(r.json::<Value>().await.unwrap()["error"]
            .as_str()
            .unwrap()
            .contains("Too Large"));
    }
    // Chunked (no Content-Length): counted as it comes.
    let mut req = b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    for _ in 0..20 {
        req.extend_from_slice(format!("{:x}\r\n", 128 << 10).as_bytes());
        req.extend(std::iter::repeat_n(b' ', 128 << 10));
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(b"0\r\n\r\n");
    let answer = raw(s.addr, &req).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("Request Entity Too Large"));
    // Multipart.
    let form = reqwest::multipart::Form::new()
        .text("q", "x".repeat(2 << 20))
        .text("source", "en");
    if let Ok(r) = c.post(s.url("/translate")).multipart(form).send().await {
        assert_eq!(r.status(), 413);
    }
    // The server is still there.
    let (st, _) = post_form(
        &s,
        "/translate",
        &[("q", "a"), ("source", "en"), ("target", "de")],
    )
    .await;
    assert_eq!(st, 200);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_keys_and_request_limits() {
    let keys = ApiKeys::parse("good\nslow 2\nshort -1 5\n").unwrap();
    let s = Server::start(
        Fake::new(),
        Settings {
            api_keys: Some(keys.clone()),
            req_limit: Some(3),
            ..Settings::default()
        },
    )
    .await;
    let body = |key: Option<&str>, q: &str| {
        let mut b = json!({"q": q, "source": "en", "target": "de"});
        if let Some(k) = key {
            b["api_key"] = json!(k);
        }
        b
    };
    let (st, _, v) = post_json(&s, "/translate", body(Some("bad"), "a")).await;
    assert_eq!((st, v), (403, err("Invalid API key")));
    let (st, v) = post_form(&s, "/detect", &[("q", "a"), ("api_key", "bad")]).await;
    assert_eq!((st, v), (403, err("Invalid API key")));
    // A key's own character limit.
    let (st, _, v) = post_json(&s, "/translate", body(Some("short"), "abcdef")).await;
    assert_eq!(
        (st, v),
        (
            400,
            err("Invalid request: request (6) exceeds text limit (5)")
        )
    );
    // A key's own request limit (2 a minute), per route.
    for _ in 0..2 {
        assert_eq!(
            post_json(&s, "/translate", body(Some("slow"), "a")).await.0,
            200
        );
    }
    let (st, h, v) = post_json(&s, "/translate", body(Some("slow"), "a")).await;
    assert_eq!((st, v), (429, err("Slowdown: 2 per 1 minute")));
    assert!(h["retry-after"].to_str().unwrap().parse::<u64>().unwrap() >= 1);
    assert_eq!(
        post_form(&s, "/detect", &[("q", "a"), ("api_key", "slow")])
            .await
            .0,
        200
    );
    // Without a key: the default (3 a minute) by address; a batch of N costs N.
    let (st, _, _) = post_json(
        &s,
        "/translate",
        json!({"q": ["a", "b"], "source": "en", "target": "de"}),
    )
    .await;
    assert_eq!(st, 200);
    assert_eq!(post_json(&s, "/translate", body(None, "a")).await.0, 200);
    let (st, _, v) = post_json(&s, "/translate", body(None, "a")).await;
    assert_eq!((st, v), (429, err("Slowdown: 3 per 1 minute")));
    // "good" has the default limit of its own.
    assert_eq!(
        post_json(&s, "/translate", body(Some("good"), "a")).await.0,
        200
    );
    // Exempt routes are never limited.
    for _ in 0..5 {
        assert_eq!(
            client()
                .get(s.url("/languages"))
                .send()
                .await
                .unwrap()
                .status(),
            200
        );
    }
    s.stop().await;

    // Keys required: a request without one is 400 (app.py 380-387).
    let s = Server::start(
        Fake::new(),
        Settings {
            api_keys: Some(keys),
            require_api_key: true,
            get_api_key_link: Some("https://example.org/keys".into()),
            ..Settings::default()
        },
    )
    .await;
    let (st, _, v) = post_json(&s, "/translate", body(None, "a")).await;
    assert_eq!(
        (st, v),
        (400, err("Visit https://example.org/keys to get an API key"))
    );
    assert_eq!(
        post_json(&s, "/translate", body(Some("good"), "a")).await.0,
        200
    );
    let fs: Value = client()
        .get(s.url("/frontend/settings"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        (fs["apiKeys"].clone(), fs["keyRequired"].clone()),
        (json!(true), json!(true))
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_is_429_with_retry_after() {
    let s = Server::start(
        Fake::new().delay(Duration::from_millis(800)).max_queue(2),
        Settings::default(),
    )
    .await;
    let url = s.url("/translate");
    let first = tokio::spawn(async move {
        client()
            .post(url)
            .json(&json!({"q": "Yes. No", "source": "en", "target": "de"}))
            .send()
            .await
            .unwrap()
            .status()
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t = Instant::now();
    let (st, h, v) = post_json(
        &s,
        "/translate",
        json!({"q": "c", "source": "en", "target": "de"}),
    )
    .await;
    assert!(t.elapsed() < Duration::from_millis(500), "answered at once");
    assert_eq!(st, 429);
    assert_eq!(h["retry-after"], "2");
    assert!(v["error"].as_str().unwrap().starts_with("Slowdown: "));
    assert_eq!(first.await.unwrap(), 200);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_drops_the_job() {
    let s = Server::start(
        Fake::new().delay(Duration::from_secs(5)).ignore_deadline(),
        Settings {
            request_timeout: Duration::from_millis(300),
            ..Settings::default()
        },
    )
    .await;
    let t = Instant::now();
    let (st, h, v) = post_json(
        &s,
        "/translate",
        json!({"q": "a", "source": "en", "target": "de"}),
    )
    .await;
    assert!(t.elapsed() < Duration::from_secs(2));
    assert_eq!(st, 503);
    assert!(h.get("retry-after").is_some());
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .starts_with("Request timed out"),
        "{v}"
    );
    // The receiver was dropped: the engine saw the job cancelled.
    let job = s.fake.jobs().pop().unwrap();
    assert!(job.deadline <= Instant::now());
    for _ in 0..50 {
        if s.fake.cancelled.load(Ordering::SeqCst) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(s.fake.cancelled.load(Ordering::SeqCst), 1);
    s.stop().await;

    // An engine that keeps the deadline answers TimedOut: the same 503.
    let s = Server::start(
        Fake::new().delay(Duration::from_secs(5)),
        Settings {
            request_timeout: Duration::from_millis(300),
            ..Settings::default()
        },
    )
    .await;
    let (st, _, _) = post_json(
        &s,
        "/translate",
        json!({"q": "a", "source": "en", "target": "de"}),
    )
    .await;
    assert_eq!(st, 503);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_cancels_its_job() {
    let s = Server::start(
        Fake::new().delay(Duration::from_secs(3)).ignore_deadline(),
        Settings::default(),
    )
    .await;
    let body = r#"{"q": "Hello", "source": "en", "target": "de"}"#;
    let mut sock = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    sock.write_all(
        format!(
            "POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    for _ in 0..100 {
        if !s.fake.jobs().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(s.fake.jobs().len(), 1);
    drop(sock);
    for _ in 0..100 {
        if s.fake.cancelled.load(Ordering::SeqCst) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        s.fake.cancelled.load(Ordering::SeqCst),
        1,
        "the handler future was dropped"
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_clients_no_answer_lost_or_swapped() {
    let s = Server::start(
        Fake::new().delay(Duration::from_millis(5)),
        Settings::default(),
    )
    .await;
    let url = s.url("/translate");
    let mut tasks = Vec::new();
    for c in 0..64 {
        let url = url.clone();
        tasks.push(tokio::spawn(async move {
            let client = client();
            for r in 0..15 {
                let q = format!("client {c} request {r}. second {c}-{r}");
                let (v, list) = if r % 3 == 0 {
                    let v: Value = client
                        .post(&url)
                        .json(&json!({"q": [q.clone(), format!("x{c}")], "source": "en", "target": "fr"}))
                        .send()
                        .await
                        .unwrap()
                        .json()
                        .await
                        .unwrap();
                    (v, true)
                } else {
                    let v: Value = client
                        .post(&url)
                        .form(&[("q", q.as_str()), ("source", "en"), ("target", "de")])
                        .send()
                        .await
                        .unwrap()
                        .json()
                        .await
                        .unwrap();
                    (v, false)
                };
                if list {
                    assert_eq!(v["translatedText"], json!([q.to_uppercase(), format!("X{c}")]));
                } else {
                    assert_eq!(v["translatedText"], json!(q.to_uppercase()));
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(s.fake.jobs().len(), 64 * 15);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_finishes_what_is_in_flight() {
    let s = Server::start(
        Fake::new().delay(Duration::from_millis(600)),
        Settings::default(),
    )
    .await;
    let url = s.url("/translate");
    let addr = s.addr;
    let inflight = tokio::spawn(async move {
        let r = client()
            .post(url)
            .json(&json!({"q": "late", "source": "en", "target": "de"}))
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json::<Value>().await.unwrap())
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    let t = Instant::now();
    s.stop().await;
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "waited for the request in flight"
    );
    assert_eq!(
        inflight.await.unwrap(),
        (200, json!({"translatedText": "LATE"}))
    );
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "no longer accepting"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_hold_nothing() {
    let s = Server::start_with(
        Fake::new(),
        Settings::default(),
        ServeOptions {
            header_read_timeout: Duration::from_millis(500),
            ..ServeOptions::default()
        },
    )
    .await;
    // Headers that never end, and an idle connection: both closed after the timeout.
    let mut slow = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    slow.write_all(b"POST /translate HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let mut idle = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    // Meanwhile others are served.
    let (st, _) = post_form(
        &s,
        "/translate",
        &[("q", "a"), ("source", "en"), ("target", "de")],
    )
    .await;
    assert_eq!(st, 200);
    let t = Instant::now();
    for sock in [&mut slow, &mut idle] {
        let mut buf = Vec::new();
        let r = tokio::time::timeout(Duration::from_secs(5), sock.read_to_end(&mut buf)).await;
        assert!(r.is_ok(), "closed by the server");
    }
    assert!(t.elapsed() < Duration::from_secs(3));
    // A request with a body that is slower than the request timeout: 408.
    let s2 = Server::start(
        Fake::new(),
        Settings {
            request_timeout: Duration::from_millis(300),
            ..Settings::default()
        },
    )
    .await;
    let mut sock = tokio::net::TcpStream::connect(s2.addr).await.unwrap();
    sock.write_all(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"q\"")
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), sock.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    let answer = String::from_utf8_lossy(&buf[..n]);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    s.stop().await;
    s2.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn translate_file_txt() {
    let s = Server::start(Fake::new(), Settings::default()).await;
    let c = client();
    let form = reqwest::multipart::Form::new()
        .text("source", "en")
        .text("target", "de")
        .part(
            "file",
            reqwest::multipart::Part::bytes(b"Hello world.\nBye.\n".to_vec())
                .file_name("my notes.txt"),
        );
    let r = c
        .post(s.url("/translate_file"))
        .multipart(form)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    let url = v["translatedFileUrl"].as_str().unwrap().to_string();
    assert!(
        url.starts_with(&format!("http://{}/download_file/", s.addr)),
        "{url}"
    );
    assert!(url.ends_with(".my_notes.txt"));
    let r = c.get(&url).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()["content-disposition"],
        "attachment; filename=my_notes.txt"
    );
    assert_eq!(r.text().await.unwrap(), "HELLO WORLD.\nBYE.\n");
    for (name, source, msg) in [
        ("a.pdf", "en", "Invalid request: file format not supported"),
        ("a.txt", "zz", "zz is not supported"),
        ("a.txt", "", "Invalid request: missing source parameter"),
    ] {
        let form = reqwest::multipart::Form::new()
            .text("source", source)
            .text("target", "de")
            .part(
                "file",
                reqwest::multipart::Part::bytes(b"x".to_vec()).file_name(name),
            );
        let r = c
            .post(s.url("/translate_file"))
            .multipart(form)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400);
        assert_eq!(r.json::<Value>().await.unwrap(), err(msg));
    }
    let form = reqwest::multipart::Form::new()
        .text("source", "en")
        .text("target", "de");
    let r = c
        .post(s.url("/translate_file"))
        .multipart(form)
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        err("Invalid request: missing file parameter")
    );
    let r = c
        .get(s.url("/download_file/nope.txt"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_page() {
    let s = Server::start(Fake::new(), Settings::default()).await;
    post_form(
        &s,
        "/translate",
        &[("q", "a"), ("source", "en"), ("target", "de")],
    )
    .await;
    post_form(
        &s,
        "/translate",
        &[("q", "a"), ("source", "en"), ("target", "zz")],
    )
    .await;
    let r = client().get(s.url("/metrics")).send().await.unwrap();
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain"));
    let text = r.text().await.unwrap();
    for needle in [
        "attn_http_requests_total{route=\"/translate\",status=\"200\"}",
        "attn_http_requests_total{route=\"/translate\",status=\"400\"}",
        "attn_http_request_duration_seconds_bucket{route=\"/translate\",le=\"0.005\"}",
        "attn_queue_sentences 0",
        "attn_running_rows 0",
        "attn_tokens_generated_total 42",
    ] {
        assert!(text.contains(needle), "{needle} in\n{text}");
    }
    s.stop().await;
}
