//! The web page of `attn serve` (src/serve/page.html) in a real browser: headless Chromium driven
//! over the DevTools protocol with real input events (mouse clicks, typed text, key presses),
//! against a small stand-in server that answers `/languages` and `/translate` the way the real
//! one does (translating by upper-casing), including a 429 with `Retry-After` and an error.
//!
//! Chromium: `$CHROMIUM`, else `chromium`, `chromium-browser`, `google-chrome` on the PATH
//! (`.ci/run` installs Debian's `chromium` when absent). Without one the test is skipped with a
//! message, except under CI (`CI` set), where that is a failure.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tungstenite::{Message, WebSocket};

const PAGE: &str = include_str!("../src/serve/page.html");

fn find_chromium() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("CHROMIUM") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    for name in [
        "chromium",
        "chromium-browser",
        "google-chrome",
        "google-chrome-stable",
    ] {
        for dir in std::env::split_paths(&path) {
            let p = dir.join(name);
            if p.is_file() {
                return Some(p);
            }
        }
    }
    None
}

// ---- the stand-in server ----------------------------------------------------------------

/// Serves the page, `/languages` (en ⇄ de) and `/translate` (upper-cases `q`; `q` containing
/// "busy" gets one 429 with `Retry-After: 1` first; containing "fail", a 400 with an error).
fn start_server() -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = format!("http://{}/", listener.local_addr().unwrap());
    let busy = Arc::new(AtomicUsize::new(0));
    let busy_seen = busy.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let busy = busy.clone();
            std::thread::spawn(move || {
                let _ = answer(stream, &busy);
            });
        }
    });
    (addr, busy_seen)
}

fn answer(stream: TcpStream, busy: &AtomicUsize) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    let mut length = 0;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line == "\r\n" {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                length = v.trim().parse().unwrap_or(0);
            }
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body)?;
    let mut parts = request_line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let json_type = "application/json";
    let (status, ctype, extra, content): (&str, &str, &str, String) = match (method, path) {
        ("GET", "/") => ("200 OK", "text/html; charset=utf-8", "", PAGE.to_string()),
        ("GET", "/languages") => (
            "200 OK",
            json_type,
            "",
            json!([
                {"code": "en", "name": "English", "targets": ["de"]},
                {"code": "de", "name": "German", "targets": ["en"]}
            ])
            .to_string(),
        ),
        ("POST", "/translate") => {
            let req: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let q = req["q"].as_str().unwrap_or("").to_string();
            if q.contains("fail") {
                (
                    "400 Bad Request",
                    json_type,
                    "",
                    json!({"error": "Invalid request: this text fails"}).to_string(),
                )
            } else if q.contains("busy") && busy.fetch_add(1, Ordering::SeqCst) == 0 {
                (
                    "429 Too Many Requests",
                    json_type,
                    "Retry-After: 1\r\n",
                    json!({"error": "Slowdown: too many requests"}).to_string(),
                )
            } else {
                let mut out = json!({"translatedText": q.to_uppercase()});
                if req["source"] == "auto" {
                    out["detectedLanguage"] = json!({"language": "en", "confidence": 90.0});
                }
                ("200 OK", json_type, "", out.to_string())
            }
        }
        _ => (
            "404 Not Found",
            json_type,
            "",
            json!({"error": "Not Found"}).to_string(),
        ),
    };
    let mut stream = stream;
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\n{extra}Connection: close\r\n\r\n{content}",
        content.len()
    )?;
    stream.flush()
}

// ---- a small DevTools protocol client ---------------------------------------------------

struct Browser {
    child: Child,
    ws: WebSocket<TcpStream>,
    next_id: u64,
    session: String,
    _profile: tempfile::TempDir,
}

