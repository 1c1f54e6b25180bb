#!/usr/bin/env bash
# Runs every fuzz target for SECONDS each (default 600), JOBS at a time (default 1), starting
# from the committed seeds (fuzz/seeds/<target>) and growing a working corpus in
# fuzz/corpus/<target> (not committed). Crashes land in fuzz/artifacts/<target>/.
#
#   fuzz/run.sh [SECONDS] [TARGET...]
#
# Needs the nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz`). Each run's last
# libFuzzer status line (executions, coverage) is printed at the end, and the full logs are
# in fuzz/logs/<target>.log.
set -euo pipefail
cd "$(dirname "$0")"
seconds=${1:-600}
shift || true
targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then
  targets=(load_weights run_inputs masks tokenizer spm_model hub_config marian_tokenizer pth_reader multilingual_hub)
fi
mkdir -p logs
cargo +nightly fuzz build -O
status=0
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t"
  echo "== $t for ${seconds}s"
  # -rss_limit_mb: a target that allocates past 2 GiB is a finding, not a slow run.
  if ! cargo +nightly fuzz run -O "$t" "corpus/$t" "seeds/$t" -- \
      -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=20 -print_final_stats=1 \
      >"logs/$t.log" 2>&1; then
    echo "!! $t found a crash: see fuzz/logs/$t.log and fuzz/artifacts/$t/"
    status=1
  fi
  grep -E "^#[0-9]+.*(DONE|cov:)" "logs/$t.log" | tail -1 || true
  grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "logs/$t.log" || true
done
exit $status
