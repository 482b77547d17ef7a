"""The selection-matched null, the continuous metric and the compressed records of a run.

On the planted tiny GPT-2 (tests/helpers.py: 3 layers x 4 heads, one harmful head) with three
nominees, so the search's budget is 3 + 3 + 1 = 7 candidates and the pool (every single head,
12) is larger than the budget: the replicates' picks differ.
"""

from __future__ import annotations

import gzip
import itertools
import json
import math

import numpy as np
import pytest
from helpers import PlantedTask, planted_model

from cel_numpy.errors import RunDirError, UserError
from cel_numpy.localize.evaluate import LMEvaluator
from cel_numpy.localize.ranking import best_of_subsamples, expected_distinct_picks
from cel_numpy.localize.routine import localize
from cel_numpy.localize.stats import cluster_bootstrap_interval, clustered_mean, clustered_summary


def _run(out, **kw):
    model = planted_model(np.random.default_rng(0), good=(0, 0), bad=(2, 3), n_layers=3, n_heads=4)
    task = PlantedTask("choice")

    def make(t, reference_items):
        return LMEvaluator(model, t, batch_size=7, spec="planted")

    args = dict(n_discovery=12, n_heldout=16, seed=0, progress=False, command="test",
                n_nominees=3, n_finalists=3)  # fmt: skip
    args.update(kw)
    return localize(out, make, task, **args)


@pytest.fixture(scope="module")
def matched_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("matched") / "run"
    return out, _run(out, null_sets=4, matched_null=300, matched_pool=12)


# --------------------------------------------------------------------------- picks


def test_best_of_subsamples_picks_rank_j_with_the_enumerated_probability():
    """Pool of 8, budget 3: P(the j-th ranked set is a replicate's pick) counted over all
    C(8, 3) subsets, against 40 000 replicates (within 5 standard errors)."""
    P, B, R = 8, 3, 40_000
    subsets = list(itertools.combinations(range(P), B))
    exact = [sum(min(s) == j for s in subsets) / len(subsets) for j in range(P)]
    ranked = [5, 2, 7, 0, 1, 6, 3, 4]  # pool index i sits at ranking position ranked[i]
    picks = best_of_subsamples(ranked, P, B, R, seed=11)
    freq = np.bincount([ranked[i] for i in picks], minlength=P) / R
    se = np.sqrt(np.array(exact) * (1 - np.array(exact)) / R)
    assert np.all(np.abs(freq - exact) <= 5 * se + 1e-12), (freq, exact)
    assert best_of_subsamples(ranked, P, B, 50, seed=3) == best_of_subsamples(ranked, P, B, 50, 3)
    # the expected number of distinct picks, from the enumerated probabilities
    for reps in (1, 5, 200):
        want = sum(1 - (1 - p) ** reps for p in exact)
        assert expected_distinct_picks(P, B, reps) == pytest.approx(want, rel=1e-12)


def test_expected_distinct_picks_edge_cases():
    assert expected_distinct_picks(10, 10, 7) == pytest.approx(1.0)  # budget = pool: the best
    assert expected_distinct_picks(5, 1, 10**6) == pytest.approx(5.0)  # budget 1: any set
    assert expected_distinct_picks(700, 175, 1) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="budget"):
        best_of_subsamples([0, 1], 2, 3, 1, seed=0)


# --------------------------------------------------------------------------- continuous metric


def test_clustered_mean_of_item_gains_is_the_gain_rate_and_its_interval():
    """Fed the per-item gains (ablated - intact in {-1, 0, 1}), the continuous-metric code gives
    exactly the accuracy gain rate and its cluster bootstrap interval."""
    rng = np.random.default_rng(5)
    clusters = [f"c{k}" for k in rng.integers(0, 9, 60)]
    intact, ablated = rng.random(60) < 0.5, rng.random(60) < 0.6
    gains = ablated.astype(int) - intact.astype(int)
    m = clustered_mean(clusters, gains, seed=4)
    s = clustered_summary(clusters, intact, ablated, seed=4)
    assert m.mean == pytest.approx(s.gain_rate, abs=1e-15)
    assert (m.ci_low, m.ci_high) == (s.ci_low, s.ci_high)
    assert m.n_clusters == s.n_clusters == len(set(clusters))


def test_clustered_mean_interval_resamples_clusters_not_items():
    """Two clusters of 50 identical values (0 and 1): resampling clusters gives means 0, 0.5
    or 1 only, so the 95% interval is [0, 1]; an item bootstrap would give about 0.5 +- 0.1."""
    values = [0.0] * 50 + [1.0] * 50
    m = clustered_mean(["a"] * 50 + ["b"] * 50, values, seed=0)
    assert m.mean == 0.5 and (m.ci_low, m.ci_high) == (0.0, 1.0)
    lo, hi = cluster_bootstrap_interval([0.0, 50.0], [50, 50], seed=0)
    assert (lo, hi) == (m.ci_low, m.ci_high)


