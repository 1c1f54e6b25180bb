//! Each search rule on a hand-made model whose log-probabilities are looked up by the whole
//! decoder prefix; the expected sequences are worked out in the comments.

use super::*;
use candle::{Device, Tensor};
use std::cell::RefCell;
use std::collections::HashMap;

const EOS: u32 = 0;
const A: u32 = 1;
const B: u32 = 2;
/// Decoder start and padding (banned as a bad word, as in Marian).
const S: u32 = 3;

/// Log-probabilities by (item, prefix with the start token); other prefixes get `default`.
struct PrefixModel {
    table: HashMap<(usize, Vec<u32>), [f32; 4]>,
    default: [f32; 4],
    /// The number of rows fed at each step.
    fed: RefCell<Vec<usize>>,
    reorders: RefCell<Vec<Vec<u32>>>,
}

/// One `(item, prefix)` per row.
type Rows = Vec<(usize, Vec<u32>)>;

impl PrefixModel {
    /// `entries`: (item, prefix, [eos, a, b, start]).
    fn new(entries: &[(usize, &[u32], [f32; 4])], default: [f32; 4]) -> Self {
        Self {
            table: entries
                .iter()
                .map(|(i, p, row)| ((*i, p.to_vec()), *row))
                .collect(),
            default,
            fed: RefCell::new(Vec::new()),
            reorders: RefCell::new(Vec::new()),
        }
    }

    fn state(batch: usize) -> Rows {
        (0..batch).map(|i| (i, Vec::new())).collect()
    }
}

impl StepDecoder for PrefixModel {
    type State = Rows;

    fn step(&self, state: &mut Rows, tokens: &[u32]) -> Result<Tensor> {
        assert_eq!(state.len(), tokens.len(), "one token per row");
        self.fed.borrow_mut().push(tokens.len());
        let mut out = Vec::new();
        for ((item, prefix), &t) in state.iter_mut().zip(tokens) {
            prefix.push(t);
            let row = self
                .table
                .get(&(*item, prefix.clone()))
                .unwrap_or(&self.default);
            out.extend_from_slice(row);
        }
        Tensor::from_vec(out, (tokens.len(), 4), &Device::Cpu)
    }

    fn reorder(&self, state: &mut Rows, rows: &[u32]) -> Result<()> {
        self.reorders.borrow_mut().push(rows.to_vec());
        *state = rows.iter().map(|&r| state[r as usize].clone()).collect();
        Ok(())
    }
}

/// Marian-like ids (start = pad = 3, EOS 0, the start token a bad word) plus `extra`
/// (`, "key": value ...`), whose keys replace the base ones.
fn config(extra: &str) -> GenerationConfig {
    let mut base = serde_json::json!({
        "decoder_start_token_id": 3, "eos_token_id": 0, "pad_token_id": 3, "bad_words_ids": [[3]]
    });
    let extra: serde_json::Value = serde_json::from_str(&format!("{{\"_\": 0 {extra}}}")).unwrap();
    for (k, v) in extra.as_object().unwrap() {
        if k != "_" {
            base[k] = v.clone();
        }
    }
    GenerationConfig::from_json_str(&base.to_string()).unwrap()
}

fn run(model: &PrefixModel, batch: usize, cfg: &GenerationConfig) -> Vec<Vec<u32>> {
    generate(model, PrefixModel::state(batch), batch, cfg).unwrap()
}

#[test]
fn greedy_pads_finished_rows_and_drops_them_from_the_state() {
    let model = PrefixModel::new(
        &[
            (0, &[S], [-2.0, -0.1, -3.0, 0.0]),
            (0, &[S, A], [-0.1, -2.0, -3.0, 0.0]),
            (1, &[S], [-2.0, -0.1, -3.0, 0.0]),
            (1, &[S, A], [-2.0, -0.3, -1.0, 0.0]),
            (1, &[S, A, A], [-2.0, -3.0, -0.2, 0.0]),
        ],
        [-0.1, -2.0, -3.0, 0.0],
    );
    // The start token's log-probability 0 is the largest: the bad word keeps it out.
    let seqs = run(&model, 2, &config(""));
    assert_eq!(seqs, vec![vec![S, A, EOS], vec![S, A, A, B, EOS]]);
    assert_eq!(*model.fed.borrow(), vec![2, 2, 1, 1]);
    assert_eq!(*model.reorders.borrow(), vec![vec![1u32]]);
    let (ids, shape) = generate_padded(&model, PrefixModel::state(2), 2, &config("")).unwrap();
    assert_eq!(shape, (2, 5));
    assert_eq!(ids, vec![S, A, EOS, S, S, S, A, A, B, EOS]);
}

