"""Which mutants the seeded suite never reaches (scripts/mutation_reach.py): line counts
from an lcov export, the spans of cargo-mutants' listing, and the check run's outcomes
rewritten for the table."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import mutation_reach  # noqa: E402
import mutation_table  # noqa: E402

LCOV = """SF:/build/tree/core/src/ec/a.rs
DA:10,0
DA:11,0
DA:12,5
DA:20,0
end_of_record
SF:/build/tree/core/src/ec/a.rs
DA:11,3
end_of_record
SF:/home/.cargo/registry/src/serde/lib.rs
DA:1,0
end_of_record
"""


def mutant(name: str, file: str, start: int, end: int) -> dict:
    return {"name": name, "file": file, "span": {"start": {"line": start, "column": 1}, "end": {"line": end, "column": 9}}}


def test_counts_are_per_line_of_core_files_the_highest_of_every_record() -> None:
    counts = mutation_reach.line_counts(LCOV)
    assert counts == {"core/src/ec/a.rs": {10: 0, 11: 3, 12: 5, 20: 0}}


def test_a_mutant_is_unreached_only_when_its_lines_hold_code_and_none_ran() -> None:
    counts = mutation_reach.line_counts(LCOV)
    mutants = [
        mutant("never ran", "core/src/ec/a.rs", 20, 20),
        mutant("one line ran", "core/src/ec/a.rs", 10, 12),
        mutant("line 10 alone", "core/src/ec/a.rs", 10, 10),
        mutant("no code on its lines", "core/src/ec/a.rs", 30, 31),
        mutant("a file with no coverage", "core/src/ec/b.rs", 1, 5),
    ]
    assert mutation_reach.unreached(counts, mutants) == ["never ran", "line 10 alone"]


def test_a_match_arm_guard_is_always_tried() -> None:
    # The guard's line reads 0 when the guard is tested and never true.
    counts = mutation_reach.line_counts(LCOV)
    guard = mutant("guard with true", "core/src/ec/a.rs", 20, 20)
    guard["genre"] = "MatchArmGuard"
    operator = mutant("operator on the same line", "core/src/ec/a.rs", 20, 20)
    operator["genre"] = "BinaryOperator"
    assert mutation_reach.unreached(counts, [guard, operator]) == ["operator on the same line"]


def test_a_const_fn_is_always_tried(tmp_path: Path, monkeypatch) -> None:
    src = tmp_path / "core/src/ec"
    src.mkdir(parents=True)
    lines = [""] * 30
    lines[17] = "    pub const fn limit() -> u64 {"
    lines[19] = "    pub fn plain() -> u64 {"
    (src / "a.rs").write_text("\n".join(lines))
    monkeypatch.chdir(tmp_path)
    counts = mutation_reach.line_counts(LCOV)
    const = mutant("in a const fn", "core/src/ec/a.rs", 20, 20)
    const["function"] = {"span": {"start": {"line": 18, "column": 5}, "end": {"line": 22, "column": 6}}}
    plain = mutant("in a plain fn", "core/src/ec/a.rs", 20, 20)
    plain["function"] = {"span": {"start": {"line": 20, "column": 5}, "end": {"line": 22, "column": 6}}}
    unreadable = mutant("source missing", "core/src/ec/gone.rs", 20, 20)
    unreadable["function"] = plain["function"]
    counts["core/src/ec/gone.rs"] = {20: 0}
    assert mutation_reach.unreached(counts, [const, plain, unreadable]) == ["in a plain fn"]


def test_sources_are_read_where_the_lcov_says_they_were_compiled(tmp_path: Path) -> None:
    src = tmp_path / "tree/core/src/ec"
    src.mkdir(parents=True)
    (src / "a.rs").write_text("\n" * 17 + "    pub const fn limit() -> u64 {\n")
    lcov = f"SF:{src / 'a.rs'}\nDA:20,0\nend_of_record\n"
    const = mutant("in a const fn", "core/src/ec/a.rs", 20, 20)
    const["function"] = {"span": {"start": {"line": 18, "column": 5}, "end": {"line": 22, "column": 6}}}
    paths = mutation_reach.source_paths(lcov)
    assert paths == {"core/src/ec/a.rs": str(src / "a.rs")}
    assert mutation_reach.unreached(mutation_reach.line_counts(lcov), [const], paths) == []
    (src / "a.rs").write_text("\n" * 17 + "    pub fn limit() -> u64 {\n")
    assert mutation_reach.unreached(mutation_reach.line_counts(lcov), [const], paths) == ["in a const fn"]


def test_the_regex_names_exactly_the_unreached(tmp_path: Path, capsys) -> None:
    (tmp_path / "s.lcov").write_text(LCOV)
    names = ["a.rs:20:5: replace > with < in f", "a.rs:11:5: replace f -> bool with true"]
    listed = [mutant(names[0], "core/src/ec/a.rs", 20, 20), mutant(names[1], "core/src/ec/a.rs", 11, 11)]
    (tmp_path / "listed.json").write_text(json.dumps(listed))
    assert mutation_reach.main(["unreached", str(tmp_path / "s.lcov"), str(tmp_path / "listed.json")]) == 0
    pattern = re.compile(capsys.readouterr().out.strip())
    assert [n for n in names if pattern.search(n)] == [names[0]]


def test_checked_mutants_become_unreached_and_the_unviable_stay_so(tmp_path: Path) -> None:
    checked = {"outcomes": [
        {"scenario": "Baseline", "summary": "Success"},
        {"scenario": {"Mutant": {"name": "m1", "file": "a.rs"}}, "summary": "Success"},
        {"scenario": {"Mutant": {"name": "m2", "file": "a.rs"}}, "summary": "Unviable"},
    ]}
    (tmp_path / "checked.json").write_text(json.dumps(checked))
    out = tmp_path / "reach.json"
    assert mutation_reach.main(["outcomes", str(tmp_path / "checked.json"), str(out)]) == 0
    table = mutation_table.merge([json.loads(out.read_text())])
    assert dict(table.rows["a.rs"]) == {"mutants": 2, "viable": 1, "unreached": 1}
    assert table.unreached == ["m1"]
    assert table.survivors == []
    assert table.kill_rate() == 0


def test_a_check_run_keeps_only_the_named_mutants(tmp_path: Path) -> None:
    """cargo-mutants 27 selects its `delete field` mutants whatever `--re` says: a check
    run by name may hold reached mutants, which must not be called unreached."""
    checked = {"outcomes": [
        {"scenario": {"Mutant": {"name": "m1", "file": "a.rs"}}, "summary": "Success"},
        {"scenario": {"Mutant": {"name": "delete field x", "file": "a.rs"}}, "summary": "Success"},
    ]}
    (tmp_path / "checked.json").write_text(json.dumps(checked))
    (tmp_path / "names.txt").write_text("m1\n")
    out = tmp_path / "reach.json"
    args = ["outcomes", str(tmp_path / "checked.json"), str(out), str(tmp_path / "names.txt")]
    assert mutation_reach.main(args) == 0
    table = mutation_table.merge([json.loads(out.read_text())])
    assert table.unreached == ["m1"]
    assert table.total()["mutants"] == 1


def test_the_names_go_to_a_file_beside_the_regex(tmp_path: Path, capsys) -> None:
    (tmp_path / "s.lcov").write_text(LCOV)
    listed = [mutant("never ran", "core/src/ec/a.rs", 20, 20), mutant("ran", "core/src/ec/a.rs", 12, 12)]
    (tmp_path / "listed.json").write_text(json.dumps(listed))
    names = tmp_path / "names.txt"
    assert mutation_reach.main(["unreached", str(tmp_path / "s.lcov"), str(tmp_path / "listed.json"), str(names)]) == 0
    assert names.read_text() == "never ran\n"
    assert capsys.readouterr().out.strip() == "^(never\\ ran)$"


def test_bad_input_is_a_clear_error(tmp_path: Path, capsys) -> None:
    (tmp_path / "bad.json").write_text("[{\"name\": \"m\"}]")
    (tmp_path / "s.lcov").write_text(LCOV)
    assert mutation_reach.main(["unreached", str(tmp_path / "s.lcov"), str(tmp_path / "bad.json")]) == 2
    assert mutation_reach.main(["unreached", str(tmp_path / "missing.lcov"), str(tmp_path / "bad.json")]) == 2
    assert mutation_reach.main(["frobnicate"]) == 2
    err = capsys.readouterr().err
    assert "mutation_reach.py:" in err and "unknown arguments" in err
