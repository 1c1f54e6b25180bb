//! Gradients of attention against central finite differences, in `f64`: multi-head attention
//! under causal, boolean, additive and key-padding masks, including queries whose keys are
//! all masked (their output is constant, so their gradient is zero, and nothing may turn NaN),
//! grouped-query attention, and a Transformer encoder and decoder layer (through
//! `Transformer::new` with one layer each).
//!
//! The check: a scalar loss `Σ output ⊙ R` (`R` fixed), `backward()` against
//! `(loss(θ + ε) - loss(θ - ε)) / 2ε` for every parameter entry (a spread subset for the
//! larger models) and every input entry. With `ε = 1e-5` in `f64` the difference quotient is
//! exact to about `1e-9` here, so the bound `1e-7 + 1e-6 · |g|` leaves a wide margin and still
//! catches any real error. Comparisons are written `diff <= bound`, which is false for NaN.

mod common;

use candle::{DType, Device, Tensor, Var};
use candle_attention::transformer::{Transformer, TransformerConfig, TransformerMasks};
use candle_attention::{AttentionArgs, Mask, MultiHeadAttention, MultiHeadAttentionConfig};
use candle_nn::{VarBuilder, VarMap};

const EPS: f64 = 1e-5;
const ATOL: f64 = 1e-7;
const RTOL: f64 = 1e-6;

/// A seeded `f64` tensor, uniform in `[-scale, scale)`.
fn uniform64(shape: &[usize], seed: u64, scale: f64) -> Tensor {
    (common::uniform(shape, seed).to_dtype(DType::F64).unwrap() * scale).unwrap()
}

fn values(t: &Tensor) -> Vec<f64> {
    t.flatten_all().unwrap().to_vec1::<f64>().unwrap()
}

/// Gives every variable of `varmap` seeded values (biases and LayerNorm parameters included,
/// so that no parameter sits at a special point such as 0 or 1), in name order.
fn randomise(varmap: &VarMap) -> Vec<(String, Var)> {
    let data = varmap.data().lock().unwrap();
    let mut vars: Vec<(String, Var)> = data.iter().map(|(n, v)| (n.clone(), v.clone())).collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    for (i, (_, var)) in vars.iter().enumerate() {
        var.set(&uniform64(var.dims(), 1000 + i as u64, 0.6))
            .unwrap();
    }
    vars
}

/// Checks `backward()` of `loss` against central differences for every variable in `vars`
/// (at most `max_entries` spread entries each). Returns how many entries were compared.
fn grad_check(
    what: &str,
    vars: &[(String, Var)],
    max_entries: usize,
    loss: &dyn Fn() -> Tensor,
) -> usize {
    let l = loss();
    let l0 = l.to_scalar::<f64>().unwrap();
    assert!(l0.is_finite(), "{what}: loss {l0}");
    let grads = l.backward().unwrap();
    let mut compared = 0;
    for (name, var) in vars {
        let g = grads
            .get(var.as_tensor())
            .unwrap_or_else(|| panic!("{what}: no gradient reaches {name}"));
        let g = values(g);
        let nan = g.iter().filter(|x| !x.is_finite()).count();
        assert_eq!(
            nan,
            0,
            "{what}: {nan} of {} gradient entries of {name} are not finite",
            g.len()
        );
        let orig = values(var.as_tensor());
        let step = orig.len().div_ceil(max_entries).max(1);
        let at = |p: &[f64]| {
            var.set(&Tensor::from_vec(p.to_vec(), var.dims(), &Device::Cpu).unwrap())
                .unwrap();
            loss().to_scalar::<f64>().unwrap()
        };
        for i in (0..orig.len()).step_by(step) {
            let mut p = orig.clone();
            p[i] = orig[i] + EPS;
            let plus = at(&p);
            p[i] = orig[i] - EPS;
            let minus = at(&p);
            let numeric = (plus - minus) / (2.0 * EPS);
            let diff = (numeric - g[i]).abs();
            let bound = ATOL + RTOL * g[i].abs().max(numeric.abs());
            assert!(
                diff <= bound,
                "{what}: d loss / d {name}[{i}]: backward {} vs finite differences {numeric} (|diff| {diff:e} > {bound:e})",
                g[i]
            );
            compared += 1;
        }
        var.set(&Tensor::from_vec(orig, var.dims(), &Device::Cpu).unwrap())
            .unwrap();
    }
    compared
}

