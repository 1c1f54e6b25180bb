//! The typed cache API, mask polarity constructors and `ModuleT`, through the public API only.

mod common;
use common::max_abs_diff;

use candle::{DType, Device, ModuleT, Tensor};
use candle_attention::transformer::{
    DecoderCache, DecoderMasks, EncoderMasks, TransformerConfig, TransformerDecoder,
    TransformerEncoder, TransformerEncoderLayer,
};
use candle_attention::{
    scaled_dot_product_attention, AttentionArgs, CachedAttentionArgs, CrossAttentionCache, KvCache,
    Mask, MultiHeadAttention, MultiHeadAttentionConfig, SdpaArgs,
};
use candle_nn::{VarBuilder, VarMap};
use proptest::prelude::*;

fn mha(embed: usize, heads: usize, seed_vars: &VarMap) -> MultiHeadAttention {
    let vb = VarBuilder::from_varmap(seed_vars, DType::F32, &Device::Cpu);
    MultiHeadAttention::new(MultiHeadAttentionConfig::new(embed, heads), vb.pp("attn")).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, .. ProptestConfig::default() })]

    /// Feeding a sequence in chunks through `attend_cached` gives the rows of one causal pass,
    /// with and without key padding.
    #[test]
    fn cached_self_attention_equals_the_full_causal_pass(
        batch in 1usize..3,
        len in 1usize..12,
        chunk in 1usize..4,
        heads in prop::sample::select(vec![1usize, 2, 4]),
        pad_last in 0usize..3,
    ) {
        let dev = Device::Cpu;
        let varmap = VarMap::new();
        let attn = mha(16, heads, &varmap);
        let x = Tensor::randn(0f32, 1., (batch, len, 16), &dev).unwrap();
        // The last `pad_last` positions of row 0 are padding (never the first one).
        let pad_last = pad_last.min(len - 1);
        let mut pad = vec![0u8; batch * len];
        for p in pad.iter_mut().take(len).skip(len - pad_last) {
            *p = 1;
        }
        let pad = Tensor::from_vec(pad, (batch, len), &dev).unwrap();
        let full = attn
            .attend(&x, &x, &x, &AttentionArgs {
                mask: Mask::causal(),
                key_padding: Some(&pad),
                ..Default::default()
            })
            .unwrap()
            .output;
        let mut cache = KvCache::new();
        let mut start = 0;
        while start < len {
            let t = chunk.min(len - start);
            let seen = pad.narrow(1, 0, start + t).unwrap();
            let step = attn
                .attend_cached(&x.narrow(1, start, t).unwrap(), &mut cache, &CachedAttentionArgs {
                    key_padding: Some(&seen),
                    ..Default::default()
                })
                .unwrap()
                .output;
            let want = full.narrow(1, start, t).unwrap();
            prop_assert!(max_abs_diff(&step, &want) <= 1e-5);
            start += t;
        }
        prop_assert_eq!(cache.len(), len);
    }

    /// Cross-attention through a `CrossAttentionCache` equals the uncached call, step after step.
    #[test]
    fn cached_cross_attention_equals_the_uncached_call(
        batch in 1usize..3,
        src in 1usize..9,
        steps in 1usize..5,
    ) {
        let dev = Device::Cpu;
        let varmap = VarMap::new();
        let attn = mha(16, 4, &varmap);
        let memory = Tensor::randn(0f32, 1., (batch, src, 16), &dev).unwrap();
        let mut cache = CrossAttentionCache::new();
        for _ in 0..steps {
            let x = Tensor::randn(0f32, 1., (batch, 1, 16), &dev).unwrap();
            let cached = attn
                .attend_cross(&x, &memory, &mut cache, &AttentionArgs::default())
                .unwrap()
                .output;
            let plain = attn.attend(&x, &memory, &memory, &AttentionArgs::default()).unwrap().output;
            prop_assert!(max_abs_diff(&cached, &plain) <= 1e-5);
        }
    }
}

