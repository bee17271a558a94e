#!/usr/bin/env python3
"""The per-file table of a mutation run (scripts/mutation.sh) from cargo-mutants'
outcomes.json: mutants, viable (it built), killed (the seeded suite failed), timed out,
survivors, kill rate among the viable; then every survivor by name.

Several outcomes.json files (the shards of one run) merge into one table; a mutant found
in more than one file counts once, with its outcome in the last file named."""

from __future__ import annotations

import json
import sys
from collections import defaultdict


def main(paths: list[str]) -> int:
    outcomes: dict[str, tuple[str, str | None]] = {}
    for path in paths:
        try:
            with open(path, encoding="utf-8") as f:
                report = json.load(f)
        except (OSError, ValueError) as e:
            print(f"mutation_table.py: cannot read {path}: {e}", file=sys.stderr)
            return 2
        for outcome in report.get("outcomes", []):
            scenario = outcome.get("scenario")
            if not isinstance(scenario, dict) or "Mutant" not in scenario:
                continue  # the baseline
            mutant = scenario["Mutant"]
            name = mutant.get("name") or f"{mutant.get('file')}: {mutant.get('replacement')}"
            outcomes[name] = (mutant.get("file", "?"), outcome.get("summary"))
    rows: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    survivors: list[str] = []
    timeouts: list[str] = []
    for name, (file, summary) in outcomes.items():
        row = rows[file]
        row["mutants"] += 1
        if summary == "Unviable":
            continue
        row["viable"] += 1
        if summary == "CaughtMutant":
            row["killed"] += 1
        elif summary == "Timeout":
            row["timeout"] += 1
            timeouts.append(name)
        else:
            row["survived"] += 1
            survivors.append(name)
    total: dict[str, int] = defaultdict(int)
    print("| file | mutants | viable | killed | timed out | survived | killed / viable |")
    print("|---|---|---|---|---|---|---|")
    for file in sorted(rows):
        row = rows[file]
        for k, v in row.items():
            total[k] += v
        print(line(file, row))
    print(line("**all**", total))
    for title, names in (("Survivors", survivors), ("Timed out", timeouts)):
        if names:
            print(f"\n{title} ({len(names)}):")
            for name in sorted(names):
                print(f"- {name}")
    return 0


def line(file: str, row: dict[str, int]) -> str:
    viable = row["viable"]
    rate = f"{100 * row['killed'] / viable:.0f}%" if viable else "-"
    return (f"| {file} | {row['mutants']} | {viable} | {row['killed']} | {row['timeout']} | "
            f"{row['survived']} | {rate} |")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: mutation_table.py OUTCOMES_JSON...")
    sys.exit(main(sys.argv[1:]))
