//! Arbitrary bytes as a torch checkpoint (`pytorch_model.bin`), read twice: as they are (a zip
//! archive, as `attn inspect FILE.bin` and a Marian directory read it), and as the `data.pkl` of
//! an archive that also holds storages `0` to `15` of 1 KiB each (so that mutations reach the
//! unpickler without having to keep a zip archive intact). Whatever opens is described and every
//! tensor loaded and converted to f32, as a model load does.
//!
//! Invariants: no panic, no abort; a checkpoint that opens has a tensor; each of its tensors
//! loads, with the shape and dtype its info gives, and holds no more bytes than the input
//! (loading never allocates past the file).

use candle::{DType, Device};
use candle_attention::weights::PthCheckpoint;

/// Runs one input; panics on a finding.
pub fn check(data: &[u8]) {
    exercise(
        PthCheckpoint::from_bytes(data.to_vec(), "fuzz.bin"),
        data.len(),
    );
    let wrapped = wrap(data);
    let len = wrapped.len();
    exercise(PthCheckpoint::from_bytes(wrapped, "fuzz-wrapped.bin"), len);
}

fn exercise(opened: candle::Result<PthCheckpoint>, len: usize) {
    let Ok(ckpt) = opened else {
        return;
    };
    assert!(ckpt.tensor_count() > 0, "an empty checkpoint opened");
    assert_eq!(ckpt.names().len(), ckpt.tensor_count());
    for name in ckpt.names() {
        let info = ckpt.info(name).expect("a listed name has an info").clone();
        assert!(ckpt.contains(name));
        let t = ckpt
            .load(name, &Device::Cpu)
            .unwrap_or_else(|e| panic!("'{name}' validated at open but does not load: {e}"));
        assert_eq!(t.dims(), info.shape(), "{name}");
        assert_eq!(t.dtype(), info.dtype(), "{name}");
        assert!(
            t.elem_count() * t.dtype().size_in_bytes() <= len,
            "'{name}' holds more bytes than the file"
        );
        t.to_dtype(DType::F32)
            .unwrap_or_else(|e| panic!("'{name}' does not convert to f32: {e}"));
    }
}

/// `pkl` as `archive/data.pkl` of a checkpoint with storages `archive/data/0` to `15`.
fn wrap(pkl: &[u8]) -> Vec<u8> {
    let storages: Vec<(String, Vec<u8>)> = (0..16u8)
        .map(|k| {
            let data = (0..1024u32)
                .map(|i| (i as u8).wrapping_mul(31).wrapping_add(k))
                .collect();
            (format!("archive/data/{k}"), data)
        })
        .collect();
    let mut entries: Vec<(&str, &[u8])> =
        vec![("archive/data.pkl", pkl), ("archive/byteorder", b"little")];
    entries.extend(storages.iter().map(|(n, d)| (n.as_str(), d.as_slice())));
    entries.push(("archive/version", b"3\n"));
    zip_stored(&entries)
}

/// A zip archive of stored entries (no CRC: the reader checks none).
fn zip_stored(entries: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut central = Vec::new();
    for (name, data) in entries {
        let offset = out.len() as u32;
        let header = |sig: u32, central: bool| {
            let mut h = sig.to_le_bytes().to_vec();
            if central {
                h.extend_from_slice(&20u16.to_le_bytes());
            }
            h.extend_from_slice(&20u16.to_le_bytes());
            h.extend_from_slice(&[0; 12]); // flags, method (stored), time, date, crc
            h.extend_from_slice(&(data.len() as u32).to_le_bytes());
            h.extend_from_slice(&(data.len() as u32).to_le_bytes());
            h.extend_from_slice(&(name.len() as u16).to_le_bytes());
            h.extend_from_slice(&0u16.to_le_bytes());
            if central {
                h.extend_from_slice(&[0; 10]); // comment, disk, attributes
                h.extend_from_slice(&offset.to_le_bytes());
            }
            h.extend_from_slice(name.as_bytes());
            h
        };
        out.extend(header(0x04034b50, false));
        out.extend_from_slice(data);
        central.extend(header(0x02014b50, true));
    }
    let start = out.len() as u32;
    out.extend_from_slice(&central);
    out.extend_from_slice(&0x06054b50u32.to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&(entries.len() as u16).to_le_bytes());
    out.extend_from_slice(&(entries.len() as u16).to_le_bytes());
    out.extend_from_slice(&(central.len() as u32).to_le_bytes());
    out.extend_from_slice(&start.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out
}
