//! Torch checkpoints through the public API: files written by torch 2.15
//! (`tests/fixtures/pth/`, made by `make_pth_fixtures.py`) load exactly the tensors torch saved,
//! the ones that must be refused are, with errors naming the file and the tensor or global; and
//! MarianMT directories whose `pytorch_model.bin` is hostile fail to load with such errors.

use candle::{DType, Device, Tensor};
use candle_attention::marian::MarianMTModel;
use candle_attention::models::checkpoint::Checkpoint;
use candle_attention::weights::PthCheckpoint;
use candle_attention::TensorFile;
use safetensors::View;
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn manifest() -> serde_json::Value {
    let text = std::fs::read_to_string(fixtures().join("pth/manifest.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn dtype_name(d: DType) -> String {
    format!("{d:?}").to_uppercase()
}

#[test]
fn files_written_by_torch_load_exactly_what_torch_saved() {
    let manifest = manifest();
    let expected = TensorFile::open(fixtures().join("pth/expected.safetensors")).unwrap();
    let files = manifest["load"].as_object().unwrap();
    assert!(files.len() >= 10, "{files:?}");
    let mut checked = 0;
    for (file, tensors) in files {
        let path = fixtures().join("pth").join(file);
        let ckpt = PthCheckpoint::open(&path).unwrap_or_else(|e| panic!("{file}: {e}"));
        let tensors = tensors.as_object().unwrap();
        let mut want: Vec<&str> = tensors.keys().map(String::as_str).collect();
        want.sort();
        assert_eq!(ckpt.names(), want, "{file}");
        assert_eq!(ckpt.tensor_count(), want.len());
        for (name, meta) in tensors {
            let info = ckpt.info(name).unwrap();
            let shape: Vec<usize> = serde_json::from_value(meta["shape"].clone()).unwrap();
            assert_eq!(info.shape(), shape, "{file}: {name}");
            assert_eq!(dtype_name(info.dtype()), meta["dtype"], "{file}: {name}");
            let t = ckpt.load(name, &Device::Cpu).unwrap();
            assert_eq!(t.dims(), shape, "{file}: {name}");
            assert_eq!(t.dtype(), info.dtype(), "{file}: {name}");
            let want: Vec<u8> = expected
                .load(&format!("{file}::{name}"), &Device::Cpu)
                .unwrap()
                .to_vec1()
                .unwrap();
            assert_eq!(t.data().as_ref(), want.as_slice(), "{file}: {name}");
            checked += 1;
        }
    }
    assert!(checked >= 100, "{checked}");
}

#[test]
fn views_of_shared_storages_keep_their_offsets_and_strides() {
    let ckpt = PthCheckpoint::open(fixtures().join("pth/views.pt")).unwrap();
    let info = ckpt.info("t").unwrap();
    assert_eq!((info.shape(), info.strides()), (&[6, 4][..], &[1, 6][..]));
    assert_eq!(info.storage_key(), ckpt.info("base").unwrap().storage_key());
    let corner = ckpt.info("corner").unwrap();
    assert_eq!(corner.storage_offset(), 16);
    let v: Vec<Vec<f32>> = ckpt
        .load("corner", &Device::Cpu)
        .unwrap()
        .to_vec2()
        .unwrap();
    assert_eq!(v, [[16., 17.], [22., 23.]]);
    let v: Vec<f32> = ckpt.load("col", &Device::Cpu).unwrap().to_vec1().unwrap();
    assert_eq!(v, [2., 8., 14., 20.]);
    // Tied embeddings of the Marian state dict share one storage.
    let ckpt = PthCheckpoint::open(fixtures().join("pth/marian_state_dict.bin")).unwrap();
    let key = |n: &str| ckpt.info(n).unwrap().storage_key().to_string();
    assert_eq!(key("model.shared.weight"), key("lm_head.weight"));
}

#[test]
fn files_torch_can_write_but_we_must_refuse_are_refused_by_name() {
    let manifest = manifest();
    let files = manifest["refuse"].as_object().unwrap();
    assert!(files.len() >= 9);
    for (file, why) in files {
        let path = fixtures().join("pth").join(file);
        let err = PthCheckpoint::open(&path).expect_err(file).to_string();
        assert!(err.contains(why.as_str().unwrap()), "{file}: {err}");
        assert!(err.contains(&path.display().to_string()), "{file}: {err}");
    }
}

// -- MarianMT directories with a hostile pytorch_model.bin --------------------------------

/// A copy of `marian/gelu_noscale` (weights only in pytorch_model.bin) with its weights
/// replaced by `bin`.
fn marian_dir(bin: &[u8]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let src = fixtures().join("marian/gelu_noscale");
    for f in ["config.json", "generation_config.json"] {
        std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
    }
    std::fs::write(dir.path().join("pytorch_model.bin"), bin).unwrap();
    dir
}

fn gelu_noscale_bin() -> Vec<u8> {
    std::fs::read(fixtures().join("marian/gelu_noscale/pytorch_model.bin")).unwrap()
}

/// The zip archive `bin` with its `data.pkl` rewritten by `edit` (entries stored, as torch
/// writes them).
fn with_pickle(bin: &[u8], edit: impl Fn(Vec<u8>) -> Vec<u8>) -> Vec<u8> {
    use std::io::Read;
    let mut zin = zip::ZipArchive::new(std::io::Cursor::new(bin)).unwrap();
    let mut zout = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let stored =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for i in 0..zin.len() {
        let mut f = zin.by_index(i).unwrap();
        let name = f.name().unwrap().to_string();
        let mut data = Vec::new();
        f.read_to_end(&mut data).unwrap();
        if name.ends_with("/data.pkl") {
            data = edit(data);
        }
        zout.start_file(name, stored).unwrap();
        zout.write_all(&data).unwrap();
    }
    zout.finish().unwrap().into_inner()
}

fn replace(data: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let at = data
        .windows(from.len())
        .position(|w| w == from)
        .expect("pattern present");
    [&data[..at], to, &data[at + from.len()..]].concat()
}

fn load_err(dir: &Path) -> String {
    MarianMTModel::from_dir(dir, &Device::Cpu)
        .expect_err("loading must fail")
        .to_string()
}

#[test]
fn a_marian_pytorch_model_bin_loads_through_our_reader() {
    let dir = marian_dir(&with_pickle(&gelu_noscale_bin(), |p| p));
    let model = MarianMTModel::from_dir(dir.path(), &Device::Cpu).unwrap();
    let weights = Checkpoint::open_dir(dir.path()).unwrap();
    assert!(matches!(weights, Checkpoint::Pth(_)));
    assert_eq!(weights.stored_dtype(), Some(DType::F32));
    drop(model);
}

#[test]
fn a_global_smuggled_under_an_unused_key_is_refused() {
    // One more key/value pair before the state dict's last SETITEMS: "unused" ->
    // posix.system("true"). The model never reads "unused"; the file is refused anyway.
    let bin = with_pickle(&gelu_noscale_bin(), |p| {
        assert!(p.ends_with(b"u."));
        let evil = b"X\x06\x00\x00\x00unusedcposix\nsystem\nX\x04\x00\x00\x00true\x85R";
        [&p[..p.len() - 2], &evil[..], b"u."].concat()
    });
    let dir = marian_dir(&bin);
    let err = load_err(dir.path());
    assert!(err.contains("'posix.system'"), "{err}");
    assert!(err.contains("pytorch_model.bin"), "{err}");
    for global in [
        &b"csubprocess\nPopen\n"[..],
        b"cbuiltins\neval\n",
        b"c__main__\nNet\n",
    ] {
        let bin = with_pickle(&gelu_noscale_bin(), |p| {
            let evil = [&b"X\x01\x00\x00\x00x"[..], global, b")R"].concat();
            [&p[..p.len() - 2], &evil, b"u."].concat()
        });
        let err = load_err(marian_dir(&bin).path());
        assert!(err.contains("refused"), "{err}");
    }
}

#[test]
fn integer_weights_are_refused_not_cast() {
    // Every storage of the pickle becomes int32 (same element size, so the storages fit).
    let bin = with_pickle(&gelu_noscale_bin(), |p| {
        replace(&p, b"ctorch\nFloatStorage\n", b"ctorch\nIntStorage\n")
    });
    let dir = marian_dir(&bin);
    let err = load_err(dir.path());
    assert!(err.contains("is stored as I32"), "{err}");
    assert!(err.contains("floating-point"), "{err}");
    assert!(err.contains("pytorch_model.bin"), "{err}");

    // The same in model.safetensors: one weight stored as int64.
    let base = fixtures().join("marian/base");
    let file = TensorFile::open(base.join("model.safetensors")).unwrap();
    let mut tensors: HashMap<String, Tensor> = HashMap::new();
    for name in file.names() {
        tensors.insert(name.to_string(), file.load(name, &Device::Cpu).unwrap());
    }
    let victim = "model.encoder.layers.0.fc1.weight";
    let t = tensors[victim].to_dtype(DType::I64).unwrap();
    tensors.insert(victim.to_string(), t);
    let dir = tempfile::tempdir().unwrap();
    for f in ["config.json", "generation_config.json"] {
        std::fs::copy(base.join(f), dir.path().join(f)).unwrap();
    }
    candle::safetensors::save(&tensors, dir.path().join("model.safetensors")).unwrap();
    let err = load_err(dir.path());
    assert!(
        err.contains(victim) && err.contains("is stored as I64"),
        "{err}"
    );
}

#[test]
fn empty_and_lying_checkpoints_fail_to_load() {
    for (file, why) in [
        ("empty.pt", "holds no tensor"),
        ("huge_storage.pt", "1000000000000 elements"),
        ("whole_module.pt", "'torch.nn.modules.linear.Linear'"),
    ] {
        let bin = std::fs::read(fixtures().join("pth/refused").join(file)).unwrap();
        let dir = marian_dir(&bin);
        let err = load_err(dir.path());
        assert!(
            err.contains(why) && err.contains("pytorch_model.bin"),
            "{file}: {err}"
        );
    }
    // A safetensors file without tensors.
    let dir = tempfile::tempdir().unwrap();
    let src = fixtures().join("marian/base");
    std::fs::copy(src.join("config.json"), dir.path().join("config.json")).unwrap();
    candle::safetensors::save(
        &HashMap::<String, Tensor>::new(),
        dir.path().join("model.safetensors"),
    )
    .unwrap();
    let err = load_err(dir.path());
    assert!(err.contains("holds no tensor"), "{err}");
}