/// A cross-attention cache holds its keys and values as `(B, H, S, head_dim)` tensors of their
/// own, each head's positions one contiguous run (what every later decoding step reads), not
/// views into the fused key/value projection, and they are that projection's values.
#[test]
fn a_cross_attention_cache_holds_contiguous_keys_and_values() {
    let dev = Device::Cpu;
    let varmap = VarMap::new();
    let attn = mha(16, 4, &varmap);
    let memory = Tensor::randn(0f32, 1., (2, 5, 16), &dev).unwrap();
    let x = Tensor::randn(0f32, 1., (2, 1, 16), &dev).unwrap();
    let mut cache = CrossAttentionCache::new();
    attn.attend_cross(&x, &memory, &mut cache, &Default::default())
        .unwrap();
    let (k, v) = cache.keys_values().unwrap();
    // The projection itself hands out strided views of one fused product.
    let (pk, pv) = attn.project_key_value(&memory, &memory).unwrap();
    assert!(!pk.is_contiguous() && !pv.is_contiguous());
    for (held, projected) in [(k, &pk), (v, &pv)] {
        assert_eq!(held.dims(), &[2, 4, 5, 4]);
        assert!(held.is_contiguous());
        assert_eq!(max_abs_diff(held, projected), 0.0);
    }
}

#[test]
fn a_cross_attention_cache_refuses_another_memory() {
    let dev = Device::Cpu;
    let varmap = VarMap::new();
    let attn = mha(8, 2, &varmap);
    let memory = Tensor::randn(0f32, 1., (1, 3, 8), &dev).unwrap();
    let other = Tensor::randn(0f32, 1., (1, 3, 8), &dev).unwrap();
    let x = Tensor::randn(0f32, 1., (1, 1, 8), &dev).unwrap();
    let mut cache = CrossAttentionCache::new();
    attn.attend_cross(&x, &memory, &mut cache, &Default::default())
        .unwrap();
    assert!(cache.holds(&memory) && cache.holds(&memory.clone()));
    let err = attn
        .attend_cross(&x, &other, &mut cache, &Default::default())
        .unwrap_err();
    assert!(err.to_string().contains("another memory tensor"), "{err}");
    cache.reset();
    attn.attend_cross(&x, &other, &mut cache, &Default::default())
        .unwrap();
    assert!(cache.holds(&other));
}

#[test]
fn a_causal_mask_written_by_hand_is_refused_with_a_cache() {
    let dev = Device::Cpu;
    let varmap = VarMap::new();
    let attn = mha(8, 2, &varmap);
    let x = Tensor::randn(0f32, 1., (1, 1, 8), &dev).unwrap();
    let mut cache = KvCache::new();
    attn.attend_cached(&x, &mut cache, &Default::default())
        .unwrap();
    let err = attn
        .attend_cached(
            &x,
            &mut cache,
            &CachedAttentionArgs {
                mask: Mask::causal(),
                ..Default::default()
            },
        )
        .unwrap_err()
        .to_string();
    assert!(err.contains("applies the causal mask itself"), "{err}");
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &dev);
    let mut cfg = TransformerConfig::new(8, 2);
    cfg.num_decoder_layers = 1;
    let decoder = TransformerDecoder::new(&cfg, vb.pp("dec"), false).unwrap();
    let masks = DecoderMasks {
        tgt_mask: Mask::causal(),
        ..Default::default()
    };
    let err = decoder
        .forward_cached(&x, &x, &masks, &mut DecoderCache::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("applies the causal mask itself"), "{err}");
}

