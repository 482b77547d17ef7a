"""`cel-numpy summarize`: report.json is data (validated, never trusted), run directories count
once, table cells cannot break the table, the output never lands in a run, and `--verify`
recomputes every number of the table from the runs' per-item records."""

from __future__ import annotations

import copy
import json
import shutil

import pytest

from cel_numpy.cli import main
from cel_numpy.localize.evaluate import TheoryEvaluator, TheoryTask
from cel_numpy.localize.routine import localize, test_heads
from cel_numpy.localize.summary import cell, render, summarize
from tests.test_localize import trained_theory  # noqa: F401
from tests.test_matched_null import _run as planted_run


@pytest.fixture(scope="module")
def runs(tmp_path_factory, trained_theory):  # noqa: F811
    """Two theory searches (one with both nulls), a test-heads run, a planted-LM search with
    log-probabilities and both nulls: pristine copies, copied again by each test that edits."""
    params, world = trained_theory
    root = tmp_path_factory.mktemp("runs")
    task = TheoryTask("A", world)
    make = lambda t, ref: TheoryEvaluator(params, t)
    localize(root / "a", make, task, n_discovery=60, n_heldout=80, seed=1, null_sets=3,
             matched_null=100, cross_tasks=[TheoryTask("B", world)], progress=False,
             command="t")  # fmt: skip
    localize(root / "b", make, task, n_discovery=60, n_heldout=80, seed=2, cross_tasks=[],
             progress=False, command="t")  # fmt: skip
    test_heads(root / "t", make, task, "L0H0", n_heldout=80, seed=5, null_sets=2,
               progress=False, command="t")  # fmt: skip
    planted_run(root / "lm", null_sets=4, matched_null=200, matched_pool=12)
    return root


def _copy(runs, tmp_path, *names):
    out = []
    for name in names:
        shutil.copytree(runs / name, tmp_path / name)
        out.append(tmp_path / name)
    return out


def _edit_report(run, edit):
    path = run / "report.json"
    report = json.loads(path.read_text())
    edit(report)
    path.write_text(json.dumps(report))


