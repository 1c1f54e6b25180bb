#!/usr/bin/env bash
# Build-check the CUDA features (`cuda`, `flash-attn`) on a machine WITHOUT a GPU.
#
#   scripts/cuda-check.sh                   # setup + the three checks below
#   scripts/cuda-check.sh setup             # only install the toolkit (idempotent)
#   scripts/cuda-check.sh cuda flash-attn   # some of: cuda, flash-attn, tests
#   CUDA_CHECK_NVCC=stub scripts/cuda-check.sh cuda tests   # Rust-only check, no toolkit
#
# Checks: `cargo check --features cuda`, `cargo check --features flash-attn`,
# `cargo check --features cuda --tests` (whole workspace, all targets of the last one).
#
# Why it needs a compiler although `cargo check` links nothing: the build scripts of
# candle-kernels (PTX of every candle kernel + libmoe.a) and candle-flash-attn (53
# FlashAttention-2 kernels, libflashattention.a) run nvcc even under `cargo check`.
#
# CUDA_CHECK_NVCC=real (default): NVIDIA's own compiler from PyPI, pinned to CUDA 13.0:
#   - 13.0 is what the device machines' driver (580) runs: PTX from a newer nvcc is refused
#     by an older driver (CUDA_ERROR_UNSUPPORTED_PTX_VERSION);
#   - cudarc 0.19.10 (candle 0.11's) accepts CUDA 11.4 ... 13.4 and panics on others (PyPI's
#     newest nvcc, 13.5, would fail: "Unsupported cuda toolkit version");
#   - the cu12 wheels (12.9) ship no `nvcc` driver; the cu13 ones (`nvidia-cuda-nvcc` 13.x)
#     do. Headers: nvidia-cuda-runtime, nvidia-cuda-crt, nvidia-cuda-cccl; cicc: nvidia-nvvm.
#   - CUTLASS for flash-attn: candle-flash-attn's build (cudaforge) git-clones NVIDIA/cutlass
#     at 7d49e6c7 (= v3.5.0) into $CUDAFORGE_HOME. This script lays the same headers out there
#     from PyPI's nvidia-cutlass==3.5.0.0, whose include/ and tools/util/include/ are
#     byte-identical to that commit (checked with diff -r), so no GitHub access is needed.
# CUDA_CHECK_NVCC=stub: a stand-in `nvcc` that writes empty PTX/objects. It checks that our
# Rust code compiles against candle's CUDA API (what CI can afford) but compiles no kernel.
#
# Env: CUDA_CHECK_CACHE (default /tmp/candle-attention-cuda: toolkit, CUTLASS, stub),
#      CUDA_COMPUTE_CAP (default 90 = H100/H200 -> sm_90a; 80 for A100; flash-attn needs >= 80),
#      CARGO_TARGET_DIR (default: cargo's), PYTHON (default python3, needs pip).
# Prints the wall time of each step. Everything runs under `nice -n 19`.
set -euo pipefail
cd "$(dirname "$0")/.."

cache=${CUDA_CHECK_CACHE:-/tmp/candle-attention-cuda}
mode=${CUDA_CHECK_NVCC:-real}
export CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-90}
python=${PYTHON:-python3}
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(setup cuda flash-attn tests)

toolkit=$cache/toolkit/nvidia/cu13
cutlass_commit=7d49e6c7e2f8896c47f586706e67e1fb215529dc
# cudaforge's cache key: cutlass-<first 16 hex digits of the commit>.
cutlass_dir=$cache/cudaforge/git/checkouts/cutlass-${cutlass_commit:0:16}

timed() { # timed LABEL CMD...: runs CMD, prints its wall time
  local label=$1 t0=$SECONDS
  shift
  echo "== $label: $*"
  "$@"
  echo "== $label: $((SECONDS - t0)) s"
}