#[test]
fn a_forked_decoder_cache_decodes_independently() {
    let dev = Device::Cpu;
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &dev);
    let mut cfg = TransformerConfig::new(16, 2);
    cfg.num_decoder_layers = 2;
    cfg.dim_feedforward = 32;
    let decoder = TransformerDecoder::new(&cfg, vb.pp("dec"), false).unwrap();
    let memory = Tensor::randn(0f32, 1., (1, 4, 16), &dev).unwrap();
    let tgt = Tensor::randn(0f32, 1., (1, 6, 16), &dev).unwrap();
    let masks = DecoderMasks::default();
    let full_a = decoder
        .forward(
            &tgt,
            &memory,
            &DecoderMasks {
                tgt_mask: Mask::causal(),
                ..Default::default()
            },
            false,
        )
        .unwrap();
    let tgt_b = Tensor::cat(
        &[
            &tgt.narrow(1, 0, 3).unwrap(),
            &Tensor::randn(0f32, 1., (1, 3, 16), &dev).unwrap(),
        ],
        1,
    )
    .unwrap();
    let full_b = decoder
        .forward(
            &tgt_b,
            &memory,
            &DecoderMasks {
                tgt_mask: Mask::causal(),
                ..Default::default()
            },
            false,
        )
        .unwrap();
    let mut a = DecoderCache::default();
    for t in 0..3 {
        decoder
            .forward_cached(&tgt.narrow(1, t, 1).unwrap(), &memory, &masks, &mut a)
            .unwrap();
    }
    let mut b = a.clone(); // fork after three shared tokens
    for t in 3..6 {
        let ya = decoder
            .forward_cached(&tgt.narrow(1, t, 1).unwrap(), &memory, &masks, &mut a)
            .unwrap();
        let yb = decoder
            .forward_cached(&tgt_b.narrow(1, t, 1).unwrap(), &memory, &masks, &mut b)
            .unwrap();
        assert!(max_abs_diff(&ya, &full_a.narrow(1, t, 1).unwrap()) <= 1e-5);
        assert!(max_abs_diff(&yb, &full_b.narrow(1, t, 1).unwrap()) <= 1e-5);
    }
}

/// Beam search through a decoder cache: rows forked by `select_rows` (one row continued in
/// several, which moves the cache into slots the rows share), dropped and permuted over several
/// steps, each row's output at every step equals a full causal pass over that row's own
/// history. Inference weights (no gradients), as a loaded model has them.
#[test]
fn forked_rows_of_a_decoder_cache_decode_as_their_own_histories() {
    let dev = Device::Cpu;
    let varmap = VarMap::new();
    let mut cfg = TransformerConfig::new(16, 4);
    cfg.num_decoder_layers = 2;
    cfg.dim_feedforward = 32;
    TransformerDecoder::new(
        &cfg,
        VarBuilder::from_varmap(&varmap, DType::F32, &dev),
        false,
    )
    .unwrap();
    let weights = candle_attention::testing::detached_weights(&varmap);
    let decoder =
        TransformerDecoder::load(&cfg, VarBuilder::from_tensors(weights, DType::F32, &dev))
            .unwrap();
    let memory = Tensor::randn(0f32, 1., (1, 5, 16), &dev).unwrap();
    let causal = DecoderMasks {
        tgt_mask: Mask::causal(),
        ..Default::default()
    };
    let u32s = |v: &[u32]| Tensor::new(v, &dev).unwrap();
    // The rows after each step: one row forks into four, then rows are continued, dropped,
    // swapped and forked again.
    let reorders: [&[u32]; 5] = [
        &[0, 0, 0, 0],
        &[0, 0, 2, 3],
        &[1, 0, 3, 3],
        &[2, 2, 0],
        &[1, 2],
    ];
    let mut cache = DecoderCache::default();
    let mut histories: Vec<Vec<Tensor>> = vec![Vec::new()];
    // The memory of every row (the cache holds the projection of this very tensor).
    let mut rows_memory = memory.clone();
    for (step, reorder) in reorders.iter().enumerate() {
        let rows = histories.len();
        let x = Tensor::randn(0f32, 1., (rows, 1, 16), &dev).unwrap();
        let got = decoder
            .forward_cached(&x, &rows_memory, &DecoderMasks::default(), &mut cache)
            .unwrap();
        for (r, history) in histories.iter_mut().enumerate() {
            history.push(x.narrow(0, r, 1).unwrap());
            let full = decoder
                .forward(&Tensor::cat(history, 1).unwrap(), &memory, &causal, false)
                .unwrap();
            let want = full.narrow(1, history.len() - 1, 1).unwrap();
            let diff = max_abs_diff(&got.narrow(0, r, 1).unwrap(), &want);
            assert!(diff <= 1e-5, "step {step}, row {r}: {diff}");
        }
        rows_memory = memory
            .broadcast_as((reorder.len(), 5, 16))
            .unwrap()
            .contiguous()
            .unwrap();
        cache.select_rows(&u32s(reorder), &rows_memory).unwrap();
        histories = reorder
            .iter()
            .map(|&r| histories[r as usize].clone())
            .collect();
    }
}

