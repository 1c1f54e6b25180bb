#!/usr/bin/env bash
# Checks the unsafe code (the SIMD attention kernels in src/sdpa/, the projection GEMM in
# src/projection/, the masked loads/stores and scratch they share in src/simd/) with the two
# tools that run here, on the nightly toolchain:
#
#   1. Miri: the kernel unit tests (src/sdpa/cpu/tests.rs, shapes at every block edge, f32
#      and the half-precision tile paths; src/sdpa/cpu/half.rs, the per-tile f16/bf16
#      conversions; the GEMM's in src/projection/gemm.rs, the in-place row kernel's in
#      src/projection/rows.rs, the half-precision GEMM's in src/projection/half.rs and bf16.rs,
#      the scratch buffer's, the row scans' and the element-wise passes' in src/simd/, the
#      caches' row gathers and in-place row moves in src/kv_cache/rows.rs, the int8 product's
#      quantization, tiles and dequantization in src/projection/int8.rs and the int8 panels
#      read in place from a file in src/weights/int8.rs) through
#      the safe wrappers. Miri reports no SIMD features, so `available_isas()` is the portable
#      level only: this runs the portable kernels and every slice/index computation around
#      them, with Tree Borrows checks.
#   2. AddressSanitizer: the same unit tests plus the tiled-vs-naive property tests (f32, and
#      tests/half_props.rs: bf16/f16 with ragged tails, which on a CPU with AVX-512 BF16 run
#      the vdpbf16ps kernels of src/sdpa/cpu/avx512_half.rs), the grouped-query tests, the
#      projection tests (f32, bf16 and f16), the cache API tests (rows sharing a memory row,
#      reordered in place), the int8 models (tests/quantized.rs: the AVX2, AVX-VNNI and
#      AVX-512 VNNI int8 tiles of src/projection/int8_x86.rs through whole translations) and
#      the hostile-input table, natively. Every one of
#      them runs each kernel at every instruction set the CPU has (`testing::available_isas`:
#      portable and AVX2 here, AVX-512 too on an AVX-512 host), so the AVX2 kernels of
#      src/sdpa/cpu/avx2.rs, src/projection/avx2.rs and src/simd/{avx2,rows,elementwise}.rs
#      run, like the AVX-512 ones, with every load and store checked against the allocation
#      it belongs to. (The partial vectors use `vmaskmovps`, which touches only its lanes; the
#      tests size buffers exactly, so a full-width access past a row's end would be reported.)
#
# Usage: scripts/sanitize.sh [miri|asan|all]   (default: all). Needs `rustup toolchain
# install nightly --component miri rust-src`. Not part of CI: Miri took 27 minutes for the three
# kernel tests here, and the ASan build rebuilds std and every dependency.
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
target=$(rustc -vV | sed -n 's/^host: //p')

if [[ $what == miri || $what == all ]]; then
  echo "== Miri: kernel unit tests (portable kernels)"
  # Tree Borrows: crossbeam-epoch (under rayon) breaks the stricter, still experimental
  # Stacked Borrows rules in its intrusive list (a known false alarm outside our code).
  # Permissive provenance: crossbeam casts integers to pointers. Isolation off: the clock.
  # Ignore leaks: rayon's global pool threads are still parked when the tests end.
  MIRIFLAGS="-Zmiri-tree-borrows -Zmiri-permissive-provenance -Zmiri-disable-isolation -Zmiri-ignore-leaks" \
    cargo +nightly miri test -p candle-attention --lib -- sdpa::cpu::tests sdpa::cpu::half projection::gemm projection::rows projection::lazy projection::half projection::bf16 projection::int8 weights::int8 simd:: kv_cache::
fi

if [[ $what == asan || $what == all ]]; then
  echo "== AddressSanitizer: kernels on this CPU's instruction set"
  # std is rebuilt with the sanitizer too (-Zbuild-std), so every allocation is tracked. Without
  # the nightly rust-src component (an offline machine) std stays uninstrumented: our code and
  # every dependency still are, which is what checks the kernels' loads and stores.
  build_std=(-Zbuild-std)
  if ! rustup +nightly component list --installed 2>/dev/null | grep -q '^rust-src'; then
    echo "(nightly has no rust-src: std is not instrumented; our code and dependencies are)"
    build_std=()
  fi
  RUSTFLAGS="-Zsanitizer=address" RUSTDOCFLAGS="-Zsanitizer=address" \
  ASAN_OPTIONS="detect_leaks=0" CARGO_TARGET_DIR=target/asan \
    cargo +nightly test "${build_std[@]}" --target "$target" -p candle-attention \
      --lib --test tiled_props --test half_props --test gqa --test projection --test projection_half --test cache_api --test quantized --test hostile_inputs -- --test-threads 2
fi
