//! The engine of `attn serve` on the small MarianMT fixture (en → de) and the NLLB one: jobs
//! from many threads answered with exactly what the translator gives each sentence alone,
//! languages as LibreTranslate names them, a bounded queue, deadlines and cancellation.

use attn_cli::serve::backend::{Backend, Job, JobError, SubmitError};
use attn_cli::serve::engine::{Engine, EngineOptions, ModelSpec};
use candle_attention::{Precision, TranslateOptions, Translator};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name)
}

fn options(max_queue: usize) -> EngineOptions {
    EngineOptions {
        beam: Some(2),
        max_new_tokens: None,
        precision: Precision::F32,
        max_batch_tokens: Some(4096),
        max_batch_rows: 64,
        max_queue,
        languages: Vec::new(),
    }
}

fn marian_engine(max_queue: usize) -> Engine {
    let spec = ModelSpec {
        pair: None,
        model: fixture("marian_e2e"),
    };
    Engine::load(vec![spec], options(max_queue)).unwrap()
}

fn job(sentences: &[&str], seconds: u64) -> Job {
    Job {
        source: "en".into(),
        target: "de".into(),
        sentences: sentences.iter().map(|s| s.to_string()).collect(),
        alternatives: 0,
        deadline: Instant::now() + Duration::from_secs(seconds),
    }
}

/// The engine's answer to a job of the one sentence `text` (en → de, 60 s).
fn answer_one(engine: &Engine, text: &str) -> String {
    let out = engine
        .submit(job(&[text], 60))
        .unwrap()
        .blocking_recv()
        .unwrap()
        .unwrap();
    out[0].as_ref().unwrap().text.clone()
}

fn sentences() -> Vec<String> {
    let expected: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixture("marian_e2e/expected.json")).unwrap(),
    )
    .unwrap();
    // Blank ones are the HTTP layer's separators, never sent as sentences.
    expected["texts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().to_string())
        .filter(|t| !t.trim().is_empty())
        .collect()
}

#[test]
fn jobs_from_many_threads_get_what_each_sentence_gets_alone() {
    let engine = Arc::new(marian_engine(10_000));
    assert_eq!(engine.beam(), 2);
    let languages = engine.languages();
    assert_eq!(languages.len(), 2);
    assert_eq!(
        (languages[1].code.as_str(), languages[1].name.as_str()),
        ("en", "English")
    );
    // Each language is its own target too (LibreTranslate's identity translation).
    assert_eq!(
        languages[1].targets,
        vec!["de".to_string(), "en".to_string()]
    );
    let translator = Translator::builder(fixture("marian_e2e"))
        .beam(2)
        .build()
        .unwrap();
    let texts = sentences();
    let alone: Vec<String> = texts
        .iter()
        .map(|t| {
            translator
                .translate(&[t], &TranslateOptions::default())
                .unwrap()[0]
                .as_ref()
                .unwrap()
                .text
                .clone()
        })
        .collect();
    let threads: Vec<_> = (0..8)
        .map(|k| {
            let engine = Arc::clone(&engine);
            let texts = texts.clone();
            std::thread::spawn(move || {
                let mut got = Vec::new();
                for round in 0..3 {
                    // 1 to 3 consecutive sentences a job, as clients send them.
                    let start = (k * 3 + round * 5) % texts.len();
                    let n = 1 + (k + round) % 3;
                    let picked: Vec<&str> = (0..n)
                        .map(|j| texts[(start + j) % texts.len()].as_str())
                        .collect();
                    let rx = engine.submit(job(&picked, 60)).unwrap();
                    let out = rx.blocking_recv().unwrap().unwrap();
                    for (j, s) in out.into_iter().enumerate() {
                        got.push(((start + j) % texts.len(), s.unwrap().text));
                    }
                }
                got
            })
        })
        .collect();
    let mut answered = 0;
    for t in threads {
        for (i, text) in t.join().unwrap() {
            assert_eq!(text, alone[i], "sentence {i}");
            answered += 1;
        }
    }
    assert!(answered >= 8 * 3);
    assert!(engine.stats().tokens_generated > 0);
}

#[test]
fn alternatives_empty_sentences_and_unsupported_pairs() {
    let engine = marian_engine(100);
    let mut j = job(&["Is it forty-two?", "", "  "], 60);
    j.alternatives = 1;
    let out = engine.submit(j).unwrap().blocking_recv().unwrap().unwrap();
    let first = out[0].as_ref().unwrap();
    assert_eq!(first.alternatives.len(), 1);
    assert_ne!(first.alternatives[0], first.text);
    assert_eq!(out[1].as_ref().unwrap().text, "");
    assert_eq!(out[2].as_ref().unwrap().text, "  ");
    let mut bad = job(&["x"], 60);
    bad.target = "zz".into();
    match engine.submit(bad) {
        Err(SubmitError::Unsupported(m)) => assert_eq!(m, "zz is not supported"),
        other => panic!("{:?}", other.map(|_| ())),
    }
    let mut bad = job(&["x"], 60);
    bad.source = "fr".into();
    match engine.submit(bad) {
        Err(SubmitError::Unsupported(m)) => assert_eq!(m, "fr is not supported"),
        other => panic!("{:?}", other.map(|_| ())),
    }
    // A sentence the model cannot take fails alone.
    let long = "nine hundred ninety-nine ".repeat(200);
    let out = engine
        .submit(job(&["Is it forty-two?", &long], 60))
        .unwrap()
        .blocking_recv()
        .unwrap()
        .unwrap();
    assert!(out[0].is_ok());
    assert!(out[1].as_ref().unwrap_err().is_input());
}

