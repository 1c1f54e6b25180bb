//! Greedy and beam search (`candle_attention::decode`) on hand-built step models with known
//! transition log-probabilities.

use candle::{Device, Result, Tensor};
use candle_attention::decode::{beam_search, greedy, Hypothesis, SearchConfig, StepDecoder};
use proptest::prelude::*;
use std::cell::RefCell;

const PAD: u32 = 0;
const BOS: u32 = 1;
const EOS: u32 = 2;
const A: u32 = 3;
const B: u32 = 4;
const C: u32 = 5;
const NINF: f32 = f32::NEG_INFINITY;

/// Next-token log-probabilities given the source sentence index and the prefix fed so far
/// (`BOS` first).
type Dist = Box<dyn Fn(usize, &[u32]) -> Vec<f32>>;

#[derive(Clone, Debug, PartialEq)]
enum Call {
    Step(Vec<u32>),
    Reorder(Vec<u32>),
}

/// A model whose next-token distribution depends on the source sentence and the whole prefix;
/// it records every call.
struct PrefixModel {
    vocab: usize,
    dist: Dist,
    calls: RefCell<Vec<Call>>,
}

/// Per row: the source sentence and the tokens fed so far.
#[derive(Clone, Debug)]
struct Rows {
    src: Vec<usize>,
    prefix: Vec<Vec<u32>>,
}

impl Rows {
    fn new(batch: usize) -> Self {
        Self::with_src((0..batch).collect())
    }

    fn with_src(src: Vec<usize>) -> Self {
        let prefix = vec![Vec::new(); src.len()];
        Self { src, prefix }
    }
}

impl PrefixModel {
    fn new(vocab: usize, dist: impl Fn(usize, &[u32]) -> Vec<f32> + 'static) -> Self {
        Self {
            vocab,
            dist: Box::new(dist),
            calls: RefCell::new(Vec::new()),
        }
    }

    fn calls(&self) -> Vec<Call> {
        self.calls.borrow().clone()
    }

    /// Teacher-forced log-probability of a hypothesis, summed in the same order as the search.
    fn rescore(&self, src: usize, hyp: &Hypothesis, cfg: &SearchConfig) -> f64 {
        let mut prefix = vec![cfg.bos_id];
        let mut lp = 0.0f64;
        for &t in &hyp.tokens {
            lp += (self.dist)(src, &prefix)[t as usize] as f64;
            prefix.push(t);
        }
        if hyp.finished {
            lp += (self.dist)(src, &prefix)[cfg.eos_id as usize] as f64;
        }
        lp
    }

    /// Checks everything a hypothesis promises.
    fn check(&self, src: usize, hyp: &Hypothesis, cfg: &SearchConfig) {
        assert_eq!(hyp.log_prob, self.rescore(src, hyp, cfg), "{hyp:?}");
        let len = hyp.tokens.len() + usize::from(hyp.finished);
        assert!(len >= 1 && len <= cfg.max_len, "{hyp:?}");
        if !hyp.finished {
            assert_eq!(hyp.tokens.len(), cfg.max_len, "{hyp:?}");
        }
        assert_eq!(hyp.score, cfg.normalized_score(hyp.log_prob, len));
        for &t in &hyp.tokens {
            assert_ne!(t, cfg.eos_id, "{hyp:?}");
            assert!(t != cfg.pad_id && t != cfg.bos_id, "{hyp:?}");
        }
    }
}

impl StepDecoder for PrefixModel {
    type State = Rows;

    fn step(&self, state: &mut Rows, tokens: &[u32]) -> Result<Tensor> {
        self.calls.borrow_mut().push(Call::Step(tokens.to_vec()));
        assert_eq!(tokens.len(), state.src.len(), "one token per row");
        let mut data = Vec::with_capacity(tokens.len() * self.vocab);
        for (row, &t) in tokens.iter().enumerate() {
            state.prefix[row].push(t);
            let lp = (self.dist)(state.src[row], &state.prefix[row]);
            assert_eq!(lp.len(), self.vocab);
            data.extend(lp);
        }
        Tensor::from_vec(data, (tokens.len(), self.vocab), &Device::Cpu)
    }

