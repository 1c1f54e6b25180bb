#!/usr/bin/env bash
# The GPU check, run ON a device machine (one H200) in one call of at most ~9 minutes:
# the test suite with ATTN_TEST_DEVICE=cuda, `attn bench attention` for N = 1024 ... 16384
# (f32 and bf16; impls generic, naive, flash-attn) and the Marian generation benchmark.
# Results land in $OUT (at most 8 files come back):
#   run.log        everything, with the wall time of each step
#   gpu.txt        nvidia-smi, the libraries found, the bundle's build settings
#   tests.log      every test binary's output
#   bench.jsonl    one JSON object per attention benchmark (failed runs: {"error": ...})
#   marian.json    bench/compare_marian.py --json (CPU, both sides, 16 threads)
#   generate.jsonl `attn generate --device cuda` timings (when attn has --device)
#
# The device machine has CUDA 13.0 and PyTorch but no Rust toolchain and no network, so the
# binaries are built beforehand, HERE, by scripts/gpu-bundle.sh (it writes .gpu-bundle/,
# git-ignored, with this script in it). The lead's device call is then:
#   run(command="bash .gpu-bundle/gpu-run.sh", carry=[".gpu-bundle"], timeout_s=560)
# (or `bash scripts/gpu-run.sh`: both look for .gpu-bundle/ in the repository root.)
#
# Budget (seconds, each step cut off by `timeout` so the whole run ends in time; figures for
# the steps are guesses until the first run): setup 30, tests 180, attention benches 150,
# Marian 130. Override with GPU_RUN_TESTS_S, GPU_RUN_BENCH_S, GPU_RUN_MARIAN_S.
set -uo pipefail
start=$SECONDS
repo=$(cd "$(dirname "$0")/.." && pwd)
[ -d "$repo/.gpu-bundle" ] || repo=$PWD
bundle=$repo/.gpu-bundle
OUT=${OUT:-/tmp/gpu-run-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/run.log") 2>&1
step() { echo "== [$((SECONDS - start)) s] $*"; }
left() { echo $((${1} - (SECONDS - ${2}))); } # left BUDGET STEP_START

step "setup"
if [ ! -f "$bundle/bundle.tar.xz" ]; then
  echo "error: $bundle/bundle.tar.xz is missing: run scripts/gpu-bundle.sh here first and carry .gpu-bundle"
  exit 1
fi
work=/tmp/gpu-bundle
rm -rf "$work" && mkdir -p "$work" && xz -dc "$bundle/bundle.tar.xz" | tar -xf - -C "$work" || exit 1
# shellcheck disable=SC1091
. "$work/paths" # manifest_dir, attn_exe (baked into the test binaries), compute_cap, features
if [ "$manifest_dir" != "$repo" ]; then
  mkdir -p "$(dirname "$manifest_dir")" && ln -sfn "$repo" "$manifest_dir"
fi
mkdir -p "$(dirname "$attn_exe")" && cp "$work/bin/attn" "$attn_exe"
attn=$work/bin/attn

# The CUDA libraries the binaries were linked against (by soname), wherever this image has them.
py=$(command -v python3)
dirs=$("$py" -c 'import nvidia, os; print(" ".join(nvidia.__path__))' 2>/dev/null)
libdirs=
for lib in libcuda.so.1 libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcurand.so.10 libnvrtc.so.13; do
  ldconfig -p | grep -q " $lib " && continue
  p=$(find $dirs /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/nvidia \
    -name "$lib" 2>/dev/null | head -1)
  [ -n "$p" ] && libdirs=$libdirs:$(dirname "$p")
done
libdirs=${libdirs#:}
export LD_LIBRARY_PATH=$libdirs${LD_LIBRARY_PATH:+${libdirs:+:}$LD_LIBRARY_PATH}
{
  nvidia-smi
  nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv
  echo "bundle built for compute capability $compute_cap with features $features"
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  ldd "$attn" | grep -E "cuda|cublas|curand|nvrtc|not found"
} >"$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
if ldd "$attn" | grep -q "not found"; then
  echo "error: a library attn needs is missing (above)"
fi

step "tests (ATTN_TEST_DEVICE=cuda)"
t0=$SECONDS
budget=${GPU_RUN_TESTS_S:-180}
export ATTN_TEST_DEVICE=cuda
pass=0 fail=0
for t in "$work"/bin/test-*; do
  name=${t##*/}
  rest=$(left "$budget" "$t0")
  if [ "$rest" -le 5 ]; then
    echo "SKIPPED (tests budget spent): $name" | tee -a "$OUT/tests.log"
    continue
  fi
  # Integration tests run from their package root, as cargo runs them.
  dir=$manifest_dir
  [[ $name == test-attn-cli-* ]] && dir=$manifest_dir/attn-cli
  echo "---- $name" >>"$OUT/tests.log"
  if (cd "$dir" && timeout "$rest" "$t" >>"$OUT/tests.log" 2>&1); then
    pass=$((pass + 1))
  else
    fail=$((fail + 1))
    echo "FAILED: $name" | tee -a "$OUT/tests.log"
  fi
done
echo "test binaries: $pass passed, $fail failed"
# The GPU-only tests of the flash-attn path are #[ignore]d on CPU machines.
lib_tests=$(ls "$work"/bin/test-*-lib-candle_attention 2>/dev/null | head -1)
if [ -n "$lib_tests" ]; then
  echo "---- $lib_tests --ignored sdpa::flash_cuda" >>"$OUT/tests.log"
  if (cd "$manifest_dir" && timeout 120 "$lib_tests" --ignored sdpa::flash_cuda 2>&1 | tee -a "$OUT/tests.log" | tail -5); then
    echo "flash-attn GPU tests: see above"
  fi
fi
unset ATTN_TEST_DEVICE

step "attention benchmarks"
t0=$SECONDS
budget=${GPU_RUN_BENCH_S:-150}
# --device comes with the device-generic path; without it only flash-attn (which moves its
# inputs to the GPU itself) runs on the GPU, and CPU runs at these sizes would take minutes.
has_device=0
"$attn" bench attention --help 2>/dev/null | grep -q -- '--device' && has_device=1
for n in 1024 2048 4096 8192 16384; do
  for dtype in bf16 f32; do
    for imp in flash-attn generic naive; do
      [ "$imp" = flash-attn ] && [ "$dtype" = f32 ] && continue # flash-attn: f16/bf16 only
      [ "$imp" = flash-attn ] && [[ $features != *flash-attn* ]] && continue
      dev=()
      if [ "$imp" != flash-attn ]; then
        [ "$has_device" = 1 ] || continue
        dev=(--device cuda)
      fi
      rest=$(left "$budget" "$t0")
      [ "$rest" -le 5 ] && { echo "bench budget spent at N=$n $dtype $imp"; break 3; }
      args=(bench attention "${dev[@]}" --batch 1 --heads 16 --head-dim 64 --seq-q "$n" --seq-k "$n"
        --dtype "$dtype" --impl "$imp" --iters 10 --warmup 3 --json)
      if ! out=$(timeout "$((rest < 60 ? rest : 60))" "$attn" "${args[@]}" 2>&1); then
        echo "failed: attn ${args[*]}: $(tail -2 <<<"$out")"
        printf '{"error": %s, "impl": "%s", "dtype": "%s", "seq_q": %s}\n' \
          "$("$py" -c 'import json,sys; print(json.dumps(sys.argv[1][-300:]))' "$out")" \
          "$imp" "$dtype" "$n" >>"$OUT/bench.jsonl"
      else
        grep '^{' <<<"$out" | tee -a "$OUT/bench.jsonl"
      fi
    done
  done
done
# Causal and key padding through flash-attn (the packed varlen path), one size.
for extra in "--causal" "--key-lengths 4096,3000,2048,1"; do
  [[ $features == *flash-attn* ]] || break
  rest=$(left "$budget" "$t0")
  [ "$rest" -le 5 ] && break
  # shellcheck disable=SC2086
  timeout "$((rest < 60 ? rest : 60))" "$attn" bench attention --batch 4 --heads 16 --head-dim 64 \
    --seq-q 4096 --seq-k 4096 --dtype bf16 --impl flash-attn $extra --iters 10 --json 2>&1 |
    tee -a "$OUT/bench.jsonl"
done

step "Marian generation"
t0=$SECONDS
budget=${GPU_RUN_MARIAN_S:-130}
model=/tmp/marian-random
# CPU, both sides (transformers and attn), on this machine's 16 cores; creates the model.
timeout "$((budget * 2 / 3))" "$py" "$repo/bench/compare_marian.py" --attn "$attn" --threads 16 \
  --runs 3 --warmup 1 --model-dir "$model" --json >"$OUT/marian.json" 2>&1 ||
  echo "compare_marian.py failed or ran out of time: $(tail -3 "$OUT/marian.json")"
cat "$OUT/marian.json"
if "$attn" generate --help 2>/dev/null | grep -q -- '--device' && [ -f "$model/config.json" ]; then
  "$py" - "$model" <<'EOF'
import sys, torch
from safetensors.torch import save_file
g = torch.Generator().manual_seed(0)
for b in (1, 8):
    ids = torch.randint(2, 58099, (b, 24), generator=g)
    ids[:, -1] = 0
    save_file({"input_ids": ids, "attention_mask": torch.ones_like(ids)}, f"{sys.argv[1]}/in{b}.safetensors")
EOF
  # Whole process (CUDA start-up and model load included), twice per setting: the first run
  # also pays the driver's PTX compilation of candle's kernels.
  for setting in "1 1" "8 1" "8 4"; do
    read -r b beams <<<"$setting"
    for run in 1 2; do
      rest=$(left "$budget" "$t0")
      [ "$rest" -le 5 ] && break 2
      s0=$EPOCHREALTIME
      if timeout "$rest" "$attn" generate --device cuda --model "$model" \
        --inputs "$model/in$b.safetensors" --output /tmp/gen-out.safetensors --beams "$beams" \
        --max-new-tokens 32 --min-new-tokens 32 >/tmp/gen.log 2>&1; then
        secs=$(awk "BEGIN { print $EPOCHREALTIME - $s0 }")
        echo "{\"bench\": \"generate\", \"device\": \"cuda\", \"batch\": $b, \"beams\": $beams, \"run\": $run, \"new_tokens\": 32, \"seconds_whole_process\": $secs}" |
          tee -a "$OUT/generate.jsonl"
      else
        echo "attn generate --device cuda failed: $(tail -3 /tmp/gen.log)" | tee -a "$OUT/generate.jsonl"
      fi
    done
  done
else
  echo "attn generate has no --device (or no model): GPU generation not timed"
fi
step "done"
