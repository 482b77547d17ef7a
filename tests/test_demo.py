"""`cel-numpy demo` (what `make demo` runs): the theory step end to end, and its bad-input path."""

import json

from cel_numpy.cli import main


def test_demo_theory_only_writes_summary(tmp_path, capsys):
    assert main(["demo", "--theory-only", "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "theory" / "summary.json").read_text())
    assert abs(summary["closed_form"]["joint"] - 0.42) < 1e-12
    assert summary["concentration"] > 0.7
    out = capsys.readouterr().out
    assert "$ cel-numpy theory" in out, (
        "the demo must show each step as a command the user can re-run"
    )


def test_demo_unwritable_out_is_one_line_error(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert main(["demo", "--theory-only", "--out", str(blocker / "sub")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot write" in err[0], err
