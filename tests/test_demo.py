"""`cel-numpy demo` (what `make demo` runs): the theory step end to end, and its bad-input path."""

import argparse
import json
import shlex
from pathlib import Path

import pytest

from cel_numpy.cli import main


def test_demo_theory_only_writes_summary_and_localizes(tmp_path, capsys):
    assert main(["demo", "--theory-only", "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "theory" / "summary.json").read_text())
    assert abs(summary["closed_form"]["joint"] - 0.42) < 1e-12
    assert summary["concentration"] > 0.7
    out = capsys.readouterr().out
    assert "$ cel-numpy theory" in out, (
        "the demo must show each step as a command the user can re-run"
    )
    report = json.loads((tmp_path / "localize-theory" / "report.json").read_text())
    primary = report["primary"]  # the routine's rank 1 holds the c-feature head of step 1
    assert [0, summary["c_head"]] in primary["heads"], (primary["heads"], summary["c_head"])
    assert primary["heldout"]["gain"] > 0 and primary["heldout"]["p_value"] < 0.01


def test_demo_unwritable_out_is_one_line_error(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert main(["demo", "--theory-only", "--out", str(blocker / "sub")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot write" in err[0], err


def test_demo_runs_the_documented_steps_in_order(tmp_path, capsys):
    """The full demo's commands, recorded instead of run: what the README says it does."""
    from cel_numpy import demo

    ran = []

    def record(argv):  # test-heads leaves its panel and records: 3 items, one in Canada
        ran.append(argv)
        if argv[0] == "test-heads":
            run = Path(argv[argv.index("--out") + 1])
            (run / "panels").mkdir(parents=True)
            panel = [("a", "Canada"), ("b", "Peru"), ("c", "Chad")]
            (run / "panels" / "heldout.jsonl").write_text(
                "".join(json.dumps({"id": i, "cluster": c}) + "\n" for i, c in panel)
            )
            verdicts = {"intact": [False, False, True], "L10H3+L11H5+L23H0": [True, True, False]}
            (run / "heldout.jsonl").write_text(
                "".join(
                    json.dumps({"block": b, "panel": "heldout", "item": i, "correct": v}) + "\n"
                    for b, vs in verdicts.items()
                    for (i, _), v in zip(panel, vs)
                )
            )
        return 0

    parser = argparse.ArgumentParser()
    demo.register(parser.add_subparsers(), run_command=record)
    args = parser.parse_args(["demo", "--out", str(tmp_path)])
    assert args.func(args) == 0
    assert [argv[0] for argv in ran] == ["theory", "test-heads", "localize", "generate"]
    test_heads = ran[1]
    assert test_heads[test_heads.index("--heads") + 1] == "L10H3+L11H5+L23H0"
    assert test_heads[test_heads.index("--task") + 1] == "capitals"
    assert test_heads[test_heads.index("--seed") + 1] == str(demo.DEMO_SEED)
    assert ran[2][ran[2].index("--model") + 1] == "theory"
    generate = ran[3]
    assert generate[generate.index("--ablate") + 1] == demo.CAPITALS_HEADS
    out = capsys.readouterr().out
    first = out.splitlines()[0]
    assert first.startswith("cel-numpy demo: 4 steps, about ") and " minutes" in first, first
    for argv in ran:  # every step is shown as the command that re-runs it
        assert f"$ cel-numpy {shlex.join(argv)}" in out
    assert (
        "  1 items (1 countries) asking a country that chose the heads: rescued 1, damaged 0" in out
    )
    assert (
        "  2 items (2 countries) asking any other: rescued 1, damaged 1, exact McNemar p = 1" in out
    )
    ran.clear()
    args = parser.parse_args(["demo", "--out", str(tmp_path / "t"), "--theory-only"])
    assert args.func(args) == 0
    assert [argv[0] for argv in ran] == ["theory", "localize"]
    assert "1/2 theory" in capsys.readouterr().out


def test_demo_stops_at_a_failing_step(tmp_path):
    from cel_numpy import demo

    ran = []
    parser = argparse.ArgumentParser()
    demo.register(parser.add_subparsers(), run_command=lambda argv: ran.append(argv) or 2)
    args = parser.parse_args(["demo", "--out", str(tmp_path)])
    with pytest.raises(SystemExit) as stop:
        args.func(args)
    assert stop.value.code == 2 and len(ran) == 1