    fn reorder(&self, state: &mut Rows, rows: &[u32]) -> Result<()> {
        self.calls.borrow_mut().push(Call::Reorder(rows.to_vec()));
        let src = rows.iter().map(|&r| state.src[r as usize]).collect();
        let prefix = rows
            .iter()
            .map(|&r| state.prefix[r as usize].clone())
            .collect();
        *state = Rows { src, prefix };
        Ok(())
    }
}

/// A log-probability row of `vocab` entries: `rest` everywhere but `entries`.
fn row(vocab: usize, rest: f32, entries: &[(u32, f32)]) -> Vec<f32> {
    let mut v = vec![rest; vocab];
    for &(t, x) in entries {
        v[t as usize] = x;
    }
    v
}

fn cfg() -> SearchConfig {
    SearchConfig::new(BOS, EOS, PAD)
}

fn ln(p: f32) -> f32 {
    p.ln()
}

fn lp_sum(xs: &[f32]) -> f64 {
    xs.iter().fold(0.0f64, |acc, &x| acc + x as f64)
}

#[test]
fn greedy_follows_the_argmax_path() -> Result<()> {
    // A bigram model: only the last token matters.
    let model = PrefixModel::new(6, |_, prefix| match *prefix.last().unwrap() {
        BOS => row(6, -9.0, &[(A, -0.5), (B, -1.0), (EOS, -2.0), (C, -3.0)]),
        A => row(6, -9.0, &[(B, -0.2), (A, -1.0), (EOS, -1.5)]),
        B => row(6, -9.0, &[(C, -0.3), (EOS, -0.4)]),
        C => row(6, -9.0, &[(EOS, -0.1), (A, -0.2)]),
        _ => row(6, -9.0, &[(EOS, 0.0)]),
    });
    let cfg = cfg();
    let hyps = greedy(&model, &mut Rows::new(1), 1, &cfg)?;
    let lp = lp_sum(&[-0.5, -0.2, -0.3, -0.1]);
    assert_eq!(
        hyps,
        vec![Hypothesis {
            tokens: vec![A, B, C],
            log_prob: lp,
            score: lp / 4.0,
            finished: true
        }]
    );
    assert_eq!(
        model.calls(),
        vec![
            Call::Step(vec![BOS]),
            Call::Step(vec![A]),
            Call::Step(vec![B]),
            Call::Step(vec![C]),
        ]
    );
    Ok(())
}

/// From BOS: A 0.6, B 0.4. After A: EOS 0.4, A 0.3, B 0.3. After B: EOS 0.9.
/// Greedy takes A, EOS (0.24); the best sequence is B, EOS (0.36).
fn greedy_trap() -> PrefixModel {
    PrefixModel::new(6, |_, prefix| match prefix {
        [BOS] => row(6, -20.0, &[(A, ln(0.6)), (B, ln(0.4))]),
        [BOS, A] => row(6, -20.0, &[(EOS, ln(0.4)), (A, ln(0.3)), (B, ln(0.3))]),
        [BOS, B] => row(6, -20.0, &[(EOS, ln(0.9)), (A, ln(0.05)), (B, ln(0.05))]),
        _ => row(6, -20.0, &[(EOS, 0.0)]),
    })
}