/// `Σ out ⊙ r` with a fixed `r` of `out`'s shape.
fn weighted_sum(out: &Tensor, seed: u64) -> Tensor {
    let r = uniform64(out.dims(), seed, 1.0);
    (out * r).unwrap().sum_all().unwrap()
}

/// A fresh `MultiHeadAttention` in `f64` with seeded weights, and its variables.
fn mha(cfg: MultiHeadAttentionConfig) -> (MultiHeadAttention, Vec<(String, Var)>) {
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F64, &Device::Cpu);
    let mha = MultiHeadAttention::new(cfg, vb.pp("attn")).unwrap();
    let vars = randomise(&varmap);
    (mha, vars)
}

fn u8_tensor(rows: &[&[u8]]) -> Tensor {
    let cols = rows[0].len();
    let flat: Vec<u8> = rows.iter().flat_map(|r| r.iter().copied()).collect();
    Tensor::from_vec(flat, (rows.len(), cols), &Device::Cpu).unwrap()
}

#[test]
fn fully_padded_sequence_has_finite_gradients() {
    // The reported case: input (2, 4, 16), key padding [[0,0,1,1],[1,1,1,1]] (the second
    // sequence all padding). Before the fix, 544 of the 1,088 parameter gradients and 64 of
    // the input gradients were NaN.
    let (mha, mut vars) = mha(MultiHeadAttentionConfig::new(16, 4));
    let total: usize = vars.iter().map(|(_, v)| v.elem_count()).sum();
    assert_eq!(total, 1088);
    let x = Var::from_tensor(&uniform64(&[2, 4, 16], 1, 1.0)).unwrap();
    vars.push(("input".into(), x.clone()));
    let pad = u8_tensor(&[&[0, 0, 1, 1], &[1, 1, 1, 1]]);
    let loss = || {
        let x = x.as_tensor();
        let args = AttentionArgs {
            key_padding: Some(&pad),
            ..Default::default()
        };
        let out = mha.attend(x, x, x, &args).unwrap().output;
        weighted_sum(&out, 7)
    };
    let n = grad_check(
        "key padding, one sequence all padding",
        &vars,
        usize::MAX,
        &loss,
    );
    assert_eq!(n, 1088 + 2 * 4 * 16);
}

#[test]
fn mha_gradients_under_every_mask_kind() {
    let (b, l, s, e) = (2, 4, 5, 8);
    let (mha, vars) = mha(MultiHeadAttentionConfig::new(e, 2));
    let query = Var::from_tensor(&uniform64(&[b, l, e], 11, 1.0)).unwrap();
    let memory = Var::from_tensor(&uniform64(&[b, s, e], 12, 1.0)).unwrap();
    let mut all = vars.clone();
    all.push(("query".into(), query.clone()));
    all.push(("memory".into(), memory.clone()));

    // Boolean (L, S), true = blocked: query 1 sees nothing.
    let blocked = u8_tensor(&[
        &[0, 1, 0, 0, 1],
        &[1, 1, 1, 1, 1],
        &[0, 0, 0, 1, 1],
        &[1, 0, 1, 0, 0],
    ]);
    // Additive (B, H, L, S): finite values, -inf entries, and one fully -inf row in one head.
    let mut add = values(&uniform64(&[b, 2, l, s], 13, 1.0));
    for (i, x) in add.iter_mut().enumerate() {
        if i % 7 == 3 {
            *x = f64::NEG_INFINITY;
        }
    }
    let row = ((2 + 1) * l + 2) * s; // batch 1, head 1, query 2
    add[row..row + s].fill(f64::NEG_INFINITY);
    let additive = Tensor::from_vec(add, (b, 2, l, s), &Device::Cpu).unwrap();
    // Key padding with a fully padded second memory.
    let pad = u8_tensor(&[&[0, 0, 0, 1, 1], &[1, 1, 1, 1, 1]]);

    // (name, self-attention over the query or attention over memory, mask, key padding)
    let cases: Vec<(&str, bool, Mask, Option<&Tensor>)> = vec![
        ("causal self-attention", true, Mask::causal(), None),
        (
            "boolean with a fully blocked query",
            false,
            Mask::boolean(blocked.clone()).unwrap(),
            None,
        ),
        (
            "additive with a fully -inf row",
            false,
            Mask::additive(additive.clone()).unwrap(),
            None,
        ),
        (
            "key padding, one memory all padding",
            false,
            Mask::none(),
            Some(&pad),
        ),
        (
            "causal offset + boolean + key padding",
            false,
            Mask::causal_with_offset(1).and(Mask::boolean(blocked.clone()).unwrap()),
            Some(&pad),
        ),
    ];
    for (what, self_attention, mask, key_padding) in cases {
        let loss = || {
            let q = query.as_tensor();
            let kv = if self_attention {
                q
            } else {
                memory.as_tensor()
            };
            let args = AttentionArgs {
                mask: mask.clone(),
                key_padding,
                need_weights: true,
                average_weights: false,
                ..Default::default()
            };
            let out = mha.attend(q, kv, kv, &args).unwrap();
            // The weights are part of the loss too: their gradient must be finite as well.
            weighted_sum(&out.output, 21)
                .add(&weighted_sum(&out.weights.unwrap(), 22))
                .unwrap()
        };
        // Self-attention does not read `memory`, so it has no gradient to check.
        let vars = if self_attention {
            &all[..all.len() - 1]
        } else {
            &all[..]
        };
        grad_check(what, vars, usize::MAX, &loss);
    }
}

