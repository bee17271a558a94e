#!/usr/bin/env bash
# Every test of the workspace, from any directory, on a machine with only Rust and Python 3:
#
#   1. provisions .venv at the workspace root (pyzmq and msgspec for the Python interop
#      peers, pytest, maturin) unless it already has them;
#   2. if python/pyproject.toml exists, builds the Python package and installs it into .venv
#      (release profile; MATURIN_PEP517_ARGS="--profile wheel" builds the published one);
#   3. runs `cargo test --workspace` with CTLPLANE_PYTHON pointing at .venv's interpreter;
#   4. runs `pytest python/tests` with .venv if that directory exists, then the scripts'
#      own tests (`pytest scripts/tests`).
#
# Re-running it is safe and only redoes what is missing (the package is rebuilt every time,
# since its sources may have changed). Any failing step stops the script with its status.
#
# CTLSIM_SUITE_SEEDS (default here 20) sets how many seeds the simulator's seeded suite
# runs inside `cargo test`; the 200-seed sweep is the main job (`ctlsim sweep`), not a test.
# PROPTEST_CASES (proptest's default 256 when unset) sets the property tests' case count.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

venv="$root/.venv"
py="$venv/bin/python"
pip=("$py" -m pip --disable-pip-version-check --quiet)

step() { printf '== %s\n' "$*"; }
fail() { printf 'scripts/test.sh: %s\n' "$*" >&2; exit 1; }

command -v python3 >/dev/null || fail "python3 is not on PATH"
command -v cargo >/dev/null || fail "cargo is not on PATH (install Rust from https://rustup.rs)"

if ! "$py" -c 'import sys' >/dev/null 2>&1; then
    step "creating $venv"
    rm -rf "$venv"
    python3 -m venv "$venv" || fail "python3 -m venv failed (on Debian/Ubuntu: apt-get install python3-venv)"
fi
if ! "$py" -c 'import zmq, msgspec, pytest, maturin' >/dev/null 2>&1; then
    step "installing pyzmq, msgspec, pytest, maturin into .venv"
    "${pip[@]}" install pyzmq msgspec pytest maturin
fi

if [[ -f python/pyproject.toml ]]; then
    # The tests exercise the package's behaviour, not its speed: the release profile builds
    # it in less time than the wheel profile's whole-program optimisation.
    export MATURIN_PEP517_ARGS="${MATURIN_PEP517_ARGS:---profile release}"
    step "building and installing the Python package (python/, maturin $MATURIN_PEP517_ARGS)"
    "${pip[@]}" install ./python
fi

export CTLPLANE_PYTHON="$py"
export CTLSIM_SUITE_SEEDS="${CTLSIM_SUITE_SEEDS:-20}"

step "cargo test --workspace (CTLPLANE_PYTHON=$CTLPLANE_PYTHON, CTLSIM_SUITE_SEEDS=$CTLSIM_SUITE_SEEDS)"
cargo test --workspace

if [[ -d python/tests ]]; then
    step "pytest python/tests"
    "$venv/bin/pytest" python/tests
fi

step "pytest scripts/tests (the mutation job's table)"
"$venv/bin/pytest" -q scripts/tests

step "all tests passed"
