"""The mutation job's table (scripts/mutation_table.py): counts per file, shard merging and
the kill-rate gate, on outcomes.json files shaped like cargo-mutants' own."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import mutation_table  # noqa: E402


def outcome(file: str, line: int, summary: str) -> dict:
    name = f"{file}:{line}:5: replace f -> bool with true"
    return {"scenario": {"Mutant": {"name": name, "file": file}}, "summary": summary}


def report(*outcomes: dict) -> dict:
    return {"outcomes": [{"scenario": "Baseline", "summary": "Success"}, *outcomes]}


def write(tmp_path: Path, name: str, data: dict) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


def run_of(tmp_path: Path, *summaries: str) -> str:
    """An outcomes file of mutants a.rs:1, a.rs:2, ... with these summaries, in order."""
    return write(tmp_path, "o.json", report(*(outcome("a.rs", i, s) for i, s in enumerate(summaries, 1))))


def test_counts_per_file_leave_the_baseline_out() -> None:
    table = mutation_table.merge([report(
        outcome("a.rs", 1, "CaughtMutant"),
        outcome("a.rs", 2, "MissedMutant"),
        outcome("a.rs", 3, "Unviable"),
        outcome("b.rs", 1, "Timeout"),
    )])
    assert dict(table.rows["a.rs"]) == {"mutants": 3, "viable": 2, "killed": 1, "survived": 1}
    assert dict(table.rows["b.rs"]) == {"mutants": 1, "viable": 1, "timeout": 1}
    assert table.survivors == ["a.rs:2:5: replace f -> bool with true"]
    assert table.timeouts == ["b.rs:1:5: replace f -> bool with true"]
    assert table.kill_rate() == 100 / 3


def test_shards_merge_and_a_mutant_seen_twice_counts_once_with_its_last_outcome() -> None:
    first = report(outcome("a.rs", 1, "MissedMutant"), outcome("a.rs", 2, "CaughtMutant"))
    second = report(outcome("a.rs", 1, "CaughtMutant"), outcome("c.rs", 9, "CaughtMutant"))
    table = mutation_table.merge([first, second])
    assert table.total()["mutants"] == 3
    assert table.total()["killed"] == 3
    assert table.survivors == []
    assert "| **all** | 3 | 3 | 3 | 0 | 0 | 0 | 100% |" in mutation_table.render(table)


def test_the_gate_fails_below_the_rate_and_passes_at_it(tmp_path: Path, capsys) -> None:
    path = run_of(tmp_path, "CaughtMutant", "CaughtMutant", "CaughtMutant", "MissedMutant")
    assert mutation_table.main(["--min-kill-rate", "75", path]) == 0
    assert mutation_table.main(["--min-kill-rate", "80", path]) == 1
    assert "kill rate 75.0% is below 80%" in capsys.readouterr().err


def test_an_unreadable_file_is_a_clear_error(tmp_path: Path, capsys) -> None:
    bad = write(tmp_path, "bad.json", {})
    (tmp_path / "bad.json").write_text("{not json")
    assert mutation_table.main([bad]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert mutation_table.main([str(tmp_path / "missing.json")]) == 2


def test_pending_names_what_no_run_killed_or_found_unviable(tmp_path: Path, capsys) -> None:
    listed = [f"a.rs:{line}:5: replace f -> bool with true" for line in (1, 2, 3, 4)]
    earlier = report(
        outcome("a.rs", 1, "CaughtMutant"),
        outcome("a.rs", 2, "MissedMutant"),
        outcome("a.rs", 3, "Unviable"),
    )
    regex = mutation_table.pending_regex(listed, [earlier])
    pattern = re.compile(regex)
    assert [name for name in listed if pattern.search(name)] == [listed[1], listed[3]]
    assert not pattern.search("a.rs:2:5: replace f -> bool with true and more")
    assert mutation_table.pending_regex(listed[:1], [earlier]) == ""
    path = tmp_path / "listed.txt"
    path.write_text("\n".join(listed) + "\n")
    assert mutation_table.main(["--pending", str(path), write(tmp_path, "o.json", earlier)]) == 0
    assert capsys.readouterr().out.strip() == regex


def test_a_resumed_run_skips_survivors_but_tries_timeouts_again(tmp_path: Path, capsys) -> None:
    listed = [f"a.rs:{line}:5: replace f -> bool with true" for line in (1, 2, 3, 4, 5)]
    earlier = report(
        outcome("a.rs", 1, "CaughtMutant"),
        outcome("a.rs", 2, "MissedMutant"),
        outcome("a.rs", 3, "Unreached"),
        outcome("a.rs", 4, "Timeout"),
    )
    pattern = re.compile(mutation_table.pending_regex(listed, [earlier], skip_survivors=True))
    assert [name for name in listed if pattern.search(name)] == [listed[2], listed[3], listed[4]], "unreached: look again"
    again = re.compile(mutation_table.pending_regex(listed, [earlier]))
    assert [name for name in listed if again.search(name)] == listed[1:]
    checked = re.compile(mutation_table.pending_regex(listed, [earlier], skip_unreached=True))
    assert [name for name in listed if checked.search(name)] == [listed[1], listed[3], listed[4]]
    path = tmp_path / "listed.txt"
    path.write_text("\n".join(listed) + "\n")
    done = write(tmp_path, "o.json", earlier)
    assert mutation_table.main(["--pending", str(path), "--skip-survivors", done]) == 0
    assert capsys.readouterr().out.strip() == pattern.pattern
    assert mutation_table.main(["--pending", str(path), "--skip-unreached", done]) == 0
    assert capsys.readouterr().out.strip() == checked.pattern


def test_an_iterated_run_does_not_run_an_equivalent_survivor_again(tmp_path: Path, capsys) -> None:
    listed = [f"a.rs:{line}:5: replace f -> bool with true" for line in (1, 2, 3, 4)]
    earlier = report(
        outcome("a.rs", 1, "MissedMutant"),
        outcome("a.rs", 2, "MissedMutant"),
        outcome("a.rs", 3, "Unreached"),
        outcome("a.rs", 4, "Timeout"),
    )
    by_name = frozenset({listed[0]})
    pattern = re.compile(mutation_table.pending_regex(listed, [earlier], equivalent=by_name))
    assert [name for name in listed if pattern.search(name)] == listed[1:]
    anywhere = frozenset({"a.rs: replace f -> bool with true"})
    pattern = re.compile(mutation_table.pending_regex(listed, [earlier], equivalent=anywhere))
    assert [name for name in listed if pattern.search(name)] == [listed[3]], "a timeout is no verdict"
    path = tmp_path / "listed.txt"
    path.write_text("\n".join(listed) + "\n")
    judged = tmp_path / "equivalent.txt"
    judged.write_text(f"{listed[1]}  # an accessor\n")
    assert mutation_table.main(["--pending", str(path), "--equivalent", str(judged), write(tmp_path, "o.json", earlier)]) == 0
    pattern = re.compile(capsys.readouterr().out.strip())
    assert [name for name in listed if pattern.search(name)] == [listed[0], listed[2], listed[3]]


def test_equivalent_survivors_are_listed_apart_and_left_out_of_the_gate(tmp_path: Path, capsys) -> None:
    path = run_of(tmp_path, "CaughtMutant", "CaughtMutant", "MissedMutant", "MissedMutant")
    listed = tmp_path / "equivalent.txt"
    listed.write_text("# reasons follow each name\na.rs:4:5: replace f -> bool with true  # an accessor\n\n")
    assert mutation_table.main(["--min-kill-rate", "60", path]) == 1
    capsys.readouterr()
    assert mutation_table.main(["--min-kill-rate", "60", "--equivalent", str(listed), path]) == 0
    out = capsys.readouterr().out
    assert "Killed among the 3 viable mutants not judged equivalent: 67%" in out
    assert "Survivors (1):\n- a.rs:3:5" in out
    assert "Equivalent survivors (1):\n- a.rs:4:5" in out
    assert mutation_table.main(["--min-kill-rate", "70", "--equivalent", str(listed), path]) == 1
    assert mutation_table.main(["--equivalent", str(tmp_path / "missing.txt"), path]) == 2


def test_unreached_mutants_are_viable_survivors_listed_apart_and_can_be_equivalent(tmp_path: Path, capsys) -> None:
    path = run_of(tmp_path, "CaughtMutant", "Unreached", "Unreached", "MissedMutant")
    equivalent = tmp_path / "eq.txt"
    equivalent.write_text("a.rs:3:5: replace f -> bool with true  # no driver calls it\n")
    assert mutation_table.main(["--equivalent", str(equivalent), "--min-kill-rate", "34", path]) == 1
    out = capsys.readouterr().out
    assert "| a.rs | 4 | 4 | 1 | 0 | 1 | 2 | 25% |" in out
    assert "Not reached by any seed (1):\n- a.rs:2:5: replace f -> bool with true" in out
    assert "Equivalent survivors (1):\n- a.rs:3:5: replace f -> bool with true" in out
    assert "Killed among the 3 viable mutants not judged equivalent: 33%" in out


def test_prune_drops_the_verdicts_of_changed_files_only(tmp_path: Path, capsys) -> None:
    first = write(tmp_path, "o1.json", report(outcome("a.rs", 1, "MissedMutant"), outcome("b.rs", 1, "CaughtMutant")))
    second = write(tmp_path, "o2.json", report(outcome("a.rs", 2, "Unreached"), outcome("c.rs", 1, "MissedMutant")))
    assert mutation_table.main(["--prune", "a.rs,c.rs", first, second]) == 0
    assert capsys.readouterr().out.strip() == "3"
    kept = [json.loads(Path(p).read_text()) for p in (first, second)]
    table = mutation_table.merge(kept)
    assert dict(table.rows) == {"b.rs": {**table.rows["b.rs"], "mutants": 1, "killed": 1}}
    assert table.survivors == [] and table.unreached == []
    assert kept[0]["outcomes"][0] == {"scenario": "Baseline", "summary": "Success"}, "the baseline stays"
    listed = ["a.rs:1:5: replace f -> bool with true", "b.rs:1:5: replace f -> bool with true"]
    pattern = re.compile(mutation_table.pending_regex(listed, kept, skip_survivors=True, skip_unreached=True))
    assert [name for name in listed if pattern.search(name)] == [listed[0]], "the pruned file is judged again"


def test_a_judgement_without_line_and_column_holds_wherever_the_function_moves(tmp_path: Path, capsys) -> None:
    moved = {"scenario": {"Mutant": {"name": "a.rs:40:9: replace g -> usize with 0", "file": "a.rs"}}, "summary": "Unreached"}
    other = {"scenario": {"Mutant": {"name": "a.rs:41:9: replace g -> usize with 1", "file": "a.rs"}}, "summary": "MissedMutant"}
    path = write(tmp_path, "o.json", report(outcome("a.rs", 1, "CaughtMutant"), moved, other))
    equivalent = tmp_path / "eq.txt"
    equivalent.write_text("a.rs: replace g -> usize with 0  # accessor\na.rs:7:9: replace g -> usize with 1  # stale line\n")
    assert mutation_table.main(["--equivalent", str(equivalent), path]) == 0
    out = capsys.readouterr().out
    assert "Equivalent survivors (1):\n- a.rs:40:9: replace g -> usize with 0" in out
    assert "Survivors (1):\n- a.rs:41:9: replace g -> usize with 1" in out, "a name with a position must match it"


def test_a_partial_run_projects_the_whole_from_the_reached_mutants_judged(tmp_path: Path, capsys) -> None:
    path = run_of(tmp_path, *(["CaughtMutant"] * 8), "MissedMutant", "Unreached", "Unviable")
    names = [f"a.rs:{i}:5: replace f -> bool with true" for i in range(1, 23)]
    listed = tmp_path / "listed.txt"
    listed.write_text("".join(f"{n}\n" for n in names))
    assert mutation_table.main(["--listed", str(listed), path]) == 0
    out = capsys.readouterr().out
    # 11 left; 10 of the 11 judged were viable, so 10 of them are expected viable, killed
    # at 8 of the 9 reached: (8 + 10 * 8/9) / (10 + 10) = 84%. Wilson 8/9: 56.5%-98.0%.
    assert "Not judged yet: 11 of the 22 mutants listed" in out
    assert "Of the 9 reached, non-equivalent viable mutants judged, 89% were killed (95% interval 56-98%)" in out
    assert "the whole run kills 84% (68-89%)" in out
    listed.write_text("".join(f"{n}\n" for n in names[:11]))
    assert mutation_table.main(["--listed", str(listed), path]) == 0
    assert "Not judged yet" not in capsys.readouterr().out
    assert mutation_table.main(["--listed", str(tmp_path / "missing.txt"), path]) == 2