impl Drop for Browser {
    /// Closes Chromium the way it likes (so it reaps its own helper processes), killing it only
    /// if it does not go within 10 s.
    fn drop(&mut self) {
        self.next_id += 1;
        let close = json!({"id": self.next_id, "method": "Browser.close"});
        let _ = self.ws.send(Message::text(close.to_string()));
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Browser {
    fn launch(chromium: &PathBuf, url: &str) -> Browser {
        let profile = tempfile::tempdir().unwrap();
        let child = Command::new(chromium)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--disable-quic",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-extensions",
                "--remote-debugging-port=0",
                "--window-size=1200,900",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", chromium.display()));
        // Chromium writes its port and the browser target's path once it listens.
        let port_file = profile.path().join("DevToolsActivePort");
        let deadline = Instant::now() + Duration::from_secs(60);
        let (port, path) = loop {
            if let Ok(s) = std::fs::read_to_string(&port_file) {
                let mut lines = s.lines();
                if let (Some(port), Some(path)) = (lines.next(), lines.next()) {
                    break (port.to_string(), path.to_string());
                }
            }
            assert!(
                Instant::now() < deadline,
                "Chromium did not open its DevTools port"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        let stream = TcpStream::connect(format!("127.0.0.1:{port}")).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let (ws, _) = tungstenite::client(format!("ws://127.0.0.1:{port}{path}"), stream)
            .expect("DevTools websocket handshake");
        let mut b = Browser {
            child,
            ws,
            next_id: 0,
            session: String::new(),
            _profile: profile,
        };
        let target = b.call("Target.createTarget", json!({"url": "about:blank"}));
        let target_id = target["targetId"].as_str().unwrap().to_string();
        let attached = b.call(
            "Target.attachToTarget",
            json!({"targetId": target_id, "flatten": true}),
        );
        b.session = attached["sessionId"].as_str().unwrap().to_string();
        b.call("Page.enable", json!({}));
        b.call("Page.navigate", json!({"url": url}));
        b
    }

    /// Sends a command (to the page once attached) and waits for its answer.
    fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut msg = json!({"id": id, "method": method, "params": params});
        if !self.session.is_empty() {
            msg["sessionId"] = json!(self.session);
        }
        self.ws.send(Message::text(msg.to_string())).unwrap();
        loop {
            let reply = self.ws.read().expect("DevTools message");
            let Message::Text(text) = reply else { continue };
            let v: Value = serde_json::from_str(text.as_str()).unwrap();
            if v["id"] == json!(id) {
                if let Some(err) = v.get("error") {
                    panic!("{method}: {err}");
                }
                return v["result"].clone();
            }
        }
    }

    fn eval(&mut self, expression: &str) -> Value {
        let r = self.call(
            "Runtime.evaluate",
            json!({"expression": expression, "returnByValue": true, "awaitPromise": true}),
        );
        assert!(
            r.get("exceptionDetails").is_none(),
            "{expression}: {}",
            r["exceptionDetails"]
        );
        r["result"]["value"].clone()
    }

    fn wait_for(&mut self, what: &str, expression: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let v = self.eval(expression);
            if !(v.is_null() || v == json!(false) || v == json!("")) {
                return v;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn text_of(&mut self, id: &str) -> String {
        self.eval(&format!("document.getElementById('{id}').textContent"))
            .as_str()
            .unwrap_or("")
            .to_string()
    }

    /// A real left click in the middle of the element.
    fn click(&mut self, id: &str) {
        let r = self.eval(&format!(
            "(() => {{ const r = document.getElementById('{id}').getBoundingClientRect(); \
             return [r.x + r.width / 2, r.y + r.height / 2]; }})()"
        ));
        let (x, y) = (r[0].as_f64().unwrap(), r[1].as_f64().unwrap());
        for kind in ["mousePressed", "mouseReleased"] {
            self.call(
                "Input.dispatchMouseEvent",
                json!({"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1}),
            );
        }
    }

    fn key(&mut self, key: &str, code: &str, vk: u32, modifiers: u32, commands: &[&str]) {
        self.call(
            "Input.dispatchKeyEvent",
            json!({"type": "rawKeyDown", "key": key, "code": code, "windowsVirtualKeyCode": vk,
                   "modifiers": modifiers, "commands": commands}),
        );
        self.call(
            "Input.dispatchKeyEvent",
            json!({"type": "keyUp", "key": key, "code": code, "windowsVirtualKeyCode": vk,
                   "modifiers": modifiers}),
        );
    }

    fn type_text(&mut self, text: &str) {
        self.call("Input.insertText", json!({ "text": text }));
    }

    fn focused(&mut self) -> String {
        self.eval("document.activeElement ? document.activeElement.id : ''")
            .as_str()
            .unwrap_or("")
            .to_string()
    }
}

const CTRL: u32 = 2;

#[test]
fn the_page_translates_in_a_real_browser() {
    let Some(chromium) = find_chromium() else {
        if std::env::var_os("CI").is_some() {
            panic!("no Chromium (CHROMIUM, chromium on PATH): CI must install it (.ci/run does)");
        }
        eprintln!(
            "\n\n*** SKIPPED serve_page: no Chromium found (set CHROMIUM or install chromium); \
             the web page was NOT tested ***\n"
        );
        return;
    };
    let started = Instant::now();
    let (url, busy) = start_server();
    let mut b = Browser::launch(&chromium, &url);

    // The languages arrive and fill both pickers.
    b.wait_for("the languages", "document.body?.dataset.ready === 'true'");
    assert_eq!(
        b.eval("[...document.getElementById('source').options].map(o => o.value)"),
        json!(["auto", "en", "de"])
    );
    assert_eq!(
        b.eval("[...document.getElementById('target').options].map(o => o.value)"),
        json!(["en", "de"])
    );

    // Keyboard: the focus order is the reading order.
    b.eval("document.activeElement && document.activeElement.blur()");
    let mut order = Vec::new();
    for _ in 0..6 {
        b.key("Tab", "Tab", 9, 0, &[]);
        order.push(b.focused());
    }
    assert_eq!(
        order,
        ["source", "swap", "target", "translate", "q", "copy"]
    );

    // Type, click Translate, read the translation.
    b.click("q");
    b.type_text("Hello world. How are you?");
    b.eval("document.getElementById('target').value = 'de'");
    b.click("translate");
    b.wait_for(
        "the translation",
        "document.getElementById('result').textContent === 'HELLO WORLD. HOW ARE YOU?'",
    );
    assert!(
        b.text_of("detected").contains("English"),
        "{}",
        b.text_of("detected")
    );
    assert_eq!(b.text_of("status"), "");

    // An error of the server is shown as it says it.
    b.click("q");
    b.key("a", "KeyA", 65, CTRL, &["selectAll"]);
    b.type_text("this will fail");
    b.key("Enter", "Enter", 13, CTRL, &[]);
    b.wait_for(
        "the error",
        "document.getElementById('status').textContent.includes('this text fails')",
    );
    assert_eq!(
        b.eval("document.getElementById('status').className"),
        json!("error")
    );

    // 429: the page says it is waiting, then retries once and gets the translation.
    b.key("a", "KeyA", 65, CTRL, &["selectAll"]);
    b.type_text("busy server");
    b.key("Enter", "Enter", 13, CTRL, &[]);
    b.wait_for(
        "the busy message",
        "document.getElementById('status').textContent === 'Server busy, retrying in 1 s'",
    );
    b.wait_for(
        "the retried translation",
        "document.getElementById('result').textContent === 'BUSY SERVER'",
    );
    assert_eq!(busy.load(Ordering::SeqCst), 2, "one 429, one retry");
    assert_eq!(b.text_of("status"), "");

    // Swap: languages and texts change places (from the detected language).
    b.click("swap");
    assert_eq!(
        b.eval("document.getElementById('source').value"),
        json!("de")
    );
    assert_eq!(
        b.eval("document.getElementById('target').value"),
        json!("en")
    );
    assert_eq!(
        b.eval("document.getElementById('q').value"),
        json!("BUSY SERVER")
    );
    assert_eq!(b.text_of("result"), "busy server");

    // Copy: with the clipboard or the fallback, the page says it copied.
    b.click("copy");
    b.wait_for(
        "the copy notice",
        "document.getElementById('copied').textContent",
    );
    let copied = b.text_of("copied");
    assert!(
        copied == "Copied." || copied.starts_with("Copy failed"),
        "{copied}"
    );
    eprintln!("serve_page: copy said {copied:?}");

    eprintln!(
        "serve_page: Chromium drove the page in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}