#[test]
fn grouped_query_attention_gradients() {
    let (b, l, s, e) = (2, 3, 5, 8);
    let (mha, mut vars) = mha(MultiHeadAttentionConfig::new(e, 4).with_num_kv_heads(2));
    let query = Var::from_tensor(&uniform64(&[b, l, e], 31, 1.0)).unwrap();
    let memory = Var::from_tensor(&uniform64(&[b, s, e], 32, 1.0)).unwrap();
    vars.push(("query".into(), query.clone()));
    vars.push(("memory".into(), memory.clone()));
    let pad = u8_tensor(&[&[0, 0, 1, 1, 1], &[1, 1, 1, 1, 1]]);
    let loss = || {
        let args = AttentionArgs {
            key_padding: Some(&pad),
            ..Default::default()
        };
        let m = memory.as_tensor();
        let out = mha.attend(query.as_tensor(), m, m, &args).unwrap();
        weighted_sum(&out.output, 33)
    };
    grad_check(
        "GQA, 2 key/value heads for 4 query heads",
        &vars,
        usize::MAX,
        &loss,
    );
}

#[test]
fn transformer_encoder_and_decoder_layer_gradients() {
    let (b, s, t, d) = (2, 4, 3, 8);
    let cfg = TransformerConfig {
        num_encoder_layers: 1,
        num_decoder_layers: 1,
        dim_feedforward: 12,
        dropout: 0.0,
        ..TransformerConfig::new(d, 2)
    };
    for norm_first in [false, true] {
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F64, &Device::Cpu);
        let model = Transformer::new(
            TransformerConfig {
                norm_first,
                ..cfg.clone()
            },
            vb,
        )
        .unwrap();
        let mut vars = randomise(&varmap);
        let src = Var::from_tensor(&uniform64(&[b, s, d], 41, 1.0)).unwrap();
        let tgt = Var::from_tensor(&uniform64(&[b, t, d], 42, 1.0)).unwrap();
        vars.push(("src".into(), src.clone()));
        vars.push(("tgt".into(), tgt.clone()));
        // The second source is all padding: its encoder rows and the decoder's cross-attention
        // rows for it are fully masked.
        let src_pad = u8_tensor(&[&[0, 0, 0, 1], &[1, 1, 1, 1]]);
        let tgt_pad = u8_tensor(&[&[0, 0, 1], &[0, 0, 0]]);
        let masks = TransformerMasks {
            tgt_mask: Mask::causal(),
            src_key_padding_mask: Some(&src_pad),
            tgt_key_padding_mask: Some(&tgt_pad),
            memory_key_padding_mask: Some(&src_pad),
            ..Default::default()
        };
        let what = format!("Transformer encoder + decoder layer, norm_first = {norm_first}");
        // The encoder stack alone (one layer and its norm), then the whole model.
        let enc_loss = || {
            let mem = model
                .encoder()
                .forward(src.as_tensor(), &masks.encoder(), false)
                .unwrap();
            weighted_sum(&mem, 43)
        };
        let encoder_vars: Vec<(String, Var)> = vars
            .iter()
            .filter(|(n, _)| n.starts_with("encoder.") || n == "src")
            .cloned()
            .collect();
        grad_check(&format!("{what}: encoder"), &encoder_vars, 24, &enc_loss);
        let loss = || {
            let out = model
                .forward(src.as_tensor(), tgt.as_tensor(), &masks, false)
                .unwrap();
            weighted_sum(&out, 44)
        };
        let n = grad_check(&what, &vars, 24, &loss);
        assert!(n > 300, "{what}: only {n} entries compared");
    }
}