#[test]
fn beam_two_finds_the_sequence_greedy_misses() -> Result<()> {
    let cfg = cfg();
    let model = greedy_trap();
    let g = greedy(&model, &mut Rows::new(1), 1, &cfg)?;
    let greedy_lp = lp_sum(&[ln(0.6), ln(0.4)]);
    assert_eq!(g[0].tokens, vec![A]);
    assert_eq!(g[0].log_prob, greedy_lp);
    assert_eq!(g[0].score, greedy_lp / 2.0);

    let model = greedy_trap();
    let nbest = beam_search(&model, Rows::new(1), 1, &cfg.with_beam_size(2))?;
    let best_lp = lp_sum(&[ln(0.4), ln(0.9)]);
    assert_eq!(
        nbest,
        vec![vec![
            Hypothesis {
                tokens: vec![B],
                log_prob: best_lp,
                score: best_lp / 2.0,
                finished: true
            },
            Hypothesis {
                tokens: vec![A],
                log_prob: greedy_lp,
                score: greedy_lp / 2.0,
                finished: true
            },
        ]]
    );
    assert!((best_lp - 0.36f64.ln()).abs() < 1e-6);
    // Expand to two rows, both live beams come from row 0, and the search stops after step 2
    // (two finished hypotheses, the best live one, A A at 0.18, cannot beat them).
    assert_eq!(
        model.calls(),
        vec![
            Call::Reorder(vec![0, 0]),
            Call::Step(vec![BOS, BOS]),
            Call::Reorder(vec![0, 0]),
            Call::Step(vec![A, B]),
        ]
    );
    Ok(())
}

/// Scripted sentences: item `i` strongly prefers `script[i]` (which ends with EOS).
fn scripted(script: Vec<Vec<u32>>) -> PrefixModel {
    PrefixModel::new(6, move |src, prefix| {
        let pos = prefix.len() - 1;
        let target = script[src].get(pos).copied().unwrap_or(EOS);
        row(6, -20.0, &[(target, -0.1 * (pos as f32 + 1.0))])
    })
}

#[test]
fn greedy_batch_handles_eos_per_sequence() -> Result<()> {
    let script = vec![vec![A, EOS], vec![A, B, C, EOS], vec![B, B, EOS]];
    let model = scripted(script.clone());
    let cfg = cfg();
    let hyps = greedy(&model, &mut Rows::new(3), 3, &cfg)?;
    for (i, h) in hyps.iter().enumerate() {
        assert_eq!(h.tokens, script[i][..script[i].len() - 1], "item {i}");
        assert!(h.finished);
        model.check(i, h, &cfg);
    }
    // Finished rows are dropped: no token is ever fed after a row's EOS.
    assert_eq!(
        model.calls(),
        vec![
            Call::Step(vec![BOS, BOS, BOS]),
            Call::Step(vec![A, A, B]),
            Call::Reorder(vec![1, 2]),
            Call::Step(vec![B, B]),
            Call::Reorder(vec![0]),
            Call::Step(vec![C]),
        ]
    );

    let model = scripted(script.clone());
    let nbest = beam_search(&model, Rows::new(3), 3, &cfg.with_beam_size(2))?;
    for (i, list) in nbest.iter().enumerate() {
        assert_eq!(list.len(), 2);
        assert_eq!(list[0].tokens, script[i][..script[i].len() - 1], "item {i}");
        assert!(list[0].score >= list[1].score);
        for h in list {
            model.check(i, h, &cfg);
        }
    }
    // Every step feeds two rows per item still being searched, and no more.
    let step_sizes: Vec<usize> = model
        .calls()
        .iter()
        .filter_map(|c| match c {
            Call::Step(t) => Some(t.len()),
            Call::Reorder(_) => None,
        })
        .collect();
    assert_eq!(step_sizes[0], 6);
    assert!(step_sizes.iter().all(|&n| n % 2 == 0), "{step_sizes:?}");
    assert!(
        step_sizes.windows(2).all(|w| w[1] <= w[0]),
        "{step_sizes:?}"
    );
    assert!(*step_sizes.last().unwrap() < 6, "{step_sizes:?}");
    Ok(())
}

