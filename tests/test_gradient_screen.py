"""The signed first-order head screen (cel_numpy.localize.gradient) and `--screen gradient`.

References: central differences of the task metric in the head mask (float64), the planted
harmful/helpful heads of tests/test_localize.py (known signs), and the routine's own exact screen.
"""

import json

import numpy as np
import pytest
from helpers import PlantedTask, localize_cli, planted_model

from cel_numpy.errors import OptionError
from cel_numpy.localize import localize
from cel_numpy.localize.evaluate import LMEvaluator
from cel_numpy.localize.gradient import (
    _chunk_metric,
    exact_metric_screen,
    gradient_screen,
    metric_rows,
)
from cel_numpy.localize.rundir import RunDirError


def _setup(scoring, seed=0, **shape):
    model = planted_model(np.random.default_rng(seed), **shape)
    task = PlantedTask(scoring)
    items = task.sample(np.random.default_rng(seed + 10), 9)
    return model, task, items, LMEvaluator(model, task, batch_size=4)


@pytest.mark.parametrize("scoring", ["generate", "choice"])
def test_metric_gradient_matches_finite_differences(scoring):
    model, task, items, ev = _setup(scoring)
    rows = metric_rows(ev, items)
    c = model.config
    _, dM_dm = _chunk_metric(model, rows, scoring, None, None, backward=True)
    eps = 1e-6
    for layer in range(c.n_layers):
        for head in range(c.n_heads):
            mask = np.ones((c.n_layers, c.n_heads))
            mask[layer, head] = 1 + eps
            up = _chunk_metric(model, rows, scoring, mask, None, backward=False)[0]
            mask[layer, head] = 1 - eps
            down = _chunk_metric(model, rows, scoring, mask, None, backward=False)[0]
            numeric = (up - down) / (2 * eps)
            assert abs(numeric - dM_dm[layer, head]) < 1e-6 * max(1.0, abs(numeric)), (
                layer,
                head,
                numeric,
                dM_dm[layer, head],
            )


@pytest.mark.parametrize("scoring", ["generate", "choice"])
def test_estimates_have_the_planted_signs(scoring):
    """Removing the head that pushes the wrong answer helps most; removing the helpful one hurts."""
    _, _, items, ev = _setup(scoring)
    metric, estimate = gradient_screen(ev, items)
    metric_exact, exact = exact_metric_screen(ev, items)
    assert metric == pytest.approx(metric_exact, abs=1e-9)
    assert np.unravel_index(np.argmax(estimate), estimate.shape) == (1, 1)
    assert np.unravel_index(np.argmax(exact), exact.shape) == (1, 1)
    assert estimate[0, 0] < 0 and exact[0, 0] < 0
    assert np.all(np.sign(estimate[[0, 1], [0, 1]]) == np.sign(exact[[0, 1], [0, 1]]))


def test_batching_does_not_change_the_screen():
    _, _, items, ev = _setup("choice")
    m1, e1 = gradient_screen(ev, items, batch_size=3)
    m2, e2 = gradient_screen(ev, items, batch_size=64)
    assert m1 == pytest.approx(m2, abs=1e-12)
    np.testing.assert_allclose(e1, e2, atol=1e-12)


def _run_gradient(tmp_path, n_candidates=5):
    model = planted_model(np.random.default_rng(0), good=(0, 0), bad=(2, 3), n_layers=3, n_heads=4)
    task = PlantedTask("choice")

    def make(t, reference_items):
        return LMEvaluator(model, t, batch_size=7, spec="planted")

    return localize(
        tmp_path / "run",
        make,
        task,
        n_discovery=20,
        n_heldout=20,
        seed=0,
        progress=False,
        command="test",
        screen="gradient",
        n_candidates=n_candidates,
        n_nominees=3,
        n_finalists=3,
    )


