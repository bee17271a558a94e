#!/usr/bin/env python3
"""The per-file table of a mutation run (scripts/mutation.sh) from cargo-mutants'
outcomes.json: mutants, viable (it built), killed (the seeded suite failed), timed out,
survivors, unreached (viable, and no seed runs its lines: scripts/mutation_reach.py), kill
rate among the viable; then every survivor by name, the unreached apart.

Several outcomes.json files (the shards of one run) merge into one table; a mutant found
in more than one file counts once, with its outcome in the last file named.

    mutation_table.py [--min-kill-rate PCT] [--equivalent LIST] [--listed LISTED] OUTCOMES_JSON...
    mutation_table.py --pending LISTED [--skip-survivors] [--skip-unreached] [--equivalent LIST] OUTCOMES_JSON...
    mutation_table.py --prune FILE[,FILE...] OUTCOMES_JSON...

`--equivalent` names a file of mutants judged equivalent (one name per line, `#` starts a
comment: the reason): survivors named there are listed apart and left out of the rate the
gate applies, killed among the viable that are not equivalent. A name without its
`:line:col` (`core/src/a.rs: replace f -> bool with true`) names that mutation of that
function wherever it sits, so an edit elsewhere in the file does not unjudge it.

`--listed` names the run's whole listing (`cargo mutants --list`, DIR/listed.txt): while
some of it is not judged yet, the table ends with a projection for the whole run. The
mutants left are taken as reached (the script checks the unreached ones before it runs
any), as often viable as those judged, and killed at the rate of the reached, viable,
non-equivalent mutants judged so far (Wilson 95% interval); a run in shuffled order makes
those a uniform sample of what was left. None of the rest is taken as equivalent.

`--pending` prints, as one anchored regular expression for cargo-mutants' `--re`, the
mutants named in LISTED (`cargo mutants --list`) that no outcome marks killed or unviable
(empty when none is left): what a resumed run still has to judge. With `--skip-survivors`
survivors count as judged too (a timeout does not: it may be the machine's load): what a
run interrupted on an unchanged core still has to try. An unreached mutant stays pending,
since the simulator may reach it now, unless `--skip-unreached` is given: of the mutants
the coverage pass still finds unreached, only those not found so before need checking.
With `--equivalent`, a survivor (reached or not) judged equivalent counts as judged: its
verdict is the reasoning listed, which no oracle can change, so an iterated run does not
spend a full suite on it again.

`--prune` rewrites each OUTCOMES_JSON without the outcomes of mutants in the named source
files (those that changed since they were judged: their verdicts no longer hold), and
prints how many it dropped.

Exit status: 0, 1 when the kill rate is below --min-kill-rate, 2 for an unreadable file."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from dataclasses import dataclass, field


@dataclass
class Table:
    """Counts per file, and the names of the mutants that survived or timed out."""

    rows: dict[str, dict[str, int]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(int)))
    survivors: list[str] = field(default_factory=list)
    timeouts: list[str] = field(default_factory=list)
    unreached: list[str] = field(default_factory=list)
    equivalent: list[str] = field(default_factory=list)

    def total(self) -> dict[str, int]:
        total: dict[str, int] = defaultdict(int)
        for row in self.rows.values():
            for k, v in row.items():
                total[k] += v
        return total

    def kill_rate(self) -> float | None:
        """Killed among the viable, in percent; None when nothing was viable."""
        total = self.total()
        return 100 * total["killed"] / total["viable"] if total["viable"] else None

    def judged_rate(self) -> float | None:
        """Killed among the viable mutants not judged equivalent, in percent."""
        total = self.total()
        seen = total["viable"] - len(self.equivalent)
        return 100 * total["killed"] / seen if seen > 0 else None

    def set_aside(self, equivalent: set[str]) -> None:
        """Moves the survivors (reached or not) named in `equivalent` out of their lists."""

        self.equivalent = sorted(name for name in self.survivors + self.unreached if is_equivalent(name, equivalent))
        self.survivors = [name for name in self.survivors if not is_equivalent(name, equivalent)]
        self.unreached = [name for name in self.unreached if not is_equivalent(name, equivalent)]


def wilson(killed: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a proportion `killed / n` (95% by default)."""
    if n == 0:
        return (0.0, 1.0)
    p = killed / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * (p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5 / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def projection(table: Table, listed: list[str], judged: set[str]) -> str | None:
    """The whole run's kill rate (viable, non-equivalent, unreached counted as survivors)
    if the mutants of `listed` not yet judged fare as the reached ones judged so far;
    None when nothing is left."""
    left = sum(1 for name in listed if name not in judged)
    if left == 0:
        return None
    total = table.total()
    killed = total["killed"]
    reached = killed + total["timeout"] + len(table.survivors)
    viable_share = total["viable"] / total["mutants"] if total["mutants"] else 1.0
    seen = total["viable"] - len(table.equivalent)
    expected_viable = left * viable_share

    def whole(rate: float) -> float:
        return 100 * (killed + expected_viable * rate) / (seen + expected_viable)

    rate = killed / reached if reached else 0.0
    low, high = wilson(killed, reached)
    return (
        f"\nNot judged yet: {left} of the {len(listed)} mutants listed. Of the {reached} reached, "
        f"non-equivalent viable mutants judged, {100 * rate:.0f}% were killed (95% interval "
        f"{100 * low:.0f}-{100 * high:.0f}%); if the rest fare alike, the whole run kills "
        f"{whole(rate):.0f}% ({whole(low):.0f}-{whole(high):.0f}%) of its viable mutants not judged "
        "equivalent, unreached counted as survivors."
    )


def is_equivalent(name: str, equivalent: frozenset[str] | set[str]) -> bool:
    """Whether `name` is judged equivalent, by its full name or wherever its function sits."""
    return name in equivalent or without_position(name) in equivalent


def read_equivalent(path: str) -> frozenset[str]:
    """The names a list of equivalents judges (one a line, `#` starts the reason)."""
    with open(path, encoding="utf-8") as f:
        return frozenset({line.split("#", 1)[0].strip() for line in f} - {""})


def without_position(name: str) -> str:
    """A mutant's name without its line and column (`core/src/a.rs: replace ...`): the
    form a judgement takes when it holds wherever the function's lines move."""
    return re.sub(r"^(\S+?\.rs):\d+:\d+: ", r"\1: ", name)


def merge(reports: list[dict]) -> Table:
    """One table from the outcomes of several runs (a later report's outcome wins)."""
    outcomes: dict[str, tuple[str, str | None]] = {}
    for report in reports:
        for mutant, summary in mutant_outcomes(report):
            name = mutant.get("name") or f"{mutant.get('file')}: {mutant.get('replacement')}"
            outcomes[name] = (mutant.get("file", "?"), summary)
    table = Table()
    for name, (file, summary) in outcomes.items():
        row = table.rows[file]
        row["mutants"] += 1
        if summary == "Unviable":
            continue
        row["viable"] += 1
        if summary == "CaughtMutant":
            row["killed"] += 1
        elif summary == "Timeout":
            row["timeout"] += 1
            table.timeouts.append(name)
        elif summary == "Unreached":
            row["unreached"] += 1
            table.unreached.append(name)
        else:
            row["survived"] += 1
            table.survivors.append(name)
    return table


def pending_regex(
    listed: list[str],
    reports: list[dict],
    skip_survivors: bool = False,
    skip_unreached: bool = False,
    equivalent: frozenset[str] = frozenset(),
) -> str:
    """The listed mutants no report marks killed or unviable (with `skip_survivors`: nor
    survived; with `skip_unreached`: nor unreached; survivors named in `equivalent`
    neither), as one anchored regex."""
    judged = ("CaughtMutant", "Unviable")
    judged += ("MissedMutant",) if skip_survivors else ()
    judged += ("Unreached",) if skip_unreached else ()
    done = {
        mutant.get("name")
        for report in reports
        for mutant, summary in mutant_outcomes(report)
        if summary in judged
        or (summary in ("MissedMutant", "Unreached") and is_equivalent(mutant.get("name", ""), equivalent))
    }
    return names_regex([name for name in listed if name not in done])


def mutant_outcomes(report: dict) -> list[tuple[dict, str | None]]:
    """Each mutant a report judged, with its summary (the baseline left out)."""
    return [
        (outcome["scenario"]["Mutant"], outcome.get("summary"))
        for outcome in report.get("outcomes", [])
        if isinstance(outcome.get("scenario"), dict) and "Mutant" in outcome["scenario"]
    ]


def prune(report: dict, files: set[str]) -> int:
    """Drops the outcomes of mutants in `files` from `report`; returns how many."""
    kept = [
        outcome
        for outcome in report.get("outcomes", [])
        if not (isinstance(outcome.get("scenario"), dict) and outcome["scenario"].get("Mutant", {}).get("file") in files)
    ]
    dropped = len(report.get("outcomes", [])) - len(kept)
    report["outcomes"] = kept
    return dropped


def names_regex(names: list[str]) -> str:
    """One anchored regular expression (cargo-mutants' `--re`) matching exactly these
    mutant names; empty for none."""
    return f"^({'|'.join(re.escape(name) for name in names)})$" if names else ""


def render(table: Table) -> str:
    lines = [
        "| file | mutants | viable | killed | timed out | survived | unreached | killed / viable |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [line(file, table.rows[file]) for file in sorted(table.rows)]
    lines.append(line("**all**", table.total()))
    if table.equivalent:
        rate = table.judged_rate()
        shown = "-" if rate is None else f"{rate:.0f}%"
        seen = table.total()["viable"] - len(table.equivalent)
        lines.append(f"\nKilled among the {seen} viable mutants not judged equivalent: {shown}")
    for title, names in (
        ("Survivors", table.survivors),
        ("Timed out", table.timeouts),
        ("Not reached by any seed", table.unreached),
        ("Equivalent survivors", table.equivalent),
    ):
        if names:
            lines.append(f"\n{title} ({len(names)}):")
            lines += [f"- {name}" for name in sorted(names)]
    return "\n".join(lines)


def line(file: str, row: dict[str, int]) -> str:
    viable = row["viable"]
    rate = f"{100 * row['killed'] / viable:.0f}%" if viable else "-"
    return (f"| {file} | {row['mutants']} | {viable} | {row['killed']} | {row['timeout']} | "
            f"{row['survived']} | {row['unreached']} | {rate} |")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="mutation_table.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--min-kill-rate", type=float, default=None, metavar="PCT")
    parser.add_argument("--pending", default=None, metavar="LISTED")
    parser.add_argument("--skip-survivors", action="store_true")
    parser.add_argument("--skip-unreached", action="store_true")
    parser.add_argument("--equivalent", default=None, metavar="LIST")
    parser.add_argument("--prune", default=None, metavar="FILES")
    parser.add_argument("--listed", default=None, metavar="LISTED")
    parser.add_argument("outcomes", nargs="*", metavar="OUTCOMES_JSON")
    args = parser.parse_args(argv)
    if args.pending is None and not args.outcomes:
        parser.error("name at least one OUTCOMES_JSON")
    reports = []
    for path in args.outcomes:
        try:
            with open(path, encoding="utf-8") as f:
                reports.append(json.load(f))
        except (OSError, ValueError) as e:
            print(f"mutation_table.py: cannot read {path}: {e}", file=sys.stderr)
            return 2
    if args.prune is not None:
        files = {f for f in args.prune.split(",") if f}
        dropped = 0
        for path, report in zip(args.outcomes, reports):
            n = prune(report, files)
            if n:
                with open(path, "w", encoding="utf-8") as f:
                    json.dump(report, f)
            dropped += n
        print(dropped)
        return 0
    listing = args.pending if args.pending is not None else args.listed
    listed: list[str] = []
    if listing is not None:
        try:
            with open(listing, encoding="utf-8") as f:
                listed = [line.strip() for line in f if line.strip()]
        except OSError as e:
            print(f"mutation_table.py: cannot read {listing}: {e}", file=sys.stderr)
            return 2
    names: frozenset[str] = frozenset()
    if args.equivalent is not None:
        try:
            names = read_equivalent(args.equivalent)
        except OSError as e:
            print(f"mutation_table.py: cannot read {args.equivalent}: {e}", file=sys.stderr)
            return 2
    if args.pending is not None:
        print(pending_regex(listed, reports, args.skip_survivors, args.skip_unreached, names))
        return 0
    table = merge(reports)
    if args.equivalent is not None:
        table.set_aside(names)
    print(render(table))
    if args.listed is not None:
        judged = {mutant.get("name", "") for report in reports for mutant, _ in mutant_outcomes(report)}
        shown = projection(table, listed, judged)
        if shown is not None:
            print(shown)
    rate = table.judged_rate() if args.equivalent is not None else table.kill_rate()
    if args.min_kill_rate is not None and (rate is None or rate < args.min_kill_rate):
        shown = "no viable mutant" if rate is None else f"{rate:.1f}%"
        print(f"mutation_table.py: kill rate {shown} is below {args.min_kill_rate:g}%", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
