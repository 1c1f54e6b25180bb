//! `attn serve` as people run it: the binary on the small MarianMT fixture (en → de), bound to
//! 127.0.0.1 on a free port, answering LibreTranslate's API with exactly what
//! `attn translate --model` gives each sentence, and draining on SIGTERM with exit 0.

#[path = "../../tests/common/mod.rs"]
mod common;

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};

/// One HTTP/1.1 request; the status and the JSON body.
fn request(addr: &str, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
    let mut stream = TcpStream::connect(addr).unwrap();
    let body = body.map(Value::to_string).unwrap_or_default();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status: u16 = response[9..12].parse().unwrap();
    let json = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b)
        .unwrap_or_default();
    // The body may be chunked: take the JSON between the first '{' / '[' and the last '}' / ']'.
    let start = json.find(['{', '[']).unwrap_or(0);
    let end = json.rfind(['}', ']']).map_or(json.len(), |e| e + 1);
    (
        status,
        serde_json::from_str(&json[start..end]).unwrap_or(Value::Null),
    )
}

fn translate_cli(texts: &[&str]) -> Vec<String> {
    let model = common::repo_root().join("tests/fixtures/marian_e2e");
    let out = Command::new(env!("CARGO_BIN_EXE_attn"))
        .args([
            "translate",
            "--model",
            model.to_str().unwrap(),
            "--beam",
            "4",
        ])
        .args(texts)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn the_binary_serves_libretranslate_requests_and_drains_on_sigterm() {
    let model = common::repo_root().join("tests/fixtures/marian_e2e");
    let mut server = Command::new(env!("CARGO_BIN_EXE_attn"))
        .args(["serve", "--model"])
        .arg(format!("en:de={}", model.display()))
        .args(["--host", "127.0.0.1", "--port", "0", "--threads", "2"])
        .env("RUST_LOG", "info")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(server.stderr.take().unwrap()).lines();
    let addr = loop {
        let line = lines
            .next()
            .expect("the server printed its address")
            .unwrap();
        if let Some(rest) = line.split("http://").nth(1) {
            break rest
                .trim_end_matches('/')
                .split('/')
                .next()
                .unwrap()
                .to_string();
        }
    };
    // Keep reading its log so that it never blocks on a full pipe.
    let log = std::thread::spawn(move || lines.map_while(Result::ok).collect::<Vec<_>>());

    let (status, v) = request(&addr, "GET", "/languages", None);
    assert_eq!(status, 200);
    assert_eq!(v[0]["code"], "de");
    assert_eq!(v[1]["code"], "en");
    assert_eq!(v[1]["targets"], json!(["de", "en"]));
    // A language to itself gives the text back unchanged, as LibreTranslate does (so does an
    // `auto` text detected as the target language).
    let same = "Is it forty-two?  Street seven.\n";
    let (status, v) = request(
        &addr,
        "POST",
        "/translate",
        Some(&json!({"q": [same, "seven"], "source": "en", "target": "en", "alternatives": 2})),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["translatedText"], json!([same, "seven"]));
    assert_eq!(v["alternatives"], json!([[], []]));

    let sentences = [
        "Is it forty-two?",
        "Street seven, please.",
        "I see three hundred twelve birds.",
    ];
    let want = translate_cli(&sentences);
    // One text of three sentences: each sentence as attn translate gives it, joined by the
    // text's own separators.
    let text = format!("{} {}\n\n{}", sentences[0], sentences[1], sentences[2]);
    let (status, v) = request(
        &addr,
        "POST",
        "/translate",
        Some(&json!({"q": text, "source": "en", "target": "de"})),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        v["translatedText"],
        format!("{} {}\n\n{}", want[0], want[1], want[2])
    );
    // A list, from many threads at once: none lost, none swapped.
    let threads: Vec<_> = (0..8)
        .map(|k| {
            let addr = addr.clone();
            let q: Vec<&str> = (0..3).map(|j| sentences[(k + j) % 3]).collect();
            std::thread::spawn(move || {
                let (status, v) = request(
                    &addr,
                    "POST",
                    "/translate",
                    Some(&json!({"q": q, "source": "en", "target": "de"})),
                );
                assert_eq!(status, 200, "{v}");
                (k, v["translatedText"].clone())
            })
        })
        .collect();
    for t in threads {
        let (k, got) = t.join().unwrap();
        let expected: Vec<&str> = (0..3).map(|j| want[(k + j) % 3].as_str()).collect();
        assert_eq!(got, json!(expected), "client {k}");
    }
    let (status, v) = request(
        &addr,
        "POST",
        "/translate",
        Some(&json!({"q": "x", "source": "en", "target": "zz"})),
    );
    assert_eq!((status, v), (400, json!({"error": "zz is not supported"})));
    let (status, v) = request(&addr, "GET", "/health", None);
    assert_eq!((status, v), (200, json!({"status": "ok"})));

    // SIGTERM: drains and exits 0.
    // SAFETY: kill(2) on the child's pid, which we own and have not waited for yet.
    unsafe {
        libc::kill(server.id() as i32, libc::SIGTERM);
    }
    let status = server.wait().unwrap();
    let log = log.join().unwrap();
    assert!(
        status.success(),
        "exit {status:?}; log:\n{}",
        log.join("\n")
    );
}
