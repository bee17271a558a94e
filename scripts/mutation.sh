#!/usr/bin/env bash
# The oracles' mutation score: cargo-mutants mutates the core's decision modules, and the
# only test run on each mutant is the main job's seeded suite (sim/tests/suite.rs: the full
# topology, each seed's swarm fault plan, every oracle). A mutant counts as killed only when
# the suite fails on it; the unit tests never run. A suite that outlives its timeout is
# listed apart (a hang is not an oracle's verdict).
#
# A mutant no seed reaches is not run: the unmutated suite runs once with line coverage
# (DIR/suite.lcov), and a mutant whose lines hold code none of which ran is only checked
# to compile, then counted as an unreached survivor (scripts/mutation_reach.py). Such a
# mutant costs a full suite when run and can only survive; the list of them is where the
# main job's workload never goes. The oracles' own code in core (the book's and the
# slab's invariant checks and what only they call) is not mutated: a weaker checker
# passes correct code too, a stricter one fails it at once.
#
#   scripts/mutation.sh [--seeds N] [--shard K/N] [--out DIR] [--iterate | --resume] [--no-reach]
#
#   --seeds  seeds of the suite per mutant (default 100)
#   --shard  only the mutants i with i % N == K (default: all of them). The shards of one N
#            partition the mutants: run them on several machines or one after another,
#            then merge with `scripts/mutation_table.py SHARD_DIR/mutants.out/outcomes.json...`
#   --out    output directory (default target/mutation); cargo-mutants writes
#            DIR/mutants.out, this script DIR/table.md
#   --iterate  resume or redo a run in DIR: mutants an earlier run there killed or found
#            unviable are skipped, and so are the survivors scripts/mutation-equivalent.txt
#            judges equivalent; the rest (survivors, timeouts, untested) run again, and
#            the table merges every run's outcomes (DIR/outcomes-*.json, oldest first). The
#            oracles only grow stronger, so a kill stays a kill.
#   --resume finish a run in DIR that stopped part-way (a session's end, a lost machine):
#            only the mutants no run there judged are tried (survivors keep their verdict,
#            a timeout is tried again, an unreached mutant is run if a seed now reaches
#            it and otherwise keeps its verdict without a second check). A core file that changed since its mutants were
#            judged (DIR/core-files.sha256) loses their verdicts: its mutants are judged
#            again; the other files keep theirs.
#   --no-reach  run every mutant, reached or not (no coverage pass)
#
# Mutants run in random order (cargo-mutants' --shuffle), those scripts/mutation-equivalent.txt
# judges equivalent after the rest: a run stopped part-way has judged a uniform sample of
# the undecided mutants it had left, so the table's estimate for the rest
# (scripts/mutation_table.py --listed) is not skewed toward the files listed first, and
# its time went to mutants whose verdict was not known.
#
# The mutants to run are built into one suite (scripts/mutation_schemata.py with
# tools/mutation-schemata: each behind a runtime switch, in target/mutation-schemata),
# so a mutant costs its suite alone; the few that cannot share that build are built in
# place in a copy of the checkout, target/mutation-tree, which keeps its build between
# mutants and between runs (an incremental rebuild of core and the simulator, profile
# `mutants` in Cargo.toml). One job at a time per checkout (a lock on the copy says so).
#
# Needs cargo-mutants (`cargo install cargo-mutants --locked`) and, for the coverage pass,
# the toolchain's llvm-tools (`rustup component add llvm-tools`). Prints the table per file
# (mutants, viable, killed, survivors, unreached) and every survivor; docs/simulator.md has
# the figures.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

seeds=100
shard=""
out="target/mutation"
iterate=0
resume=0
reach=1
while [[ $# -gt 0 ]]; do
    case "$1" in
        --seeds) seeds="$2"; shift 2 ;;
        --shard) shard="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        --iterate) iterate=1; shift ;;
        --resume) iterate=1; resume=1; shift ;;
        --no-reach) reach=0; shift ;;
        *) echo "scripts/mutation.sh: unknown argument $1 (see the header of this script)" >&2; exit 2 ;;
    esac
done
[[ "$seeds" =~ ^[1-9][0-9]*$ ]] || { echo "scripts/mutation.sh: --seeds takes a positive number, not '$seeds'" >&2; exit 2; }
cargo mutants --version >/dev/null 2>&1 || {
    echo "scripts/mutation.sh: cargo-mutants is not installed (cargo install cargo-mutants --locked)" >&2
    exit 2
}
llvm="$(rustc --print sysroot)/lib/rustlib/$(rustc -vV | sed -n 's/^host: //p')/bin"
if [[ "$reach" == 1 && ! -x "$llvm/llvm-cov" ]]; then
    echo "scripts/mutation.sh: the coverage pass needs llvm-tools (rustup component add llvm-tools), or run with --no-reach" >&2
    exit 2
fi