/// Two sentences, beam 2: sentence 0 finishes at step 2 and is dropped from the state; the
/// live beams of sentence 1 both come from its second beam at step 2.
fn two_sentences() -> PrefixModel {
    PrefixModel::new(6, |src, prefix| {
        let mut v = vec![-9.0; 6];
        let mut set = |t: u32, x: f32| v[t as usize] = x;
        match (src, &prefix[1..]) {
            (_, []) => {
                set(A, -0.1);
                set(B, -0.2);
                set(EOS, -5.0);
            }
            (0, [A]) => {
                set(EOS, -0.1);
                set(A, -3.0);
                set(B, -3.0);
            }
            (0, [B]) => {
                set(EOS, -0.1);
                set(A, -4.0);
                set(B, -4.0);
            }
            (1, [A]) => {
                set(A, -2.0);
                set(B, -2.0);
                set(EOS, -3.0);
            }
            (1, [B]) => {
                set(A, -0.3);
                set(B, -0.4);
                set(EOS, -3.0);
            }
            (1, [B, A]) => set(EOS, -0.1),
            (1, [B, B]) => set(EOS, -0.2),
            _ => set(EOS, -0.5),
        }
        v
    })
}

#[test]
fn beam_search_reorders_to_the_parent_rows() -> Result<()> {
    let model = two_sentences();
    let cfg = cfg().with_beam_size(2);
    let nbest = beam_search(&model, Rows::new(2), 2, &cfg)?;
    assert_eq!(
        model.calls(),
        vec![
            Call::Reorder(vec![0, 0, 1, 1]),
            Call::Step(vec![BOS, BOS, BOS, BOS]),
            Call::Reorder(vec![0, 0, 2, 2]),
            Call::Step(vec![A, B, A, B]),
            Call::Reorder(vec![3, 3]),
            Call::Step(vec![A, B]),
        ]
    );
    let tokens: Vec<Vec<Vec<u32>>> = nbest
        .iter()
        .map(|l| l.iter().map(|h| h.tokens.clone()).collect())
        .collect();
    assert_eq!(
        tokens,
        vec![vec![vec![A], vec![B]], vec![vec![B, A], vec![B, B]]]
    );
    for (i, list) in nbest.iter().enumerate() {
        for h in list {
            assert!(h.finished);
            model.check(i, h, &cfg);
        }
    }
    Ok(())
}

#[test]
fn dead_beams_are_fed_padding() -> Result<()> {
    // Vocabulary PAD, BOS, EOS, A: a beam of 3 never has more than one live beam.
    let model = PrefixModel::new(4, |_, prefix| match prefix {
        [BOS] => vec![-0.1, -0.1, -1.0, -0.5],
        _ => vec![-0.1, -0.1, -0.7, -0.2],
    });
    let cfg = cfg().with_beam_size(3).with_max_len(2);
    let nbest = beam_search(&model, Rows::new(1), 1, &cfg)?;
    assert_eq!(
        model.calls(),
        vec![
            Call::Reorder(vec![0, 0, 0]),
            Call::Step(vec![BOS, BOS, BOS]),
            Call::Reorder(vec![0, 0, 0]),
            Call::Step(vec![A, PAD, PAD]),
        ]
    );
    let got: Vec<(Vec<u32>, bool)> = nbest[0]
        .iter()
        .map(|h| (h.tokens.clone(), h.finished))
        .collect();
    // A A (cut, -0.7 / 2), A EOS (-1.2 / 2), EOS (-1.0 / 1).
    assert_eq!(
        got,
        vec![(vec![A, A], false), (vec![A], true), (vec![], true)]
    );
    for h in &nbest[0] {
        model.check(0, h, &cfg);
    }
    Ok(())
}

#[test]
fn max_len_cuts_unfinished_sequences() -> Result<()> {
    let never_ends = || {
        PrefixModel::new(6, |_, _| {
            row(6, -9.0, &[(A, -0.1), (B, -0.3), (C, -0.4), (EOS, -5.0)])
        })
    };
    let cfg = cfg().with_max_len(3);
    let model = never_ends();
    let g = greedy(&model, &mut Rows::new(2), 2, &cfg)?;
    for h in &g {
        assert_eq!(h.tokens, vec![A, A, A]);
        assert!(!h.finished);
        assert_eq!(h.log_prob, lp_sum(&[-0.1, -0.1, -0.1]));
        assert_eq!(h.score, h.log_prob / 3.0);
    }
    assert_eq!(model.calls().len(), 3, "three steps, no reorder");

    let model = never_ends();
    let beam_cfg = cfg.with_beam_size(2);
    let nbest = beam_search(&model, Rows::new(2), 2, &beam_cfg)?;
    for (i, list) in nbest.iter().enumerate() {
        assert_eq!(list.len(), 2);
        assert_eq!(list[0].tokens, vec![A, A, A]);
        for h in list {
            assert!(!h.finished);
            model.check(i, h, &beam_cfg);
        }
    }

    let model = never_ends();
    let one = cfg.with_max_len(1);
    let g = greedy(&model, &mut Rows::new(1), 1, &one)?;
    assert_eq!((g[0].tokens.clone(), g[0].finished), (vec![A], false));
    Ok(())
}

