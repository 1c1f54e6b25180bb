//! Crafted checkpoints: a tiny pickle writer and a stored-zip writer, then one test per
//! hostile class (and the well-formed cases they are variations of). Files written by torch
//! itself are checked in `tests/pth_checkpoints.rs`.

use super::*;

/// A pickle, opcode by opcode (protocol 2, as torch writes it).
struct P(Vec<u8>);

impl P {
    fn new() -> Self {
        P(vec![0x80, 2])
    }
    fn raw(mut self, b: &[u8]) -> Self {
        self.0.extend_from_slice(b);
        self
    }
    fn op(self, b: u8) -> Self {
        self.raw(&[b])
    }
    fn global(self, module: &str, name: &str) -> Self {
        self.op(b'c')
            .raw(module.as_bytes())
            .op(b'\n')
            .raw(name.as_bytes())
            .op(b'\n')
    }
    fn str(self, s: &str) -> Self {
        self.op(b'X')
            .raw(&(s.len() as u32).to_le_bytes())
            .raw(s.as_bytes())
    }
    fn int(self, i: i64) -> Self {
        if (0..256).contains(&i) {
            self.op(b'K').op(i as u8)
        } else if let Ok(v) = i32::try_from(i) {
            self.op(b'J').raw(&v.to_le_bytes())
        } else {
            self.op(0x8a).op(8).raw(&i.to_le_bytes())
        }
    }
    fn ints(self, v: &[i64]) -> Self {
        v.iter().fold(self.op(b'('), |p, &i| p.int(i)).op(b't')
    }
    fn put(self, k: u8) -> Self {
        self.op(b'q').op(k)
    }
    fn get(self, k: u8) -> Self {
        self.op(b'h').op(k)
    }
    /// `_rebuild_tensor_v2(storage, offset, size, stride, False, OrderedDict())`.
    fn tensor(self, storage: &str, key: &str, numel: i64, t: (i64, &[i64], &[i64])) -> Self {
        let (offset, size, stride) = t;
        self.global("torch._utils", "_rebuild_tensor_v2")
            .op(b'(')
            .op(b'(')
            .str("storage")
            .global("torch", storage)
            .str(key)
            .str("cpu")
            .int(numel)
            .op(b't')
            .op(b'Q')
            .int(offset)
            .ints(size)
            .ints(stride)
            .op(0x89)
            .global("collections", "OrderedDict")
            .op(b')')
            .op(b'R')
            .op(b't')
            .op(b'R')
    }
    fn stop(self) -> Vec<u8> {
        self.op(b'.').0
    }
}

