"""`cel-numpy test-heads`: the held-out test of a given head set, with the routine's statistics."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import copy_fixture, with_tokenizer

from cel_numpy.cli import main
from cel_numpy.errors import InvalidHeadError
from cel_numpy.localize.evaluate import TheoryEvaluator, TheoryTask
from cel_numpy.localize.routine import localize, test_heads
from cel_numpy.tasks import Item
from tests.test_localize import FakeEvaluator, FakeTask, trained_theory  # noqa: F401


def test_same_statistics_as_the_routines_heldout_stage(tmp_path, trained_theory):  # noqa: F811
    """On the theory model: testing the routine's rank-1 set with the routine's seed and panel
    sizes reproduces its held-out result exactly (same panel, same code, same numbers)."""
    params, world = trained_theory
    task = TheoryTask("A", world)
    make = lambda t, ref: TheoryEvaluator(params, t)
    res = localize(tmp_path / "run", make, task, n_discovery=80, n_heldout=150, seed=4,
                   progress=False, command="test")  # fmt: skip
    routine = res["heldout"]["heldout"]["finalists"][0]
    tested = test_heads(tmp_path / "test", make, task, routine["name"], n_heldout=150,
                        n_discovery=80, seed=4, progress=False, command="test")  # fmt: skip
    assert tested["heldout"]["heldout"]["finalists"][0] == routine
    held = (tmp_path / "run" / "panels" / "heldout.jsonl").read_text()
    assert (tmp_path / "test" / "panels" / "heldout.jsonl").read_text() == held


def test_cli_on_the_theory_model_finds_the_c_head(tmp_path, trained_theory, capsys):  # noqa: F811
    from cel_numpy.theory import loadings, sample_batch
    from cel_numpy.theory.data import TASK_A

    params, world = trained_theory
    c_load, _ = loadings(params, sample_batch(np.random.default_rng(1), world, 4096, task=TASK_A))
    c_head = int(np.argmax(np.abs(c_load)))
    np.savez(tmp_path / "params.npz", K=params["K"], V=params["V"])
    argv = ["test-heads", "--model", f"theory:{tmp_path / 'params.npz'}", "--task", "A",
            "--heads", f"L0H{c_head}", "--heldout", "300", "--seed", "9", "--null-sets", "3",
            "--out", str(tmp_path / "run"), "--quiet"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"L0H{c_head} on 300 held-out theory-A items (300 clusters)" in out
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    ho = report["primary"]["heldout"]
    assert report["kind"] == "test-heads" and ho["gain"] > 0 and ho["p_value"] < 1e-3
    assert ho["p_value"] == pytest.approx(ho["item_p_value"])  # one item per cluster
    assert report["primary"]["nulls"]["n"] == 3 and (tmp_path / "run" / "nulls.png").exists()
    assert "Removing **L0H" in (tmp_path / "run" / "report.md").read_text()
    # resumable: the same command validates what is on disk and prints the same result
    assert main(argv) == 0
    assert capsys.readouterr().out == out


def test_planted_head_and_examples(tmp_path):
    ev = FakeEvaluator(n_layers=3, n_heads=4, planted={(1, 2): 6.0})
    res = test_heads(tmp_path / "run", lambda t, ref: ev, FakeTask(), "L1H2", n_heldout=60,
                     n_discovery=20, seed=0, progress=False, command="test")  # fmt: skip
    ho = res["heldout"]["heldout"]["finalists"][0]
    assert ho["name"] == "L1H2" and ho["damaged"] == 0 and ho["correct"] == 60
    examples = res["report"]["examples"]
    assert examples["rescued"] and not examples["damaged"]
    assert all(e["intact"] == "wrong" and e["ablated"] == e["answer"] for e in examples["rescued"])
    assert not (tmp_path / "run" / "screen.jsonl").exists()  # no search, only the test


def test_stages_and_bad_heads(tmp_path, capsys):
    ev = FakeEvaluator(n_layers=3, n_heads=4)
    make = lambda t, ref: ev
    kw = dict(n_heldout=30, n_discovery=10, seed=0, progress=False, command="test")
    res = test_heads(tmp_path / "a", make, FakeTask(), [(0, 1), (2, 3)], until="heldout", **kw)
    assert set(res) == {"heldout"} and not (tmp_path / "a" / "report.json").exists()
    with pytest.raises(InvalidHeadError, match="--heads: head L3H0 is not in the model"):
        test_heads(tmp_path / "b", make, FakeTask(), "L3H0", **kw)
    assert not (tmp_path / "b" / "manifest.json").exists()  # refused before anything is written
    base = ["test-heads", "--model", "theory", "--task", "A", "--out", str(tmp_path / "c")]
    for extra, message in [
        (["--heads", "3.0"], "--heads: '3.0' is not a head name: write L3H0"),
        (["--heads", "L0H1", "--stage", "screen"], "--stage must be one of heldout, nulls, report"),
        (["--heads", "intact"], "--heads: name at least one head"),
    ]:
        assert main(base + extra) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "c").exists()  # refused before any work


def test_a_head_the_model_lacks_is_refused_before_workers_start(tmp_path, capsys):
    """Checked against the model's configuration, before any weight is read or a worker is
    planned: the one line on stderr is the error, with no worker note before it."""
    model = with_tokenizer(copy_fixture(tmp_path, "tiny_llama"))  # 2 layers x 4 heads
    argv = ["test-heads", "--model", str(model), "--task", "agreement", "--heads", "L0H99",
            "--discovery", "4", "--heldout", "4", "--workers", "2",
            "--out", str(tmp_path / "r")]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--heads: head L0H99 is not in the model" in err, err
    assert not (tmp_path / "r").exists()


# --------------------------------------------------------------------------- summarize


def test_summarize_table_holm_and_recurrence(tmp_path, trained_theory, capsys):  # noqa: F811
    from cel_numpy.localize.stats import holm
    from cel_numpy.localize.summary import summarize

    params, world = trained_theory
    task = TheoryTask("A", world)
    make = lambda t, ref: TheoryEvaluator(params, t)
    dirs = []
    for seed in (1, 2):
        dirs.append(tmp_path / f"seed{seed}")
        localize(dirs[-1], make, task, n_discovery=60, n_heldout=80, seed=seed, null_sets=3,
                 progress=False, command="test")  # fmt: skip
    dirs.append(tmp_path / "tested")
    test_heads(dirs[-1], make, task, "L0H0", n_heldout=80, seed=5, progress=False, command="t")
    summary = summarize(dirs)
    rows = summary["rows"]
    assert [r["kind"] for r in rows] == ["localize", "localize", "test-heads"]
    assert [r["p_holm"] for r in rows] == holm([r["heldout"]["p_value"] for r in rows])
    rec = summary["recurrence"]["theory-A"]
    # the two searches (fresh theory samples share no cluster); the test-heads run's set was
    # given to it
    assert rec["runs"] == 2 and rec["not_independent"] == 0
    expected = {}
    for r in rows[:2]:
        for h in r["primary"].split("+"):
            expected[h] = expected.get(h, 0) + 1
    assert rec["primary"] == expected
    assert main(["summarize", *map(str, dirs), "--json", str(tmp_path / "s.json")]) == 0
    out = capsys.readouterr().out
    assert out.count("| theory-A |") == 3 and "Holm: adjusted across the 3 primary tests" in out
    assert json.loads((tmp_path / "s.json").read_text())["rows"][0]["nulls"]["n"] == 3


def test_head_recurrence_keeps_models_apart():
    """A head of one model is not the head of another with the same coordinates."""
    from cel_numpy.localize.summary import head_recurrence

    row = lambda model, primary, finalists: {
        "model": model, "task": "antonyms", "primary": primary, "finalists": finalists,
        "clusters": [primary],
    }  # fmt: skip
    rows = [
        row("smollm2", "L8H1+L13H2", ["L8H1+L13H2", "L13H2+L14H3"]),
        row("smollm2", "L13H2+L14H3", ["L13H2+L14H3"]),
        row("qwen", "L8H1+L10H3", ["L8H1+L10H3"]),
    ]
    rec = head_recurrence(rows)
    assert set(rec) == {"smollm2 antonyms", "qwen antonyms"}
    assert rec["smollm2 antonyms"] == {
        "runs": 2,
        "not_independent": 0,
        "primary": {"L13H2": 2, "L8H1": 1, "L14H3": 1},
        "finalists": {"L13H2": 2, "L14H3": 2, "L8H1": 1},
    }
    assert rec["qwen antonyms"]["primary"] == {"L8H1": 1, "L10H3": 1}
    assert set(head_recurrence(rows[:2])) == {"antonyms"}  # one model: keyed by task alone
    # a test-heads run tests a given set: it is not a search's finding and is not counted
    given = {**row("smollm2", "L8H1+L13H2", []), "kind": "test-heads"}
    assert head_recurrence(rows[:2] + [given]) == head_recurrence(rows[:2])


def test_summarize_refuses_old_and_unfinished_runs(tmp_path, capsys):
    from pathlib import Path

    old = (
        Path(__file__).parent.parent
        / "docs"
        / "results"
        / "archive"
        / "round1-old-format"
        / "capitals"
    )
    assert main(["summarize", str(old)]) == 2
    assert "old format" in capsys.readouterr().err
    ev = FakeEvaluator(n_layers=2, n_heads=3)
    test_heads(tmp_path / "half", lambda t, r: ev, FakeTask(), "L0H1", n_heldout=20,
               n_discovery=10, until="heldout", progress=False, command="t")  # fmt: skip
    assert main(["summarize", str(tmp_path / "half")]) == 2
    assert "no report.json: finish the run first" in capsys.readouterr().err


class YesNoTask(FakeTask):
    """A choice task with one fixed label set, like BoolQ: two thirds of the items are "yes"."""

    scoring = "choice"

    def sample(self, rng, n):
        return [
            Item(self.name, "s", f"q{int(k)}", (" no", " yes", " yes")[k % 3], (" no", " yes"))
            for k in rng.integers(0, 10**6, n)
        ]


class LabelEvaluator(FakeEvaluator):
    """FakeEvaluator's verdicts, with a wrong answer written as the other label."""

    def evaluate_one(self, items, cond):
        flip = {" no": " yes", " yes": " no"}
        return [
            r if r.correct else type(r)(r.item_id, False, flip[it.answer], r.ref_logprob)
            for it, r in zip(items, super().evaluate_one(items, cond))
        ]