def test_report_gives_the_mean_logprob_change_from_the_records(matched_run):
    out, res = matched_run
    report = json.loads((out / "report.json").read_text())
    lines = [json.loads(x) for x in (out / "heldout.jsonl").read_text().splitlines()]
    intact = [r["ref_logprob"] for r in lines if r["block"] == "intact"]
    primary = report["primary"]
    removed = [r["ref_logprob"] for r in lines if r["block"] == primary["name"]]
    want = sum(b - a for a, b in zip(intact, removed)) / len(intact)
    lp = primary["heldout_logprob"]
    assert lp["mean"] == pytest.approx(want, rel=1e-12) and lp["mean"] > 0
    assert lp["ci_low"] <= lp["mean"] <= lp["ci_high"] and lp["n"] == 16
    assert report["finalists"][0]["heldout_logprob"] == lp
    md = (out / "report.md").read_text()
    assert "Mean change of the reference answer's log-probability" in md
    assert f"{lp['mean']:+.3f} [{lp['ci_low']:+.3f}, {lp['ci_high']:+.3f}]" in md


def test_evaluation_plan_counts_what_the_run_evaluated(matched_run):
    """`--plan`'s counts against the records each stage of a finished run wrote (the matched
    null's held-out picks are random: its count is an expectation, checked against the
    enumerated probabilities in test_expected_distinct_picks_*)."""
    from cel_numpy.localize.routine import evaluation_plan

    out, res = matched_run
    rows = evaluation_plan(12, 12, 16, n_nominees=3, n_finalists=3, null_sets=4,
                           matched_null=300, matched_pool=12,
                           set_size=res["matched-pool"]["size"])  # fmt: skip
    written = {
        path.name.split(".")[0]: json.loads(path.read_text())["n_records"]
        for path in out.glob("*.done.json")
    }
    planned = {stage: conditions * items for stage, conditions, items in rows}
    assert [stage for stage, _, _ in rows] == [
        "baseline", "screen", "joint", "confirm", "heldout", "nulls", "matched-pool",
        "matched-null",
    ]  # fmt: skip
    assert {k: v for k, v in planned.items() if k != "matched-null"} == {
        k: v for k, v in written.items() if k in planned and k != "matched-null"
    }
    expected = expected_distinct_picks(12, 7, 300) * 16
    assert planned["matched-null"] == pytest.approx(expected)
    assert written["matched-null"] == res["matched-null"]["distinct"] * 16


# --------------------------------------------------------------------------- the matched null


def test_matched_null_is_the_best_of_the_budget_by_the_search_ranking(matched_run):
    out, res = matched_run
    pool, null = res["matched-pool"], res["matched-null"]
    assert pool["budget"] == 7 == res["joint"]["n_candidates"]
    assert len(pool["conditions"]) == 12  # every set of the rank-1 size (one head), no more
    assert null["replicates"] == null["n"] == 300 and sum(s["times"] for s in null["sets"]) == 300
    # the pick of a replicate is never ranked below pool rank P - B + 1 = 6
    assert all(s["pool_rank"] <= 6 for s in null["sets"])
    assert 1 < null["distinct"] == len(null["sets"])
    # the planted harmful head L2H3 is the best single head: every replicate that draws it
    # picks it, which is the share B / P = 7 / 12 of the replicates (binomial, 5 SE)
    times = {s["name"]: s["times"] for s in null["sets"]}
    share, p = times["L2H3"] / 300, 7 / 12
    assert abs(share - p) < 5 * math.sqrt(p * (1 - p) / 300)
    gains = [s["gain"] for s in null["sets"] for _ in range(s["times"])]
    primary = res["heldout"]["heldout"]["finalists"][0]
    assert primary["name"] == "L2H3" and null["primary_gain"] == primary["gain"]
    assert null["below"] == sum(g < primary["gain"] for g in gains)
    report = json.loads((out / "report.json").read_text())
    digest = report["primary"]["matched_null"]
    assert digest["percentile"] == null["percentile"] and digest["budget"] == 7
    assert "Selection-matched null" in (out / "report.md").read_text()
    assert report["figures"]["nulls"] == "nulls.png" and (out / "nulls.png").stat().st_size > 0


def test_matched_null_is_priced_before_it_runs(tmp_path):
    import io

    stream = io.StringIO()
    _run(tmp_path / "run", matched_null=50, matched_pool=12, until="baseline", stream=stream,
         progress=True)  # fmt: skip
    first = stream.getvalue().splitlines()[0]
    assert first.startswith("matched null: 12 pool sets x 12 discovery items + about")
    assert "evaluations (condition x item)" in first
    assert not (tmp_path / "run" / "matched-pool.jsonl").exists()
    stream = io.StringIO()
    _run(tmp_path / "run", matched_null=50, matched_pool=12, until="baseline", stream=stream,
         progress=True, matched_gate=0.05)  # fmt: skip
    first = stream.getvalue().splitlines()[0]
    assert first.endswith("stages: 192; run only if the held-out gain passes 0.05")