# The core's decision modules.
files=(
    core/src/ec/reservations.rs core/src/ec/slab.rs core/src/ec/shard.rs core/src/ec/serve_step.rs
    core/src/ec/producer.rs core/src/ec/request_slot.rs core/src/ec/inbox.rs core/src/ec/readiness.rs
    core/src/ec/scheduler.rs 'core/src/ec/scheduler/*.rs' core/src/ec/shutdown_drain.rs
    core/src/p2p/registry.rs core/src/p2p/session.rs 'core/src/p2p/manager/*.rs' 'core/src/p2p/manager/**/*.rs'
)
# The oracles' own code: the book's and the slab's invariant checks, and the views of
# memory only the oracles read.
not_decisions=(
    'ReservationBook<R>::(check_invariants|allocations|writer_owned_regions)( |$)'
    'Slab::(check|allocated_spans)( |$)'
)
# cargo-mutants' own baseline would run the mutated package's tests, not the suite; the
# unmutated suite is run here first instead, and the mutants' timeout is set from it.
# Each mutant is rebuilt before its suite, so the timeout is for the suite alone.
mkdir -p "$out"
out="$(cd "$out" && pwd)"
# The core the mutants are made from, file by file: a resumed run keeps the verdicts of
# the files that did not change since (their mutants' names carry line numbers, and a
# survivor is judged against one version of its file) and judges the others again.
core_files="$(git ls-files -z core | sort -z | xargs -0 sha256sum)"
stale=""
if [[ "$resume" == 1 && -f "$out/core-files.sha256" ]]; then
    stale="$({ diff <(sort -k2 "$out/core-files.sha256") <(sort -k2 <<<"$core_files") || true; } |
        sed -n 's/^[<>] [0-9a-f]*  //p' | sort -u | paste -sd, -)"
fi
# The table of every outcome in DIR, oldest first (a later outcome of a mutant wins).
print_table() {
    cd "$root"
    shopt -s nullglob
    local reports=("$out"/outcomes-*.json)
    shopt -u nullglob
    [[ -f "$out/mutants.out/outcomes.json" ]] && reports+=("$out/mutants.out/outcomes.json")
    # A resumed run's listing is the whole run's: the table projects what is left.
    local listed=()
    [[ "$iterate" == 1 ]] && listed=(--listed "$out/listed.txt")
    python3 scripts/mutation_table.py --equivalent scripts/mutation-equivalent.txt "${listed[@]}" "${reports[@]}" |
        tee "$out/table.md"
}
common=(-p ctlplane-core --test-package ctlplane-sim --cargo-arg=--test=suite --profile mutants
        --in-place --baseline skip)
for f in "${files[@]}"; do common+=(-f "$f"); done
for re in "${not_decisions[@]}"; do common+=(--exclude-re "$re"); done
base=("${common[@]}" --output "$out")
args=("${base[@]}")
[[ -n "$shard" ]] && args+=(--shard "$shard" --sharding round-robin)
if [[ "$iterate" == 1 ]]; then
    if [[ -f "$out/mutants.out/outcomes.json" ]]; then
        n=$(find "$out" -maxdepth 1 -name 'outcomes-*.json' | wc -l)
        # Moved, not copied: a run stopped before cargo-mutants starts again must not
        # bring back verdicts a later prune dropped.
        mv "$out/mutants.out/outcomes.json" "$out/outcomes-$(printf %03d "$n").json"
    fi
    if [[ -n "$stale" ]]; then
        shopt -s nullglob
        dropped="$(python3 scripts/mutation_table.py --prune "$stale" "$out"/outcomes-*.json)"
        shopt -u nullglob
        echo "== core files changed since the run in $out: $stale ($dropped verdicts dropped, judged again)"
    fi
    # The shard's mutants less those an earlier run killed or found unviable, named one by
    # one: cargo-mutants' own --iterate would shard the shorter list, a different sample.
    shopt -s nullglob
    cargo mutants "${args[@]}" --list >"$out/listed.txt"
    skip=()
    [[ "$resume" == 1 ]] && skip=(--skip-survivors)
    # A survivor judged equivalent keeps that verdict: no oracle can kill it.
    only="$(python3 scripts/mutation_table.py --pending "$out/listed.txt" "${skip[@]}" \
        --equivalent scripts/mutation-equivalent.txt "$out"/outcomes-*.json)"
    shopt -u nullglob
    if [[ -z "$only" ]]; then
        echo "== every mutant of this run in $out is judged already"
        print_table
        exit 0
    fi
    args=("${base[@]}" --re "$only")
fi

printf '%s\n' "$core_files" >"$out/core-files.sha256"

# The copy: the checkout's files as they are now (committed or not); only files whose
# content changed are written, so cargo rebuilds only what changed since the last run.
tree="$root/target/mutation-tree"
mkdir -p "$tree"
exec 9>"$tree.lock"
flock -n 9 || { echo "scripts/mutation.sh: another mutation job holds $tree.lock" >&2; exit 2; }
python3 scripts/mutation_tree.py "$root" "$tree"
cd "$tree"

