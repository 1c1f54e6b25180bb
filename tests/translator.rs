//! [`Translator`] as a user holds it: one type over MarianMT and the multilingual families,
//! languages per call (family codes or ISO 639-1), typed per-text errors, results that do not
//! depend on the batching, one model shared by many threads. Parity of the texts themselves
//! with transformers is in tests/marian_translate.rs and tests/multilingual_models.rs.

use candle_attention::{ErrorKind, Family, TranslateOptions, Translation, Translator};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn marian() -> Translator {
    Translator::from_dir(fixture("marian_e2e")).unwrap()
}

fn nllb() -> Translator {
    Translator::from_dir(fixture("multilingual_e2e/nllb")).unwrap()
}

/// The texts of the Marian fixture (number words, hostile characters, repeats).
fn marian_texts() -> Vec<String> {
    let expected: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixture("marian_e2e/expected.json")).unwrap(),
    )
    .unwrap();
    expected["texts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().to_string())
        .collect()
}

fn texts_of(results: Vec<Result<Translation, candle_attention::TranslateError>>) -> Vec<String> {
    results.into_iter().map(|r| r.unwrap().text).collect()
}

#[test]
fn families_and_languages_are_read_from_the_directory() {
    let m = marian();
    assert_eq!(m.family(), Family::Marian);
    assert_eq!(m.family_name(), "MarianMT");
    assert_eq!(m.default_pair(), Some(("en", "de")));
    assert_eq!(m.source_languages()[0].name, "English");
    assert_eq!(m.target_languages()[0].iso639_1.as_deref(), Some("de"));

    let n = nllb();
    assert_eq!(n.family(), Family::M2M100);
    assert_eq!(n.family_name(), "NLLB-200");
    assert_eq!(n.default_pair(), None);
    let deu = n
        .target_languages()
        .iter()
        .find(|l| l.code == "deu_Latn")
        .unwrap();
    assert_eq!(
        (deu.iso639_1.as_deref(), deu.name.as_str()),
        (Some("de"), "German")
    );
    assert_eq!(n.source_languages().len(), 202);

    let mbart = Translator::from_dir(fixture("multilingual_e2e/mbart50")).unwrap();
    assert_eq!(
        (mbart.family(), mbart.family_name()),
        (Family::MBart, "mBART-50")
    );
    assert!(mbart
        .source_languages()
        .iter()
        .any(|l| l.code == "en_XX" && l.is_named("en")));
}

#[test]
fn iso_codes_and_family_codes_translate_alike() {
    let n = nllb();
    let texts = ["Hello, world!", "a"];
    let options = TranslateOptions::default();
    let by_code = texts_of(
        n.translate_pair(&texts, "eng_Latn", "deu_Latn", &options)
            .unwrap(),
    );
    let by_iso = texts_of(n.translate_pair(&texts, "en", "de", &options).unwrap());
    assert_eq!(by_code, by_iso);
    let m = marian();
    let own = texts_of(m.translate(&texts, &options).unwrap());
    assert_eq!(
        own,
        texts_of(m.translate_pair(&texts, "en", "de", &options).unwrap())
    );
}

#[test]
fn bad_requests_are_input_errors_that_name_the_problem() {
    let n = nllb();
    let options = TranslateOptions::default();
    let err = n
        .translate_pair(&["x"], "eng_Latn", "xx_Nope", &options)
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Input);
    assert!(err.message().contains("xx_Nope"), "{err}");
    let err = n.translate(&["x"], &options).unwrap_err();
    assert!(
        err.is_input() && err.message().contains("source and target"),
        "{err}"
    );
    let err = n
        .translate_pair(
            &["x"],
            "en",
            "de",
            &TranslateOptions {
                n_best: 3,
                ..TranslateOptions::beam(2)
            },
        )
        .unwrap_err();
    assert!(err.is_input() && err.message().contains("beams"), "{err}");
    let err = n
        .translate_pair(
            &["x"],
            "en",
            "de",
            &TranslateOptions {
                max_new_tokens: Some(100_000),
                ..options.clone()
            },
        )
        .unwrap_err();
    assert!(
        err.is_input() && err.message().contains("max_position_embeddings"),
        "{err}"
    );
    let err = marian()
        .translate_pair(&["x"], "fr", "de", &options)
        .unwrap_err();
    assert!(
        err.is_input() && err.message().contains("fr is not a source language"),
        "{err}"
    );
    // A `?` in a candle::Result function takes it.
    let as_candle: candle_attention::candle::Error = err.into();
    assert!(as_candle.to_string().contains("fr"));
}