def test_gradient_prefilter_screens_the_top_candidates_and_finds_the_planted_head(tmp_path):
    res = _run_gradient(tmp_path)
    saved = json.loads((tmp_path / "run" / "gradient.json").read_text())
    estimate = np.array(saved["estimate"])  # (L, H)
    top5 = {divmod(int(i), 4) for i in np.argsort(-estimate.ravel(), kind="stable")[:5]}
    screened = {tuple(c["heads"][0]) for c in res["screen"]["conditions"]}
    assert screened == top5 and len(screened) == 5
    assert "gradient pre-filter" in res["screen"]["note"] and res["screen"]["n_heads_total"] == 12
    assert res["joint"]["ranking"][0] == "L2H3"
    ho = res["heldout"]["heldout"]["finalists"][0]
    assert ho["name"] == "L2H3" and ho["rescued"] == 20 and ho["damaged"] == 0
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["screen"] == {"method": "gradient", "n_candidates": 5}
    # `--plan`'s counts for this run: 5 heads screened, not 12 (evaluation_plan)
    from cel_numpy.localize.routine import evaluation_plan

    planned = {st: c * i for st, c, i in evaluation_plan(12, 20, 20, screen="gradient",
                                                         n_candidates=5, n_nominees=3,
                                                         n_finalists=3)}  # fmt: skip
    written = {st: json.loads((tmp_path / "run" / f"{st}.done.json").read_text())["n_records"]
               for st in planned}  # fmt: skip
    assert planned == written and planned["screen"] == 5 * 20


def test_gradient_run_resumes_and_refuses_a_changed_estimate_file(tmp_path):
    first = _run_gradient(tmp_path)
    assert _run_gradient(tmp_path)["report"] == first["report"]  # validated, not recomputed
    with pytest.raises(
        RunDirError, match="different run"
    ):  # a different --candidates is a different run
        _run_gradient(tmp_path, n_candidates=6)
    path = tmp_path / "run" / "gradient.json"
    saved = json.loads(path.read_text())
    saved["estimate"][0][0] += 1.0
    path.write_text(json.dumps(saved))
    with pytest.raises(RunDirError, match="computed from different earlier stages"):
        _run_gradient(tmp_path)


def test_cli_refuses_gradient_screen_for_the_theory_model(tmp_path):
    with pytest.raises(OptionError, match="needs a language model"):
        localize_cli(
            [
                "localize",
                "--model",
                "theory",
                "--task",
                "A",
                "--out",
                str(tmp_path / "r"),
                "--screen",
                "gradient",
            ]
        )
    with pytest.raises(OptionError, match="--candidates must be >= 10"):
        localize_cli(
            [
                "localize",
                "--model",
                "theory",
                "--task",
                "A",
                "--out",
                str(tmp_path / "r"),
                "--candidates",
                "3",
            ]
        )


@pytest.mark.parametrize("scoring", ["generate", "choice"])
def test_exact_screen_equals_plain_forwards(scoring):
    """The shared-prefix exact screen equals M recomputed with the plain forward, head by head."""
    from cel_numpy.localize.gradient import panel_metric

    model, _, items, ev = _setup(scoring, n_layers=3, n_heads=4)
    intact, change = exact_metric_screen(ev, items, batch_size=5)
    assert intact == pytest.approx(panel_metric(ev, items), abs=1e-10)
    for layer, head in [(0, 0), (1, 2), (2, 3)]:
        plain = panel_metric(ev, items, ablate=[(layer, head)]) - panel_metric(ev, items)
        assert change[layer, head] == pytest.approx(plain, abs=1e-10)


def test_a_long_screen_says_so_after_its_first_block(monkeypatch):
    """The estimate from the first block, and the hint, only when the estimate is long."""
    import io

    from cel_numpy.localize import progress
    from cel_numpy.localize.routine import SLOW_HINTS

    clock = iter([0.0, 10.0, 10.0, 20.0, 20.0, 30.0])
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    out = io.StringIO()
    bar = progress.Progress("screen", 270, stream=out, slow_hint=SLOW_HINTS["screen-exact"])
    bar.update(8)  # 8 of 270 in 10 s: about 5.6 minutes in all
    first = out.getvalue().splitlines()[0]
    assert first.startswith("screen     about 05:38 in all") and "--screen gradient" in first
    assert "--workers" in first
    bar.update(8)
    assert sum("--screen gradient" in line for line in out.getvalue().splitlines()) == 1
    quick = io.StringIO()
    clock = iter([0.0, 1.0, 1.0])
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    progress.Progress("screen", 100, stream=quick, slow_hint="hint").update(10)  # ~10 s in all
    assert "hint" not in quick.getvalue()
    plain = io.StringIO()  # a long stage without a hint (joint, nulls...) still says how long
    clock = iter([0.0, 60.0, 60.0])
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    progress.Progress("joint", 165, stream=plain, plan="2 workers", parallel=2).update(8)
    assert plain.getvalue().splitlines()[0] == (
        "joint      about 10:19 in all with 2 workers at the pace of its first 8 of 165 (01:00)"
    )


