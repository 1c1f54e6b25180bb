//! The one generation engine (`candle_attention::generation`) on hand-built step models with
//! known transition log-probabilities: what it feeds the model, when it reorders and drops
//! rows, and that every hypothesis's scores are what its tokens cost. (Token-for-token parity
//! with transformers is `tests/generation.rs` and the Marian suites; these check the
//! mechanics with models small enough to reason about.)

use candle::{Device, Result, Tensor};
use candle_attention::generation::{
    generate, generate_hypotheses, GenerationConfig, Hypothesis, StepDecoder,
};
use proptest::prelude::*;
use std::cell::RefCell;

const PAD: u32 = 0;
const BOS: u32 = 1;
const EOS: u32 = 2;
const A: u32 = 3;
const B: u32 = 4;
const C: u32 = 5;

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

    /// Teacher-forced log-probability of a hypothesis, summed in `f32` in the order of the
    /// search (as transformers accumulates it).
    fn rescore(&self, src: usize, hyp: &Hypothesis) -> f32 {
        let mut lp = 0f32;
        for i in 1..hyp.tokens.len() {
            lp += (self.dist)(src, &hyp.tokens[..i])[hyp.tokens[i] as usize];
        }
        lp
    }

    /// Checks everything a hypothesis promises under `cfg` (start token, length limit,
    /// banned tokens, scores).
    fn check(&self, src: usize, hyp: &Hypothesis, cfg: &GenerationConfig) {
        assert_eq!(
            hyp.tokens[0],
            cfg.decoder_start_token_id.unwrap(),
            "{hyp:?}"
        );
        assert_eq!(hyp.log_prob, self.rescore(src, hyp), "{hyp:?}");
        let generated = hyp.tokens.len() - 1;
        let max_new = cfg.max_new_tokens.unwrap();
        assert!((1..=max_new).contains(&generated), "{hyp:?}");
        let eos = &cfg.eos_token_id.as_ref().unwrap()[..];
        assert_eq!(hyp.ended_with_eos, eos.contains(hyp.tokens.last().unwrap()));
        if !hyp.ended_with_eos {
            assert_eq!(generated, max_new, "{hyp:?}");
        }
        let penalty = cfg.length_penalty.unwrap_or(1.0);
        assert_eq!(
            hyp.score,
            hyp.log_prob / (generated as f64).powf(penalty) as f32
        );
        for &t in &hyp.tokens[1..hyp.tokens.len() - usize::from(hyp.ended_with_eos)] {
            assert!(!eos.contains(&t), "{hyp:?}");
            for banned in cfg.bad_words_ids.iter().flatten() {
                assert!(
                    banned.len() != 1 || banned[0] != t || eos.contains(&t),
                    "{hyp:?}"
                );
            }
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

/// The rules of a translation model like the shipped number translator: start from BOS, end
/// at EOS, PAD and BOS never generated, `max_new` tokens at most.
fn rules(bos: u32, eos: u32, pad: u32, max_new: usize) -> GenerationConfig {
    GenerationConfig {
        decoder_start_token_id: Some(bos),
        eos_token_id: Some(vec![eos]),
        pad_token_id: Some(pad),
        bad_words_ids: Some(vec![vec![pad], vec![bos]]),
        max_new_tokens: Some(max_new),
        ..Default::default()
    }
}

fn cfg() -> GenerationConfig {
    rules(BOS, EOS, PAD, 128)
}

fn ln(p: f32) -> f32 {
    p.ln()
}

fn hyps<M: StepDecoder>(
    model: &M,
    state: M::State,
    batch: usize,
    cfg: &GenerationConfig,
) -> Result<Vec<Vec<Hypothesis>>> {
    generate_hypotheses(model, state, batch, cfg)
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
    let got = hyps(&model, Rows::new(1), 1, &cfg)?;
    let lp = -0.5f32 + -0.2 + -0.3 + -0.1;
    assert_eq!(
        got,
        vec![vec![Hypothesis {
            tokens: vec![BOS, A, B, C, EOS],
            log_prob: lp,
            score: lp / 4.0,
            ended_with_eos: true
        }]]
    );
    assert_eq!(got[0][0].generated(), &[A, B, C]);
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
    let g = hyps(&model, Rows::new(1), 1, &cfg)?;
    let greedy_lp = ln(0.6) + ln(0.4);
    assert_eq!(g[0][0].tokens, vec![BOS, A, EOS]);
    assert_eq!(g[0][0].log_prob, greedy_lp);
    assert_eq!(g[0][0].score, greedy_lp / 2.0);

    let model = greedy_trap();
    let two = cfg.clone().with_num_beams(2).with_num_return_sequences(2);
    let nbest = hyps(&model, Rows::new(1), 1, &two)?;
    let best_lp = ln(0.4) + ln(0.9);
    assert_eq!(
        nbest,
        vec![vec![
            Hypothesis {
                tokens: vec![BOS, B, EOS],
                log_prob: best_lp,
                score: best_lp / 2.0,
                ended_with_eos: true
            },
            Hypothesis {
                tokens: vec![BOS, A, EOS],
                log_prob: greedy_lp,
                score: greedy_lp / 2.0,
                ended_with_eos: true
            },
        ]]
    );
    assert!((best_lp - 0.36f32.ln()).abs() < 1e-6);
    // The first step reads the item's one row for both beams; then both live beams are
    // expanded from it; the search stops when the item is settled.
    let calls = model.calls();
    assert_eq!(calls[0], Call::Step(vec![BOS]));
    assert_eq!(calls[1], Call::Reorder(vec![0, 0]));
    assert_eq!(calls[2], Call::Step(vec![A, B]));
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
fn greedy_batch_drops_finished_rows() -> Result<()> {
    let script = vec![vec![A, EOS], vec![A, B, C, EOS], vec![B, B, EOS]];
    let model = scripted(script.clone());
    let cfg = cfg();
    let got = hyps(&model, Rows::new(3), 3, &cfg)?;
    for (i, h) in got.iter().enumerate() {
        assert_eq!(
            h[0].generated(),
            &script[i][..script[i].len() - 1],
            "item {i}"
        );
        assert!(h[0].ended_with_eos);
        model.check(i, &h[0], &cfg);
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
    // generate() gives the same sequences, without the scores.
    let model = scripted(script.clone());
    let seqs = generate(&model, Rows::new(3), 3, &cfg)?;
    let want: Vec<Vec<u32>> = got.iter().map(|h| h[0].tokens.clone()).collect();
    assert_eq!(seqs, want);

    let model = scripted(script.clone());
    let beam = cfg.with_num_beams(2).with_num_return_sequences(2);
    let nbest = hyps(&model, Rows::new(3), 3, &beam)?;
    for (i, list) in nbest.iter().enumerate() {
        assert_eq!(list.len(), 2);
        assert_eq!(
            list[0].generated(),
            &script[i][..script[i].len() - 1],
            "item {i}"
        );
        assert!(list[0].score >= list[1].score);
        for h in list {
            model.check(i, h, &beam);
        }
    }
    // Every step after the first feeds two rows per item still being searched, and no more.
    let step_sizes: Vec<usize> = model
        .calls()
        .iter()
        .filter_map(|c| match c {
            Call::Step(t) => Some(t.len()),
            Call::Reorder(_) => None,
        })
        .collect();
    assert_eq!(step_sizes[0], 3, "one row per item at the first step");
    assert!(
        step_sizes[1..].iter().all(|&n| n % 2 == 0),
        "{step_sizes:?}"
    );
    assert!(
        step_sizes[1..].windows(2).all(|w| w[1] <= w[0]),
        "{step_sizes:?}"
    );
    Ok(())
}

#[test]
fn max_length_cuts_unfinished_sequences() -> Result<()> {
    let never_ends = || {
        PrefixModel::new(6, |_, _| {
            row(6, -9.0, &[(A, -0.1), (B, -0.3), (C, -0.4), (EOS, -5.0)])
        })
    };
    let cfg = rules(BOS, EOS, PAD, 3);
    let model = never_ends();
    let g = hyps(&model, Rows::new(2), 2, &cfg)?;
    for h in &g {
        assert_eq!(h[0].tokens, vec![BOS, A, A, A]);
        assert!(!h[0].ended_with_eos);
        assert_eq!(h[0].log_prob, -0.1f32 + -0.1 + -0.1);
        model.check(0, &h[0], &cfg);
    }
    assert_eq!(model.calls().len(), 3, "three steps, no reorder");

    let model = never_ends();
    let beam = cfg.clone().with_num_beams(2).with_num_return_sequences(2);
    let nbest = hyps(&model, Rows::new(2), 2, &beam)?;
    for (i, list) in nbest.iter().enumerate() {
        assert_eq!(list.len(), 2);
        assert_eq!(list[0].tokens, vec![BOS, A, A, A]);
        for h in list {
            assert!(!h.ended_with_eos);
            model.check(i, h, &beam);
        }
    }

    let model = never_ends();
    let g = hyps(&model, Rows::new(1), 1, &rules(BOS, EOS, PAD, 1))?;
    assert_eq!(
        (g[0][0].tokens.clone(), g[0][0].ended_with_eos),
        (vec![BOS, A], false)
    );
    Ok(())
}

#[test]
fn banned_tokens_are_never_generated_unless_they_are_eos() -> Result<()> {
    // The model prefers PAD and BOS everywhere.
    let model = PrefixModel::new(6, |_, prefix| {
        let eos = if prefix.len() >= 3 { -0.5 } else { -4.0 };
        vec![-0.01, -0.02, eos, -1.0, -1.5, -2.0]
    });
    let cfg = rules(BOS, EOS, PAD, 5);
    let g = hyps(&model, Rows::new(2), 2, &cfg)?;
    for h in &g {
        assert_eq!(h[0].generated(), &[A, A]);
        assert!(h[0].ended_with_eos);
        model.check(0, &h[0], &cfg);
    }
    let beam = cfg.with_num_beams(4).with_num_return_sequences(4);
    let nbest = hyps(&model, Rows::new(2), 2, &beam)?;
    for list in &nbest {
        assert_eq!(list.len(), 4);
        for h in list {
            model.check(0, h, &beam);
        }
    }
    // PAD == EOS (or BOS == EOS): EOS wins, and may be generated.
    for cfg in [rules(BOS, PAD, PAD, 5), rules(BOS, BOS, PAD, 5)] {
        let g = hyps(&model, Rows::new(1), 1, &cfg)?;
        assert_eq!(g[0][0].generated(), &[] as &[u32]);
        assert!(g[0][0].ended_with_eos);
        let b = hyps(&model, Rows::new(1), 1, &cfg.clone().with_num_beams(2))?;
        assert_eq!(b[0][0].tokens, g[0][0].tokens);
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
    let base = rules(BOS, EOS, PAD, 4)
        .with_num_beams(2)
        .with_num_return_sequences(2);
    let short_lp = -1.0f32;
    let long_lp = -1.2f32 + -0.1 + -0.2;

    let model = short_or_long();
    let flat = hyps(
        &model,
        Rows::new(1),
        1,
        &base.clone().with_length_penalty(0.0),
    )?;
    assert_eq!(flat[0][0].tokens, vec![BOS, EOS]);
    assert_eq!(flat[0][0].score, short_lp);
    assert_eq!(flat[0][1].tokens, vec![BOS, A, A, EOS]);
    assert_eq!(flat[0][1].score, long_lp);

    let model = short_or_long();
    let normed_cfg = base.with_length_penalty(1.0);
    let normed = hyps(&model, Rows::new(1), 1, &normed_cfg)?;
    assert_eq!(normed[0][0].tokens, vec![BOS, A, A, EOS]);
    assert_eq!(normed[0][0].score, long_lp / 3.0);
    assert_eq!(normed[0][1].tokens, vec![BOS, EOS]);
    assert_eq!(normed[0][1].score, short_lp);
    for h in &normed[0] {
        assert!(h.ended_with_eos);
        model.check(0, h, &normed_cfg);
    }
    // Greedy does not look ahead: it stops at once.
    let g = hyps(&model, Rows::new(1), 1, &rules(BOS, EOS, PAD, 4))?;
    assert_eq!(g[0][0].tokens, vec![BOS, EOS]);
    Ok(())
}

#[test]
fn empty_batch_does_not_call_the_model() -> Result<()> {
    let model = greedy_trap();
    assert!(hyps(&model, Rows::new(0), 0, &cfg())?.is_empty());
    assert!(hyps(&model, Rows::new(0), 0, &cfg().with_num_beams(3))?.is_empty());
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
fn bad_configs_are_errors_before_the_model_is_called() {
    let model = greedy_trap();
    for (c, what) in [
        (cfg().with_num_beams(0), "num_beams"),
        (cfg().with_max_new_tokens(0), "max_new_tokens"),
        (cfg().with_length_penalty(f64::NAN), "length_penalty"),
        (cfg().with_length_penalty(f64::INFINITY), "length_penalty"),
        (
            cfg().with_num_beams(2).with_num_return_sequences(3),
            "num_return_sequences",
        ),
    ] {
        expect_err(hyps(&model, Rows::new(1), 1, &c), &[what]);
    }
    assert!(model.calls().is_empty(), "checked before calling the model");

    for (c, what) in [
        (rules(6, EOS, PAD, 4), "decoder_start_token_id 6"),
        (rules(BOS, EOS, 7, 4), "bad_words_ids 7"),
    ] {
        expect_err(
            hyps(&model, Rows::new(1), 1, &c),
            &[what, "vocabulary of 6"],
        );
        expect_err(
            hyps(&model, Rows::new(1), 1, &c.with_num_beams(2)),
            &[what, "vocabulary of 6"],
        );
    }
}

/// A model that returns `row` for every token fed, plus `extra_rows` more rows.
struct Fixed {
    row: Vec<f32>,
    extra_rows: usize,
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
    let wrong_rows = Fixed {
        row: vec![0.0; 6],
        extra_rows: 1,
    };
    expect_err(hyps(&wrong_rows, (), 1, &cfg), &["fed 1 tokens", "2 rows"]);
    expect_err(
        hyps(&wrong_rows, (), 1, &cfg.clone().with_num_beams(2)),
        &["fed 1 tokens", "2 rows"],
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
    expect_err(hyps(&Rank3, (), 1, &cfg), &["(rows, vocab)"]);
    // Too small a vocabulary for the 2 × num_beams candidates transformers keeps.
    let tiny = Fixed {
        row: vec![0.0],
        extra_rows: 0,
    };
    expect_err(
        hyps(&tiny, (), 1, &rules(0, 0, 0, 3).with_num_beams(2)),
        &["candidates"],
    );
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
    let g = hyps(&Half, (), 1, &cfg())?;
    assert_eq!(g[0][0].tokens, vec![BOS, A, EOS]);
    assert_eq!(g[0][0].log_prob, -0.75);
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
    (1usize..4, 5usize..8).prop_flat_map(move |(batch, vocab)| {
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

    /// Greedy: every hypothesis's scores are what its tokens cost, every rule holds, and a
    /// batch gives what one sentence at a time gives (so every row drop moved the right rows).
    #[test]
    fn greedy_batches_match_single_sentences(
        (batch, vocab, table, (bos, eos, pad), max_new, penalty) in
            table_case(&[-0.25, -0.5, -1.0, -2.0, -4.0])
    ) {
        let cfg = rules(bos, eos, pad, max_new).with_length_penalty(penalty);
        let model = table_model(vocab, table);
        let together = hyps(&model, Rows::new(batch), batch, &cfg)?;
        for (i, list) in together.iter().enumerate() {
            prop_assert_eq!(list.len(), 1);
            model.check(i, &list[0], &cfg);
            let alone = hyps(&model, Rows::with_src(vec![i]), 1, &cfg)?;
            prop_assert_eq!(list, &alone[0]);
        }
    }

    /// Beam search: sentences are searched independently (a batch gives what one sentence at a
    /// time gives, which also checks that every reorder moved the right rows), hypotheses come
    /// best first, and their scores are what their tokens cost.
    #[test]
    fn batched_beam_search_matches_one_sentence_at_a_time(
        (batch, vocab, table, (bos, eos, pad), max_new, penalty) in
            table_case(&[-0.3, -0.7, -1.1, -1.9, -2.3, -3.7]),
        beam in 2usize..4,
    ) {
        let cfg = rules(bos, eos, pad, max_new)
            .with_num_beams(beam)
            .with_num_return_sequences(beam)
            .with_length_penalty(penalty);
        let model = table_model(vocab, table);
        let together = hyps(&model, Rows::new(batch), batch, &cfg)?;
        for (i, list) in together.iter().enumerate() {
            let alone = hyps(&model, Rows::with_src(vec![i]), 1, &cfg)?;
            prop_assert_eq!(list, &alone[0]);
            prop_assert_eq!(list.len(), beam);
            prop_assert!(list.windows(2).all(|w| w[0].score >= w[1].score));
            for h in list {
                model.check(i, h, &cfg);
            }
        }
    }
}