#[test]
fn outputs_do_not_depend_on_the_batching_and_repeats_are_shared() {
    let mut texts = marian_texts();
    texts.push(texts[0].clone());
    texts.push(String::new());
    for beam in [1, 3] {
        let options = TranslateOptions::beam(beam);
        let all = texts_of(marian().translate(&texts, &options).unwrap());
        let one_by_one = Translator::builder(fixture("marian_e2e"))
            .max_batch_tokens(1)
            .build()
            .unwrap();
        assert_eq!(
            all,
            texts_of(one_by_one.translate(&texts, &options).unwrap()),
            "beam {beam}"
        );
        assert_eq!(all[0], all[all.len() - 2]);
        for (text, want) in texts.iter().zip(&all).step_by(5) {
            let alone = texts_of(marian().translate(&[text], &options).unwrap());
            assert_eq!(&alone[0], want, "{text:?} alone, beam {beam}");
        }
    }
    assert!(marian()
        .translate(&[] as &[&str], &TranslateOptions::default())
        .unwrap()
        .is_empty());
}

#[test]
fn n_best_alternatives_and_alignments_come_when_asked() {
    let m = marian();
    let options = TranslateOptions {
        n_best: 3,
        alignments: true,
        ..TranslateOptions::beam(4)
    };
    let out = m
        .translate(&["Is it forty-two?"], &options)
        .unwrap()
        .remove(0)
        .unwrap();
    assert_eq!(out.alternatives.len(), 3);
    assert_eq!(out.alternatives[0].text, out.text);
    assert!(out
        .alternatives
        .windows(2)
        .all(|w| w[0].score >= w[1].score));
    let alignments = out.alignments.unwrap();
    assert_eq!(alignments.len(), out.generated_tokens);
    assert!(alignments
        .iter()
        .all(|a| a.source_index < out.source_tokens));
    let plain = m
        .translate(&["Is it forty-two?"], &TranslateOptions::beam(4))
        .unwrap()
        .remove(0)
        .unwrap();
    assert!(plain.alternatives.is_empty() && plain.alignments.is_none());
    assert_eq!(plain.text, out.text);
}

#[test]
fn streaming_gives_every_text_exactly_once_and_can_stop() {
    let m = marian();
    let mut texts = marian_texts();
    texts.push("nine hundred ninety-nine ".repeat(200));
    let mut seen = vec![0; texts.len()];
    m.translate_each(&texts, None, &TranslateOptions::default(), |i, result| {
        seen[i] += 1;
        assert_eq!(result.is_err(), i == texts.len() - 1, "text {i}");
        ControlFlow::Continue(())
    })
    .unwrap();
    assert!(seen.iter().all(|&n| n == 1), "{seen:?}");
    let mut calls = 0;
    m.translate_each(&texts, None, &TranslateOptions::default(), |_, _| {
        calls += 1;
        ControlFlow::Break(())
    })
    .unwrap();
    assert_eq!(calls, 1);
}

#[test]
fn one_model_serves_many_threads() {
    let m = Arc::new(marian());
    let texts = marian_texts();
    let want = texts_of(m.translate(&texts, &TranslateOptions::default()).unwrap());
    let handles: Vec<_> = (0..4)
        .map(|k| {
            let m = Arc::clone(&m);
            let texts: Vec<String> = texts.iter().skip(k).cloned().collect();
            std::thread::spawn(move || {
                texts_of(m.translate(&texts, &TranslateOptions::default()).unwrap())
            })
        })
        .collect();
    for (k, h) in handles.into_iter().enumerate() {
        assert_eq!(h.join().unwrap(), want[k..].to_vec(), "thread {k}");
    }
}

#[test]
fn a_missing_directory_says_what_it_takes() {
    let err = Translator::from_dir("no/such/dir").unwrap_err().to_string();
    assert!(err.contains("no/such/dir"), "{err}");
    let err = Translator::builder("/definitely/not/here")
        .build()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("/definitely/not/here")
            && (err.contains("not a directory") || err.contains("no such file or directory")),
        "{err}"
    );
    let err = Translator::builder(fixture("marian_e2e"))
        .max_batch_tokens(0)
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("max_batch_tokens"), "{err}");
}