def _err(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err  # one line
    return err


# --------------------------------------------------------------------------- validation


BAD_REPORTS = [  # (id, edit of report.json, words of the one-line error)
    ("p-nan", lambda r: r["primary"]["heldout"].update(p_value=float("nan")),
     "primary.heldout.p_value is nan, not a p-value in [0, 1]"),
    ("p-negative", lambda r: r["primary"]["heldout"].update(p_value=-5),
     "primary.heldout.p_value is -5, not a p-value in [0, 1]"),
    ("p-above-one", lambda r: r["primary"]["heldout"].update(p_value=1.5),
     "primary.heldout.p_value is 1.5, not a p-value"),
    ("p-string", lambda r: r["primary"]["heldout"].update(p_value="0.01"),
     "primary.heldout.p_value is '0.01', not a p-value"),
    ("item-p-none", lambda r: r["primary"]["heldout"].update(item_p_value=None),
     "primary.heldout.item_p_value is missing (or null), not a p-value"),
    ("no-primary", lambda r: r.pop("primary"), "primary is missing (or null), not an object"),
    ("primary-list", lambda r: r.update(primary=[1, 2]), "primary is [1, 2], not an object"),
    ("heldout-list", lambda r: r["primary"].update(heldout=[]), "primary.heldout is [], not an"),
    ("rate-out-of-range", lambda r: r["primary"]["heldout"].update(ci_high=3.0),
     "primary.heldout.ci_high is 3.0, not a rate in [-1, 1]"),
    ("gain-bool", lambda r: r["primary"]["heldout"].update(gain=True),
     "primary.heldout.gain is True, not a count"),
    ("gain-beyond-n", lambda r: r["primary"]["heldout"].update(gain=10**6),
     "primary.heldout.gain is 1000000, not a gain of at most 80 items"),
    ("format-unknown", lambda r: r.update(format="cel-numpy.localize.report/9"),
     "format is 'cel-numpy.localize.report/9', not cel-numpy.localize.report/2"),
    ("format-missing", lambda r: r.pop("format"),
     "format is missing (or null), not cel-numpy.localize.report/2"),
    ("null-percentile", lambda r: r["primary"]["nulls"].update(percentile=250),
     "primary.nulls.percentile is 250, not a number in [0, 100]"),
    ("gate-zero", lambda r: r["primary"].update(
        matched_null=None, matched_null_skipped={"gate": 0, "gain": -2, "p_value": 0.5}),
     "primary.matched_null_skipped.gate is 0, not a number in (0, 1]"),
    ("gate-beside-result", lambda r: r["primary"].update(
        matched_null={"n": 3, "percentile": 50.0},
        matched_null_skipped={"gate": 0.05, "gain": -2, "p_value": 0.5}),
     "primary.matched_null is 'a result', not absent beside primary.matched_null_skipped"),
    ("cross-p", lambda r: r["primary"]["crosstask"]["theory-B"].update(p_value=-1),
     "primary.crosstask.theory-B.p_value is -1"),
    ("finalists-object", lambda r: r.update(finalists={"a": 1}),
     "finalists is {'a': 1}, not a list"),
    ("seconds-negative", lambda r: r["stage_seconds"].update(screen=-3),
     "stage_seconds.screen is -3, not a number of seconds"),
]  # fmt: skip


@pytest.mark.parametrize(
    "edit,words", [c[1:] for c in BAD_REPORTS], ids=[c[0] for c in BAD_REPORTS]
)
def test_a_damaged_report_is_one_line_naming_the_field(runs, tmp_path, capsys, edit, words):
    (run,) = _copy(runs, tmp_path, "a")
    _edit_report(run, edit)
    assert main(["summarize", str(run)]) == 2
    err = _err(capsys)
    assert err.startswith(f"cel-numpy summarize: error: {run / 'report.json'}: ") and words in err


@pytest.mark.parametrize(
    "content,words",
    [("[1, 2]", "the file is [1, 2], not an object"), ("{", "invalid JSON"),
     ("[" * 100_000 + "]" * 100_000, "JSON nested too deeply to be a report"),
     ("\xff", "not UTF-8 text")],
    ids=["list", "truncated", "nested", "not-utf8"],
)  # fmt: skip
def test_a_report_that_is_not_a_json_object_is_one_line(runs, tmp_path, capsys, content, words):
    (run,) = _copy(runs, tmp_path, "a")
    (run / "report.json").write_bytes(content.encode("latin-1"))
    assert main(["summarize", str(run)]) == 2
    err = _err(capsys)
    assert words in err and "rerun the run's command (in its manifest.json) with the same" in err


def test_the_advice_for_a_damaged_report_repairs_it(runs, tmp_path, capsys, trained_theory):  # noqa: F811
    """ "rerun the run's command with the same --out": the report stage rewrites report.json
    from the kept records, so the damaged run summarizes again, with the same numbers."""
    (run,) = _copy(runs, tmp_path, "b")
    before = summarize([run])["rows"][0]
    (run / "report.json").write_text("[1, 2]")
    assert main(["summarize", str(run)]) == 2
    assert "rerun the run's command (in its manifest.json) with the same --out" in _err(capsys)
    params, world = trained_theory
    localize(run, lambda t, ref: TheoryEvaluator(params, t), TheoryTask("A", world),
             n_discovery=60, n_heldout=80, seed=2, cross_tasks=[], progress=False,
             command="t")  # fmt: skip
    after = summarize([run])["rows"][0]
    assert {k: v for k, v in after.items() if k != "seconds"} == {
        k: v for k, v in before.items() if k != "seconds"
    }


def test_a_report_that_is_not_a_regular_file_is_refused(runs, tmp_path, capsys):
    import os

    (run,) = _copy(runs, tmp_path, "a")
    (run / "report.json").unlink()
    os.mkfifo(run / "report.json")  # reading it would wait forever
    assert main(["summarize", str(run)]) == 2
    assert "report.json: a FIFO, not a regular file: give the report itself" in _err(capsys)


def test_a_damaged_manifest_field_is_one_line(runs, tmp_path, capsys):
    (run,) = _copy(runs, tmp_path, "a")
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["task"] = ["theory-A"]
    (run / "manifest.json").write_text(json.dumps(manifest))
    assert main(["summarize", str(run)]) == 2
    assert "manifest.json: task is ['theory-A'], not an object" in _err(capsys)


@pytest.mark.parametrize(
    "fold,words",
    [("x", "fold is 'x', not an object"), ({"k": 3, "folds": 3}, "fold.k is 3, not a fold in 0..2"),
     ({"k": 0, "folds": 1}, "fold.folds is 1, not a count of at least 2")],
)  # fmt: skip
def test_a_damaged_fold_is_one_line(runs, tmp_path, capsys, fold, words):
    (run,) = _copy(runs, tmp_path, "a")
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["fold"] = fold
    (run / "manifest.json").write_text(json.dumps(manifest))
    assert main(["summarize", str(run)]) == 2
    assert words in _err(capsys)


def test_two_folds_of_one_seed_read_as_two_runs(runs, tmp_path):
    """Folds of one panel seed are independent replications: the seed cell names the fold."""
    a, b = _copy(runs, tmp_path, "a", "b")
    for run, k in ((a, 0), (b, 2)):
        manifest = json.loads((run / "manifest.json").read_text())
        manifest["seed"], manifest["fold"] = 7, {"k": k, "folds": 3}
        (run / "manifest.json").write_text(json.dumps(manifest))
    rows = [l for l in render(summarize([a, b])).splitlines() if l.startswith("| theory-A")]
    assert [row.split(" | ")[1] for row in rows] == ["7 (fold 0 of 3)", "7 (fold 2 of 3)"]
    header = render(summarize([a])).splitlines()[0]
    assert "| seed (fold) |" in header


def test_a_set_tested_under_another_ablation_names_it(runs, tmp_path):
    """A mean or resample robustness test of a set must not read as its zero-ablation row."""
    a, b, c = (tmp_path / name for name in ("zero", "mean", "resample"))
    for run in (a, b, c):
        shutil.copytree(runs / "t", run)
    for run, model in (
        (b, {"ablation": "mean"}),
        (c, {"ablation": "resample", "resample_seed": 4}),
    ):
        manifest = json.loads((run / "manifest.json").read_text())
        manifest["model"].update(model)
        (run / "manifest.json").write_text(json.dumps(manifest))
    rows = [l for l in render(summarize([a, b, c])).splitlines() if l.startswith("| theory-A")]
    assert [row.split(" | ")[5] for row in rows] == [
        "L0H0",
        "L0H0 (mean ablation)",
        "L0H0 (resample ablation, donor seed 4)",
    ]


def test_a_percentile_with_a_tie_keeps_its_half(runs, tmp_path):
    """Ties count half, so a percentile can be 32.5: the table prints it as the report has it
    (rounding it to 32 would disagree with the docs that quote the report), and 40.0 as 40."""
    (a,) = _copy(runs, tmp_path, "a")

    def edit(report):
        report["primary"]["nulls"]["percentile"] = 40.0
        report["primary"]["matched_null"]["percentile"] = 32.5

    _edit_report(a, edit)
    (row,) = [l for l in render(summarize([a])).splitlines() if l.startswith("| theory-A")]
    assert "| 40 (of " in row and "| 32.5 (of " in row, row


# --------------------------------------------------------------------------- directories, cells


def test_a_directory_given_twice_counts_once(runs, tmp_path, capsys, monkeypatch):
    a, b = _copy(runs, tmp_path, "a", "b")
    (tmp_path / "link").symlink_to(a)
    monkeypatch.chdir(tmp_path)
    summary = summarize([a, "b", "./a", tmp_path / "link", "a/"])
    assert [r["dir"] for r in summary["rows"]] == [str(a), "b"]
    assert len(summary["repeated"]) == 3
    assert main(["summarize", "a", "b", "./a"]) == 0
    out, err = capsys.readouterr()
    assert "Holm: adjusted across the 2 primary tests" in out
    assert err == "cel-numpy summarize: note: a names a run directory already given: counted once\n"


def test_cells_escape_newlines_pipes_and_control_characters():
    assert cell("L1H0\n| x |\r\x1b[31m") == "L1H0 \\| x \\|  [31m"
    assert cell("plain") == "plain"


def test_a_set_name_with_a_newline_and_a_pipe_keeps_the_table(runs, tmp_path):
    (run,) = _copy(runs, tmp_path, "b")
    _edit_report(run, lambda r: r["primary"].update(name="L0H1\n| injected |"))
    table = render(summarize([run]))
    rows = [line for line in table.splitlines() if line.startswith("| theory-A")]
    assert len(rows) == 1 and "L0H1 \\| injected \\|" in rows[0]
    header = table.splitlines()[0]
    assert rows[0].replace("\\|", "").count("|") == header.count("|")


@pytest.mark.parametrize("target", ["report.json", "manifest.json", "new.json", "sub/x.json", "."])
def test_json_output_inside_a_run_directory_is_refused(runs, tmp_path, capsys, target):
    (run,) = _copy(runs, tmp_path, "a")
    before = (run / "report.json").read_bytes()
    assert main(["summarize", str(run), "--json", str(run / target)]) == 2
    assert "is inside the run directory" in _err(capsys)
    assert (run / "report.json").read_bytes() == before and not (run / "new.json").exists()
    assert main(["summarize", str(run), "--json", str(tmp_path / "s.json")]) == 0
    assert json.loads((tmp_path / "s.json").read_text())["rows"][0]["dir"] == str(run)


# --------------------------------------------------------------------------- --verify


def test_verify_recomputes_every_number_of_the_table(runs, capsys):
    dirs = [runs / n for n in ("a", "b", "t", "lm")]
    assert main(["summarize", "--verify", *map(str, dirs)]) == 0
    out = capsys.readouterr().out
    assert "verified: every number above recomputed from the records of the 4 runs" in out
    lm = summarize([runs / "lm"])["rows"][0]
    assert lm["heldout_logprob"]["mean"] > 0 and lm["matched_null"]["budget"] == 7


def test_verify_reads_the_gzip_copies_alone(runs, tmp_path, capsys):
    (run,) = _copy(runs, tmp_path, "lm")
    for plain in run.glob("*.jsonl"):
        plain.unlink()
    assert main(["summarize", "--verify", str(run)]) == 0


EDITS = [  # (id, edit of report.json that stays valid, the number --verify names)
    ("cross", lambda r: r["primary"]["crosstask"]["theory-B"].update(p_value=0.25),
     "cross-task theory-B p_value is 0.25"),
    ("p", lambda r: r["primary"]["heldout"].update(p_value=0.5), "held-out p_value is 0.5"),
    ("gain", lambda r: r["primary"]["heldout"].update(gain=r["primary"]["heldout"]["gain"] - 1),
     "held-out gain"),
    ("ci", lambda r: r["primary"]["heldout"].update(ci_low=-0.9), "held-out ci_low is -0.9"),
    ("primary", lambda r: r["primary"].update(name="L0H0"), "primary set is 'L0H0'"),
    ("discovery", lambda r: r["finalists"][0]["discovery"].update(gain=-40),
     "discovery gain is -40"),
    ("intact", lambda r: r["intact"]["heldout"].update(correct=1), "intact held-out correct is 1"),
    ("nulls", lambda r: r["primary"]["nulls"].update(percentile=1.0), "nulls percentile is 1.0"),
    ("matched", lambda r: r["primary"]["matched_null"].update(percentile=3.0),
     "matched_null percentile is 3.0"),
    ("logprob", lambda r: r["primary"]["heldout_logprob"].update(mean=-2.0),
     "held-out log p change mean is -2.0"),
]  # fmt: skip


@pytest.mark.parametrize("edit,words", [c[1:] for c in EDITS], ids=[c[0] for c in EDITS])
def test_verify_names_a_number_that_differs_from_the_records(runs, tmp_path, capsys, edit, words):
    (run,) = _copy(runs, tmp_path, "a" if "cross-task" in words else "lm")
    _edit_report(run, edit)
    assert main(["summarize", str(run)]) == 0  # a valid report: the plain table trusts it
    capsys.readouterr()
    assert main(["summarize", "--verify", str(run)]) == 2
    err = _err(capsys)
    assert f"error: {run}: {words}" in err and "from the records (summarize --verify)" in err


def test_verify_checks_holm_across_the_table(runs):
    from cel_numpy.errors import RunDirError
    from cel_numpy.localize.verify import verify

    summary = summarize([runs / "a", runs / "lm"])
    verify(copy.deepcopy(summary))
    summary["rows"][1]["p_holm"] = 0.0
    with pytest.raises(RunDirError, match="Holm p is 0.0 in the table"):
        verify(summary)


def test_verify_refuses_a_run_without_records(runs, tmp_path, capsys):
    (run,) = _copy(runs, tmp_path, "b")
    for stage in ("baseline", "screen", "joint", "confirm", "heldout", "crosstask"):
        for suffix in (".jsonl", ".jsonl.gz"):
            (run / f"{stage}{suffix}").unlink(missing_ok=True)
    assert main(["summarize", str(run)]) == 0  # the table alone still works
    capsys.readouterr()
    assert main(["summarize", "--verify", str(run)]) == 2
    want = (f"{run} keeps no per-item records of its baseline stage (baseline.jsonl or "
            "baseline.jsonl.gz), which --verify recomputes the table from")  # fmt: skip
    assert want in _err(capsys)


def test_verify_refuses_edited_records(runs, tmp_path, capsys):
    import gzip

    (run,) = _copy(runs, tmp_path, "lm")
    (run / "nulls.jsonl").unlink()
    gz = run / "nulls.jsonl.gz"
    data = gzip.decompress(gz.read_bytes())
    gz.write_bytes(gzip.compress(data.replace(b'"correct": false', b'"correct": true', 1)))
    assert main(["summarize", "--verify", str(run)]) == 2
    assert "nulls.jsonl.gz does not match nulls.done.json (sha256 differs" in _err(capsys)


def test_matched_null_options_are_checked_before_any_work(tmp_path, capsys):
    for flags in (["--matched-null", "-1"], ["--matched-pool", "0"], ["--matched-seed", "-2"]):
        assert main(["localize", "--model", "theory", "--task", "A", "--out",
                     str(tmp_path / "r"), *flags]) == 2  # fmt: skip
        assert "--matched-null and --matched-seed must be >= 0 and --matched-pool >= 1" in (
            _err(capsys)
        )
        assert not (tmp_path / "r").exists()


def _doc_rows() -> dict[str, str]:
    """bad input -> the quoted message, from docs/bad_input.md's summarize section."""
    from pathlib import Path

    doc = (Path(__file__).parent.parent / "docs" / "bad_input.md").read_text()
    section = doc.split("## Summaries, verification and the matched null", 1)[1]
    rows = {}
    for line in section.splitlines():
        if line.startswith("| ") and "`cel-numpy" in line:
            what, seen = line.split(" | ")[:2]
            rows[what.strip("| ")] = seen.split("`")[1]
    return rows


DOC_CASES = [  # (the row's first cell starts with, edit of report.json, extra arguments)
    ("a p-value out of range", lambda r: r["primary"]["heldout"].update(p_value=-5), []),
    ("report.json without `primary`", lambda r: r.pop("primary"), []),
    ("an unknown report format",
     lambda r: r.update(format="cel-numpy.localize.report/9"), []),
    ("`--json run/report.json`", None, ["--json", "run/report.json"]),
    ("`--verify` on a run directory without", "no-records", ["--verify"]),
]  # fmt: skip


@pytest.mark.parametrize("start,edit,extra", DOC_CASES, ids=[c[0][:24] for c in DOC_CASES])
def test_docs_rows_quote_what_the_commands_print(
    runs, tmp_path, capsys, monkeypatch, start, edit, extra
):
    """Each row of docs/bad_input.md's summarize section is the line the command prints."""
    rows = _doc_rows()
    (want,) = [msg for what, msg in rows.items() if what.startswith(start)]
    shutil.copytree(runs / "a", tmp_path / "run")
    monkeypatch.chdir(tmp_path)
    if edit == "no-records":
        for f in list((tmp_path / "run").glob("*.jsonl")) + list((tmp_path / "run").glob("*.gz")):
            f.unlink()
    elif edit is not None:
        _edit_report(tmp_path / "run", edit)
    assert main(["summarize", "run", *extra]) == 2
    assert _err(capsys) == want


def test_verify_accepts_a_report_written_before_the_new_fields(runs, tmp_path, capsys):
    """A report without the continuous metric (as cel-numpy wrote them before it existed) shows
    "-" in those cells, and --verify checks every number it does show."""
    (run,) = _copy(runs, tmp_path, "lm")

    def strip(r):
        r["primary"].pop("heldout_logprob")
        r["primary"]["nulls"].pop("logprob")

    _edit_report(run, strip)
    assert main(["summarize", "--verify", str(run)]) == 0
    row = capsys.readouterr().out.splitlines()[2]
    assert " | - | " in row