#[test]
fn greedy_length_limits() {
    let model = PrefixModel::new(
        &[(0, &[S], [-0.1, -1.0, -2.0, -9.0])],
        [-3.0, -0.5, -1.0, -9.0],
    );
    // EOS first unless banned for 2 new tokens; then A until max_new_tokens.
    assert_eq!(run(&model, 1, &config("")), vec![vec![S, EOS]]);
    let min2 = config("").with_min_new_tokens(2).with_max_new_tokens(4);
    assert_eq!(run(&model, 1, &min2), vec![vec![S, A, A, A, A]]);
    // min_length counts the start token: 2 bans EOS for the first token only.
    let min_len = config(r#", "min_length": 2, "max_length": 4"#);
    assert_eq!(run(&model, 1, &min_len), vec![vec![S, A, A, A]]);
    // Forced EOS at the last allowed step.
    let forced = config(r#", "min_length": 2, "max_length": 4, "forced_eos_token_id": 0"#);
    assert_eq!(run(&model, 1, &forced), vec![vec![S, A, A, EOS]]);
    // max_new_tokens wins over max_length.
    let both = config(r#", "min_length": 2, "max_length": 9"#).with_max_new_tokens(2);
    assert_eq!(run(&model, 1, &both), vec![vec![S, A, A]]);
}

#[test]
fn greedy_multi_token_bad_word_after_the_start_token() {
    let model = PrefixModel::new(&[], [-3.0, -0.5, -1.0, -9.0]);
    let cfg = config(r#", "bad_words_ids": [[3], [3, 1], [2, 1]], "max_length": 5"#);
    // A is banned right after the start token and after B: B forever.
    assert_eq!(run(&model, 1, &cfg), vec![vec![S, B, B, B, B]]);
    let cfg = config(r#", "bad_words_ids": [[3], [3, 1], [1, 1]], "max_length": 5"#);
    assert_eq!(run(&model, 1, &cfg), vec![vec![S, B, A, B, A]]);
}

/// The length-penalty table: `[S, EOS]` has total -1.0, `[S, A, EOS]` total -1.5.
fn penalty_model() -> PrefixModel {
    PrefixModel::new(
        &[
            (0, &[S], [-1.0, -0.5, -5.0, 0.0]),
            (0, &[S, A], [-1.0, -2.0, -5.0, 0.0]),
        ],
        [-3.0, -4.0, -4.5, 0.0],
    )
}

#[test]
fn beam_length_penalty_ranks_finished_hypotheses() {
    // lp 0: -1.0 beats -1.5. lp 1: -1.5 / 2 = -0.75 beats -1.0 / 1.
    let base = config(r#", "max_length": 10"#).with_num_beams(2);
    let lp0 = base.clone().with_length_penalty(0.0);
    assert_eq!(run(&penalty_model(), 1, &lp0), vec![vec![S, EOS]]);
    let lp1 = base.with_length_penalty(1.0);
    assert_eq!(run(&penalty_model(), 1, &lp1), vec![vec![S, A, EOS]]);
    // Both hypotheses, best first, padded like generate() pads them.
    let two = lp1.with_num_return_sequences(2);
    let (ids, shape) = generate_padded(&penalty_model(), PrefixModel::state(1), 1, &two).unwrap();
    assert_eq!((ids, shape), (vec![S, A, EOS, S, EOS, S], (2, 3)));
}

/// The early-stopping table (lp 1, 2 beams, max_length 10):
/// step 1 finishes `[S,EOS]` (-1.2); step 2 finishes `[S,A,EOS]` (-0.6 / 2 = -0.3): with
/// `true` both slots are full, stop. With `false` the best running beam `[S,A,A]` (-0.3 / 2)
/// can still win: step 3 finishes `[S,A,A,EOS]` (-0.6 / 3 = -0.2) and the running `[S,A,A,A]`
/// (-1.5 / 3 = -0.5) cannot beat the worst slot (-0.3): stop. With `"never"` the running beam
/// is judged at `max_length - 1 = 9` (-1.5 / 9 > -0.3), so it goes on through cheap `A`s
/// (-0.01 each) to the last step, where `[S, A x 9]` (-1.56 / 9 = -0.1733) wins.
fn early_model() -> PrefixModel {
    PrefixModel::new(
        &[
            (0, &[S], [-1.2, -0.1, -3.0, 0.0]),
            (0, &[S, A], [-0.5, -0.2, -4.0, 0.0]),
            (0, &[S, A, A], [-0.3, -1.2, -6.0, 0.0]),
        ],
        [-0.05, -0.01, -5.0, 0.0],
    )
}

#[test]
fn beam_early_stopping_variants() {
    let base = config(r#", "max_length": 10, "num_beams": 2"#);
    let cases = [
        (EarlyStopping::True, vec![S, A, EOS]),
        (EarlyStopping::False, vec![S, A, A, EOS]),
        (EarlyStopping::Never, vec![S, A, A, A, A, A, A, A, A, A]),
    ];
    for (es, want) in cases {
        let model = early_model();
        let got = run(&model, 1, &base.clone().with_early_stopping(es));
        assert_eq!(got, vec![want], "{es:?}");
    }
    // The default is `false`.
    assert_eq!(run(&early_model(), 1, &base), vec![vec![S, A, A, EOS]]);
}

#[test]
fn beam_forced_eos_at_the_last_step() {
    let cfg = config(r#", "max_length": 4, "num_beams": 2, "forced_eos_token_id": 0"#);
    let model = PrefixModel::new(&[], [-4.0, -0.5, -1.0, 0.0]);
    let got = run(&model, 1, &cfg);
    assert_eq!(got[0].len(), 4);
    assert_eq!(got[0][3], EOS);
    // Without forcing, sequences are cut at max_length without EOS.
    let cut = run(&model, 1, &config(r#", "max_length": 4, "num_beams": 2"#));
    assert_eq!(cut, vec![vec![S, A, A, A]]);
}

#[test]
fn beam_batch_drops_settled_items_and_matches_single_runs() {
    // Item 0 settles at step 2 (early_stopping true); item 1 runs on.
    let entries: [(usize, &[u32], [f32; 4]); 4] = [
        (0, &[S], [-1.2, -0.1, -3.0, 0.0]),
        (0, &[S, A], [-0.5, -0.2, -4.0, 0.0]),
        (0, &[S, A, A], [-0.3, -1.2, -6.0, 0.0]),
        (1, &[S], [-3.0, -0.1, -0.3, 0.0]),
    ];
    let model = PrefixModel::new(&entries, [-0.9, -0.4, -1.1, 0.0]);
    let cfg = config(r#", "max_length": 7, "num_beams": 2, "early_stopping": true"#);
    let both = run(&model, 2, &cfg);
    assert_eq!(both[0], vec![S, A, EOS]);
    // Rows fed: 2 items at step 1, then 2 beams each, then only item 1's beams.
    let fed = model.fed.borrow().clone();
    assert_eq!(fed[..2], [2, 4]);
    assert!(fed[2..].iter().all(|&n| n == 2), "{fed:?}");
    // The first reorder expands items to beams: both beams of item 0 come from row 0.
    assert_eq!(model.reorders.borrow()[0][..2], [0, 0]);
    // Item 1 alone gives the same sequence.
    let single = PrefixModel::new(
        &[(0, &[S], [-3.0, -0.1, -0.3, 0.0])],
        [-0.9, -0.4, -1.1, 0.0],
    );
    assert_eq!(run(&single, 1, &cfg)[0], both[1]);
}

#[test]
fn bad_model_output_and_ids_are_errors() {
    struct Wrong;
    impl StepDecoder for Wrong {
        type State = ();
        fn step(&self, _: &mut (), tokens: &[u32]) -> Result<Tensor> {
            Tensor::zeros((tokens.len() + 1, 4), candle::DType::F32, &Device::Cpu)
        }
        fn reorder(&self, _: &mut (), _: &[u32]) -> Result<()> {
            Ok(())
        }
    }
    let err = generate(&Wrong, (), 1, &config(""))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("returned log-probabilities for 2 rows"),
        "{err}"
    );

    let model = PrefixModel::new(&[], [-1.0, -1.0, -1.0, -1.0]);
    let cfg = config(r#", "forced_bos_token_id": 9"#);
    let err = generate(&model, PrefixModel::state(1), 1, &cfg)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("forced_bos_token_id 9") && err.contains("4 tokens"),
        "{err}"
    );
    // 4 EOS ids and 5 beams keep (1 + 4) * 5 = 25 candidates of 5 * 4.
    let cfg = config(r#", "num_beams": 5, "eos_token_id": [0, 1, 2, 3]"#);
    let err = generate(&model, PrefixModel::state(1), 1, &cfg)
        .unwrap_err()
        .to_string();
    assert!(err.contains("candidates"), "{err}");
    assert!(generate(&model, PrefixModel::state(0), 0, &config(""))
        .unwrap()
        .is_empty());
}

#[test]
fn pad_sequences_pads_to_the_longest() {
    let (ids, shape) = pad_sequences(&[vec![5, 1], vec![5, 2, 3, 0], vec![5]], 9);
    assert_eq!(shape, (3, 4));
    assert_eq!(ids, vec![5, 1, 9, 9, 5, 2, 3, 0, 5, 9, 9, 9]);
    assert_eq!(pad_sequences(&[], 9), (vec![], (0, 0)));
}
