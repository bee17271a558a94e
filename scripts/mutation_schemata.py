#!/usr/bin/env python3
"""Judges many mutants with one build (scripts/mutation.sh): tools/mutation-schemata writes
them all into a copy of the checkout, each behind the switch `CTLPLANE_MUTANT=id`, the
copy's suite is built once, and each mutant is one run of that suite with its switch on.

A mutant whose branch does not type-check (a `Default` the type lacks, an operator its
operands lack, a mismatched type) is what cargo-mutants calls unviable: rustc rejects
exactly that code in exactly that place, and the verdict says so. A mutant that fails to
build for any other reason, or that the rewrite cannot place, is left for cargo-mutants
to judge the classic way (one build of its own). Verdicts are written to OUT after every
mutant, in cargo-mutants' outcomes format, so a run stopped part-way keeps them.

    mutation_schemata.py --listed LISTED.json --src TREE --work COPY --seeds N --timeout S --out OUT
                         [--equivalent LIST]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import mutation_table  # noqa: E402
import mutation_tree  # noqa: E402

TEST = "seeded_suite_of_the_full_topology_has_no_violations"
# rustc's verdicts on a mutant's own code: the same error the mutant alone would get.
UNVIABLE_CODES = {"E0277", "E0308", "E0369", "E0599", "E0600", "E0614"}
SWITCH = re.compile(r"(?:crate::)?__mutant_on\((\d+)\)")


def log(text: str) -> None:
    print(f"== schemata: {text}", flush=True)


def tool(root: str) -> str:
    """Builds tools/mutation-schemata (its own workspace) and returns the binary."""
    target = os.path.join(root, "target", "mutation-schemata-tool")
    subprocess.run(
        ["cargo", "build", "--release", "--quiet", "--manifest-path",
         os.path.join(root, "tools", "mutation-schemata", "Cargo.toml"), "--target-dir", target],
        check=True,
    )
    return os.path.join(target, "release", "mutation-schemata")


def write(exe: str, listed: str, ids: list[int], src: str, work: str) -> tuple[list[int], list[int]]:
    """Brings the copy up to date with the checkout and rewrites it from `src` (the sources
    the listing was made from) with `ids` placed; (placed, unplaced)."""
    mutation_tree.main(os.path.dirname(HERE), work)
    out = subprocess.run([exe, listed, ",".join(map(str, ids)), src, work],
                         check=True, capture_output=True, text=True).stdout
    report = json.loads(out)
    return report["placed"], report["unplaced"]


def errors(work: str, command: list[str]) -> tuple[list[dict], str | None]:
    """The compile errors of `command` in the copy, and the suite's executable if built."""
    proc = subprocess.run(command + ["--message-format=json"], cwd=work, capture_output=True, text=True)
    found, exe = [], None
    for line in proc.stdout.splitlines():
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if msg.get("reason") == "compiler-message" and msg["message"].get("level") == "error":
            found.append(msg["message"])
        if (msg.get("reason") == "compiler-artifact" and msg.get("executable")
                and msg["target"]["name"] == "suite"):
            exe = msg["executable"]
    if proc.returncode != 0 and not found:
        sys.stderr.write(proc.stderr[-4000:])
        raise RuntimeError(f"{' '.join(command)} failed with no compile error to blame")
    return found, exe


def culprit(work: str, message: dict, texts: dict[str, str]) -> int | None:
    """The mutant whose branch holds the error: the last switch ahead of its first span."""
    spans = [s for s in message.get("spans", []) if s.get("is_primary")] or message.get("spans", [])
    if not spans:
        return None
    span = spans[0]
    path = span["file_name"]
    if path not in texts:
        try:
            with open(os.path.join(work, path), encoding="utf-8") as f:
                texts[path] = f.read()
        except OSError:
            return None
    lines = texts[path].split("\n")
    offset = sum(len(x) + 1 for x in lines[: span["line_start"] - 1]) + span["column_start"] - 1
    last = None
    for m in SWITCH.finditer(texts[path]):
        if m.start() > offset:
            break
        last = m
    return int(last.group(1)) if last else None


def build(exe: str, listed: str, ids: list[int], src: str, work: str) -> tuple[list[int], dict[int, str], str]:
    """Places `ids` and builds the suite, dropping the mutants rustc rejects.

    Returns the mutants built in, the unviable ones (id: rustc's message) and the suite's
    executable; a mutant neither built in nor unviable is left for cargo-mutants."""
    unviable: dict[int, str] = {}
    left_out: set[int] = set()
    core = ["cargo", "check", "--profile", "mutants", "-p", "ctlplane-core"]
    suite = ["cargo", "test", "--profile", "mutants", "-p", "ctlplane-sim", "--test", "suite", "--no-run"]
    for round_ in range(1, 31):
        want = [i for i in ids if i not in unviable and i not in left_out]
        placed, unplaced = write(exe, listed, want, src, work)
        left_out.update(unplaced)
        found, suite_exe = errors(work, core)
        if not found:
            found, suite_exe = errors(work, suite)
        if not found and suite_exe:
            log(f"{len(placed)} mutants built into one suite ({round_} build(s)); "
                f"{len(unviable)} unviable, {len(left_out)} left for cargo-mutants")
            return placed, unviable, suite_exe
        texts: dict[str, str] = {}
        blamed = set()
        for message in found:
            who = culprit(work, message, texts)
            if who is None:
                continue
            blamed.add(who)
            code = (message.get("code") or {}).get("code")
            if code in UNVIABLE_CODES:
                unviable.setdefault(who, f"{code}: {message.get('message', '')}")
            else:
                left_out.add(who)
        if not blamed:
            raise RuntimeError("the copy does not build and no mutant's branch holds the error")
        log(f"build {round_}: {len(blamed)} mutant(s) do not compile, building again without them")
    raise RuntimeError("the copy still does not build after 30 rounds")