/// Texts arriving one step after another each start a cohort while a quarter of the row cap is
/// free, up to six cohorts decoding at once (a seventh waits), and each gets what it gets alone.
#[test]
fn arriving_texts_start_up_to_six_cohorts() {
    let m = Translator::builder(fixture("marian_e2e"))
        .max_batch_rows(12)
        .build()
        .unwrap();
    let options = TranslateOptions::beam(1);
    // The fixture text with the longest greedy translation, so that none ends in 7 steps.
    let (text, alone) = marian_texts()
        .into_iter()
        .map(|t| {
            let out = m.translate(&[&t], &options).unwrap().remove(0).unwrap();
            (t, out)
        })
        .max_by_key(|(_, out)| out.generated_tokens)
        .unwrap();
    assert!(alone.generated_tokens > 8, "{}", alone.generated_tokens);
    let mut running = m.continuous();
    let mut rows = Vec::new();
    let mut results = Vec::new();
    for tag in 0..7u64 {
        running.push(tag, &text, None, &options).unwrap();
        results.extend(running.step());
        rows.push(running.running_rows());
    }
    // One row a text: six cohorts of one (12 rows, a quarter = 3 free), the seventh waiting.
    assert_eq!(rows, [1, 2, 3, 4, 5, 6, 6]);
    assert_eq!(running.waiting(), 1);
    while !running.is_idle() {
        results.extend(running.step());
    }
    assert_eq!(results.len(), 7);
    for (tag, result) in results {
        let got = result.unwrap();
        assert_eq!(
            (got.text, got.tokens),
            (alone.text.clone(), alone.tokens.clone()),
            "{tag}"
        );
    }
}

/// A running batch's own token budget bounds its padded source tokens instead of the
/// translator's (what `attn serve` sizes from its memory at rest); zero is refused.
#[test]
fn a_running_batch_takes_its_own_token_budget() {
    let m = marian();
    let options = TranslateOptions::beam(1);
    let text = marian_texts().remove(0);
    let alone = m.translate(&[&text], &options).unwrap().remove(0).unwrap();
    let tokens = alone.source_tokens;
    let err = m.continuous().with_max_batch_tokens(0).err().unwrap();
    assert!(err.to_string().contains("max_batch_tokens"), "{err}");
    assert_eq!(m.continuous().max_batch_tokens(), m.max_batch_tokens());
    // Room for two copies of the text: the running batch never holds more.
    let mut running = m.continuous().with_max_batch_tokens(2 * tokens).unwrap();
    assert_eq!(running.max_batch_tokens(), 2 * tokens);
    let mut results = Vec::new();
    for tag in 0..5u64 {
        running.push(tag, &text, None, &options).unwrap();
    }
    while !running.is_idle() {
        results.extend(running.step());
        assert!(
            running.source_tokens() <= 2 * tokens,
            "{}",
            running.source_tokens()
        );
        assert!(running.running_rows() <= 2);
    }
    assert_eq!(results.len(), 5);
    for (tag, result) in results {
        assert_eq!(result.unwrap().text, alone.text, "{tag}");
    }
}

/// Continuous batching: texts pushed while others decode, a cancelled text, the row cap; every
/// result equal to the text's translation alone.
#[test]
fn continuous_batching_admits_texts_mid_decode_and_cancels() {
    use candle_attention::translator::MAX_BATCH_ROWS;
    let m = marian();
    let texts = marian_texts();
    for beam in [1, 2] {
        let options = TranslateOptions::beam(beam);
        // Text, and scores to f32 round-off (a sentence's encoder pass depends on the length
        // of the batch it is padded to by a few ulp), while cohorts of different lengths step
        // in one model call: rows of one cohort never see another's.
        let exact = |t: Translation| (t.text, t.score, t.log_prob);
        let alone: Vec<(String, f32, f32)> = texts
            .iter()
            .map(|t| exact(m.translate(&[t], &options).unwrap().remove(0).unwrap()))
            .collect();
        let mut running = m.continuous();
        let mut got: Vec<Option<(String, f32, f32)>> = vec![None; texts.len()];
        let (first, later) = texts.split_at(texts.len() / 2);
        for (i, t) in first.iter().enumerate() {
            running.push(i as u64, t, None, &options).unwrap();
        }
        let cancelled = first.len() as u64 - 1;
        assert!(running.cancel(cancelled));
        let mut steps = 0;
        while !running.is_idle() {
            if steps == 2 {
                for (k, t) in later.iter().enumerate() {
                    let tag = (first.len() + k) as u64;
                    running.push(tag, t, None, &options).unwrap();
                }
            }
            assert!(running.running_rows() <= MAX_BATCH_ROWS);
            for (tag, result) in running.step() {
                assert!(got[tag as usize].is_none(), "text {tag} twice");
                got[tag as usize] = Some(exact(result.unwrap()));
            }
            steps += 1;
        }
        for (i, want) in alone.iter().enumerate() {
            if i as u64 == cancelled {
                assert_eq!(got[i], None, "a cancelled text gets nothing");
            } else {
                let (text, score, log_prob) = got[i].clone().expect("every text ends");
                assert_eq!(text, want.0, "text {i}, beam {beam}");
                let close = |a: f32, b: f32| (a - b).abs() <= 1e-5 * b.abs().max(1.0);
                assert!(
                    close(score, want.1) && close(log_prob, want.2),
                    "text {i}, beam {beam}: scores {score} {log_prob} alone {} {}",
                    want.1,
                    want.2
                );
            }
        }
        assert!(running.tokens_generated() > 0);
    }
}