/// A zip archive of stored entries, as torch writes it (no CRC: nothing here checks one).
fn zip(entries: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut central = Vec::new();
    for (name, data) in entries {
        let offset = out.len() as u32;
        let header = |sig: u32, central: bool| {
            let mut h = sig.to_le_bytes().to_vec();
            if central {
                h.extend_from_slice(&20u16.to_le_bytes()); // made by
            }
            h.extend_from_slice(&20u16.to_le_bytes()); // needed
            h.extend_from_slice(&0u16.to_le_bytes()); // flags
            h.extend_from_slice(&0u16.to_le_bytes()); // stored
            h.extend_from_slice(&0u32.to_le_bytes()); // time, date
            h.extend_from_slice(&0u32.to_le_bytes()); // crc
            h.extend_from_slice(&(data.len() as u32).to_le_bytes());
            h.extend_from_slice(&(data.len() as u32).to_le_bytes());
            h.extend_from_slice(&(name.len() as u16).to_le_bytes());
            h.extend_from_slice(&0u16.to_le_bytes()); // extra
            if central {
                h.extend_from_slice(&[0; 6]); // comment length, disk, internal attributes
                h.extend_from_slice(&0u32.to_le_bytes()); // external attributes
                h.extend_from_slice(&offset.to_le_bytes());
            }
            h.extend_from_slice(name.as_bytes());
            h
        };
        out.extend(header(0x04034b50, false));
        out.extend_from_slice(data);
        central.extend(header(0x02014b50, true));
    }
    let cd_start = out.len() as u32;
    out.extend_from_slice(&central);
    out.extend_from_slice(&0x06054b50u32.to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&(entries.len() as u16).to_le_bytes());
    out.extend_from_slice(&(entries.len() as u16).to_le_bytes());
    out.extend_from_slice(&(central.len() as u32).to_le_bytes());
    out.extend_from_slice(&cd_start.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out
}

/// A checkpoint: `archive/data.pkl` and one entry per storage.
fn archive(pkl: &[u8], storages: &[(&str, &[u8])]) -> Vec<u8> {
    let names: Vec<String> = storages
        .iter()
        .map(|(k, _)| format!("archive/data/{k}"))
        .collect();
    let mut entries: Vec<(&str, &[u8])> =
        vec![("archive/data.pkl", pkl), ("archive/byteorder", b"little")];
    entries.extend(
        names
            .iter()
            .map(String::as_str)
            .zip(storages.iter().map(|s| s.1)),
    );
    entries.push(("archive/version", b"3\n"));
    zip(&entries)
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn open(bytes: Vec<u8>) -> candle::Result<PthCheckpoint> {
    PthCheckpoint::from_bytes(bytes, "crafted.bin")
}

fn err(bytes: Vec<u8>) -> String {
    match open(bytes) {
        Ok(c) => panic!("expected an error, opened {c:?}"),
        Err(e) => e.to_string(),
    }
}

fn assert_mentions(msg: &str, parts: &[&str]) {
    for p in parts {
        assert!(msg.contains(p), "'{msg}' does not mention '{p}'");
    }
}

/// `{"w": f32 (2, 3)}` over storage 0 of six floats, with extra pickle bytes for other keys.
fn one_tensor(extra: impl Fn(P) -> P) -> Vec<u8> {
    let p =
        P::new()
            .op(b'}')
            .op(b'(')
            .str("w")
            .tensor("FloatStorage", "0", 6, (0, &[2, 3], &[3, 1]));
    let pkl = extra(p).op(b'u').stop();
    archive(&pkl, &[("0", &f32_bytes(&[0., 1., 2., 3., 4., 5.]))])
}

fn values(c: &PthCheckpoint, name: &str) -> Vec<f32> {
    c.load(name, &Device::Cpu)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

#[test]
fn a_crafted_state_dict_loads() {
    let c = open(one_tensor(|p| p)).unwrap();
    assert_eq!(c.names(), ["w"]);
    assert_eq!(c.tensor_count(), 1);
    let info = c.info("w").unwrap();
    assert_eq!(
        (info.dtype(), info.shape(), info.torch_dtype()),
        (DType::F32, &[2, 3][..], "float32")
    );
    assert_eq!(values(&c, "w"), [0., 1., 2., 3., 4., 5.]);
}

#[test]
fn strided_views_and_offsets_are_gathered() {
    // The transpose (3, 2) and a column at offset 1 of the same storage.
    let pkl = P::new()
        .op(b'}')
        .op(b'(')
        .str("t")
        .tensor("FloatStorage", "0", 6, (0, &[3, 2], &[1, 3]))
        .str("col")
        .tensor("FloatStorage", "0", 6, (1, &[2], &[3]))
        .str("scalar")
        .tensor("FloatStorage", "0", 6, (5, &[], &[]))
        .str("empty")
        .tensor("FloatStorage", "0", 6, (6, &[0, 4], &[4, 1]))
        .op(b'u')
        .stop();
    let c = open(archive(
        &pkl,
        &[("0", &f32_bytes(&[0., 1., 2., 3., 4., 5.]))],
    ))
    .unwrap();
    assert_eq!(values(&c, "t"), [0., 3., 1., 4., 2., 5.]);
    assert_eq!(c.load("t", &Device::Cpu).unwrap().dims(), [3, 2]);
    assert_eq!(values(&c, "col"), [1., 4.]);
    assert_eq!(values(&c, "scalar"), [5.]);
    assert_eq!(c.load("scalar", &Device::Cpu).unwrap().rank(), 0);
    assert_eq!(c.load("empty", &Device::Cpu).unwrap().dims(), [0, 4]);
}

#[test]
fn big_endian_storages_are_swapped_and_bools_normalised() {
    let pkl = P::new()
        .op(b'}')
        .op(b'(')
        .str("w")
        .tensor("FloatStorage", "0", 2, (0, &[2], &[1]))
        .str("mask")
        .tensor("BoolStorage", "1", 3, (0, &[3], &[1]))
        .op(b'u')
        .stop();
    let be: Vec<u8> = [1.5f32, -2.0]
        .iter()
        .flat_map(|x| x.to_be_bytes())
        .collect();
    let bytes = zip(&[
        ("archive/data.pkl", &pkl),
        ("archive/byteorder", b"big"),
        ("archive/data/0", &be),
        ("archive/data/1", &[0, 2, 1]),
    ]);
    let c = open(bytes).unwrap();
    assert_eq!(values(&c, "w"), [1.5, -2.0]);
    let mask: Vec<u8> = c.load("mask", &Device::Cpu).unwrap().to_vec1().unwrap();
    assert_eq!(mask, [0, 1, 1]);
    assert_eq!(c.info("mask").unwrap().torch_dtype(), "bool");
    let bytes = zip(&[
        ("archive/data.pkl", &pkl),
        ("archive/byteorder", b"middle"),
        ("archive/data/0", &be),
        ("archive/data/1", &[0, 2, 1]),
    ]);
    assert_mentions(&err(bytes), &["crafted.bin", "byteorder", "middle"]);
}

// -- deep nesting -------------------------------------------------------------------------

#[test]
fn nesting_100k_deep_is_an_error_not_an_abort() {
    let marks = P::new().raw(&vec![b'('; 100_000]).stop();
    assert_mentions(
        &err(archive(&marks, &[])),
        &["crafted.bin", "data.pkl", "nesting deeper than 256"],
    );
    // Tuples of tuples without marks.
    let tuples = P::new().op(b'N').raw(&vec![0x85; 100_000]).stop();
    assert_mentions(&err(archive(&tuples, &[])), &["nesting deeper than 256"]);
    // Lists appended into lists, and dicts into dicts.
    let lists = P::new()
        .raw(&vec![b']'; 100_000])
        .raw(&vec![b'a'; 99_999])
        .stop();
    assert_mentions(&err(archive(&lists, &[])), &["nesting deeper than 256"]);
    let mut dicts = P::new();
    for _ in 0..100_000 {
        dicts = dicts.op(b'}').str("k");
    }
    let dicts = dicts.op(b'}').raw(&vec![b's'; 100_000]).stop();
    assert_mentions(&err(archive(&dicts, &[])), &["nesting deeper than 256"]);
}

#[test]
fn nesting_within_the_limit_is_fine() {
    let c = open(one_tensor(|p| {
        p.str("deep").raw(&[b'('; 200]).raw(&[b't'; 200])
    }))
    .unwrap();
    assert_eq!(c.names(), ["w"]);
}

// -- memo blow-up ---------------------------------------------------------------------------

#[test]
fn memo_references_are_shared_not_copied() {
    // junk = L40 where L0 = [None] and L(i+1) = [L(i), L(i)]: 2^40 leaves if memo values were
    // copied; here 41 lists.
    let c = open(one_tensor(|p| {
        let mut p = p.str("junk").op(b']').op(b'N').op(b'a').put(0);
        for i in 0..40u8 {
            p = p.op(b']').op(b'(').get(i).get(i).op(b'e').put(i + 1);
        }
        p
    }))
    .unwrap();
    assert_eq!(values(&c, "w"), [0., 1., 2., 3., 4., 5.]);
    // The same with DUP and tuples: 2^64 leaves in principle.
    let c = open(one_tensor(|p| {
        let mut p = p.str("junk").op(b'N');
        for _ in 0..64 {
            p = p.op(b'2').op(0x86);
        }
        p
    }))
    .unwrap();
    assert_eq!(c.names(), ["w"]);
}

#[test]
fn a_dict_shared_under_two_keys_is_refused() {
    // d(i+1) = {"a": d(i), "b": d(i)}, 40 levels: 2^40 tensor names if followed.
    let tensor = P::new().tensor("FloatStorage", "0", 6, (0, &[6], &[1]));
    let mut p = P::new()
        .op(b'}')
        .put(0)
        .str("w")
        .raw(&tensor.0[2..])
        .op(b's')
        .op(b'0');
    for i in 0..40u8 {
        p = p
            .op(b'}')
            .op(b'(')
            .str("a")
            .get(i)
            .str("b")
            .get(i)
            .op(b'u')
            .put(i + 1)
            .op(b'0');
    }
    let pkl = p.get(40).stop();
    let msg = err(archive(&pkl, &[("0", &f32_bytes(&[0.; 6]))]));
    assert_mentions(&msg, &["crafted.bin", "also stored under another key"]);
}

// -- globals --------------------------------------------------------------------------------

#[test]
fn globals_outside_the_allow_list_are_refused_wherever_they_are() {
    for (module, name) in [
        ("posix", "system"),
        ("os", "system"),
        ("subprocess", "Popen"),
        ("builtins", "eval"),
        ("__main__", "Model"),
        ("torch", "load"),
        ("torch._utils", "_rebuild_qtensor"),
        ("collections", "defaultdict"),
    ] {
        // Under a key the model never reads, called with an argument.
        let bytes = one_tensor(|p| {
            p.str("unused")
                .global(module, name)
                .str("echo hacked")
                .op(0x85)
                .op(b'R')
        });
        assert_mentions(
            &err(bytes),
            &["crafted.bin", &format!("'{module}.{name}'"), "refused"],
        );
    }
    // The protocol-4 spelling.
    let bytes = one_tensor(|p| p.str("unused").str("posix").str("system").op(0x93));
    assert_mentions(&err(bytes), &["'posix.system'", "refused"]);
    // Calling an allowed type is refused as well.
    let bytes = one_tensor(|p| p.str("x").global("torch", "FloatStorage").op(b')').op(b'R'));
    assert_mentions(&err(bytes), &["calls a type"]);
}

#[test]
fn opcodes_that_instantiate_or_look_up_are_refused_by_name() {
    for (op, name) in [
        (b'i', "INST"),
        (b'o', "OBJ"),
        (0x82, "EXT1"),
        (b'P', "PERSID"),
        (0x97, "NEXT_BUFFER"),
    ] {
        let bytes = one_tensor(|p| p.str("x").op(b'(').op(op).raw(b"posix\nsystem\n"));
        assert_mentions(
            &err(bytes),
            &[
                "crafted.bin",
                &format!("unsupported opcode {name}"),
                "offset",
            ],
        );
    }
    let bytes = one_tensor(|p| p.str("x").op(0xff));
    assert_mentions(&err(bytes), &["unknown opcode 0xff", "offset"]);
}

// -- sizes ------------------------------------------------------------------------------------

#[test]
fn a_storage_of_10_to_the_12_elements_is_refused_at_open() {
    let pkl = P::new()
        .op(b'}')
        .op(b'(')
        .str("huge")
        .tensor(
            "FloatStorage",
            "0",
            1_000_000_000_000,
            (0, &[1_000_000, 1_000_000], &[1_000_000, 1]),
        )
        .op(b'u')
        .stop();
    let msg = err(archive(&pkl, &[("0", &f32_bytes(&[0.; 4]))]));
    assert_mentions(
        &msg,
        &[
            "crafted.bin",
            "tensor 'huge'",
            "1000000000000 elements",
            "holds 16 bytes",
        ],
    );
    // An honest storage with a shape that claims more than it holds.
    let pkl = P::new()
        .op(b'}')
        .op(b'(')
        .str("huge")
        .tensor(
            "FloatStorage",
            "0",
            4,
            (0, &[1_000_000, 1_000_000], &[1_000_000, 1]),
        )
        .op(b'u')
        .stop();
    let msg = err(archive(&pkl, &[("0", &f32_bytes(&[0.; 4]))]));
    assert_mentions(&msg, &["tensor 'huge'", "[1000000, 1000000]", "(4)"]);
}

#[test]
fn shapes_strides_and_offsets_that_lie_are_refused_naming_the_tensor() {
    let storage = f32_bytes(&[0.; 6]);
    let case = |t: (i64, &[i64], &[i64])| {
        let pkl = P::new()
            .op(b'}')
            .op(b'(')
            .str("bad")
            .tensor("FloatStorage", "0", 6, t)
            .op(b'u')
            .stop();
        err(archive(&pkl, &[("0", &storage)]))
    };
    assert_mentions(
        &case((0, &[-1, 3], &[3, 1])),
        &["tensor 'bad'", "negative dimension"],
    );
    assert_mentions(
        &case((0, &[2, 3], &[-3, 1])),
        &["tensor 'bad'", "negative stride"],
    );
    assert_mentions(
        &case((-1, &[2], &[1])),
        &["tensor 'bad'", "negative storage offset"],
    );
    assert_mentions(
        &case((1 << 62, &[2], &[1])),
        &["tensor 'bad'", "past the end"],
    );
    assert_mentions(
        &case((5, &[2], &[1])),
        &["tensor 'bad'", "past the end", "6 elements"],
    );
    assert_mentions(
        &case((0, &[2, 3], &[4, 1])),
        &["tensor 'bad'", "past the end"],
    );
    assert_mentions(
        &case((0, &[3], &[1 << 62])),
        &["tensor 'bad'", "past the end"],
    );
    assert_mentions(
        &case((7, &[0], &[1])),
        &["tensor 'bad'", "starts past the end"],
    );
    // Element counts that overflow usize.
    assert_mentions(
        &case((0, &[1 << 62, 1 << 62, 16], &[0, 0, 0])),
        &["tensor 'bad'", "more elements than its storage"],
    );
    // A broadcast (stride 0) view with more elements than its storage.
    assert_mentions(
        &case((0, &[3, 4], &[1, 0])),
        &["tensor 'bad'", "[3, 4]", "(6)"],
    );
    // Shape and stride of different ranks; too many dimensions.
    let pkl = P::new()
        .op(b'}')
        .op(b'(')
        .str("bad")
        .tensor("FloatStorage", "0", 6, (0, &[6], &[1, 1]))
        .op(b'u')
        .stop();
    assert_mentions(
        &err(archive(&pkl, &[("0", &storage)])),
        &["differ in length"],
    );
    let ones = vec![1; 65];
    let pkl = P::new()
        .op(b'}')
        .op(b'(')
        .str("bad")
        .tensor("FloatStorage", "0", 6, (0, &ones, &ones))
        .op(b'u')
        .stop();
    assert_mentions(&err(archive(&pkl, &[("0", &storage)])), &["65 dimensions"]);
}

#[test]
fn storages_must_exist_agree_and_be_representable() {
    let storage = f32_bytes(&[0.; 6]);
    let with = |storage_class: &str, key: &str, numel: i64, entries: &[(&str, &[u8])]| {
        let pkl = P::new()
            .op(b'}')
            .op(b'(')
            .str("w")
            .tensor("FloatStorage", "0", 6, (0, &[6], &[1]))
            .str("v")
            .tensor(storage_class, key, numel, (0, &[1], &[1]))
            .op(b'u')
            .stop();
        err(archive(&pkl, entries))
    };
    assert_mentions(
        &with("FloatStorage", "1", 1, &[("0", &storage)]),
        &["tensor 'v'", "archive/data/1 is missing"],
    );
    assert_mentions(
        &with("LongStorage", "0", 3, &[("0", &storage)]),
        &["tensor 'v'", "storage '0'", "int64"],
    );
    assert_mentions(
        &with("CharStorage", "1", 1, &[("0", &storage), ("1", &[1])]),
        &["tensor 'v'", "int8", "cannot represent"],
    );
    assert_mentions(
        &with("FloatStorage", "../0", 1, &[("0", &storage)]),
        &["crafted.bin", "storage key '../0'", "not a plain name"],
    );
}

#[test]
fn an_empty_state_dict_or_no_dict_is_refused() {
    assert_mentions(
        &err(archive(&P::new().op(b'}').stop(), &[])),
        &["crafted.bin", "holds no tensor"],
    );
    let only_junk = P::new().op(b'}').str("epoch").int(3).op(b's').stop();
    assert_mentions(&err(archive(&only_junk, &[])), &["holds no tensor"]);
    assert_mentions(
        &err(archive(&P::new().op(b']').stop(), &[])),
        &["a list, not a state dict"],
    );
}

#[test]
fn nested_dicts_give_dotted_names_and_duplicates_are_refused() {
    let t = P::new().tensor("FloatStorage", "0", 6, (0, &[6], &[1]));
    let pkl = P::new()
        .op(b'}')
        .str("model")
        .op(b'}')
        .str("enc")
        .raw(&t.0[2..])
        .op(b's')
        .op(b's')
        .str("epoch")
        .int(3)
        .op(b's')
        .stop();
    let c = open(archive(&pkl, &[("0", &f32_bytes(&[0.; 6]))])).unwrap();
    assert_eq!(c.names(), ["model.enc"]);
    let pkl = P::new()
        .op(b'}')
        .str("a")
        .op(b'}')
        .str("b")
        .raw(&t.0[2..])
        .op(b's')
        .op(b's')
        .str("a.b")
        .raw(&t.0[2..])
        .op(b's')
        .stop();
    assert_mentions(
        &err(archive(&pkl, &[("0", &f32_bytes(&[0.; 6]))])),
        &["'a.b' occurs twice"],
    );
}

// -- the stream and the archive ---------------------------------------------------------------

#[test]
fn lengths_are_checked_before_allocating() {
    for op in [b'X', b'B', b'T'] {
        let bytes = one_tensor(|p| p.str("x").op(op).raw(&u32::MAX.to_le_bytes()));
        assert_mentions(&err(bytes), &["crafted.bin", "longer than the"]);
    }
    for op in [0x8d, 0x8e, 0x96, 0x95] {
        let bytes = one_tensor(|p| p.str("x").op(op).raw(&u64::MAX.to_le_bytes()));
        assert_mentions(&err(bytes), &["longer than the"]);
    }
    let bytes = one_tensor(|p| p.str("x").op(0x8b).raw(&u32::MAX.to_le_bytes()));
    assert_mentions(&err(bytes), &["longer than the"]);
    // A GLOBAL line without its newline.
    let bytes = one_tensor(|p| p.str("x").op(b'c').raw(&[b'a'; 1000]));
    assert_mentions(&err(bytes), &["longer than 256"]);
}

#[test]
fn truncated_or_corrupted_archives_are_errors() {
    let good = one_tensor(|p| p);
    for n in 0..good.len() {
        let msg = err(good[..n].to_vec());
        assert!(msg.starts_with("crafted.bin: "), "{msg}");
    }
    // Every byte flipped: an error or a checkpoint whose tensors load; never a panic.
    for i in 0..good.len() {
        let mut bad = good.clone();
        bad[i] ^= 0xff;
        if let Ok(c) = open(bad) {
            for name in c.names() {
                let t = c.load(name, &Device::Cpu).unwrap();
                assert_eq!(t.dims(), c.info(name).unwrap().shape());
            }
        }
    }
    // A truncated pickle inside a sound archive.
    let pkl = P::new().op(b'}').op(b'(').str("w").stop();
    let pkl = &pkl[..pkl.len() - 3];
    assert_mentions(&err(archive(pkl, &[])), &["data.pkl", "truncated"]);
}

#[test]
fn entries_past_the_end_or_compressed_are_refused() {
    let good = one_tensor(|p| p);
    // The storage entry's sizes (local and central headers) say 1 MiB.
    let mut bad = good.clone();
    let data0 = b"archive/data/0";
    let mut patched = 0;
    for i in 0..bad.len() - data0.len() {
        if &bad[i..i + data0.len()] == data0 {
            let sizes = i - if bad[i - 46..i - 42] == [0x50, 0x4b, 1, 2] {
                46 - 20
            } else {
                30 - 18
            };
            for off in [sizes, sizes + 4] {
                bad[off..off + 4].copy_from_slice(&(1u32 << 20).to_le_bytes());
            }
            patched += 1;
        }
    }
    assert_eq!(patched, 2);
    let msg = err(bad);
    assert!(msg.starts_with("crafted.bin: "), "{msg}");
    // Compression method 8 (deflate) in both headers.
    let mut bad = good.clone();
    for i in 0..bad.len() - data0.len() {
        if &bad[i..i + data0.len()] == data0 {
            let method = i - if bad[i - 46..i - 42] == [0x50, 0x4b, 1, 2] {
                46 - 10
            } else {
                30 - 8
            };
            bad[method] = 8;
        }
    }
    let msg = err(bad);
    assert_mentions(&msg, &["crafted.bin"]);
    // Not a zip at all, and the legacy format.
    assert_mentions(
        &err(b"hello".to_vec()),
        &["crafted.bin", "not a torch checkpoint"],
    );
    assert_mentions(
        &err(P::new().op(b'}').stop()),
        &["legacy torch.save format"],
    );
    assert_mentions(
        &err(zip(&[("other/file", b"x")])),
        &["without other/data.pkl"],
    );
}

#[test]
fn lazily_negated_views_are_refused() {
    let pkl = P::new()
        .op(b'}')
        .op(b'(')
        .str("neg")
        .global("torch._utils", "_rebuild_tensor_v2")
        .op(b'(')
        .op(b'(')
        .str("storage")
        .global("torch", "FloatStorage")
        .str("0")
        .str("cpu")
        .int(1)
        .op(b't')
        .op(b'Q')
        .int(0)
        .ints(&[1])
        .ints(&[1])
        .op(0x89)
        .op(b'N')
        .op(b'}')
        .str("neg")
        .op(0x88)
        .op(b's')
        .op(b't')
        .op(b'R')
        .op(b'u')
        .stop();
    let msg = err(archive(&pkl, &[("0", &f32_bytes(&[1.]))]));
    assert_mentions(&msg, &["tensor 'neg'", "negated"]);
}

#[test]
fn parameters_and_protocol_1_booleans_are_understood() {
    // _rebuild_parameter(tensor, INT "01" (protocol 1's True), OrderedDict()).
    let p = P::new()
        .op(b'}')
        .op(b'(')
        .str("p")
        .global("torch._utils", "_rebuild_parameter")
        .op(b'(');
    let inner = P::new().tensor("FloatStorage", "0", 6, (0, &[6], &[1]));
    let pkl = p
        .raw(&inner.0[2..])
        .raw(b"I01\n")
        .global("collections", "OrderedDict")
        .op(b')')
        .op(b'R')
        .op(b't')
        .op(b'R')
        .op(b'u')
        .stop();
    let c = open(archive(
        &pkl,
        &[("0", &f32_bytes(&[1., 2., 3., 4., 5., 6.]))],
    ))
    .unwrap();
    assert_eq!(values(&c, "p"), [1., 2., 3., 4., 5., 6.]);
}

#[test]
fn memoised_arguments_cannot_amplify_work_or_memory() {
    // One rank-64 tensor rebuilt under 100,000 names from memoised arguments: 5 bytes of
    // pickle each would be 1 KiB of shape and strides each; the dimension budget refuses it.
    let ones = vec![1; 64];
    let mut p = P::new()
        .op(b'}')
        .op(b'(')
        .str("w")
        .global("torch._utils", "_rebuild_tensor_v2")
        .put(1)
        .op(b'(')
        .op(b'(')
        .str("storage")
        .global("torch", "FloatStorage")
        .str("0")
        .str("cpu")
        .int(1)
        .op(b't')
        .op(b'Q')
        .int(0)
        .ints(&ones)
        .ints(&ones)
        .op(0x89)
        .op(b'N')
        .op(b't')
        .put(2)
        .op(b'R');
    for i in 0..100_000 {
        p = p.str(&format!("k{i}")).get(1).get(2).op(b'R');
    }
    let bytes = archive(&p.op(b'u').stop(), &[("0", &f32_bytes(&[1.]))]);
    assert_mentions(
        &err(bytes),
        &["crafted.bin", "dimensions past what the pickle"],
    );
    // Argument tuples, tensor metadata and storage keys are bounded before they are used.
    let bytes = one_tensor(|p| {
        p.str("x")
            .global("collections", "OrderedDict")
            .raw(&[b'('; 1])
            .raw(&[b'N'; 9])
            .op(b't')
            .op(b'R')
    });
    assert_mentions(&err(bytes), &["tuple of 9 items"]);
    let long_key = "7".repeat(65);
    let pkl = P::new()
        .op(b'}')
        .op(b'(')
        .str("w")
        .tensor("FloatStorage", &long_key, 1, (0, &[1], &[1]))
        .op(b'u')
        .stop();
    assert_mentions(
        &err(archive(&pkl, &[])),
        &["not a plain name of at most 64"],
    );
}
