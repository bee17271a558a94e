#!/usr/bin/env bash
# Short bounded fuzz smoke for CI: builds every cargo-fuzz target and runs each for
# ${FUZZ_SMOKE_SECS:-20} seconds on one core, starting from the committed seeds
# (fuzz/seeds/<target>) plus whatever fuzz/corpus/<target> already holds. Fails on the
# first crash, leak, timeout or out-of-memory; libFuzzer leaves the input under
# fuzz/artifacts/<target>/.
#
# Runs on the stable toolchain: cargo-fuzz needs nightly-only flags, which
# RUSTC_BOOTSTRAP=1 unlocks. See docs/hostile-input.md ("Fuzzing") for long runs.
set -euo pipefail
cd "$(dirname "$0")"
export RUSTC_BOOTSTRAP=1
secs="${FUZZ_SMOKE_SECS:-20}"
# The targets are safe Rust (overflow checks and debug assertions stay on); AddressSanitizer
# adds little to them and doubles the build, so the smoke skips it. fuzz/long.sh keeps it.
sanitizer="${FUZZ_SANITIZER:-none}"
jobs="${CARGO_BUILD_JOBS:-2}"

if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked --jobs "$jobs"
fi

targets=$(cargo fuzz list)
start=$(date +%s)
CARGO_BUILD_JOBS="$jobs" cargo fuzz build --sanitizer "$sanitizer"
echo "fuzz: built $(echo $targets | wc -w) targets in $(( $(date +%s) - start ))s"

for target in $targets; do
    mkdir -p "corpus/$target" "seeds/$target"
    echo "fuzz: $target for ${secs}s"
    # -rss_limit_mb: a hostile frame must cost no more than its own length, so 1 GiB is
    # far above anything a target may legitimately use.
    if ! cargo fuzz run --sanitizer "$sanitizer" "$target" "corpus/$target" "seeds/$target" -- \
        -max_total_time="$secs" -rss_limit_mb=1024 -timeout=10 -print_final_stats=1 2>"logs-$target.txt"; then
        tail -n 60 "logs-$target.txt"
        echo "fuzz: $target FAILED (input under fuzz/artifacts/$target/)"
        exit 1
    fi
    grep -E "^stat::number_of_executed_units" "logs-$target.txt" | sed "s/^/fuzz: $target /" || true
    rm -f "logs-$target.txt"
done
echo "fuzz: smoke passed in $(( $(date +%s) - start ))s"