/// However many short texts the token budget would take, at most MAX_BATCH_ROWS decoder rows
/// decode at once.
#[test]
fn the_row_cap_holds_for_a_large_call() {
    use candle_attention::translator::MAX_BATCH_ROWS;
    let m = Translator::builder(fixture("marian_e2e"))
        .max_batch_tokens(1 << 20)
        .max_new_tokens(3)
        .build()
        .unwrap();
    let mut running = m.continuous();
    let options = TranslateOptions::beam(3);
    for i in 0..400u64 {
        running.push(i, &format!("{i}"), None, &options).unwrap();
    }
    let (mut most, mut results) = (0, 0);
    while !running.is_idle() {
        results += running.step().len();
        most = most.max(running.running_rows());
    }
    assert_eq!(results, 400);
    assert!(
        most <= MAX_BATCH_ROWS && most > MAX_BATCH_ROWS / 2,
        "{most}"
    );

    // A cap of its own (a server's): held, and the results are the default cap's.
    let capped = Translator::builder(fixture("marian_e2e"))
        .max_new_tokens(3)
        .max_batch_rows(7)
        .build()
        .unwrap();
    assert_eq!(capped.max_batch_rows(), 7);
    let mut running = capped.continuous();
    let texts: Vec<String> = (0..40).map(|i| format!("{i} {}", i * 7)).collect();
    for (i, text) in texts.iter().enumerate() {
        running.push(i as u64, text, None, &options).unwrap();
    }
    let mut got: Vec<Option<String>> = vec![None; texts.len()];
    let mut most = 0;
    while !running.is_idle() {
        for (tag, result) in running.step() {
            got[tag as usize] = Some(result.unwrap().text);
        }
        most = most.max(running.running_rows());
    }
    assert!(
        (6..=7).contains(&most),
        "{most} rows at beam 3 under a cap of 7"
    );
    let want = texts_of(m.translate(&texts, &options).unwrap());
    assert_eq!(
        got.into_iter().map(Option::unwrap).collect::<Vec<_>>(),
        want
    );
    let err = Translator::builder(fixture("marian_e2e"))
        .max_batch_rows(0)
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("max_batch_rows"), "{err}");
}

#[test]
fn the_token_budget_holds_for_the_whole_running_batch() {
    // 40 texts of 3 to 6 source tokens, a budget of 24 padded tokens and room for every row:
    // each cohort would fit the budget alone, so without a bound on the running batch as a
    // whole a second cohort would start beside the first and hold up to twice the budget.
    let budget = 24;
    let m = Translator::builder(fixture("marian_e2e"))
        .max_new_tokens(6)
        .max_batch_tokens(budget)
        .build()
        .unwrap();
    let options = TranslateOptions::beam(2);
    let texts: Vec<String> = (0..40)
        .map(|i| format!("{i} {} {}", i * 3, i * 11).repeat(1 + i % 2))
        .collect();
    let mut running = m.continuous();
    for (i, text) in texts.iter().enumerate() {
        running.push(i as u64, text, None, &options).unwrap();
    }
    let mut most = 0;
    let mut got: Vec<Option<String>> = vec![None; texts.len()];
    while !running.is_idle() {
        for (tag, result) in running.step() {
            got[tag as usize] = Some(result.unwrap().text);
        }
        most = most.max(running.source_tokens());
    }
    assert!(
        most <= budget && most > budget / 2,
        "{most} padded source tokens held under a budget of {budget}"
    );
    let want = texts_of(m.translate(&texts, &options).unwrap());
    assert_eq!(
        got.into_iter().map(Option::unwrap).collect::<Vec<_>>(),
        want
    );
}