/// Groups of rows sharing one memory row (the beams of a sentence) decode as rows with their
/// own copy of it: the same outputs through steps, reorders inside the groups (in place) and
/// a dropped group (rows shifting down), with key padding on the memory.
#[test]
fn rows_sharing_a_memory_row_decode_as_rows_with_their_own() {
    let dev = Device::Cpu;
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &dev);
    let mut cfg = TransformerConfig::new(16, 4);
    cfg.num_decoder_layers = 2;
    let decoder = TransformerDecoder::new(&cfg, vb.pp("dec"), true).unwrap();
    let (sentences, beams, s) = (3usize, 3usize, 5usize);
    let memory = Tensor::randn(0f32, 1., (sentences, s, 16), &dev).unwrap();
    let padding =
        Tensor::new(&[[0u8, 0, 0, 1, 1], [0, 0, 0, 0, 0], [0, 0, 1, 1, 1]], &dev).unwrap();
    let u32s = |v: &[u32]| Tensor::new(v, &dev).unwrap();
    // Row r of the expanded decode reads memory row r / beams.
    let per_row: Vec<u32> = (0..sentences * beams).map(|r| (r / beams) as u32).collect();
    let mut expanded_memory = memory.index_select(&u32s(&per_row), 0).unwrap();
    let mut expanded_padding = padding.index_select(&u32s(&per_row), 0).unwrap();
    let (mut shared_memory, mut shared_padding) = (memory.clone(), padding.clone());
    let (mut shared, mut expanded) = (DecoderCache::default(), DecoderCache::default());
    let mut rows = sentences * beams;
    // Reorders inside the groups; then the middle sentence is dropped.
    let reorders: [(&[u32], &[u32]); 3] = [
        (&[0, 0, 2, 3, 5, 5, 6, 7, 6], &[0, 1, 2]),
        (&[1, 1, 1, 3, 4, 3, 8, 6, 7], &[0, 1, 2]),
        (&[2, 0, 1, 6, 7, 7], &[0, 2]),
    ];
    for step in 0..=reorders.len() {
        let x = Tensor::randn(0f32, 1., (rows, 1, 16), &dev).unwrap();
        let masks = |p| DecoderMasks {
            memory_key_padding_mask: Some(p),
            ..Default::default()
        };
        let got = decoder
            .forward_cached(&x, &shared_memory, &masks(&shared_padding), &mut shared)
            .unwrap();
        let want = decoder
            .forward_cached(
                &x,
                &expanded_memory,
                &masks(&expanded_padding),
                &mut expanded,
            )
            .unwrap();
        let diff = max_abs_diff(&got, &want);
        assert!(diff <= 1e-5, "step {step}: {diff}");
        let Some(&(row_ids, memory_ids)) = reorders.get(step) else {
            break;
        };
        rows = row_ids.len();
        shared_memory = shared_memory.index_select(&u32s(memory_ids), 0).unwrap();
        shared_padding = shared_padding.index_select(&u32s(memory_ids), 0).unwrap();
        shared
            .select_rows_shared_memory(&u32s(row_ids), &u32s(memory_ids), &shared_memory)
            .unwrap();
        expanded_memory = expanded_memory.index_select(&u32s(row_ids), 0).unwrap();
        expanded_padding = expanded_padding.index_select(&u32s(row_ids), 0).unwrap();
        expanded
            .select_rows(&u32s(row_ids), &expanded_memory)
            .unwrap();
    }
    // A memory mask cannot be shared by groups of rows: refused, with the counts.
    let x = Tensor::randn(0f32, 1., (rows, 1, 16), &dev).unwrap();
    let masks = DecoderMasks {
        memory_mask: Mask::additive(Tensor::zeros((1, 5), DType::F32, &dev).unwrap()).unwrap(),
        memory_key_padding_mask: Some(&shared_padding),
        ..Default::default()
    };
    let err = decoder
        .forward_cached(&x, &shared_memory, &masks, &mut shared)
        .unwrap_err()
        .to_string();
    assert!(err.contains("share 2 memory rows"), "{err}");
}