def test_a_fixed_label_set_reports_its_balance(tmp_path):
    """report.json and report.md give, per label, the items, the right answers of each model and
    the picks; the per-label counts add up to the held-out test's own counts."""
    ev = LabelEvaluator(n_layers=3, n_heads=4, planted={(1, 2): 1.0})
    res = test_heads(tmp_path / "run", lambda t, ref: ev, YesNoTask(), "L1H2", n_heldout=90,
                     n_discovery=20, seed=0, progress=False, command="test")  # fmt: skip
    ho = res["heldout"]["heldout"]["finalists"][0]
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    balance = report["primary"]["answer_balance"]
    assert [row["label"] for row in balance] == [" no", " yes"]
    assert sum(row["items"] for row in balance) == ho["n"] == 90
    assert sum(row["ablated_correct"] for row in balance) == ho["correct"]
    assert sum(row["intact_correct"] for row in balance) == report["intact"]["heldout"]["correct"]
    assert (
        sum(row["intact_picked"] for row in balance)
        == sum(r["ablated_picked"] for r in balance)
        == 90
    )
    assert ho["gain"] > 0
    assert (
        "By reference label (every item offers the same choices)"
        in (tmp_path / "run" / "report.md").read_text()
    )


def test_a_search_on_a_fixed_label_set_reports_its_balance(tmp_path):
    """The same per-label counts in a localize report, against its own held-out statistics."""
    ev = LabelEvaluator(n_layers=3, n_heads=4, planted={(1, 2): 1.0})
    res = localize(tmp_path / "run", lambda t, ref: ev, YesNoTask(), n_discovery=30,
                   n_heldout=90, seed=0, cross_tasks=[], progress=False,
                   command="test")  # fmt: skip
    primary = res["report"]["primary"]
    balance, ho = primary["answer_balance"], primary["heldout"]
    assert [row["label"] for row in balance] == [" no", " yes"]
    assert sum(row["items"] for row in balance) == ho["n"] == 90
    assert sum(row["ablated_correct"] for row in balance) == ho["correct"]
    assert sum(r["ablated_correct"] - r["intact_correct"] for r in balance) == ho["gain"]
    assert "By reference label" in (tmp_path / "run" / "report.md").read_text()