#[test]
fn pad_and_bos_are_never_generated() -> Result<()> {
    // The model prefers PAD and BOS everywhere.
    let model = PrefixModel::new(6, |_, prefix| {
        let eos = if prefix.len() >= 3 { -0.5 } else { -4.0 };
        vec![-0.01, -0.02, eos, -1.0, -1.5, -2.0]
    });
    let cfg = cfg().with_max_len(5);
    let g = greedy(&model, &mut Rows::new(2), 2, &cfg)?;
    for h in &g {
        assert_eq!(h.tokens, vec![A, A]);
        assert!(h.finished);
        model.check(0, h, &cfg);
    }
    let beam_cfg = cfg.with_beam_size(4);
    let nbest = beam_search(&model, Rows::new(2), 2, &beam_cfg)?;
    for list in &nbest {
        assert_eq!(list.len(), 4);
        for h in list {
            model.check(0, h, &beam_cfg);
        }
    }

    // PAD == EOS (or BOS == EOS): EOS wins, and may be generated.
    for cfg in [
        SearchConfig::new(BOS, PAD, PAD),
        SearchConfig::new(BOS, BOS, PAD),
    ] {
        let g = greedy(&model, &mut Rows::new(1), 1, &cfg)?;
        assert_eq!(g[0].tokens, Vec::<u32>::new());
        assert!(g[0].finished);
        let b = beam_search(&model, Rows::new(1), 1, &cfg.with_beam_size(2))?;
        assert_eq!(b[0][0], g[0]);
    }
    Ok(())
}

/// EOS right away costs 1.0; A A EOS costs 1.5 over three tokens.
fn short_or_long() -> PrefixModel {
    PrefixModel::new(6, |_, prefix| match prefix {
        [BOS] => row(6, -9.0, &[(EOS, -1.0), (A, -1.2), (B, -5.0)]),
        [BOS, A] => row(6, -9.0, &[(A, -0.1), (EOS, -3.0), (B, -6.0)]),
        [BOS, A, A] => row(6, -9.0, &[(EOS, -0.2), (A, -4.0), (B, -6.0)]),
        _ => row(6, -9.0, &[(EOS, -0.5)]),
    })
}

#[test]
fn length_penalty_changes_the_winner() -> Result<()> {
    let cfg = cfg().with_beam_size(2).with_max_len(4);
    let short_lp = lp_sum(&[-1.0]);
    let long_lp = lp_sum(&[-1.2, -0.1, -0.2]);

    let model = short_or_long();
    let flat = beam_search(&model, Rows::new(1), 1, &cfg.with_length_penalty(0.0))?;
    assert_eq!(flat[0][0].tokens, Vec::<u32>::new());
    assert_eq!(flat[0][0].score, short_lp);
    assert_eq!(flat[0][1].tokens, vec![A, A]);
    assert_eq!(flat[0][1].score, long_lp);

    let model = short_or_long();
    let normed = beam_search(&model, Rows::new(1), 1, &cfg.with_length_penalty(1.0))?;
    assert_eq!(normed[0][0].tokens, vec![A, A]);
    assert_eq!(normed[0][0].score, long_lp / 3.0);
    assert_eq!(normed[0][1].tokens, Vec::<u32>::new());
    assert_eq!(normed[0][1].score, short_lp);
    for h in &normed[0] {
        assert!(h.finished);
        model.check(0, h, &cfg);
    }
    // Greedy does not look ahead: it stops at once.
    let g = greedy(&model, &mut Rows::new(1), 1, &cfg)?;
    assert_eq!(g[0].tokens, Vec::<u32>::new());
    Ok(())
}

