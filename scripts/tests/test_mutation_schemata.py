"""The one-build mutation runner (scripts/mutation_schemata.py): which mutant a compile
error is blamed on, and that its verdicts read like cargo-mutants' in the table."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import mutation_schemata  # noqa: E402
import mutation_table  # noqa: E402

# The shape tools/mutation-schemata writes: nested switches, one line each.
SOURCE = """pub fn f(a: Instant, d: Duration) -> Instant {
    if crate::__mutant_on(3) { return Default::default(); }
    (if crate::__mutant_on(4) { (a) * ((if crate::__mutant_on(5) { (d) - (d) } else { d + d })) } else { a + d })
}
"""


def error(line: int, column: int, code: str = "E0369") -> dict:
    return {"code": {"code": code}, "message": "m",
            "spans": [{"file_name": "core/src/x.rs", "line_start": line, "column_start": column, "is_primary": True}]}


def blame(tmp_path: Path, message: dict) -> int | None:
    (tmp_path / "core" / "src").mkdir(parents=True)
    (tmp_path / "core" / "src" / "x.rs").write_text(SOURCE)
    return mutation_schemata.culprit(str(tmp_path), message, {})


def test_an_error_in_a_value_branch_is_blamed_on_its_switch(tmp_path: Path) -> None:
    assert blame(tmp_path, error(2, 39, "E0277")) == 3


def test_an_operator_error_is_blamed_on_the_switch_before_it_not_on_one_inside_it(tmp_path: Path) -> None:
    # `(a) * (...)` starts after switch 4 and holds switch 5: the error is mutant 4's.
    assert blame(tmp_path, error(3, 33)) == 4


def test_an_error_ahead_of_every_switch_is_blamed_on_none(tmp_path: Path) -> None:
    assert blame(tmp_path, error(1, 1)) is None


def test_verdicts_merge_into_the_table_as_cargo_mutants_outcomes() -> None:
    mutant = {"name": "core/src/ec/a.rs:3:5: replace f -> u64 with 0", "file": "core/src/ec/a.rs"}
    other = {"name": "core/src/ec/a.rs:4:9: replace < with > in f", "file": "core/src/ec/a.rs"}
    report = {"outcomes": [
        mutation_schemata.outcome(mutant, "CaughtMutant", 3.0),
        mutation_schemata.outcome(other, "Unviable", 0.0, "E0369: cannot multiply"),
    ]}
    report = json.loads(json.dumps(report))
    judged = dict((m["name"], s) for m, s in mutation_table.mutant_outcomes(report))
    assert judged == {mutant["name"]: "CaughtMutant", other["name"]: "Unviable"}
    table = mutation_table.merge([report])
    assert table.kill_rate() == 100.0


def test_an_error_on_the_switch_itself_is_blamed_on_it(tmp_path: Path) -> None:
    # A switch where no function may be called (a constant) is rejected at the call.
    assert blame(tmp_path, error(2, 8, "E0015")) == 3


def test_mutants_judged_equivalent_run_last_and_every_placed_one_runs_once() -> None:
    listing = [{"name": f"core/src/ec/a.rs:{i}:5: replace f{i} -> bool with true"} for i in range(12)]
    equivalent = frozenset({listing[2]["name"], "core/src/ec/a.rs: replace f7 -> bool with true"})
    placed = [0, 1, 2, 3, 5, 7, 8, 11]
    order = mutation_schemata.run_order(listing, placed, equivalent, random.Random(4))
    assert sorted(order) == placed
    assert set(order[-2:]) == {2, 7}