#[test]
fn mask_polarities_agree() {
    let dev = Device::Cpu;
    let q = Tensor::randn(0f32, 1., (2, 2, 3, 8), &dev).unwrap();
    let k = Tensor::randn(0f32, 1., (2, 2, 4, 8), &dev).unwrap();
    let v = Tensor::randn(0f32, 1., (2, 2, 4, 8), &dev).unwrap();
    let blocked = Tensor::new(&[[0u8, 1, 0, 0], [0, 0, 1, 1], [1, 0, 0, 0]], &dev).unwrap();
    let allowed = Tensor::new(&[[1i64, 0, 1, 1], [1, 1, 0, 0], [0, 1, 1, 1]], &dev).unwrap();
    let run = |mask: Mask| {
        scaled_dot_product_attention(
            &q,
            &k,
            &v,
            &SdpaArgs {
                mask,
                ..Default::default()
            },
        )
        .unwrap()
        .output
    };
    let a = run(Mask::blocked(blocked.clone()).unwrap());
    let b = run(Mask::allowed(allowed).unwrap());
    let c = run(Mask::boolean(blocked).unwrap());
    assert!(max_abs_diff(&a, &b) <= 0.0);
    assert!(max_abs_diff(&a, &c) <= 0.0);
    // Hugging Face attention_mask (1 = keep) versus torch key padding (1 = padding).
    let hf = Tensor::new(&[[1u32, 1, 1, 0], [1, 0, 0, 0]], &dev).unwrap();
    let torch = Tensor::new(&[[0u8, 0, 0, 1], [0, 1, 1, 1]], &dev).unwrap();
    let d = run(Mask::key_padding_from_attention_mask(&hf).unwrap());
    let e = run(Mask::key_padding(torch).unwrap());
    assert!(max_abs_diff(&d, &e) <= 0.0);
    let err = Mask::allowed(Tensor::zeros((3, 4), DType::F32, &dev).unwrap()).unwrap_err();
    assert!(err.to_string().contains("integer dtype"), "{err}");
}

#[test]
fn train_and_eval_differ_only_by_dropout() {
    let dev = Device::Cpu;
    let x = Tensor::randn(0f32, 1., (2, 5, 16), &dev).unwrap();
    for p in [0.0f32, 0.5] {
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &dev);
        let attn = MultiHeadAttention::new(
            MultiHeadAttentionConfig::new(16, 4).with_dropout(p),
            vb.pp("attn"),
        )
        .unwrap();
        let mut cfg = TransformerConfig::new(16, 4);
        cfg.dropout = p;
        cfg.num_encoder_layers = 2;
        cfg.dim_feedforward = 32;
        let layer = TransformerEncoderLayer::new(&cfg, vb.pp("layer")).unwrap();
        let stack = TransformerEncoder::new(&cfg, vb.pp("enc"), true).unwrap();
        let eval = |m: &dyn ModuleT| m.forward_t(&x, false).unwrap();
        let train = |m: &dyn ModuleT| m.forward_t(&x, true).unwrap();
        for (name, m) in [
            ("mha", &attn as &dyn ModuleT),
            ("layer", &layer as &dyn ModuleT),
            ("stack", &stack as &dyn ModuleT),
        ] {
            let (e1, e2, t) = (eval(m), eval(m), train(m));
            assert!(
                max_abs_diff(&e1, &e2) <= 0.0,
                "{name}: eval is deterministic"
            );
            let diff = max_abs_diff(&e1, &t);
            if p == 0.0 {
                assert!(
                    diff <= 1e-6,
                    "{name}: without dropout train == eval, got {diff}"
                );
            } else {
                assert!(diff > 1e-3, "{name}: dropout {p} changes the training pass");
            }
        }
        assert!(
            max_abs_diff(&attn.forward(&x).unwrap(), &eval(&attn)) <= 0.0,
            "inherent forward is the eval pass"
        );
        let masked = layer.forward(&x, &EncoderMasks::default(), false).unwrap();
        assert!(max_abs_diff(&masked, &eval(&layer)) <= 0.0);
    }
}
