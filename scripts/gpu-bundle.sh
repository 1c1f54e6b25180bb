#!/usr/bin/env bash
# Build, on THIS machine (no GPU needed), everything scripts/gpu-run.sh runs on a device
# machine, which has CUDA 13.0 (nvcc, driver 580) and PyTorch's CUDA libraries but no Rust
# toolchain, no crates and no network:
#
#   scripts/gpu-bundle.sh            # -> .gpu-bundle/bundle.tar.xz (+ the scripts it needs)
#   GPU_BUNDLE_FEATURES=cuda scripts/gpu-bundle.sh   # without flash-attn (see the cost below)
#   GPU_BUNDLE_TESTS='lib-candle_attention|gqa|mha_api' scripts/gpu-bundle.sh  # some test binaries
#
# then ONE device call (the lead's), e.g.
#   run(command="bash .gpu-bundle/gpu-run.sh", carry=[".gpu-bundle"], timeout_s=560)
#
# What it builds: `cargo test --no-run --features cuda,flash-attn` (every test binary of the
# workspace) and `attn`, compiled for CUDA_COMPUTE_CAP (default 90: H100/H200, sm_90a), with
# the CUDA 13.0 toolkit of scripts/cuda-check.sh. The dev profile (dependencies at opt-level
# 3, this crate at 1: GPU work is in the kernels) shares candle-kernels' nvcc build with
# scripts/cuda-check.sh in the same target dir; a release build would compile it again.
# Cost: candle-kernels' PTX + libmoe.a and, with flash-attn, 53 FlashAttention kernel files
# compiled one at a time on a 2-core machine (cudaforge uses half the cores): several CPU
# minutes per file, hours in all (docs/cuda.md has the figures). CANDLE_FLASH_ATTN_BUILD_DIR
# keeps libflashattention.a in $CUDA_CHECK_CACHE/flash-attn-build across target dirs. The device tool carries at
# most 64 MiB: the binaries go stripped into one xz archive (they share most of their bytes:
# candle's PTX and the FlashAttention kernels), and the script fails loudly if it is too big.
#
# Linking needs libcuda, libcublas, libcublasLt, libcurand and libnvrtc (cudarc links them
# dynamically). Rather than downloading ~1 GB of wheels for a link step, it links against
# stub libraries with the real sonames (libcuda.so.1, libcublas.so.13, libcublasLt.so.13,
# libcurand.so.10, libnvrtc.so.13) that define exactly the symbols the linker asked for: at run
# time the device machine's real libraries are loaded under those names (gpu-run.sh puts
# them on LD_LIBRARY_PATH). libcudart.so.13 is the real one from the toolkit wheel.
#
# Env: CUDA_CHECK_CACHE, CUDA_COMPUTE_CAP, CARGO_TARGET_DIR (as scripts/cuda-check.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
cache=${CUDA_CHECK_CACHE:-/tmp/candle-attention-cuda}
export CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-90}
scripts/cuda-check.sh setup
toolkit=$cache/toolkit/nvidia/cu13
export CUDA_HOME=$toolkit PATH=$toolkit/bin:$PATH CUDAFORGE_HOME=$cache/cudaforge
features=${GPU_BUNDLE_FEATURES:-cuda,flash-attn}
mkdir -p "$cache/flash-attn-build"
export CANDLE_FLASH_ATTN_BUILD_DIR=$cache/flash-attn-build
target=${CARGO_TARGET_DIR:-$root/target}
stubs=$cache/link-stubs
mkdir -p "$stubs"

# lib name, soname, symbol pattern (first match wins, in this order).
libs=(
  "cublasLt libcublasLt.so.13 ^cublasLt"
  "cublas libcublas.so.13 ^cublas"
  "curand libcurand.so.10 ^curand"
  "nvrtc libnvrtc.so.13 ^nvrtc"
  "cuda libcuda.so.1 ^cu[A-Z]"
)
make_stubs() { # make_stubs SYMBOL_FILE: one stub .so per library, defining its symbols
  for spec in "${libs[@]}"; do
    read -r name soname _ <<<"$spec"
    : >"$stubs/$name.c"
  done
  local sym spec name soname pat
  while read -r sym; do
    for spec in "${libs[@]}"; do
      read -r name soname pat <<<"$spec"
      if [[ $sym =~ $pat ]]; then
        echo "void $sym(void) {}" >>"$stubs/$name.c"
        break
      fi
    done
  done < <(grep -E '^(cublasLt|cublas|curand|nvrtc|cu[A-Z])' "$1")
  for spec in "${libs[@]}"; do
    read -r name soname _ <<<"$spec"
    cc -shared -fPIC -o "$stubs/lib$name.so" -Wl,-soname,"$soname" "$stubs/$name.c"
  done
}
touch "$stubs/symbols.txt"
make_stubs "$stubs/symbols.txt"