#[test]
fn beam_one_matches_greedy_when_sums_round() -> Result<()> {
    // After a huge first cost, -0.5 and -0.25 round to the same total: the better token still
    // wins, as in greedy.
    let model = PrefixModel::new(6, |_, prefix| match prefix {
        [BOS] => row(6, -1e18, &[(A, -1e17)]),
        [BOS, A] => row(6, -9.0, &[(B, -0.5), (C, -0.25)]),
        _ => row(6, -9.0, &[(EOS, -0.1)]),
    });
    let cfg = cfg();
    let g = greedy(&model, &mut Rows::new(1), 1, &cfg)?;
    assert_eq!(g[0].tokens, vec![A, C]);
    let b = beam_search(&model, Rows::new(1), 1, &cfg)?;
    assert_eq!(b[0], g);
    Ok(())
}

#[test]
fn empty_batch_does_not_call_the_model() -> Result<()> {
    let model = greedy_trap();
    assert!(greedy(&model, &mut Rows::new(0), 0, &cfg())?.is_empty());
    assert!(beam_search(&model, Rows::new(0), 0, &cfg().with_beam_size(3))?.is_empty());
    assert!(model.calls().is_empty());
    Ok(())
}

fn expect_err<T: std::fmt::Debug>(r: Result<T>, needles: &[&str]) {
    let msg = r.expect_err("expected an error").to_string();
    for n in needles {
        assert!(msg.contains(n), "{msg:?} should mention {n:?}");
    }
}

#[test]
fn bad_configs_are_errors() {
    let model = greedy_trap();
    let bad = [
        (cfg().with_beam_size(0), "beam_size"),
        (cfg().with_max_len(0), "max_len"),
        (cfg().with_length_penalty(f64::NAN), "length_penalty"),
        (cfg().with_length_penalty(f64::INFINITY), "length_penalty"),
    ];
    for (c, what) in bad {
        expect_err(greedy(&model, &mut Rows::new(1), 1, &c), &[what]);
        expect_err(beam_search(&model, Rows::new(1), 1, &c), &[what]);
    }
    assert!(model.calls().is_empty(), "checked before calling the model");

    for (c, what) in [
        (SearchConfig::new(6, EOS, PAD), "bos_id 6"),
        (SearchConfig::new(BOS, 10, PAD), "eos_id 10"),
        (SearchConfig::new(BOS, EOS, 7), "pad_id 7"),
    ] {
        expect_err(
            greedy(&model, &mut Rows::new(1), 1, &c),
            &[what, "vocabulary of 6"],
        );
        expect_err(
            beam_search(&model, Rows::new(1), 1, &c.with_beam_size(2)),
            &[what, "vocabulary of 6"],
        );
    }
}

/// A model that returns `row` for every token fed, plus `extra_rows` more rows.
struct Fixed {
    row: Vec<f32>,
    extra_rows: usize,
}

impl Fixed {
    fn new(row: Vec<f32>) -> Self {
        Self { row, extra_rows: 0 }
    }
}

impl StepDecoder for Fixed {
    type State = ();
    fn step(&self, _: &mut (), tokens: &[u32]) -> Result<Tensor> {
        let rows = tokens.len() + self.extra_rows;
        let data = self.row.repeat(rows);
        Tensor::from_vec(data, (rows, self.row.len()), &Device::Cpu)
    }
    fn reorder(&self, _: &mut (), _: &[u32]) -> Result<()> {
        Ok(())
    }
}

