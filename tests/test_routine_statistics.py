"""Evidence in the routine: the informed tie-break (and `coordinates` reproducing the released
rankings), cluster-level held-out statistics, null sets, old run directories."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cel_numpy.errors import RunDirError, UserError
from cel_numpy.localize import rundir as rd
from cel_numpy.localize.conditions import ExampleResult, normalize_condition
from cel_numpy.localize.evaluate import evaluate_naive
from cel_numpy.localize.ranking import (
    Scored,
    decided_by,
    draw_null_sets,
    joint_key,
    nominees,
    rank_joint,
    rank_singletons,
    singleton_key,
)
from cel_numpy.localize.routine import localize, null_percentile
from cel_numpy.tasks.base import Item
from tests.test_localize import FakeEvaluator, FakeTask, run_fake

RESULTS = Path(__file__).parent.parent / "docs" / "results" / "archive" / "round1-old-format"


def S(heads, correct, rescued, damaged, lp=None):
    return Scored(normalize_condition(heads), correct, rescued, damaged, lp)


# --------------------------------------------------------------------------- tie-break


def test_informed_tie_break_orders_a_constructed_tie():
    """Equal (gain, damaged, correct): the larger log-probability change ranks first; head
    coordinates decide only what is still tied; `coordinates` is the released order."""
    a = S([(0, 1)], 12, 5, 1, lp=-0.20)
    b = S([(4, 2)], 12, 5, 1, lp=+0.35)  # same counts, raises the answer's log-probability most
    c = S([(2, 0)], 12, 5, 1, lp=+0.10)
    d = S([(3, 3)], 12, 5, 1, lp=+0.10)  # ties c on everything but coordinates
    e = S([(5, 5)], 15, 8, 1, lp=-3.0)  # larger gain: first whatever its log-probability
    informed = rank_singletons([a, b, c, d, e], "logprob")
    assert [s.heads for s in informed] == [((5, 5),), ((4, 2),), ((2, 0),), ((3, 3),), ((0, 1),)]
    released = rank_singletons([a, b, c, d, e], "coordinates")
    assert [s.heads for s in released] == [((5, 5),), ((0, 1),), ((2, 0),), ((3, 3),), ((4, 2),)]
    assert rank_singletons([a, b, c, d, e]) == released  # the default of the pure function
    assert decided_by(informed, 4, joint=False, tie_break="logprob") == {
        "gain": 1, "damaged": 0, "correct": 0, "logprob": 2, "coordinates": 1,
    }  # fmt: skip


def test_informed_tie_break_comes_after_set_size_in_the_joint_ranking():
    pair = S([(0, 0), (1, 1)], 12, 5, 1, lp=0.0)
    triple = S([(0, 0), (1, 1), (2, 2)], 12, 5, 1, lp=5.0)  # better log-prob, but larger
    single = S([(3, 3)], 12, 5, 1, lp=-1.0)
    ranked = rank_joint([triple, pair, single], "logprob")
    assert [len(s.heads) for s in ranked] == [1, 2, 3]
    assert decided_by(ranked, 3, joint=True, tie_break="logprob")["set size"] == 2
    assert joint_key(pair, "logprob") < joint_key(triple, "logprob")


def test_missing_log_probabilities_fall_back_to_coordinates():
    conds = [S([(l, 0)], 10, 3, 1) for l in (4, 1, 3)]
    assert rank_singletons(conds, "logprob") == rank_singletons(conds, "coordinates")
    counts = decided_by(rank_singletons(conds, "logprob"), 3, joint=False, tie_break="logprob")
    assert counts["coordinates"] == 2 and counts["logprob"] == 0 and counts["uncontested"] == 1
    assert singleton_key(conds[0], "logprob")[3] == float("inf")


def _committed_runs():
    return sorted(p.parent for p in RESULTS.glob("*/report.json"))


def test_the_committed_old_format_runs_are_found():
    """An empty parameter list would make the test below skip silently, e.g. after a move."""
    assert len(_committed_runs()) >= 4, f"no old-format run reports under {RESULTS}"


@pytest.mark.parametrize("run", _committed_runs(), ids=lambda p: p.name)
def test_coordinates_tie_break_reproduces_the_committed_rankings(run):
    """On the committed (old-format) discovery records: the released key ranks the 270 singletons
    exactly as recorded, gives the same nominees, and orders every joint candidate whose counts
    the report keeps (nominee singletons and finalists) as the recorded joint ranking does."""
    report = json.loads((run / "report.json").read_text())
    singles = [
        S(s["heads"], s["correct"], s["rescued"], s["damaged"]) for s in report["singletons"]
    ]
    ranked = rank_singletons(singles, "coordinates")
    by_rank = sorted(report["singletons"], key=lambda s: s["rank"])
    assert [s.heads for s in ranked] == [normalize_condition(s["heads"]) for s in by_rank]
    assert [list(h) for h in nominees(ranked, 10)] == report["nominees"]
    known = {s["name"]: s for s in report["singletons"]}
    known.update({f["name"]: f["discovery"] for f in report["finalists"]})
    order = [name for name in report["joint_ranking"] if name in known]
    scored = {
        name: S(known[name]["heads"], known[name]["correct"], known[name]["rescued"],
                known[name]["damaged"])
        for name in order
    }  # fmt: skip
    reranked = rank_joint(list(scored.values()), "coordinates")
    assert [s.heads for s in reranked] == [scored[name].heads for name in order]
    assert [f["name"] for f in report["finalists"]] == report["joint_ranking"][:10]


# --------------------------------------------------------------------------- null sets


def test_null_sets_reproducible_distinct_and_never_the_primary():
    primary = normalize_condition([(1, 2), (3, 0), (4, 4)])
    a = draw_null_sets(5, 5, 3, 40, seed=7, exclude=primary)
    assert a == draw_null_sets(5, 5, 3, 40, seed=7, exclude=primary)
    assert a != draw_null_sets(5, 5, 3, 40, seed=8, exclude=primary)
    assert len(set(a)) == 40 and primary not in a
    assert all(len(c) == 3 and len(set(c)) == 3 and c == tuple(sorted(c)) for c in a)
    # every other set of a tiny model: the primary is still never drawn
    everything = draw_null_sets(1, 4, 2, 5, seed=0, exclude=((0, 0), (0, 1)))
    assert len(set(everything)) == 5 and ((0, 0), (0, 1)) not in everything
    with pytest.raises(ValueError, match="only 5 other sets"):
        draw_null_sets(1, 4, 2, 6, seed=0, exclude=((0, 0), (0, 1)))


def test_null_percentile():
    assert null_percentile(5, [1, 2, 5, 7]) == {
        "n": 4, "below": 2, "ties": 1, "percentile": 62.5, "p_value": 3 / 5,
    }  # fmt: skip
    assert null_percentile(9, [0] * 49)["p_value"] == pytest.approx(1 / 50)


# --------------------------------------------------------------------------- the routine


class ClusterTask(FakeTask):
    """Fake items in clusters of several items (the same "query" asked with different shots)."""

    def sample(self, rng, n):
        out = []
        for k in rng.integers(0, 10**6, n):
            out.append(Item(self.name, "s", f"q{int(k)}", f"a{int(k)}", cluster=f"c{int(k) % 23}"))
        return out


class LogprobEvaluator(FakeEvaluator):
    """FakeEvaluator that also records a reference log-probability (the item's margin)."""

    def evaluate_one(self, items, cond):
        out = []
        for r, it in zip(super().evaluate_one(items, cond), items):
            score, pushes = self.draws[it.id]
            margin = score + sum(pushes[l, h] for l, h in cond)
            out.append(ExampleResult(r.item_id, r.correct, r.answer, ref_logprob=float(margin)))
        return out

    def evaluate_many(self, items, conditions):
        return evaluate_naive(self.evaluate_one, items, conditions)


def _run(out, task, ev, **kw):
    return localize(
        out,
        lambda t, ref: ev,
        task,
        n_discovery=kw.pop("n_disc", 30),
        n_heldout=kw.pop("n_held", 60),
        seed=0,
        progress=False,
        command="test",
        **kw,
    )


def test_routine_records_log_probabilities_and_uses_them(tmp_path):
    out = tmp_path / "run"
    res = _run(out, FakeTask(), LogprobEvaluator(n_layers=4, n_heads=6), n_disc=6)
    first = json.loads((out / "screen.jsonl").read_text().splitlines()[0])
    assert isinstance(first["ref_logprob"], float)
    screen = res["screen"]
    assert all(c["logprob_change"] is not None for c in screen["conditions"])
    # six discovery items: many singletons tie on the counts, and the log-probability decides
    assert screen["decided_by"]["logprob"] > 0 and screen["tie_break"] == "logprob"
    conds = [S(c["heads"], c["correct"], c["rescued"], c["damaged"], c["logprob_change"])
             for c in screen["conditions"]]  # fmt: skip
    expected = [s.heads for s in rank_singletons(conds, "logprob")]
    assert [((l, h),) for l, h in screen["nominees"]] == expected[:10]
    report = json.loads((out / "report.json").read_text())
    assert report["decided_by"]["nominees"] == screen["decided_by"]
    assert "nominee slots decided by:" in (out / "report.md").read_text()
    # a resumed run re-reads the recorded log-probabilities and validates every stage
    again = _run(out, FakeTask(), LogprobEvaluator(n_layers=4, n_heads=6), n_disc=6)
    assert again["screen"] == screen


def test_coordinates_option_is_recorded_and_keeps_the_released_ranking(tmp_path):
    ev = LogprobEvaluator(n_layers=4, n_heads=6)
    res = _run(tmp_path / "run", FakeTask(), ev, n_disc=6, tie_break="coordinates")
    conds = [
        S(c["heads"], c["correct"], c["rescued"], c["damaged"]) for c in res["screen"]["conditions"]
    ]
    assert res["screen"]["ranking"] == [
        "+".join(f"L{l}H{h}" for l, h in s.heads) for s in rank_singletons(conds, "coordinates")
    ]
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["tie_break"] == "coordinates"
    with pytest.raises(RunDirError, match="tie_break"):  # the same directory, another rule
        _run(tmp_path / "run", FakeTask(), ev, n_disc=6, tie_break="logprob")


def test_heldout_statistics_take_the_cluster_as_the_unit(tmp_path):
    out = tmp_path / "run"
    res = _run(out, ClusterTask(), FakeEvaluator(n_layers=3, n_heads=4), n_held=120)
    disc = rd.read_panel(out / "panels" / "discovery.jsonl")
    held = rd.read_panel(out / "panels" / "heldout.jsonl")
    assert not {it.cluster for it in disc} & {it.cluster for it in held}
    top = res["heldout"]["heldout"]["finalists"][0]
    n_clusters = len({it.cluster for it in held})
    assert (
        top["n_clusters"] == n_clusters < 23
        and res["heldout"]["heldout"]["n_clusters"] == n_clusters
    )
    for key in ("p_value", "ci_low", "ci_high", "item_p_value", "item_ci_low", "item_ci_high"):
        assert key in top
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["n_clusters"]["heldout"] == n_clusters


def test_null_sets_stage_and_report(tmp_path):
    out = tmp_path / "run"
    ev = FakeEvaluator(n_layers=4, n_heads=5, planted={(2, 3): 6.0})
    res = _run(out, FakeTask(), ev, null_sets=15, null_seed=3)
    nulls = res["nulls"]
    primary = normalize_condition(res["joint"]["finalists"][0])
    drawn = [normalize_condition(s["heads"]) for s in nulls["sets"]]
    assert drawn == draw_null_sets(4, 5, len(primary), 15, seed=3, exclude=primary)
    assert nulls["n"] == 15 and nulls["seed"] == 3 and primary not in drawn
    gains = [s["gain"] for s in nulls["sets"]]
    assert nulls == {**nulls, **null_percentile(nulls["primary_gain"], gains)}
    assert nulls["percentile"] > 90  # the planted head helps every item: random sets do not
    report = json.loads((out / "report.json").read_text())
    assert report["primary"]["nulls"]["percentile"] == nulls["percentile"]
    assert (out / "nulls.png").stat().st_size > 0 and "Null sets:" in (
        out / "report.md"
    ).read_text()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["null_sets"] == {"n": 15, "seed": 3}


def test_no_null_sets_by_default(tmp_path):
    res = run_fake(tmp_path / "run")
    assert res["nulls"]["n"] == 0 and res["nulls"]["sets"] == []
    assert not (tmp_path / "run" / "nulls.png").exists()


def test_old_format_run_directory_is_refused_in_one_line(tmp_path):
    out = tmp_path / "old"
    out.mkdir()
    (out / "manifest.json").write_text(json.dumps({"format": "cel-numpy.localize/1"}))
    with pytest.raises(RunDirError, match="old format cel-numpy.localize/1.*re-run") as err:
        run_fake(out)
    assert "\n" not in str(err.value)
    with pytest.raises(UserError):  # RunDirError is a UserError: one line at the command line
        rd.read_manifest(out)


@pytest.mark.parametrize("run", _committed_runs(), ids=lambda p: p.name)
def test_committed_old_results_are_refused_not_mixed(run):
    with pytest.raises(RunDirError, match="old format"):
        rd.read_manifest(run)