export CTLSIM_SUITE_SEEDS="$seeds" CTLSIM_SUITE_THREADS="${CTLSIM_SUITE_THREADS:-2}" CTLSIM_SUITE_FAIL_FAST=1
test_name=seeded_suite_of_the_full_topology_has_no_violations
echo "== the unmutated suite ($seeds seeds), which every mutant's run is timed against"
cargo test --profile mutants -p ctlplane-sim --test suite --no-run
started=$(date +%s)
cargo test --profile mutants -p ctlplane-sim --test suite -- "$test_name" --exact
took=$(( $(date +%s) - started ))
timeout=$(( took * 5 > 60 ? took * 5 : 60 ))
args+=(--timeout "$timeout")

if [[ "$reach" == 1 ]]; then
    echo "== line coverage of the unmutated suite ($seeds seeds): a mutant no seed reaches is only checked"
    cov="$tree/target/coverage"
    # The build's own instrumented programs (build scripts, proc macros) profile into
    # a directory of their own, not the tree.
    exe="$(RUSTFLAGS="-C instrument-coverage" CARGO_TARGET_DIR="$cov" LLVM_PROFILE_FILE="$cov/build-profraw/%p-%m.profraw" \
        cargo test --profile mutants -p ctlplane-sim --test suite --no-run --message-format=json |
        python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "suite" and m.get("executable"):
        print(m["executable"])')"
    rm -rf "$cov/profraw"
    (cd sim && LLVM_PROFILE_FILE="$cov/profraw/%p-%m.profraw" "$exe" "$test_name" --exact)
    "$llvm/llvm-profdata" merge -sparse "$cov"/profraw/*.profraw -o "$cov/suite.profdata"
    "$llvm/llvm-cov" export --format=lcov --instr-profile "$cov/suite.profdata" "$exe" >"$out/suite.lcov"
    cargo mutants "${args[@]}" --list --json >"$out/listed.json"
    unreached="$(python3 "$root/scripts/mutation_reach.py" unreached "$out/suite.lcov" "$out/listed.json" "$out/unreached.txt")"
    # An earlier run of DIR checked some of them already (unreached then, still unreached).
    shopt -s nullglob
    unchecked="$(python3 "$root/scripts/mutation_table.py" --pending "$out/unreached.txt" --skip-unreached \
        "$out"/outcomes-*.json)"
    shopt -u nullglob
    if [[ -n "$unchecked" ]]; then
        echo "== cargo check of the mutants no seed reaches (a viable one is an unreached survivor)"
        set +e
        cargo mutants "${common[@]}" --check --re "$unchecked" --output "$out/reach"
        status=$?
        set -e
        # 0: all checked; the other statuses name mutants that did not (unviable).
        case "$status" in
            0 | 2 | 3) ;;
            *) echo "scripts/mutation.sh: cargo mutants --check failed with status $status" >&2; exit "$status" ;;
        esac
        n=$(find "$out" -maxdepth 1 -name 'outcomes-*.json' | wc -l)
        python3 "$root/scripts/mutation_reach.py" outcomes "$out/reach/mutants.out/outcomes.json" \
            "$out/outcomes-$(printf %03d "$n")-reach.json" "$out/unreached.txt"
    fi
    if [[ -n "$unreached" ]]; then
        args+=(--exclude-re "$unreached")
    fi
fi
if [[ -z "$(cargo mutants "${args[@]}" --list)" ]]; then
    echo "== no mutant left to run: every one is judged or unreached"
    print_table
    exit 0
fi
# One build for every mutant that can share it (scripts/mutation_schemata.py); the rest
# (those it cannot place or that fail to build for another reason) cargo-mutants builds
# one by one below.
cargo mutants "${args[@]}" --list --json >"$out/to-judge.json"
cargo mutants "${args[@]}" --list >"$out/to-judge.txt"
n=$(find "$out" -maxdepth 1 -name 'outcomes-*.json' | wc -l)
schemata="$out/outcomes-$(printf %03d "$n")-schemata.json"
echo "== ${#files[@]} decision modules' mutants built into one suite, each run with its switch on ($seeds seeds, timeout ${timeout} s)"
python3 "$root/scripts/mutation_schemata.py" --listed "$out/to-judge.json" --src "$tree" \
    --work "$root/target/mutation-schemata" --seeds "$seeds" --timeout "$timeout" --out "$schemata" \
    --equivalent "$root/scripts/mutation-equivalent.txt"
left="$(python3 "$root/scripts/mutation_table.py" --pending "$out/to-judge.txt" --skip-survivors "$schemata")"
status=0
if [[ -n "$left" ]]; then
    echo "== cargo mutants over the mutants left, one build each, the seeded suite of $seeds seeds as the only test (timeout ${timeout} s)"
    # Exit status 2 (survivors) and 3 (timeouts) are results, not failures of the job.
    set +e
    cargo mutants "${base[@]}" --re "$left" --timeout "$timeout" --shuffle -- -- "$test_name" --exact
    status=$?
    set -e
fi
case "$status" in
    0 | 2 | 3) ;;
    *) echo "scripts/mutation.sh: cargo mutants failed with status $status" >&2; exit "$status" ;;
esac
print_table
