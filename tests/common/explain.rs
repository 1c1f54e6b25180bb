//! The check every explained model shares: each block's explained output equals its forward
//! pass (used by the library's and the number translator's explain tests).

use candle_attention::explain::{AttentionUse, Explanation};

const TOL: f32 = 1e-5;

/// Every block of a model: the explained output equals the forward pass's, the steps equal
/// attend on the traced inputs, and the labels fit.
pub fn check_model_blocks(
    explain: impl Fn(AttentionUse, usize) -> candle::Result<Explanation>,
    layers: (usize, usize),
) {
    for attention in AttentionUse::ALL {
        let n = if attention == AttentionUse::EncoderSelf {
            layers.0
        } else {
            layers.1
        };
        for layer in 0..n {
            let e = explain(attention, layer).unwrap();
            let what = format!("{attention} layer {layer}");
            let d = e.max_forward_difference().unwrap();
            assert!(
                d < TOL,
                "{what}: explained output is {d} from the forward pass"
            );
            assert_eq!(e.num_layers, n);
            assert_eq!(e.query_tokens.len(), e.steps.num_queries(), "{what}");
            assert_eq!(e.key_tokens.len(), e.steps.num_keys(), "{what}");
            let blocked = e.steps.blocked(0).unwrap();
            for (i, row) in blocked.iter().enumerate() {
                for (j, &b) in row.iter().enumerate() {
                    let want = attention == AttentionUse::DecoderSelf && j > i;
                    assert_eq!(b, want, "{what}: mask at ({i}, {j})");
                }
            }
            // The paper's argument holds on every row: dividing by √d_k > 1 flattens the
            // softmax (a smaller peak, more entropy).
            for head in 0..e.steps.num_heads {
                let cmp = e.steps.scaling_comparison(head).unwrap();
                for (a, b) in cmp.scaled.iter().zip(&cmp.unscaled) {
                    assert!(
                        a.max_weight <= b.max_weight + 1e-5,
                        "{what}: {a:?} vs {b:?}"
                    );
                    assert!(
                        a.entropy_bits + 1e-4 >= b.entropy_bits,
                        "{what}: {a:?} vs {b:?}"
                    );
                }
                let ratio = cmp.raw_std as f64 / cmp.scaled_std as f64;
                assert!((ratio - cmp.sqrt_d_k).abs() < 1e-3 * cmp.sqrt_d_k);
            }
            assert_eq!(e.steps.head_summaries().unwrap().len(), e.steps.num_heads);
        }
    }
}
