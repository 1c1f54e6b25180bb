//! A few training steps of a tiny configuration: the loss falls, checkpoints resume exactly,
//! and the written model directory loads and translates (whatever it has learnt by then).

use attn_cli::number_translator::train::{train, TrainConfig};
use attn_cli::number_translator::translator::Translator;
use candle::Device;
use candle_attention::TensorFile;

fn tiny(steps: usize) -> TrainConfig {
    TrainConfig {
        d_model: 32,
        heads: 4,
        layers: 1,
        dim_feedforward: 64,
        batch_tokens: 700,
        steps,
        warmup: 10,
        lr_scale: 1.0,
        eval_every: 0,
        checkpoint_every: 0,
        max_examples: 3000,
        ..TrainConfig::default()
    }
}

fn weights(dir: &std::path::Path) -> Vec<(String, Vec<f32>)> {
    let file = TensorFile::open(dir.join("model.safetensors")).unwrap();
    file.names()
        .iter()
        .map(|n| {
            (
                n.to_string(),
                file.load(n, &Device::Cpu)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1()
                    .unwrap(),
            )
        })
        .collect()
}

#[test]
fn tiny_training_learns_resumes_exactly_and_translates() {
    let dev = Device::Cpu;
    let straight = tempfile::tempdir().unwrap();
    let mut losses = Vec::new();
    train(
        &tiny(40),
        straight.path(),
        &dev,
        |s| losses.push(s.loss),
        |_| {},
    )
    .unwrap();
    assert_eq!(losses.len(), 40);
    let first: f32 = losses[..4].iter().sum::<f32>() / 4.0;
    let last: f32 = losses[36..].iter().sum::<f32>() / 4.0;
    assert!(last < 0.88 * first, "loss {first} -> {last}");

    // Stop at 20 steps, then resume to 40: the same weights as the straight run.
    let resumed = tempfile::tempdir().unwrap();
    train(&tiny(20), resumed.path(), &dev, |_| {}, |_| {}).unwrap();
    let mut resumed_steps = Vec::new();
    train(
        &tiny(40),
        resumed.path(),
        &dev,
        |s| resumed_steps.push(s.step),
        |_| {},
    )
    .unwrap();
    assert_eq!(resumed_steps, (21..=40).collect::<Vec<_>>());
    assert_eq!(weights(straight.path()), weights(resumed.path()));

    // A different model in the same directory is refused.
    let other = TrainConfig {
        d_model: 64,
        ..tiny(30)
    };
    let err = train(&other, resumed.path(), &dev, |_| {}, |_| {})
        .unwrap_err()
        .to_string();
    assert!(err.contains("different configuration"), "{err}");

    // The directory is a loadable model; bad input gets an error, not a made-up answer.
    let translator = Translator::load(straight.path(), &dev).unwrap();
    let out = translator
        .translate(
            &["three hundred and forty-two", "", "two two", "one million"],
            2,
        )
        .unwrap();
    assert!(
        out[0].is_ok()
            || out[0]
                .as_ref()
                .unwrap_err()
                .to_string()
                .contains("did not finish")
    );
    assert!(out[1]
        .as_ref()
        .unwrap_err()
        .to_string()
        .contains("empty input"));
    assert!(out[2].as_ref().unwrap_err().to_string().contains("two"));
    assert!(out[3].is_err());
}

/// The written model is the mean of the weights at the averaged checkpoints, not the last ones.
#[test]
fn the_model_averages_the_last_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = TrainConfig {
        checkpoint_every: 10,
        average_last: 3,
        ..tiny(30)
    };
    assert_eq!(cfg.averaged_steps(), vec![10, 20, 30]);
    train(&cfg, dir.path(), &Device::Cpu, |_| {}, |_| {}).unwrap();
    let model = weights(dir.path());
    let snapshots: Vec<Vec<(String, Vec<f32>)>> = [10, 20, 30]
        .iter()
        .map(|s| {
            let d = tempfile::tempdir().unwrap();
            std::fs::copy(
                dir.path().join(format!("average/step-{s}.safetensors")),
                d.path().join("model.safetensors"),
            )
            .unwrap();
            weights(d.path())
        })
        .collect();
    let last = &snapshots[2];
    let mut differs_from_last = false;
    for (i, (name, values)) in model.iter().enumerate() {
        for (j, &x) in values.iter().enumerate() {
            let mean = (snapshots[0][i].1[j] + snapshots[1][i].1[j] + snapshots[2][i].1[j]) / 3.0;
            assert!(
                (x - mean).abs() <= 1e-6 * (1.0 + mean.abs()),
                "{name}[{j}]: {x} vs {mean}"
            );
            differs_from_last |= x != last[i].1[j];
        }
    }
    assert!(
        differs_from_last,
        "the model is the final weights, not the average"
    );
    // Short runs average what exists; 1 or no checkpoints means the final weights.
    assert_eq!(
        TrainConfig {
            checkpoint_every: 10,
            average_last: 5,
            ..tiny(25)
        }
        .averaged_steps(),
        vec![5, 15, 25]
    );
    assert_eq!(
        TrainConfig {
            checkpoint_every: 0,
            ..tiny(25)
        }
        .averaged_steps(),
        vec![25]
    );
}