def test_eta_after_the_first_of_parallel_pieces_counts_the_pieces_beside_it(monkeypatch):
    """Two workers start two chunks of 800 at once; the first ends after 11:54, the second a
    moment later. The first line's ETA must not be the serial pace's 19:20 (a log of the Qwen
    BoolQ joint stage said so, and 03:43 on the next line): 714 s / (800/2100) / 2 workers =
    15:37 in all, so 03:43 left, as the line after the second chunk says too."""
    import io

    from cel_numpy.localize import progress

    clock = iter([0.0, 714.0, 714.0, 714.0])
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    out = io.StringIO()
    bar = progress.Progress("joint", 2100, stream=out, parallel=2, unit="evaluations")
    bar.update(800)
    bar.update(800)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("joint      about 15:37 in all")
    assert lines[1].endswith("800/2100 evaluations  38.1%  11:54 elapsed, ETA 03:43")
    assert lines[2].endswith("1600/2100 evaluations  76.2%  11:54 elapsed, ETA 03:43")
    clock = iter([0.0, 620.0, 620.0])  # a first piece of 800 beside one of 300 (a confirm log)
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    uneven = io.StringIO()
    progress.Progress("confirm", 1100, stream=uneven, parallel=2, unit="evaluations").update(800)
    lines = uneven.getvalue().splitlines()  # not "about 07:06 in all", less than its own 10:20
    assert lines[0].startswith("confirm    about 10:20 in all")
    assert lines[1].endswith("10:20 elapsed, ETA 00:00")
    clock = iter([0.0, 714.0, 714.0, 714.0])  # one worker: the serial pace is the estimate
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    serial = progress.Progress("joint", 2100, stream=io.StringIO(), parallel=1)
    serial.update(800)
    assert serial.line().endswith("ETA 19:20")


def test_stage_estimate_weighs_pieces_by_their_text(monkeypatch):
    """A first piece of short items must not predict a short stage: 50 of 500 evaluations that
    hold 4% of the text (as a HellaSwag held-out panel's first slice nearly does) in 60 s, 2
    workers -> 60 / 0.04 / 2 = 750 s; counted alone they would say 60 x 10 / 2 = 300 s. The ETA
    on the progress line follows the same share."""
    import io

    from cel_numpy.localize import progress
    from cel_numpy.localize.routine import item_text_length
    from cel_numpy.tasks.base import Item

    clock = iter([0.0, 60.0, 60.0, 120.0, 120.0])
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    out = io.StringIO()
    bar = progress.Progress("nulls", 500, stream=out, parallel=2, total_work=1000.0)
    bar.update(50, work=40.0)
    assert out.getvalue().splitlines()[0] == (
        "nulls      about 12:30 in all at the pace of its first 50 of 500 (01:00, 4.0% of the "
        "stage's text)"
    )
    bar.update(50, work=60.0)  # 10% of the text after 120 s: 18 min left
    assert bar.line().endswith("02:00 elapsed, ETA 18:00")
    silent = io.StringIO()  # a first piece of no text predicts nothing
    clock = iter([0.0, 60.0, 60.0])
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    progress.Progress("nulls", 500, stream=silent, total_work=10.0).update(50, work=0.0)
    assert "in all" not in silent.getvalue()
    with pytest.raises(ValueError, match="give `work`"):
        progress.Progress("nulls", 500, stream=silent, total_work=10.0).update(50)
    choice = Item("t", "", "The cat", " sat", (" sat", " ran away"))
    generate = Item("t", "", "2 + 2 =", " 4")
    assert item_text_length(choice) == 7 + 4 + 9 and item_text_length(generate) == 7 + 2


# --------------------------------------------------------------------------- agreement


