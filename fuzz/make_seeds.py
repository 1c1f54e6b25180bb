"""Writes the seed corpora of the fuzz targets into fuzz/seeds/<target>/ (committed).

Plain Python, no packages: the seeds are built from the committed test fixtures (real
safetensors files written by PyTorch), the num2words sample, and a few hand-made inputs.
Run from the repository root: python3 fuzz/make_seeds.py
"""
import json
import os
import random
import struct
import sys
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEEDS = os.path.join(ROOT, "fuzz", "seeds")
MHA = os.path.join(ROOT, "tests", "fixtures", "mha")
PTH = os.path.join(ROOT, "tests", "fixtures", "pth")
TRANSFORMER = os.path.join(ROOT, "tests", "fixtures", "transformer")


def write(target, name, data):
    d = os.path.join(SEEDS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def read(path):
    with open(path, "rb") as f:
        return f.read()


def safetensors(tensors):
    """A safetensors file from {name: (dtype, shape, raw bytes)}."""
    header, data = {}, b""
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data


def f32(n, seed=0):
    rnd = random.Random(seed)
    return struct.pack(f"<{n}f", *[rnd.uniform(-1, 1) for _ in range(n)])


def weights_seeds():
    for case in ["single_key", "cross_kdim_vdim_bias_kv", "self_unbatched", "no_bias",
                 "hf_no_bias", "fused_prefix_decoder_cross", "hf_prefix_encoder"]:
        write("load_weights", case, read(os.path.join(MHA, f"{case}.weights.safetensors")))
    # A tiny nn.Transformer state dict: one encoder and one decoder layer, d_model 4, ffn 2.
    t = {}
    d, f = 4, 2
    def lin(prefix, out, inp):
        t[f"{prefix}.weight"] = ("F32", [out, inp], f32(out * inp, len(t)))
        t[f"{prefix}.bias"] = ("F32", [out], f32(out, len(t)))
    def attn(prefix):
        t[f"{prefix}.in_proj_weight"] = ("F32", [3 * d, d], f32(3 * d * d, len(t)))
        t[f"{prefix}.in_proj_bias"] = ("F32", [3 * d], f32(3 * d, len(t)))
        lin(f"{prefix}.out_proj", d, d)
    attn("encoder.layers.0.self_attn")
    lin("encoder.layers.0.linear1", f, d)
    lin("encoder.layers.0.linear2", d, f)
    for n in ["norm1", "norm2"]:
        lin(f"encoder.layers.0.{n}", d, 1)
        t[f"encoder.layers.0.{n}.weight"] = ("F32", [d], f32(d, len(t)))
    t["encoder.norm.weight"] = ("F32", [d], f32(d, 1))
    t["encoder.norm.bias"] = ("F32", [d], f32(d, 2))
    attn("decoder.layers.0.self_attn")
    attn("decoder.layers.0.multihead_attn")
    lin("decoder.layers.0.linear1", f, d)
    lin("decoder.layers.0.linear2", d, f)
    for n in ["norm1", "norm2", "norm3"]:
        t[f"decoder.layers.0.{n}.weight"] = ("F32", [d], f32(d, len(t)))
        t[f"decoder.layers.0.{n}.bias"] = ("F32", [d], f32(d, len(t)))
    t["decoder.norm.weight"] = ("F32", [d], f32(d, 3))
    t["decoder.norm.bias"] = ("F32", [d], f32(d, 4))
    write("load_weights", "transformer_tiny", safetensors(t))
    # Hostile shapes that are easy to miss by mutation alone.
    write("load_weights", "bool_and_f16", safetensors({
        "out_proj.weight": ("F16", [2, 2], b"\0" * 8),
        "mask": ("BOOL", [3], b"\x01\x00\x01"),
    }))
    write("load_weights", "overflowing_shape", safetensors({
        "in_proj_weight": ("F32", [2**62, 2**62], b""),
    }))
    write("load_weights", "huge_header", struct.pack("<Q", 2**32 + 5) + b"{}")


def input_seeds():
    for case in ["self_default", "cross_kdim_vdim", "key_padding_mask", "bool_attn_mask_3d",
                 "self_unbatched", "add_zero_attn_masks"]:
        raw = read(os.path.join(MHA, f"{case}.inputs.safetensors"))
        for flags in [0x00, 0x04, 0x26, 0xC4]:
            write("run_inputs", f"mha_{case}_{flags:02x}", bytes([flags]) + raw)
    for case in ["batch_first_padding", "enc2_dec1_eps1e-6"]:
        raw = read(os.path.join(TRANSFORMER, f"{case}.inputs.safetensors"))
        for flags in [0x01, 0x07]:
            write("run_inputs", f"transformer_{case}_{flags:02x}", bytes([flags]) + raw)


def mask_seeds():
    rnd = random.Random(7)
    # Layout (see fuzz_targets/masks.rs): batch, heads, L, S, D, terms, then per term a
    # kind byte and (for tensors) dtype, rank, dims, values; then a seed byte.
    def term_tensor(kind, dtype, dims):
        n = 1
        for x in dims:
            n *= x
        return bytes([kind, dtype, len(dims), *dims]) + bytes(rnd.randrange(256) for _ in range(n))
    write("masks", "none", bytes([1, 1, 5, 9, 3, 0]))
    write("masks", "causal", bytes([0, 1, 64, 65, 7, 1, 0, 3]))
    write("masks", "key_padding", bytes([1, 0, 3, 6, 2, 1]) + term_tensor(3, 0, [2, 6]))
    write("masks", "bool_2d", bytes([0, 0, 4, 5, 1, 1]) + term_tensor(1, 0, [4, 5]))
    write("masks", "additive_4d", bytes([1, 1, 2, 3, 3, 1]) + term_tensor(2, 1, [1, 2, 2, 3]))
    write("masks", "three_terms", bytes([0, 1, 4, 4, 3, 3, 0, 1]) + term_tensor(4, 2, [4, 4]) + term_tensor(3, 0, [1, 4]))


def tokenizer_seeds():
    lines = read(os.path.join(ROOT, "tests", "fixtures", "num2words", "sample.tsv")).decode().splitlines()
    rnd = random.Random(3)
    for i, line in enumerate(rnd.sample(lines, 12)):
        _, en, de = line.split("\t")
        write("tokenizer", f"en_{i}", en.encode())
        write("tokenizer", f"de_{i}", de.encode())
    write("tokenizer", "american", b"three hundred forty-two")
    write("tokenizer", "multi_line", b"seven\n\nnine hundred thousand\nten million")
    write("tokenizer", "unknown", b"three hundred and fourty-two")
    write("tokenizer", "vocab_json", json.dumps(["<pad>", "<bos>", "<eos>", "<unk>", "one"]).encode())
    write("tokenizer", "unicode", "Zwölf — ＴＷＥＬＶＥ \u0301 \ud7ff".encode("utf-8", "surrogatepass"))


def pth_seeds():
    """pth_reader: small torch checkpoints written by torch (tests/fixtures/pth), the bare
    data.pkl of some (the check also wraps its input in an archive with storages 0..15), and
    hand-made hostile pickles: deep nesting, memo blow-up, foreign globals, lying sizes."""
    def zip_of(pkl, storages=(), byteorder=b"little"):
        import io
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
            z.writestr("archive/data.pkl", pkl)
            z.writestr("archive/byteorder", byteorder)
            for k, data in storages:
                z.writestr(f"archive/data/{k}", data)
            z.writestr("archive/version", "3\n")
        return buf.getvalue()

    def s(x):
        return b"X" + struct.pack("<I", len(x)) + x.encode()

    def tensor(cls, key, numel, offset, size, stride):
        ints = lambda v: b"(" + b"".join(b"J" + struct.pack("<i", i) for i in v) + b"t"
        return (b"ctorch._utils\n_rebuild_tensor_v2\n((" + s("storage") + b"ctorch\n" + cls
                + b"\n" + s(key) + s("cpu") + b"\x8a\x08" + struct.pack("<q", numel) + b"tQ"
                + b"J" + struct.pack("<i", offset) + ints(size) + ints(stride)
                + b"\x89ccollections\nOrderedDict\n)RtR")

    for name in ["dtypes.pt", "views.pt", "module.pt", "nested.pt", "params.pt", "protocol1.pt",
                 "protocol4.pt", "big_endian.pt", "refused/expanded.pt", "refused/int8.pt",
                 "refused/empty.pt", "refused/huge_storage.pt", "refused/deflated.pt",
                 "refused/smuggled_posix_system.pt", "refused/legacy.pt"]:
        data = read(os.path.join(PTH, name))
        seed = name.replace("refused/", "refused_").replace(".pt", "")
        write("pth_reader", seed, data)
        if zipfile.is_zipfile(os.path.join(PTH, name)) and not name.startswith("refused/"):
            z = zipfile.ZipFile(os.path.join(PTH, name))
            pkl = [n for n in z.namelist() if n.endswith("/data.pkl")][0]
            write("pth_reader", f"{seed}.pkl", z.read(pkl))
    f32 = struct.pack("<6f", *range(6))
    one = b"\x80\x02}(" + s("w") + tensor(b"FloatStorage", "0", 6, 0, [2, 3], [3, 1])
    write("pth_reader", "crafted_one", zip_of(one + b"u.", [("0", f32)]))
    write("pth_reader", "crafted_one.pkl", one + b"u.")
    write("pth_reader", "crafted_strided.pkl", b"\x80\x02}(" + s("t") + tensor(b"FloatStorage", "1", 6, 1, [3, 2], [1, 3]) + b"u.")
    write("pth_reader", "deep_marks.pkl", b"\x80\x02" + b"(" * 5000 + b".")
    write("pth_reader", "deep_tuples.pkl", b"\x80\x02N" + b"\x85" * 5000 + b".")
    memo = b"\x80\x02}(" + s("w") + tensor(b"FloatStorage", "0", 6, 0, [6], [1]) + s("junk") + b"]q\x00Na"
    for i in range(40):
        memo += b"](h" + bytes([i]) + b"h" + bytes([i]) + b"eq" + bytes([i + 1])
    write("pth_reader", "memo_blowup.pkl", memo + b"u.")
    write("pth_reader", "posix_system.pkl", one + s("unused") + b"cposix\nsystem\n" + s("true") + b"\x85Ru.")
    write("pth_reader", "huge_storage", zip_of(b"\x80\x02}(" + s("w") + tensor(b"FloatStorage", "0", 10**12, 0, [10**6, 10**6], [10**6, 1]) + b"u.", [("0", bytes(16))]))
    write("pth_reader", "big_endian_crafted", zip_of(one + b"u.", [("0", struct.pack(">6f", *range(6)))], b"big"))


if __name__ == "__main__":
    weights_seeds()
    input_seeds()
    mask_seeds()
    tokenizer_seeds()
    pth_seeds()
    for t in sorted(os.listdir(SEEDS)):
        files = os.listdir(os.path.join(SEEDS, t))
        size = sum(os.path.getsize(os.path.join(SEEDS, t, f)) for f in files)
        print(f"{t}: {len(files)} seeds, {size} bytes", file=sys.stderr)
