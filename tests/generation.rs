//! `generate()` parity with `transformers` 5.24: every case of
//! `tests/fixtures/generation/generate_cases.json` (written by
//! `tests/fixtures/make_generation_fixtures.py`, which ran transformers' own `generate()`) is
//! replayed through `marian::generation::generate_padded` with the same deterministic model,
//! and the `(B, T')` sequences must be identical, padding included.

use candle::{Device, Result, Tensor};
use candle_attention::generation::StepDecoder;
use candle_attention::generation::{generate_padded, EarlyStopping, GenerationConfig};
use serde_json::Value;

/// The fixture's model: next-token log-probabilities `LOG_PROBS[h]`, where `h` hashes the
/// source item and the whole decoder prefix (decoder start token included).
struct TableModel {
    log_probs: Vec<f32>,
    vocab: usize,
    rows: u64,
    mul: u64,
    add: u64,
}

impl StepDecoder for TableModel {
    /// The running hash of each row.
    type State = Vec<u64>;

    fn step(&self, state: &mut Vec<u64>, tokens: &[u32]) -> Result<Tensor> {
        let mut out = Vec::with_capacity(tokens.len() * self.vocab);
        for (h, &t) in state.iter_mut().zip(tokens) {
            *h = (*h * self.mul + t as u64 + self.add) % self.rows;
            let r = *h as usize;
            out.extend_from_slice(&self.log_probs[r * self.vocab..(r + 1) * self.vocab]);
        }
        Tensor::from_vec(out, (tokens.len(), self.vocab), &Device::Cpu)
    }

    fn reorder(&self, state: &mut Vec<u64>, rows: &[u32]) -> Result<()> {
        *state = rows.iter().map(|&r| state[r as usize]).collect();
        Ok(())
    }
}

fn u(v: &Value) -> usize {
    v.as_u64().expect("non-negative integer") as usize
}

/// The file config plus `generate()`'s keyword arguments, through the public overrides.
fn config(case: &Value) -> GenerationConfig {
    let mut cfg = GenerationConfig::from_json_str(&case["file"].to_string()).unwrap();
    cfg.max_position_embeddings = Some(u(&case["max_position_embeddings"]));
    for (key, value) in case["overrides"].as_object().unwrap() {
        cfg = match key.as_str() {
            "num_beams" => cfg.with_num_beams(u(value)),
            "max_new_tokens" => cfg.with_max_new_tokens(u(value)),
            "min_new_tokens" => cfg.with_min_new_tokens(u(value)),
            "max_length" => cfg.with_max_length(u(value)),
            "num_return_sequences" => cfg.with_num_return_sequences(u(value)),
            "length_penalty" => cfg.with_length_penalty(value.as_f64().unwrap()),
            "early_stopping" => cfg.with_early_stopping(match value {
                Value::Bool(true) => EarlyStopping::True,
                Value::Bool(false) => EarlyStopping::False,
                _ => EarlyStopping::Never,
            }),
            other => panic!("fixture override {other} has no with_* method"),
        };
    }
    cfg
}

#[test]
fn generate_matches_transformers_token_for_token() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/generation/generate_cases.json"
    );
    let fixture: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let vocab = u(&fixture["vocab"]);
    let rows = fixture["rows"].as_u64().unwrap();
    let hash = &fixture["hash"];
    let log_probs: Vec<f32> = fixture["log_probs"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|row| {
            row.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
        })
        .collect();
    assert_eq!(log_probs.len(), rows as usize * vocab);
    let model = TableModel {
        log_probs,
        vocab,
        rows,
        mul: hash["mul"].as_u64().unwrap(),
        add: hash["add"].as_u64().unwrap(),
    };
    let (item_mul, item_add) = (
        hash["item_mul"].as_u64().unwrap(),
        hash["item_add"].as_u64().unwrap(),
    );

    let cases = fixture["cases"].as_array().unwrap();
    let (mut greedy, mut beam) = (0, 0);
    let mut mismatches = Vec::new();
    for case in cases {
        let cfg = config(case);
        if cfg.num_beams.unwrap_or(1) > 1 {
            beam += 1
        } else {
            greedy += 1
        }
        let items: Vec<u64> = case["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        let state: Vec<u64> = items
            .iter()
            .map(|&it| (it * item_mul + item_add) % rows)
            .collect();
        let (ids, (b, t)) = generate_padded(&model, state, items.len(), &cfg).unwrap();
        let got: Vec<Vec<u32>> = (0..b).map(|r| ids[r * t..(r + 1) * t].to_vec()).collect();
        let want: Vec<Vec<u32>> = case["sequences"]
            .as_array()
            .unwrap()
            .iter()
            .map(|row| {
                row.as_array()
                    .unwrap()
                    .iter()
                    .map(|x| u(x) as u32)
                    .collect()
            })
            .collect();
        if got != want {
            mismatches.push(format!(
                "{}:\n  transformers {want:?}\n  ours         {got:?}",
                case["name"].as_str().unwrap()
            ));
        }
    }
    println!(
        "generation parity with transformers {}: {} cases ({greedy} greedy, {beam} beam search), {} mismatches",
        fixture["transformers"].as_str().unwrap(),
        cases.len(),
        mismatches.len()
    );
    assert!(
        cases.len() >= 200,
        "the fixture lost cases: {}",
        cases.len()
    );
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}