build() {
  # LIBRARY_PATH, not RUSTFLAGS: the linker driver (cc) searches it for -lcuda & co., and it
  # is not part of cargo's fingerprints (RUSTFLAGS would rebuild everything, nvcc included).
  LIBRARY_PATH=$stubs:$toolkit/lib${LIBRARY_PATH:+:$LIBRARY_PATH} nice -n 19 \
    cargo test --workspace --features "$features" --no-run --no-fail-fast \
    --message-format=json-render-diagnostics >"$stubs/build.json" 2>"$stubs/build.log" && return 0
  cp "$stubs/build.log" "$stubs/build-failed-$(date +%s).log"
  return 1
}
t0=$SECONDS
for attempt in 1 2 3 4 5 6; do
  if build; then break; fi
  # The symbols the stubs must define: what the compiled crates leave undefined (nm), and
  # what the linker reported (GNU ld: "undefined reference to `x'", lld: "undefined symbol:
  # x"; lld stops at 20 errors, hence the rounds). Any other error is a real one.
  { nm -u --format=just-symbols "$target"/debug/deps/*.rlib 2>/dev/null || true
    grep -oE "undefined (reference to \`|symbol: )[A-Za-z0-9_]+" "$stubs/build.log" |
      sed -E "s/.*(\`|: )//" || true; } | grep -E '^(cublasLt|cublas|curand|nvrtc|cu[A-Z])' |
    sort -u | comm -23 - "$stubs/symbols.txt" >"$stubs/new.txt" || true
  if [ ! -s "$stubs/new.txt" ] || [ "$attempt" = 6 ]; then
    tail -40 "$stubs/build.log" >&2
    echo "error: the CUDA build failed (log: $stubs/build.log)" >&2
    exit 1
  fi
  sort -u "$stubs/symbols.txt" "$stubs/new.txt" -o "$stubs/symbols.txt"
  echo "linking against stubs for $(wc -l <"$stubs/symbols.txt") CUDA library symbols"
  make_stubs "$stubs/symbols.txt"
done
LIBRARY_PATH=$stubs:$toolkit/lib${LIBRARY_PATH:+:$LIBRARY_PATH} nice -n 19 \
  cargo build -p attn-cli --features "$features" 2>>"$stubs/build.log"
echo "== build ($features: tests + attn): $((SECONDS - t0)) s"

# The test executables cargo reported, plus attn. Test binaries find fixtures through the
# CARGO_MANIFEST_DIR and CARGO_BIN_EXE_attn baked in at compile time: gpu-run.sh recreates
# those paths on the device (the repository itself travels with every device call).
bundle=$root/.gpu-bundle
exclude=$(git rev-parse --git-path info/exclude)
grep -qx '/.gpu-bundle/' "$exclude" 2>/dev/null || echo '/.gpu-bundle/' >>"$exclude"
rm -rf "$bundle" && mkdir -p "$bundle/stage/bin"
python3 - "$stubs/build.json" "$bundle/stage/bin" <<'EOF'
import json, shutil, sys, os, re
# GPU_BUNDLE_TESTS: a regular expression on the names below (default: every test binary).
keep = re.compile(os.environ.get("GPU_BUNDLE_TESTS", ""))
seen = set()
for line in open(sys.argv[1]):
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        exe = m["executable"]
        pkg = "attn-cli" if m["manifest_path"].endswith("attn-cli/Cargo.toml") else "candle-attention"
        name = f'test-{pkg}-{m["target"]["kind"][0]}-{m["target"]["name"]}'
        if exe not in seen and keep.search(name):
            seen.add(exe)
            shutil.copy(exe, os.path.join(sys.argv[2], name))
EOF
cp "$target/debug/attn" "$bundle/stage/bin/attn"
strip "$bundle"/stage/bin/*
printf 'manifest_dir=%s\nattn_exe=%s\ncompute_cap=%s\nfeatures=%s\n' "$root" \
  "$target/debug/attn" "$CUDA_COMPUTE_CAP" "$features" >"$bundle/stage/paths"
cp scripts/gpu-run.sh "$bundle/gpu-run.sh"
(cd "$bundle/stage" && tar -cf - . | xz -T2 -9e --lzma2=dict=192MiB >"$bundle/bundle.tar.xz")
ls -la "$bundle"/stage/bin
rm -rf "$bundle/stage"
size=$(du -sm "$bundle" | cut -f1)
echo "bundle: $bundle ($size MiB; the device tool carries at most 64 MiB with the working tree)"
if [ "$size" -gt 60 ]; then
  echo "error: the bundle is too big for the device tool" >&2
  exit 1
fi