#[test]
fn bad_model_outputs_are_errors() {
    let cfg = cfg();
    let beam = cfg.with_beam_size(2);
    let wrong_rows = Fixed {
        row: vec![0.0; 6],
        extra_rows: 1,
    };
    expect_err(
        greedy(&wrong_rows, &mut (), 1, &cfg),
        &["fed 1 tokens", "2 rows"],
    );
    expect_err(
        beam_search(&wrong_rows, (), 1, &beam),
        &["fed 2 tokens", "3 rows"],
    );
    let nan = Fixed::new(vec![-1.0, -1.0, -1.0, f32::NAN, -1.0, -1.0]);
    expect_err(greedy(&nan, &mut (), 1, &cfg), &["NaN", "token 3"]);
    expect_err(beam_search(&nan, (), 1, &beam), &["NaN", "token 3"]);
    let plus_inf = Fixed::new(vec![-1.0, -1.0, -1.0, f32::INFINITY, -1.0, -1.0]);
    expect_err(greedy(&plus_inf, &mut (), 1, &cfg), &["inf", "token 3"]);
    let impossible = Fixed::new(vec![0.0, 0.0, NINF, NINF, NINF, NINF]);
    expect_err(
        greedy(&impossible, &mut (), 1, &cfg),
        &["-inf", "batch item 0"],
    );
    expect_err(
        beam_search(&impossible, (), 1, &beam),
        &["-inf", "batch item 0"],
    );
    struct Rank3;
    impl StepDecoder for Rank3 {
        type State = ();
        fn step(&self, _: &mut (), t: &[u32]) -> Result<Tensor> {
            Tensor::zeros((t.len(), 1, 6), candle::DType::F32, &Device::Cpu)
        }
        fn reorder(&self, _: &mut (), _: &[u32]) -> Result<()> {
            Ok(())
        }
    }
    expect_err(greedy(&Rank3, &mut (), 1, &cfg), &["(rows, vocab)"]);
}

#[test]
fn other_dtypes_are_accepted() -> Result<()> {
    struct Half;
    impl StepDecoder for Half {
        type State = ();
        fn step(&self, _: &mut (), t: &[u32]) -> Result<Tensor> {
            let rows: Vec<Vec<f32>> = t
                .iter()
                .map(|&x| {
                    if x == BOS {
                        vec![-9., -9., -2., -0.5]
                    } else {
                        vec![-9., -9., -0.25, -1.]
                    }
                })
                .collect();
            Tensor::new(rows, &Device::Cpu)?.to_dtype(candle::DType::BF16)
        }
        fn reorder(&self, _: &mut (), _: &[u32]) -> Result<()> {
            Ok(())
        }
    }
    let g = greedy(&Half, &mut (), 1, &cfg())?;
    assert_eq!(g[0].tokens, vec![A]);
    assert_eq!(g[0].log_prob, -0.75);
    Ok(())
}

/// A random model: log-probabilities indexed by (source, position mod 3, last token, next).
fn table_model(vocab: usize, table: Vec<f32>) -> PrefixModel {
    PrefixModel::new(vocab, move |src, prefix| {
        let last = *prefix.last().unwrap() as usize;
        let pos = (prefix.len() - 1) % 3;
        let at = ((src * 3 + pos) * vocab + last) * vocab;
        table[at..at + vocab].to_vec()
    })
}