def test_matched_pool_smaller_than_the_budget_is_refused_before_any_work(tmp_path):
    with pytest.raises(UserError, match="--matched-pool 5 is smaller than the search budget"):
        _run(tmp_path / "run", matched_null=10, matched_pool=5)
    assert not (tmp_path / "run" / "manifest.json").exists()


def test_matched_null_resumes_and_is_part_of_the_run_identity(tmp_path, matched_run):
    out, res = matched_run
    again = _run(out, null_sets=4, matched_null=300, matched_pool=12)  # validated, not rerun
    assert again["matched-null"] == res["matched-null"]
    with pytest.raises(RunDirError, match="matched_null"):
        _run(out, null_sets=4, matched_null=301, matched_pool=12)


def test_matched_gate_skips_both_stages_and_dropping_it_runs_them(tmp_path, matched_run, capsys):
    """--matched-gate P: a held-out result that is not a positive gain with cluster p < P skips
    the matched stages (no records; the report, summarize's table and --verify say so); the
    gate is not part of the run's identity, so the same run without it then runs them, equal to
    a run that never had a gate."""
    from cel_numpy.cli import main
    from cel_numpy.localize import rundir as rd

    _, ungated = matched_run
    out = tmp_path / "run"
    # no exact sign-flip p on 16 items reaches 1e-12: the gate cannot pass
    res = _run(out, null_sets=4, matched_null=300, matched_pool=12, matched_gate=1e-12)
    held = res["heldout"]["heldout"]["finalists"][0]
    skipped = {"gate": 1e-12, "gain": held["gain"], "p_value": held["p_value"]}
    assert res["matched-pool"] == res["matched-null"] == {"skipped": skipped}
    assert not any(p.exists() for s in ("matched-pool", "matched-null")
                   for p in rd.stage_paths(out, s))  # fmt: skip
    report = json.loads((out / "report.json").read_text())
    assert report["primary"]["matched_null"] is None
    assert report["primary"]["matched_null_skipped"] == skipped
    assert "Selection-matched null: not run" in (out / "report.md").read_text()
    capsys.readouterr()
    assert main(["summarize", "--verify", str(out)]) == 0
    assert "not run (gate: gain > 0 with p < 1e-12)" in capsys.readouterr().out
    (out / "matched-pool.jsonl").write_text("")  # records the report's skip would hide
    assert main(["summarize", "--verify", str(out)]) == 2
    assert "skipped with no matched records is True in report.json" in capsys.readouterr().err
    (out / "matched-pool.jsonl").unlink()
    again = _run(out, null_sets=4, matched_null=300, matched_pool=12)  # the gate dropped
    assert again["matched-null"] == ungated["matched-null"]
    assert json.loads((out / "report.json").read_text())["primary"]["matched_null_skipped"] is None
    with pytest.raises(UserError, match="--matched-gate must be in"):
        _run(tmp_path / "bad", matched_null=3, matched_pool=12, matched_gate=0)


def test_matched_gate_that_passes_runs_the_matched_null_as_without_it(tmp_path, matched_run):
    _, ungated = matched_run
    held = ungated["heldout"]["heldout"]["finalists"][0]
    assert held["gain"] > 0 and held["p_value"] < 1.0  # the planted bad head: removing it helps
    res = _run(tmp_path / "run", null_sets=4, matched_null=300, matched_pool=12, matched_gate=1.0)
    assert res["matched-null"] == ungated["matched-null"]
    assert json.loads((tmp_path / "run" / "matched-gate.json").read_text())["gate"] == 1.0


def test_matched_gate_verdict_needs_a_positive_gain_below_the_gate(tmp_path):
    """A negative gain with a small p fails the gate as a non-significant one does."""
    from types import SimpleNamespace

    from cel_numpy.localize.routine import Localizer

    def verdict(gain, p, gate=0.05):
        held = {"heldout": {"finalists": [{"gain": gain, "p_value": p}]}}
        loc = SimpleNamespace(matched_gate=gate, results={"heldout": held}, out=tmp_path)
        return Localizer._matched_gate_verdict(loc)

    assert verdict(+9, 0.01) is None
    assert verdict(-9, 0.01) == {"gate": 0.05, "gain": -9, "p_value": 0.01}
    assert verdict(+9, 0.05) == {"gate": 0.05, "gain": 9, "p_value": 0.05}  # p < gate, strictly
    assert verdict(0, 0.0) == {"gate": 0.05, "gain": 0, "p_value": 0.0}  # no gain: skipped
    (tmp_path / "matched-pool.jsonl").write_text("")  # matched records on disk: never skipped
    assert verdict(-9, 0.01) is None