#[test]
fn the_queue_is_bounded_and_deadlines_and_dropped_receivers_free_the_batch() {
    let engine = marian_engine(4);
    let texts = sentences();
    let many: Vec<&str> = texts.iter().map(String::as_str).take(4).collect();
    // Fill the queue faster than it drains: some job is refused at once with a Retry-After.
    let mut receivers = Vec::new();
    let mut refused = 0;
    for _ in 0..50 {
        match engine.submit(job(&many, 60)) {
            Ok(rx) => receivers.push(rx),
            Err(SubmitError::Overloaded { retry_after_secs }) => {
                assert!(retry_after_secs >= 1);
                refused += 1;
            }
            Err(SubmitError::Unsupported(m)) => panic!("{m}"),
        }
    }
    assert!(refused > 0, "a queue of 4 sentences took 50 jobs of 4");
    // Dropped receivers: their sentences leave; the rest are answered.
    let kept = receivers.split_off(receivers.len() / 2);
    drop(receivers);
    for rx in kept {
        assert!(rx.blocking_recv().unwrap().is_ok());
    }
    // A deadline already past: the job is answered TimedOut, never translated.
    let mut late = job(&many, 0);
    late.deadline = Instant::now();
    let out = engine.submit(late).unwrap().blocking_recv().unwrap();
    assert!(matches!(out, Err(JobError::TimedOut)));
    // The engine still answers.
    let out = engine.submit(job(&["Is it forty-two?"], 60)).unwrap();
    assert!(out.blocking_recv().unwrap().is_ok());
    let stats = engine.stats();
    assert_eq!((stats.queued_sentences, stats.running_rows), (0, 0));
}

#[test]
fn a_multilingual_model_serves_every_pair_of_its_languages() {
    let spec = ModelSpec {
        pair: None,
        model: fixture("multilingual_e2e/nllb"),
    };
    let engine = Engine::load(
        vec![spec],
        EngineOptions {
            languages: vec!["en".into(), "de".into(), "ru".into(), "zh-Hans".into()],
            ..options(100)
        },
    )
    .unwrap();
    let codes: Vec<String> = engine.languages().into_iter().map(|l| l.code).collect();
    assert_eq!(codes, vec!["de", "en", "ru", "zh-Hans"]);
    let translator = Translator::builder(fixture("multilingual_e2e/nllb"))
        .beam(2)
        .build()
        .unwrap();
    let want = translator
        .translate_pair(
            &["Hello, world!"],
            "eng_Latn",
            "deu_Latn",
            &TranslateOptions::default(),
        )
        .unwrap()
        .remove(0)
        .unwrap()
        .text;
    assert_eq!(answer_one(&engine, "Hello, world!"), want);
}

/// More engines alive at once than rayon has threads (as when several servers or these tests
/// share a process): each loads and answers. An engine that waited for work on a thread of
/// the pool held that thread while idle; with as many idle engines as threads, the next
/// engine's work (its warm-up first) never ran. A hang fails here after two minutes.
#[test]
fn more_engines_than_pool_threads_each_answer() {
    let count = rayon::current_num_threads() + 2;
    let text = sentences()[0].clone();
    let go = Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
    let (tx, rx) = std::sync::mpsc::channel();
    for i in 0..count {
        let (tx, text, go) = (tx.clone(), text.clone(), Arc::clone(&go));
        std::thread::spawn(move || {
            let engine = marian_engine(100);
            let _ = tx.send((i, "loaded", true));
            // Every engine alive and idle before any work arrives.
            let (lock, wake) = &*go;
            let mut started = lock.lock().unwrap();
            while !*started {
                started = wake.wait(started).unwrap();
            }
            drop(started);
            let answer = engine.submit(job(&[&text], 120)).unwrap().blocking_recv();
            let _ = tx.send((i, "answered", answer.map(|r| r.is_ok()).unwrap_or(false)));
        });
    }
    drop(tx);
    let deadline = Instant::now() + Duration::from_secs(120);
    let wait_for = |what: &str| {
        for _ in 0..count {
            let left = deadline.saturating_duration_since(Instant::now());
            let (i, event, ok) = rx
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("not every one of {count} engines {what} in 120 s"));
            assert_eq!(event, what);
            assert!(ok, "engine {i} answered with an error");
        }
    };
    wait_for("loaded");
    std::thread::sleep(Duration::from_millis(200));
    *go.0.lock().unwrap() = true;
    go.1.notify_all();
    wait_for("answered");
}

#[test]
fn the_token_budget_is_given_or_sized_from_the_memory_at_rest() {
    let given = marian_engine(10);
    assert_eq!(given.max_batch_tokens(), [4096]);
    let spec = |dir: &str| ModelSpec {
        pair: Some(("en".into(), "de".into())),
        model: fixture(dir),
    };
    let sized = Engine::load(
        vec![spec("marian_e2e")],
        EngineOptions {
            max_batch_tokens: None,
            ..options(10)
        },
    )
    .unwrap();
    // The fixture's running batch is small next to the process: the largest budget.
    assert_eq!(sized.max_batch_tokens(), [1024]);
    let out = answer_one(&sized, "Is it forty-two?");
    let want = Translator::builder(fixture("marian_e2e"))
        .beam(2)
        .build()
        .unwrap()
        .translate(&["Is it forty-two?"], &TranslateOptions::default())
        .unwrap()
        .remove(0)
        .unwrap()
        .text;
    assert_eq!(out, want);
    let err = Engine::load(
        vec![spec("marian_e2e")],
        EngineOptions {
            max_batch_tokens: Some(0),
            ..options(10)
        },
    )
    .err()
    .unwrap();
    assert!(err.to_string().contains("--max-batch-tokens"), "{err}");
}