def outcome(mutant: dict, summary: str, secs: float, detail: str = "") -> dict:
    phase = "Build" if summary == "Unviable" else "Test"
    result = {"phase": phase, "duration": secs, "process_status": summary, "argv": [], "detail": detail}
    return {"scenario": {"Mutant": mutant}, "summary": summary, "phase_results": [result],
            "judged_by": "schemata"}


def save(path: str, outcomes: list[dict]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"outcomes": outcomes}, f)
    os.replace(tmp, path)


def judge(suite_exe: str, work: str, mutant_id: int, seeds: int, timeout: float) -> tuple[str, float]:
    env = dict(os.environ, CTLPLANE_MUTANT=str(mutant_id), CTLSIM_SUITE_SEEDS=str(seeds), CTLSIM_SUITE_FAIL_FAST="1")
    env.setdefault("CTLSIM_SUITE_THREADS", "2")
    started = time.monotonic()
    try:
        proc = subprocess.run([suite_exe, TEST, "--exact"], cwd=os.path.join(work, "sim"), env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "Timeout", time.monotonic() - started
    return ("MissedMutant" if proc.returncode == 0 else "CaughtMutant"), time.monotonic() - started


def run_order(listing: list[dict], placed: list[int], equivalent: frozenset[str], rng: random.Random) -> list[int]:
    """The mutants in random order, those judged equivalent last: a run stopped part-way
    has spent its time on the mutants whose verdict is not known yet (an equivalent one
    runs only to confirm it survives), and each part is still a uniform sample of its kind."""
    first = [i for i in placed if not mutation_table.is_equivalent(listing[i]["name"], equivalent)]
    last = [i for i in placed if mutation_table.is_equivalent(listing[i]["name"], equivalent)]
    rng.shuffle(first)
    rng.shuffle(last)
    return first + last


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="mutation_schemata.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--listed", required=True, help="cargo mutants --list --json of the mutants to judge")
    parser.add_argument("--src", required=True, help="the checkout the listing was made from")
    parser.add_argument("--work", required=True, help="the copy to build the mutants in")
    parser.add_argument("--seeds", type=int, default=100)
    parser.add_argument("--timeout", type=float, required=True, help="seconds per mutant's suite")
    parser.add_argument("--out", required=True, help="outcomes JSON to write")
    parser.add_argument("--equivalent", help="mutants judged equivalent (scripts/mutation-equivalent.txt): run last")
    args = parser.parse_args(argv)
    equivalent = mutation_table.read_equivalent(args.equivalent) if args.equivalent else frozenset()
    with open(args.listed, encoding="utf-8") as f:
        listing = json.load(f)
    if not listing:
        log("no mutant to judge")
        return 0
    root = os.path.dirname(HERE)
    os.makedirs(args.work, exist_ok=True)
    exe = tool(root)
    ids = list(range(len(listing)))
    placed, unviable, suite_exe = build(exe, args.listed, ids, args.src, args.work)
    outcomes = [outcome(listing[i], "Unviable", 0.0, why) for i, why in sorted(unviable.items())]
    save(args.out, outcomes)
    # With no mutant switched on the copy must pass as the checkout does.
    summary, secs = judge(suite_exe, args.work, -1, args.seeds, args.timeout)
    if summary != "MissedMutant":
        log(f"the copy with no mutant on fails its suite ({summary}): no verdict is taken from it")
        return 1
    log(f"the copy with no mutant on passes {args.seeds} seeds in {secs:.0f} s")
    order = run_order(listing, placed, equivalent, random.Random())
    counts: dict[str, int] = {}
    started = time.monotonic()
    for n, i in enumerate(order, 1):
        summary, secs = judge(suite_exe, args.work, i, args.seeds, args.timeout)
        outcomes.append(outcome(listing[i], summary, secs))
        save(args.out, outcomes)
        counts[summary] = counts.get(summary, 0) + 1
        if summary != "CaughtMutant":
            print(f"{summary}: {listing[i]['name']} ({secs:.0f} s)", flush=True)
        if n % 10 == 0 or n == len(order):
            done = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
            log(f"{n}/{len(order)} judged in {time.monotonic() - started:.0f} s ({done})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
