#!/usr/bin/env bash
# Long fuzz runs, one target at a time on one core: ${FUZZ_SECS:-600} seconds each (all
# targets, or those named as arguments), logging to fuzz/logs/<target>.log and growing
# fuzz/corpus/<target>. Prints each target's executions and whether it crashed.
set -uo pipefail
cd "$(dirname "$0")"
export RUSTC_BOOTSTRAP=1
secs="${FUZZ_SECS:-600}"
mkdir -p logs
targets="${*:-$(cargo fuzz list)}"
CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}" cargo fuzz build
for target in $targets; do
    mkdir -p "corpus/$target" "seeds/$target"
    cargo fuzz run "$target" "corpus/$target" "seeds/$target" -- \
        -max_total_time="$secs" -rss_limit_mb=1024 -timeout=10 -print_final_stats=1 >"logs/$target.log" 2>&1
    rc=$?
    execs=$(grep -E "^stat::number_of_executed_units" "logs/$target.log" | awk '{print $2}')
    echo "$(date -u +%FT%TZ) $target secs=$secs execs=${execs:-?} exit=$rc corpus=$(ls "corpus/$target" | wc -l)" \
        | tee -a logs/summary.txt
done