def test_matched_gate_is_refused_after_the_heldout_result_and_never_hides_records(
    tmp_path, matched_run
):
    """The gate cannot be added once the held-out stage has finished; a finished matched null
    is reported as it is, never as skipped."""
    import shutil

    run, ungated = matched_run
    out = tmp_path / "run"
    _run(out, null_sets=4, matched_null=300, matched_pool=12, until="heldout")
    with pytest.raises(UserError, match="given after the held-out result exists") as err:
        _run(out, null_sets=4, matched_null=300, matched_pool=12, matched_gate=1e-12)
    assert str(err.value).endswith("run without it (the matched null then runs)")  # none recorded
    (out / "matched-gate.json").write_text('{"gate": 0.05, "set_before": "heldout"}')
    with pytest.raises(UserError, match=r"or with the recorded one \(0\.05\)$"):
        _run(out, null_sets=4, matched_null=300, matched_pool=12, matched_gate=1e-12)
    shutil.copytree(run, tmp_path / "done")
    (tmp_path / "done" / "matched-gate.json").write_text('{"gate": 1e-12}')  # as if recorded
    res = _run(tmp_path / "done", null_sets=4, matched_null=300, matched_pool=12,
               matched_gate=1e-12)  # fmt: skip
    assert res["matched-null"] == ungated["matched-null"]
    report = json.loads((tmp_path / "done" / "report.json").read_text())
    assert report["primary"]["matched_null"] and not report["primary"]["matched_null_skipped"]


def test_verify_refuses_a_skip_the_records_do_not_justify(tmp_path, capsys):
    """A report claiming the gate skipped the matched null, where the records' held-out gain
    passes that gate, is named by --verify."""
    from cel_numpy.cli import main

    out = tmp_path / "run"
    res = _run(out, null_sets=4, matched_null=300, matched_pool=12, matched_gate=1e-12)
    held = res["heldout"]["heldout"]["finalists"][0]
    assert held["gain"] > 0  # the planted bad head: removing it helps
    path = out / "report.json"
    report = json.loads(path.read_text())
    report["primary"]["matched_null_skipped"]["gate"] = 1.0  # p < 1 and gain > 0: passes
    path.write_text(json.dumps(report))
    capsys.readouterr()
    assert main(["summarize", "--verify", str(out)]) == 2
    assert "matched null skip's gate (matched-gate.json) is 1.0 in report.json but 1e-12" in (
        capsys.readouterr().err
    )
    (out / "matched-gate.json").write_text('{"gate": 1.0}')  # the gate file agrees, the records not
    assert main(["summarize", "--verify", str(out)]) == 2
    assert "matched null skipped by its gate is True in report.json but False" in (
        capsys.readouterr().err
    )
    report["primary"]["matched_null_skipped"].update(gate=1e-12, gain=held["gain"] - 1)
    (out / "matched-gate.json").write_text('{"gate": 1e-12}')
    path.write_text(json.dumps(report))
    assert main(["summarize", "--verify", str(out)]) == 2
    assert "matched null skip's gain" in capsys.readouterr().err


# --------------------------------------------------------------------------- compressed records


def test_finished_stages_keep_a_deterministic_gzip_copy(tmp_path, matched_run):
    out, _ = matched_run
    for stage in ("baseline", "screen", "joint", "confirm", "heldout", "nulls", "matched-pool",
                  "matched-null"):  # fmt: skip
        gz = (out / f"{stage}.jsonl.gz").read_bytes()
        assert gzip.decompress(gz) == (out / f"{stage}.jsonl").read_bytes(), stage
        assert gz[4:8] == b"\0\0\0\0"  # mtime 0: the same records give the same bytes
    other = tmp_path / "again"
    _run(other, until="screen")
    assert (other / "screen.jsonl.gz").read_bytes() == (out / "screen.jsonl.gz").read_bytes()


def test_a_run_keeping_only_the_gzip_copies_resumes(tmp_path):
    out = tmp_path / "run"
    first = _run(out, until="heldout")
    for stage in ("baseline", "screen", "joint", "confirm", "heldout"):
        (out / f"{stage}.jsonl").unlink()
    res = _run(out)  # validates the finished stages from the .gz, runs the rest
    assert res["heldout"] == first["heldout"] and "report" in res
    gz = out / "joint.jsonl.gz"
    data = gzip.decompress(gz.read_bytes())
    flipped = data.replace(b'"correct": true', b'"correct": false', 1)
    assert flipped != data
    gz.write_bytes(gzip.compress(flipped))
    with pytest.raises(RunDirError, match="joint.jsonl.gz does not match joint.done.json"):
        _run(out)