setup_real() {
  if [ ! -x "$toolkit/bin/nvcc" ]; then
    "$python" -m pip --version >/dev/null 2>&1 || {
      echo "error: $python has no pip (set PYTHON to one that has)" >&2
      exit 1
    }
    timed "install CUDA 13.0 compiler and headers (PyPI)" nice -n 19 "$python" -m pip install \
      --quiet --no-deps --disable-pip-version-check --root-user-action=ignore --target "$cache/toolkit" --upgrade \
      nvidia-cuda-nvcc==13.0.88 nvidia-cuda-runtime==13.0.96 nvidia-cuda-crt==13.0.88 \
      nvidia-nvvm==13.0.88 nvidia-cuda-cccl==13.0.85
  fi
  # The layout tools expect: lib64/ (cudaforge, cudarc) and an unversioned libcudart.so.
  ln -sfn lib "$toolkit/lib64"
  ln -sf libcudart.so.13 "$toolkit/lib/libcudart.so"
  if [ ! -f "$cutlass_dir/include/cutlass/cutlass.h" ]; then
    local tmp=$cache/cutlass-wheel
    rm -rf "$tmp" "$cutlass_dir"
    timed "install CUTLASS 3.5.0 headers (PyPI)" nice -n 19 "$python" -m pip install \
      --quiet --no-deps --disable-pip-version-check --root-user-action=ignore --target "$tmp" nvidia-cutlass==3.5.0.0
    mkdir -p "$cutlass_dir/tools/util"
    cp -r "$tmp/cutlass_library/source/include" "$cutlass_dir/"
    cp -r "$tmp/cutlass_library/source/tools/util/include" "$cutlass_dir/tools/util/"
    rm -rf "$tmp"
  fi
  # cudaforge reuses a checkout when `git rev-parse HEAD` names the pinned commit and
  # include/ exists; the headers above are that commit's.
  if [ "$(git -C "$cutlass_dir" rev-parse HEAD 2>/dev/null)" != "$cutlass_commit" ]; then
    rm -rf "$cutlass_dir/.git"
    git -C "$cutlass_dir" init -q
    echo "$cutlass_commit" >"$cutlass_dir/.git/HEAD"
  fi
  "$toolkit/bin/nvcc" --version | tail -2
  echo "toolkit + CUTLASS: $(du -sh "$cache" | cut -f1) in $cache"
}

setup_stub() {
  mkdir -p "$cache/stub/bin"
  cat >"$cache/stub/bin/nvcc" <<'EOF'
#!/usr/bin/env bash
# Stand-in nvcc for `cargo check` without a CUDA toolkit: answers --version as CUDA 13.0
# (cudarc picks its API from it) and writes empty outputs where nvcc would write PTX,
# objects or a static library. Nothing it writes can run.
out= outdir= src= lib=0 prev=
for a in "$@"; do
  case $prev in -o) out=$a ;; --output-directory) outdir=$a ;; esac
  case $a in --version) printf 'nvcc: NVIDIA (R) Cuda compiler driver\nstub\nstub\nCuda compilation tools, release 13.0, V13.0.88\n'; exit 0 ;;
    --list-gpu-code) echo sm_80 sm_90; exit 0 ;;
    --lib) lib=1 ;; *.cu) src=$a ;; esac
  prev=$a
done
if [ "$lib" = 1 ]; then rm -f "$out"; ar rcs "$out"; exit 0; fi
if [ -n "$outdir" ] && [ -n "$src" ]; then b=${src##*/}; : >"$outdir/${b%.cu}.ptx"; exit 0; fi
[ -n "$out" ] && : >"$out"
EOF
  chmod +x "$cache/stub/bin/nvcc"
  # candle-flash-attn's build still asks cudaforge for CUTLASS (it would git-clone it): an
  # empty stand-in at the pinned commit, since the stub compiles nothing.
  if [ "$(git -C "$cutlass_dir" rev-parse HEAD 2>/dev/null)" != "$cutlass_commit" ]; then
    mkdir -p "$cutlass_dir/include"
    rm -rf "$cutlass_dir/.git"
    git -C "$cutlass_dir" init -q
    echo "$cutlass_commit" >"$cutlass_dir/.git/HEAD"
  fi
}

case $mode in
real) [[ " ${steps[*]} " == *" setup "* || ! -x $toolkit/bin/nvcc ]] && setup_real
  export CUDA_HOME=$toolkit PATH=$toolkit/bin:$PATH ;;
stub) setup_stub
  export PATH=$cache/stub/bin:$PATH
  unset CUDA_HOME ;;
*) echo "error: CUDA_CHECK_NVCC must be real or stub, got '$mode'" >&2; exit 1 ;;
esac
export CUDAFORGE_HOME=$cache/cudaforge

for step in "${steps[@]}"; do
  case $step in
  setup) ;;
  cuda) timed "check --features cuda" nice -n 19 cargo check --workspace --features cuda ;;
  flash-attn) timed "check --features flash-attn" nice -n 19 cargo check --workspace --features flash-attn ;;
  tests) timed "check --features cuda --tests" nice -n 19 cargo check --workspace --features cuda --tests ;;
  *) echo "error: unknown step '$step' (setup, cuda, flash-attn, tests)" >&2; exit 1 ;;
  esac
done