fn table_case(
    levels: &'static [f32],
) -> impl Strategy<Value = (usize, usize, Vec<f32>, (u32, u32, u32), usize, f64)> {
    (1usize..4, 3usize..7).prop_flat_map(move |(batch, vocab)| {
        let v = vocab as u32;
        (
            Just(batch),
            Just(vocab),
            prop::collection::vec(prop::sample::select(levels), batch * 3 * vocab * vocab),
            (0..v, 0..v, 0..v),
            1usize..7,
            prop::sample::select(&[0.0, 0.6, 1.0, 2.0][..]),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Coarse levels make ties common, so this also checks that both break them alike.
    #[test]
    fn beam_width_one_is_greedy(
        (batch, vocab, table, (bos, eos, pad), max_len, penalty) in
            table_case(&[-0.25, -0.5, -1.0, -2.0, -4.0, NINF])
    ) {
        let cfg = SearchConfig::new(bos, eos, pad)
            .with_max_len(max_len)
            .with_length_penalty(penalty);
        let model = table_model(vocab, table);
        let g = greedy(&model, &mut Rows::new(batch), batch, &cfg);
        let b = beam_search(&model, Rows::new(batch), batch, &cfg);
        match (g, b) {
            (Ok(g), Ok(b)) => {
                prop_assert_eq!(b.len(), batch);
                for (i, (gh, bl)) in g.iter().zip(&b).enumerate() {
                    prop_assert_eq!(bl.len(), 1);
                    prop_assert_eq!(gh, &bl[0]);
                    model.check(i, gh, &cfg);
                }
            }
            (Err(_), Err(_)) => {}
            (g, b) => prop_assert!(false, "greedy {:?} but beam {:?}", g, b),
        }
    }

    /// A beam wider than the number of sequences never prunes: it returns every possible
    /// sequence, sorted by score.
    #[test]
    fn wide_beam_returns_every_sequence(
        table in prop::collection::vec(prop::sample::select(&[-0.25f32, -0.5, -1.0, -2.0, -3.0][..]), 3 * 5 * 5),
        max_len in 1usize..5,
        penalty in prop::sample::select(&[0.0, 1.0, 2.0][..]),
    ) {
        // Vocabulary PAD, BOS, EOS, A, B: at most 2^4 live prefixes, 3 candidates each.
        let cfg = cfg().with_beam_size(48).with_max_len(max_len).with_length_penalty(penalty);
        let model = table_model(5, table);
        let got = beam_search(&model, Rows::new(1), 1, &cfg)?;
        let mut expected = Vec::new();
        let mut prefixes: Vec<Vec<u32>> = vec![vec![]];
        for len in 1..=max_len {
            let mut next = Vec::new();
            for p in prefixes {
                expected.push(Hypothesis { tokens: p.clone(), log_prob: 0.0, score: 0.0, finished: true });
                for t in [A, B] {
                    let mut q = p.clone();
                    q.push(t);
                    if len == max_len {
                        expected.push(Hypothesis { tokens: q, log_prob: 0.0, score: 0.0, finished: false });
                    } else {
                        next.push(q);
                    }
                }
            }
            prefixes = next;
        }
        for h in &mut expected {
            h.log_prob = model.rescore(0, h, &cfg);
            h.score = cfg.normalized_score(h.log_prob, h.tokens.len() + usize::from(h.finished));
        }
        let key = |h: &Hypothesis| (h.tokens.clone(), h.finished);
        expected.sort_by(|a, b| b.score.total_cmp(&a.score).then(key(a).cmp(&key(b))));
        let mut sorted = got[0].clone();
        prop_assert!(sorted.windows(2).all(|w| w[0].score >= w[1].score));
        sorted.sort_by(|a, b| b.score.total_cmp(&a.score).then(key(a).cmp(&key(b))));
        prop_assert_eq!(sorted, expected);
    }

    /// Sentences are searched independently: a batch gives what one sentence at a time gives,
    /// which also checks that every reorder moved the right rows.
    #[test]
    fn batched_beam_search_matches_one_sentence_at_a_time(
        (batch, vocab, table, (bos, eos, pad), max_len, penalty) in
            table_case(&[-0.3, -0.7, -1.1, -1.9, -2.3, -3.7]),
        beam in 2usize..5,
    ) {
        let cfg = SearchConfig::new(bos, eos, pad)
            .with_beam_size(beam)
            .with_max_len(max_len)
            .with_length_penalty(penalty);
        let model = table_model(vocab, table);
        let together = beam_search(&model, Rows::new(batch), batch, &cfg)?;
        for (i, list) in together.iter().enumerate() {
            let alone = beam_search(&model, Rows::with_src(vec![i]), 1, &cfg)?;
            prop_assert_eq!(list, &alone[0]);
            prop_assert!(!list.is_empty() && list.len() <= beam);
            prop_assert!(list.windows(2).all(|w| w[0].score >= w[1].score));
            for h in list {
                model.check(i, h, &cfg);
            }
        }
    }
}
