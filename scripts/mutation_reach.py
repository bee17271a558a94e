#!/usr/bin/env python3
"""Which mutants the seeded suite never reaches, from the line coverage of the unmutated
suite (scripts/mutation.sh runs it): a mutant whose source lines hold code and none of
them ran in any seed cannot change what a run observes, so it survives without being
tried. Running such a mutant costs a full suite of seeds and says nothing a coverage
report does not; listing it says where the main job's workload never goes.

    mutation_reach.py unreached LCOV MUTANTS_JSON [NAMES_OUT]
        the mutants in MUTANTS_JSON (`cargo mutants --list --json`) whose span covers at
        least one instrumented line of LCOV (`llvm-cov export --format=lcov`) and no line
        that ran, as one anchored regular expression for cargo-mutants' `--re` and
        `--exclude-re` (empty when every mutant is reached); their names also go to
        NAMES_OUT, one per line
    mutation_reach.py outcomes CHECKED_JSON OUT_JSON [NAMES]
        the outcomes.json of `cargo mutants --check` over those mutants, rewritten for
        mutation_table.py: a mutant that checks is `Unreached` (viable, not killed), one
        that does not stays `Unviable`. With NAMES, only the mutants named there are
        kept: cargo-mutants 27 applies neither `--re` nor `--exclude-re` to its
        `delete field` mutants, so a check run selected by name holds those too, reached
        or not.

A line with no code region (a comment, a declaration, a constant) is not instrumented and
decides nothing here: a mutant with only such lines is tried as usual. Nor does a `const
fn`: what the compiler evaluates leaves no count, so its mutants are always tried. Nor
does a match arm's guard (cargo-mutants' `MatchArmGuard`): llvm-cov counts the guard's
line as its arm's body, so a guard that is tested and never true (a regression switch
that is off) reads as a line that never ran, while replacing it with `true` changes
what every run through that match does.

Exit status: 0, 2 for an unreadable or malformed file."""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mutation_table import names_regex  # noqa: E402


def core_file(sf_line: str) -> str | None:
    """An lcov `SF:` line's file as cargo-mutants names it (from `core/src/` on), or None
    for a file outside core."""
    at = sf_line.rfind("core/src/")
    return sf_line[at:].strip() if at >= 0 else None


def source_paths(lcov_text: str) -> dict[str, str]:
    """Where each core file was compiled from (cargo-mutants' name to the lcov's path)."""
    return {
        name: raw[3:].strip()
        for raw in lcov_text.splitlines()
        if raw.startswith("SF:") and (name := core_file(raw)) is not None
    }


def line_counts(lcov_text: str) -> dict[str, dict[int, int]]:
    """Execution count per instrumented line, per core file (the highest of its records)."""
    counts: dict[str, dict[int, int]] = defaultdict(dict)
    current: str | None = None
    for raw in lcov_text.splitlines():
        line = raw.strip()
        if line.startswith("SF:"):
            current = core_file(line)
        elif line.startswith("DA:") and current is not None:
            number, count = line[3:].split(",")[:2]
            lines = counts[current]
            lines[int(number)] = max(lines.get(int(number), 0), int(count))
        elif line == "end_of_record":
            current = None
    return counts


def is_const_fn(mutant: dict, source: dict[str, list[str]], paths: dict[str, str]) -> bool:
    """Whether the mutant's function is a `const fn` (or its source cannot be read, which
    is treated the same way: tried, not judged)."""
    function = mutant.get("function")
    if not function:
        return False
    path = mutant["file"]
    if path not in source:
        try:
            source[path] = read(paths.get(path, path)).splitlines()
        except OSError:
            source[path] = []
    lines = source[path]
    start = function["span"]["start"]["line"]
    if start > len(lines):
        return True
    header = " ".join(lines[start - 1:start + 2])
    return "const fn" in header.split("{", 1)[0]


def unreached(counts: dict[str, dict[int, int]], mutants: list[dict], paths: dict[str, str] | None = None) -> list[str]:
    """The mutants whose span has instrumented lines, none of which ran. `paths` says where
    to read each file for the `const fn` test (default: relative to the working directory)."""
    paths = paths or {}
    names = []
    source: dict[str, list[str]] = {}
    for mutant in mutants:
        if mutant.get("genre") == "MatchArmGuard":
            continue
        lines = counts.get(mutant["file"], {})
        span = mutant["span"]
        seen = [lines[n] for n in range(span["start"]["line"], span["end"]["line"] + 1) if n in lines]
        if seen and max(seen) == 0 and not is_const_fn(mutant, source, paths):
            names.append(mutant["name"])
    return names


def as_unreached(checked: dict, names: set[str] | None = None) -> dict:
    """`cargo mutants --check` outcomes with each mutant that checked marked `Unreached`;
    with `names`, only the mutants named there."""
    outcomes = []
    for outcome in checked.get("outcomes", []):
        scenario = outcome.get("scenario")
        if not isinstance(scenario, dict) or "Mutant" not in scenario:
            continue  # the baseline
        if names is not None and scenario["Mutant"].get("name") not in names:
            continue
        summary = "Unviable" if outcome.get("summary") == "Unviable" else "Unreached"
        outcomes.append({"scenario": scenario, "summary": summary})
    return {"outcomes": outcomes}


def read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def main(argv: list[str]) -> int:
    try:
        if len(argv) in (3, 4) and argv[0] == "unreached":
            lcov = read(argv[1])
            names = unreached(line_counts(lcov), json.loads(read(argv[2])), source_paths(lcov))
            if len(argv) == 4:
                with open(argv[3], "w", encoding="utf-8") as f:
                    f.write("".join(f"{name}\n" for name in names))
            print(names_regex(names))
            return 0
        if len(argv) in (3, 4) and argv[0] == "outcomes":
            names = {line.strip() for line in read(argv[3]).splitlines()} - {""} if len(argv) == 4 else None
            result = as_unreached(json.loads(read(argv[1])), names)
            with open(argv[2], "w", encoding="utf-8") as f:
                json.dump(result, f)
            return 0
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"mutation_reach.py: {e}", file=sys.stderr)
        return 2
    print(f"mutation_reach.py: unknown arguments {argv}\n\n{__doc__}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