def test_screen_agreement_against_scipy_and_by_hand():
    """Spearman from scipy on the same vectors; overlaps and top-N counts by hand."""
    from scipy.stats import spearmanr

    from cel_numpy.localize.agreement import screen_agreement

    rng = np.random.default_rng(2)
    estimate = rng.normal(size=(3, 5))  # (L, H)
    heads = [(l, h) for l in range(3) for h in range(5)]
    lp = {hd: float(estimate[hd] + rng.normal(scale=0.5)) for hd in heads}
    gain = {hd: int(round(2 * lp[hd])) for hd in heads}
    conds = [{"heads": [list(hd)], "gain": gain[hd], "logprob_change": lp[hd]} for hd in heads]
    nominated = sorted(heads, key=lambda hd: (-gain[hd], hd))[:4]
    a = screen_agreement(estimate, conds, nominated, k=4)
    est = [estimate[hd] for hd in heads]
    assert a["spearman_logprob"] == pytest.approx(spearmanr(est, [lp[h] for h in heads])[0])
    assert a["spearman_gain"] == pytest.approx(spearmanr(est, [gain[h] for h in heads])[0])
    grad_top = set(sorted(heads, key=lambda hd: -estimate[hd])[:4])
    assert a["overlap_nominees"] == len(grad_top & set(nominated))
    assert a["overlap_logprob"] == len(grad_top & set(sorted(heads, key=lambda h: -lp[h])[:4]))
    assert a["nominees_in_top"] == {"10": len(set(sorted(heads, key=lambda h: -estimate[h])[:10])
                                               & set(nominated))}  # fmt: skip
    assert a["complete"] and a["n_heads"] == 15
    flat = [dict(c, gain=0) for c in conds]  # every gain 0: no rank correlation to speak of
    assert screen_agreement(estimate, flat, nominated)["spearman_gain"] is None


def test_exact_run_with_gradient_agreement_reports_it(tmp_path):
    """--gradient-agreement on an exact screen: every head screened exactly, the estimate
    beside it; the planted harmful head tops both."""
    model = planted_model(np.random.default_rng(0), good=(0, 0), bad=(2, 3), n_layers=3, n_heads=4)

    def make(t, reference_items):
        return LMEvaluator(model, t, batch_size=7, spec="planted")

    localize(tmp_path / "run", make, PlantedTask("choice"), n_discovery=20, n_heldout=20, seed=0,
             progress=False, command="t", n_nominees=3, n_finalists=3,
             gradient_agreement=True)  # fmt: skip
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    a = report["screen_agreement"]
    assert a["complete"] and a["n_heads"] == 12 and a["spearman_logprob"] > 0.5
    assert a["nominees_in_top"]["10"] >= 1
    assert (
        "Screen agreement: gradient pre-filter vs exact screen over all 12 heads"
        in (tmp_path / "run" / "report.md").read_text()
    )
    # the script over two directories: this exact run and a --screen gradient run on the same
    # model and panel (its estimates are the same numbers)
    import subprocess
    import sys
    from pathlib import Path

    _run_gradient(tmp_path / "g")
    script = Path(__file__).parent.parent / "scripts" / "screen_agreement.py"
    cmd = [sys.executable, str(script), str(tmp_path / "run"), str(tmp_path / "g" / "run")]
    done = subprocess.run(cmd + ["--json", str(tmp_path / "a.json")], capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "a.json").read_text()) == a
    done = subprocess.run([*cmd[:2], str(tmp_path / "g" / "run"), str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2 and "did not screen every head exactly" in done.stderr


def test_cli_refuses_gradient_agreement_for_the_theory_model(tmp_path):
    with pytest.raises(OptionError, match="--gradient-agreement needs a language model"):
        localize_cli(["localize", "--model", "theory", "--task", "A", "--gradient-agreement",
                      "--out", str(tmp_path / "r")])  # fmt: skip
    assert not (tmp_path / "r").exists()


def test_a_silent_stage_says_it_is_still_working():
    """Inside `with`, a stage that prints nothing for `heartbeat` seconds (one long chunk) gets
    a line saying it is still working; a stage whose updates come faster gets none, and none is
    written after the stage ends or when progress is off."""
    import io
    import time

    from cel_numpy.localize import progress

    out = io.StringIO()
    with progress.Progress("heldout", 2, stream=out, heartbeat=0.2):
        time.sleep(0.7)  # one chunk of both conditions, still running
    beats = out.getvalue().splitlines()
    assert len(beats) >= 2
    assert beats[0].startswith("heldout    still working: 0 of 2 finished after 00:00")
    after = len(out.getvalue())
    time.sleep(0.3)
    assert len(out.getvalue()) == after  # the thread stopped with the stage

    busy = io.StringIO()  # a line every decile, faster than the heartbeat: no extra lines
    with progress.Progress("screen", 20, stream=busy, heartbeat=0.5) as bar:
        for _ in range(20):
            time.sleep(0.05)
            bar.update(1)
    assert "still working" not in busy.getvalue()

    off = io.StringIO()
    with progress.Progress("heldout", 2, stream=off, enabled=False, heartbeat=0.1):
        time.sleep(0.3)
    assert off.getvalue() == ""
