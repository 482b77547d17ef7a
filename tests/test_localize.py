"""The localization routine: statistics, ranking, enumeration, run directory (resume, lock), the
theory-model acceptance test, and a planted harmful head.

Most tests use `FakeEvaluator`, a millisecond stand-in for a model: every item has an intact
score and every head a per-item push; an example is correct iff the score plus the pushes of the
ablated heads is positive. Its results are a pure function of (item id, condition).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from helpers import PlantedTask, localize_cli, planted_model

from cel_numpy.cli import UserError
from cel_numpy.errors import OptionError
from cel_numpy.localize import rundir as rd
from cel_numpy.localize.conditions import ExampleResult, condition_name, normalize_condition
from cel_numpy.localize.evaluate import TheoryEvaluator, TheoryTask, evaluate_naive
from cel_numpy.localize.ranking import (
    Scored,
    joint_enumeration,
    joint_key,
    nominees,
    rank_joint,
    rank_singletons,
)
from cel_numpy.localize.routine import STAGES, chunk_blocks, localize, panel_slices, stage_pace
from cel_numpy.localize.stats import (
    mcnemar_exact,
    mover_difference,
    newcombe_paired_interval,
    paired_summary,
    wilson_interval,
)
from cel_numpy.tasks.base import Item

# --------------------------------------------------------------------------- fixtures


class FakeTask:
    name = "fake"
    scoring = "generate"
    max_new_tokens = 4

    def __init__(self, name="fake"):
        self.name = name

    def sample(self, rng, n):
        return [Item(self.name, "s", f"q{int(k)}", f"a{int(k)}") for k in rng.integers(0, 10**6, n)]

    def is_correct(self, item, output):
        return output == item.answer


def _item_rng(item_id: str, salt: int) -> np.random.Generator:
    return np.random.default_rng([int(item_id, 16) % (2**63), salt])


class FakeEvaluator:
    """score(item) + sum of pushes of the ablated heads > 0  <=>  correct.

    planted: {(layer, head): push} added to every item (e.g. a head whose removal helps).
    """

    def __init__(self, n_layers=3, n_heads=5, planted=None, salt=0, flaky=False):
        self.n_layers, self.n_heads = n_layers, n_heads
        self.planted = planted or {}
        self.salt = salt
        self.flaky = flaky
        self.calls = 0
        self.draws = {}  # item id -> (score, pushes (L, H))

    def identity(self):
        return {
            "kind": "fake",
            "spec": "fake",
            "n_layers": self.n_layers,
            "n_heads": self.n_heads,
            "planted": sorted([list(k), v] for k, v in self.planted.items()),
            "salt": self.salt,
        }

    def evaluate_one(self, items, cond):
        self.calls += 1
        out = []
        for it in items:
            if it.id not in self.draws:
                r = _item_rng(it.id, self.salt)
                self.draws[it.id] = (r.normal(), 0.3 * r.normal(size=(self.n_layers, self.n_heads)))
            score, pushes = self.draws[it.id]
            total = score + sum(pushes[l, h] + self.planted.get((l, h), 0.0) for l, h in cond)
            if self.flaky and self.calls % 2 == 0 and it is items[0]:
                total = -total
            ok = bool(total > 0)
            out.append(ExampleResult(it.id, ok, it.answer if ok else "wrong"))
        return out

    def evaluate_many(self, items, conditions):
        return evaluate_naive(self.evaluate_one, items, conditions)


def fake_factory(**kw):
    ev = FakeEvaluator(**kw)
    return lambda task, reference_items: ev


def run_fake(out, until="report", n_disc=40, n_held=40, seed=0, **kw):
    factory = kw.pop("factory", None) or fake_factory(**kw.pop("ev", {}))
    return localize(
        out,
        factory,
        FakeTask(),
        n_discovery=n_disc,
        n_heldout=n_held,
        seed=seed,
        until=until,
        progress=False,
        command="test",
        **kw,
    )


# --------------------------------------------------------------------------- statistics


def test_wilson_matches_published_value():
    # Newcombe (1998a), Stat Med 17:857, method 3 on 81/263: 0.2553 to 0.3662.
    lo, hi = wilson_interval(81, 263)
    assert (round(lo, 4), round(hi, 4)) == (0.2553, 0.3662)


def test_square_and_add_matches_published_value():
    # Newcombe (1998b), Stat Med 17:873, method 10 on 56/70 - 48/80: 0.0524 to 0.3339.
    # The paired interval is this construction with the correlation phi of the pairs.
    l1, u1 = wilson_interval(56, 70)
    l2, u2 = wilson_interval(48, 80)
    lo, hi = mover_difference(56 / 70, l1, u1, 48 / 80, l2, u2, phi=0.0)
    assert (round(lo, 4), round(hi, 4)) == (0.0524, 0.3339)


def test_paired_interval_properties():
    for a, b, c, d in [(30, 9, 2, 59), (0, 0, 0, 10), (5, 5, 5, 5), (0, 10, 0, 0), (40, 0, 12, 48)]:
        n = a + b + c + d
        lo, hi = newcombe_paired_interval(a, b, c, d)
        assert -1 <= lo <= (b - c) / n <= hi <= 1, (a, b, c, d, lo, hi)
    # positive correlation of the pairs narrows the interval compared with independent samples
    lo, hi = newcombe_paired_interval(30, 9, 2, 59)
    l1, u1 = wilson_interval(39, 100)
    l2, u2 = wilson_interval(32, 100)
    ilo, ihi = mover_difference(0.39, l1, u1, 0.32, l2, u2, 0.0)
    assert hi - lo < ihi - ilo


def test_paired_interval_coverage_near_nominal():
    rng = np.random.default_rng(0)
    probs = np.array([0.5, 0.15, 0.05, 0.3])  # a, b, c, d: true gain 0.10
    hits = 0
    n_sims = 2000
    for _ in range(n_sims):
        a, b, c, d = rng.multinomial(100, probs)
        lo, hi = newcombe_paired_interval(a, b, c, d)
        hits += lo <= 0.10 <= hi
    assert 0.93 <= hits / n_sims <= 0.975, hits / n_sims


def test_mcnemar_exact_is_binomial_on_discordant_pairs():
    # 2 * P(X >= 10 | Bin(12, 1/2)) = 2 * 79 / 4096
    assert mcnemar_exact(10, 2) == pytest.approx(2 * 79 / 4096)
    assert mcnemar_exact(2, 10) == pytest.approx(2 * 79 / 4096)
    assert mcnemar_exact(0, 0) == 1.0


def test_paired_summary_counts():
    intact = [True, True, False, False, True]
    ablated = [True, False, True, True, True]
    s = paired_summary(intact, ablated)
    assert (s.rescued, s.damaged, s.gain, s.correct, s.intact_correct) == (2, 1, 1, 4, 3)
    assert s.gain_rate == pytest.approx(0.2)


# --------------------------------------------------------------------------- ranking


def S(heads, correct, rescued, damaged):
    return Scored(normalize_condition(heads), correct, rescued, damaged)


def test_singleton_ranking_and_tie_breaks():
    a = S([(0, 1)], 50, 5, 1)  # gain 4
    b = S([(2, 0)], 50, 6, 2)  # gain 4, more damage -> after a
    c = S([(1, 3)], 52, 5, 1)  # gain 4, damage 1, more correct -> before a
    d = S([(0, 0)], 52, 5, 1)  # identical counts to c: head order decides -> before c
    e = S([(3, 3)], 60, 9, 0)  # gain 9 -> first
    ranked = rank_singletons([a, b, c, d, e])
    assert [s.heads for s in ranked] == [((3, 3),), ((0, 0),), ((1, 3),), ((0, 1),), ((2, 0),)]


def test_joint_ranking_prefers_fewer_heads_on_ties():
    triple = S([(0, 0), (0, 1), (0, 2)], 50, 5, 1)
    pair = S([(1, 1), (2, 2)], 50, 5, 1)
    single = S([(5, 5)], 50, 5, 1)
    better = S(
        [
            (0, 0),
            (0, 1),
            (0, 2),
        ],
        51,
        5,
        1,
    )
    ranked = rank_joint([triple, pair, single])
    assert [len(s.heads) for s in ranked] == [1, 2, 3]
    assert rank_joint([single, better])[0] is better  # -correct comes before the size tie-break
    assert joint_key(pair) < joint_key(triple)


def test_joint_enumeration_is_175_candidates():
    ranked = rank_singletons(
        [S([(l, h)], 10, (7 * l + 3 * h) % 11, 0) for l in range(4) for h in range(5)]
    )
    nom = nominees(ranked, 10)
    assert len(nom) == 10 and len(set(nom)) == 10
    singles, new = joint_enumeration(nom)
    assert len(singles) == 10 and len(new) == 45 + 120
    everything = singles + new
    assert len(everything) == 175 and len(set(everything)) == 175
    assert all(
        len(set(c)) == len(c) and set(c) <= set(nom) and list(c) == sorted(c) for c in everything
    )
    assert sum(len(c) == 2 for c in new) == 45 and sum(len(c) == 3 for c in new) == 120


def test_condition_names():
    assert condition_name(()) == "intact"
    assert condition_name(normalize_condition([(7, 1), (3, 5)])) == "L3H5+L7H1"
    with pytest.raises(ValueError):
        normalize_condition([(1, 1), (1, 1)])


# --------------------------------------------------------------------------- routine on the fake


def test_panels_disjoint_and_recorded(tmp_path):
    run_fake(tmp_path / "run", until="baseline")
    disc = rd.read_panel(tmp_path / "run" / "panels" / "discovery.jsonl")
    held = rd.read_panel(tmp_path / "run" / "panels" / "heldout.jsonl")
    assert len(disc) == 40 and len(held) == 40
    assert not {it.id for it in disc} & {it.id for it in held}
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["panel_hashes"]["discovery"] == rd.items_hash(disc)
    assert manifest["panel_sizes"] == {"discovery": 40, "heldout": 40}


def test_full_run_175_candidates_and_report(tmp_path):
    out = tmp_path / "run"
    res = run_fake(out, ev={"n_layers": 3, "n_heads": 5})
    assert res["joint"]["n_candidates"] == 175
    assert len(res["joint"]["conditions"]) == 165
    assert len(res["joint"]["finalists"]) == 10
    frozen = json.loads((out / "finalists.json").read_text())
    assert frozen["finalists"] == res["joint"]["finalists"]
    # confirmation and held-out keep the discovery order: no reselection
    assert [f["name"] for f in res["confirm"]["discovery"]["finalists"]] == frozen["names"]
    assert [f["name"] for f in res["heldout"]["heldout"]["finalists"]] == frozen["names"]
    report = json.loads((out / "report.json").read_text())
    assert report["primary"]["name"] == frozen["names"][0]
    assert len(report["singletons"]) == 15
    for stage in STAGES[:-1]:  # the matched null runs only when asked for (--matched-null R)
        assert (out / f"{stage}.done.json").exists() != stage.startswith("matched-"), stage
    for name in ("report.md", "singletons.png", "finalists.png", "crosstask.png"):
        assert (out / name).stat().st_size > 0, name
    # per-example records: one line per (condition, example), greppable by block
    lines = (out / "screen.jsonl").read_text().splitlines()
    assert len(lines) == 15 * 40
    assert sum('"block": "L1H2"' in line for line in lines) == 40


def test_planted_fake_head_is_rank_one(tmp_path):
    res = run_fake(tmp_path / "run", ev={"n_layers": 3, "n_heads": 5, "planted": {(2, 3): 6.0}})
    assert res["joint"]["ranking"][0] == "L2H3"
    assert res["screen"]["ranking"][0] == "L2H3"


def test_baseline_must_agree_exactly(tmp_path):
    with pytest.raises(UserError, match="two intact passes disagree on 1 of 40"):
        run_fake(tmp_path / "run", until="baseline", ev={"flaky": True})
    assert not (tmp_path / "run" / "baseline.done.json").exists()


def test_executor_gives_identical_records(tmp_path):
    run_fake(tmp_path / "seq", until="joint", chunk_size=3)
    with ThreadPoolExecutor(max_workers=2) as pool:
        run_fake(tmp_path / "par", until="joint", chunk_size=3, executor=pool)
    for stage in ("baseline", "screen", "joint"):
        assert (tmp_path / "seq" / f"{stage}.jsonl").read_bytes() == (
            tmp_path / "par" / f"{stage}.jsonl"
        ).read_bytes()


def test_chunks_hold_at_most_chunk_items_evaluations():
    blocks = [rd.Block(f"s{i}", "heldout", ((0, i),)) for i in range(11)]
    blocks += [rd.Block(f"d{i}", "discovery", ((1, i),)) for i in range(10)]
    chunks = chunk_blocks(blocks, {"heldout": 500, "discovery": 100}, 8, 1600)
    # 1600 // 500 = 3 per chunk: 11 in four chunks; 8 on 100 items: 10 in two chunks, evenly
    assert [len(c) for c in chunks] == [2, 3, 3, 3, 5, 5]
    assert [b for c in chunks for b in c] == blocks  # order kept, panels never mixed
    assert all(len({b.panel for b in c}) == 1 for c in chunks)
    # a panel larger than the budget still gets one condition per chunk
    assert [len(c) for c in chunk_blocks(blocks[:3], {"heldout": 5000}, 8, 1600)] == [1, 1, 1]
    # a confirm stage (11 conditions on 100 items): 5 + 6, never 8 + 3 beside an idle worker
    confirm = [rd.Block(f"c{i}", "discovery", ((1, i),)) for i in range(11)]
    assert [len(c) for c in chunk_blocks(confirm, {"discovery": 100}, 8, 1600)] == [5, 6]


def test_chunk_items_changes_no_record(tmp_path):
    run_fake(tmp_path / "big", until="joint", chunk_size=8)
    run_fake(tmp_path / "small", until="joint", chunk_size=8, chunk_items=50)  # 1 per chunk
    for stage in ("baseline", "screen", "joint"):
        big = (tmp_path / "big" / f"{stage}.jsonl").read_bytes()
        assert big and big == (tmp_path / "small" / f"{stage}.jsonl").read_bytes()


def test_panel_slices_cover_the_rows_in_order_within_the_bound():
    assert panel_slices(500, 100) == [range(k, k + 100) for k in range(0, 500, 100)]
    assert panel_slices(250, 100) == [range(0, 83), range(83, 166), range(166, 250)]
    assert panel_slices(100, 100) == [range(0, 100)]
    assert panel_slices(7, 1) == [range(k, k + 1) for k in range(7)]
    for n, size in [(1, 5), (101, 100), (999, 64)]:
        slices = panel_slices(n, size)
        assert [i for r in slices for i in r] == list(range(n))
        assert max(map(len, slices)) <= size and max(map(len, slices)) - min(map(len, slices)) <= 1


class SlicingFake(FakeEvaluator):
    """A FakeEvaluator that evaluates a slice of a panel (`rows`) and notes what it was asked."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.asked = []  # (panel size, rows or None) per call

    def evaluate_many(self, items, conditions, rows=None):
        self.asked.append((len(items), rows))
        items = items if rows is None else [items[i] for i in rows]
        return evaluate_naive(self.evaluate_one, items, conditions)


@pytest.mark.parametrize("workers", [0, 2])
def test_large_panels_are_computed_in_slices_and_change_no_record(tmp_path, workers):
    """A held-out panel larger than slice_items is evaluated slice by slice (every worker busy,
    progress per slice); the records equal those of whole-panel chunks, byte for byte."""
    kw = dict(until="nulls", n_disc=12, n_held=140, null_sets=4)  # held-out > SLICE_ABOVE
    run_fake(tmp_path / "whole", **kw)
    sliced = SlicingFake()
    with ThreadPoolExecutor(max_workers=2) if workers else contextlib.nullcontext() as pool:
        run_fake(
            tmp_path / "sliced", factory=lambda t, ref: sliced, slice_items=60, executor=pool, **kw
        )
    asked = set(sliced.asked)
    assert {(12, None), (140, range(0, 46)), (140, range(46, 93)), (140, range(93, 140))} == asked
    for stage in ("baseline", "screen", "joint", "confirm", "heldout", "nulls"):
        whole = (tmp_path / "whole" / f"{stage}.jsonl.gz").read_bytes()
        assert whole == (tmp_path / "sliced" / f"{stage}.jsonl.gz").read_bytes(), stage


def test_a_sliced_stage_counts_its_progress_in_evaluations_slice_by_slice(tmp_path):
    """One null set on a 140-item held-out panel is one chunk; in three slices its progress line
    moves three times (a log gets a line per tenth reached: at 46, 93 and 140 of 140)."""
    import io

    stream = io.StringIO()
    localize(tmp_path / "run", lambda t, ref: SlicingFake(), FakeTask(), n_discovery=12,
             n_heldout=140, seed=0, until="nulls", null_sets=1, slice_items=50, stream=stream,
             command="test")  # fmt: skip
    lines = [ln for ln in stream.getvalue().splitlines() if ln.startswith("nulls ")]
    assert [ln.split("]")[1].split()[0] for ln in lines] == ["46/140", "93/140", "140/140"]
    assert all("evaluations" in ln for ln in lines)


def test_resume_reuses_finished_stages(tmp_path):
    out = tmp_path / "run"
    factory_ev = FakeEvaluator()
    factory = lambda task, ref: factory_ev
    run_fake(out, until="screen", factory=factory)
    calls = factory_ev.calls
    run_fake(out, until="screen", factory=factory)
    assert factory_ev.calls == calls  # validated, not recomputed
    run_fake(out, factory=factory)
    assert (out / "report.json").exists()


def test_resume_after_crash_matches_uninterrupted_run(tmp_path):
    run_fake(tmp_path / "whole", until="screen")
    out = tmp_path / "crashed"
    run_fake(out, until="screen")
    records, done = rd.stage_paths(out, "screen")
    data = records.read_bytes()
    done.unlink()
    records.write_bytes(data[: len(data) * 2 // 3 + 17])  # mid-block, mid-line: a crash
    run_fake(out, until="screen")
    assert records.read_bytes() == (tmp_path / "whole" / "screen.jsonl").read_bytes()
    assert json.loads(done.read_text())["sha256"] == hashlib.sha256(data).hexdigest()


def test_tampered_record_refuses(tmp_path):
    out = tmp_path / "run"
    run_fake(out, until="joint")
    records = out / "screen.jsonl"
    text = records.read_text()
    first = text.splitlines()[0]
    flipped = (
        first.replace('"correct": true', '"correct": false')
        if '"correct": true' in first
        else first.replace('"correct": false', '"correct": true')
    )
    records.write_text(text.replace(first, flipped, 1))
    with pytest.raises(rd.RunDirError, match=r"screen\.jsonl does not match screen\.done\.json"):
        run_fake(out, until="joint")


def test_tampered_done_summary_refuses(tmp_path):
    out = tmp_path / "run"
    run_fake(out, until="screen")
    done = out / "screen.done.json"
    info = json.loads(done.read_text())
    info["summary"]["conditions"][0]["gain"] += 1
    done.write_text(json.dumps(info))
    with pytest.raises(rd.RunDirError, match="summary does not match"):
        run_fake(out, until="screen")


def test_corrupted_partial_record_is_an_error(tmp_path):
    out = tmp_path / "run"
    run_fake(out, until="screen")
    records, done = rd.stage_paths(out, "screen")
    done.unlink()
    lines = records.read_text().splitlines(keepends=True)
    lines[3] = '{"block": "L0H0", "oops"\n'
    records.write_text("".join(lines))
    with pytest.raises(rd.RunDirError, match=r"screen\.jsonl:4: malformed record"):
        run_fake(out, until="screen")


def test_tampered_finalists_refuse(tmp_path):
    out = tmp_path / "run"
    run_fake(out, until="joint")
    path = out / "finalists.json"
    frozen = json.loads(path.read_text())
    frozen["finalists"] = frozen["finalists"][::-1]
    path.write_text(json.dumps(frozen))
    with pytest.raises(rd.RunDirError, match="finalists.json"):
        run_fake(out, until="confirm")


def test_manifest_mismatch_refuses(tmp_path):
    out = tmp_path / "run"
    run_fake(out, until="baseline")
    with pytest.raises(rd.RunDirError, match="describes a different run"):
        run_fake(out, until="baseline", seed=1)
    with pytest.raises(rd.RunDirError, match="describes a different run"):
        run_fake(out, until="baseline", ev={"salt": 5})  # a different model


def test_lock_stops_a_second_writer(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "lock").write_text(f"{os.getpid()} {__import__('socket').gethostname()} now\n")
    with pytest.raises(rd.RunDirError, match="held by pid"):
        run_fake(out, until="baseline")
    (out / "lock").write_text(f"999999999 {__import__('socket').gethostname()} then\n")
    run_fake(
        out, until="baseline"
    )  # pid not running on this host: the stale lock is taken over (see rundir)
    assert not (out / "lock").exists()  # released after the run


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"seed": 1.7}, "seed must be an integer >= 0, got 1.7"),
        ({"seed": "1"}, "seed must be an integer >= 0, got '1'"),
        ({"n_held": 2.5}, "n_heldout must be an integer >= 1, got 2.5"),
        ({"null_sets": 2.5}, "null_sets must be an integer >= 0, got 2.5"),
        ({"null_seed": -1}, "null_seed must be an integer >= 0, got -1"),
        ({"n_nominees": -1}, "n_nominees must be an integer >= 1, got -1"),
        ({"n_finalists": 0}, "n_finalists must be an integer >= 1, got 0"),
        ({"chunk_size": 0}, "chunk_size must be an integer >= 1, got 0"),
    ],
)
def test_the_python_api_refuses_counts_it_would_truncate(tmp_path, kw, message):
    """seed=1.7 ran as seed 1 and n_nominees=-1 dropped a nominee (nominees[:-1]); each is now
    refused before anything is written."""
    with pytest.raises(UserError, match=message):
        run_fake(tmp_path / "run", until="baseline", **kw)
    assert not (tmp_path / "run" / "manifest.json").exists()


def test_lock_is_released_on_error(tmp_path):
    with pytest.raises(UserError, match="two intact passes disagree"):  # raised under the lock
        run_fake(tmp_path / "run", until="baseline", ev={"flaky": True})
    assert not (tmp_path / "run" / "lock").exists()


def test_unwritable_out_is_one_line_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(OptionError, match="cannot write to --out"):
        run_fake(blocker / "run", until="baseline")


def test_few_heads_all_nominated(tmp_path):
    res = run_fake(tmp_path / "run", ev={"n_layers": 1, "n_heads": 4})
    assert len(res["screen"]["nominees"]) == 4
    assert res["joint"]["n_candidates"] == 4 + 6 + 4
    assert "only 4 heads" in (tmp_path / "run" / "report.md").read_text()


# --------------------------------------------------------------------------- theory acceptance


@pytest.fixture(scope="module")
def trained_theory():
    from cel_numpy.theory import TrainConfig, train

    config = TrainConfig()
    train_rng, _ = np.random.default_rng(0).spawn(2)  # as `cel-numpy localize --model theory` does
    return train(TrainConfig(log_every=config.steps), train_rng).params, config.world


def test_theory_acceptance(tmp_path, trained_theory):
    """Rank 1 holds the largest-|c-loading| head; held-out gain on A > 0, significant; B worse."""
    from cel_numpy.theory import loadings, sample_batch
    from cel_numpy.theory.data import TASK_A

    params, world = trained_theory
    c_load, _ = loadings(params, sample_batch(np.random.default_rng(123), world, 8192, task=TASK_A))
    c_head = int(np.argmax(np.abs(c_load)))
    task_a, task_b = TheoryTask("A", world), TheoryTask("B", world)

    def make(task, reference_items):
        return TheoryEvaluator(params, task)

    res = localize(
        tmp_path / "run",
        make,
        task_a,
        n_discovery=300,
        n_heldout=300,
        seed=0,
        cross_tasks=[task_b],
        progress=False,
        command="test",
    )
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    primary = report["primary"]
    assert [0, c_head] in primary["heads"], (primary["heads"], c_load)
    ho = primary["heldout"]
    assert ho["gain"] > 0 and ho["ci_low"] > 0 and ho["p_value"] < 1e-3, ho
    b = primary["crosstask"]["theory-B"]
    assert b["gain"] < 0 and b["ci_high"] < 0 and b["p_value"] < 1e-3, b
    confirm = res["confirm"]["discovery"]
    assert confirm["intact_matches_baseline"] and confirm["intact_answers_differ"] == 0
    assert confirm["intact_logprob_max_diff"] == 0.0


def test_intact_comparator_note_says_what_differs():
    from cel_numpy.localize.report import intact_comparator_note

    rounding = {"intact_matches_baseline": False, "intact_answers_differ": 0,
                "intact_logprob_max_diff": 2.3e-5}  # fmt: skip
    note = intact_comparator_note(rounding)
    assert "agrees with the baseline on every answer" in note and "2e-05 nats" in note, note
    answers = dict(rounding, intact_answers_differ=3)
    assert intact_comparator_note(answers).endswith("differs from the baseline in 3 answers")
    old = {"intact_matches_baseline": False}  # a summary written before the counts existed
    assert intact_comparator_note(old).endswith("differs from the baseline")


def test_theory_items_round_trip_exactly(trained_theory):
    from cel_numpy.localize.evaluate import items_to_batch
    from cel_numpy.theory import sample_batch
    from cel_numpy.theory.data import TASK_A

    params, world = trained_theory
    task = TheoryTask("A", world)
    items = task.sample(np.random.default_rng(5), 7)
    batch = sample_batch(np.random.default_rng(5), world, 7, task=TASK_A)
    decoded = items_to_batch(items)
    assert np.array_equal(decoded.z, batch.z) and np.array_equal(decoded.types, batch.types)
    assert np.array_equal(decoded.y, batch.y)


def test_theory_evaluator_invariants(trained_theory):
    params, world = trained_theory
    task = TheoryTask("A", world)
    items = task.sample(np.random.default_rng(1), 50)
    ev = TheoryEvaluator(params, task)
    intact, single, again = ev.evaluate_many(items, [(), ((0, 1),), ((0, 1),)])
    assert single == again
    # joint ablation of every head predicts exactly 0
    everything = tuple((0, h) for h in range(ev.n_heads))
    assert np.all(ev.predict(items, everything) == 0.0)
    # mean ablation with the same items as reference keeps the batch mean of each head
    mean_ev = TheoryEvaluator(params, task, ablation="mean", reference_items=items)
    y_zero, y_mean = ev.predict(items, ((0, 2),)), mean_ev.predict(items, ((0, 2),))
    assert abs(y_mean.mean() - ev.predict(items, ()).mean()) < 1e-12
    assert not np.allclose(y_zero, y_mean)


# ----------------------------------------------------------- a planted harmful head in a real model


@pytest.mark.parametrize("scoring", ["generate", "choice"])
def test_planted_harmful_head_is_rank_one(tmp_path, scoring):
    from cel_numpy.localize.evaluate import LMEvaluator

    model = planted_model(np.random.default_rng(0), good=(0, 0), bad=(1, 1))
    task = PlantedTask(scoring)

    def make(t, reference_items):
        return LMEvaluator(model, t, batch_size=7, spec="planted")

    res = localize(
        tmp_path / "run",
        make,
        task,
        n_discovery=30,
        n_heldout=30,
        seed=0,
        progress=False,
        command="test",
    )
    assert res["baseline"]["correct"] == 0  # the harmful head wins everywhere
    assert res["joint"]["ranking"][0] == "L1H1"
    ho = res["heldout"]["heldout"]["finalists"][0]
    assert ho["name"] == "L1H1" and ho["rescued"] == 30 and ho["damaged"] == 0
    # removing the helpful head instead changes nothing: the wrong answer already wins
    screen = {c["name"]: c for c in res["screen"]["conditions"]}
    assert screen["L0H0"]["gain"] == 0


def test_lm_evaluator_choice_matches_manual_logprobs():
    from cel_numpy.localize.evaluate import LMEvaluator

    model = planted_model(np.random.default_rng(1))
    task = PlantedTask("choice")
    items = task.sample(np.random.default_rng(2), 5)
    ev = LMEvaluator(model, task, batch_size=3)
    (res,) = ev.evaluate_many(items, [((0, 2),)])
    for it, r in zip(items, res):
        scores = []
        for ch in it.choices:
            ids = model.tokenizer.encode(it.prompt + ch)
            logits = np.asarray(model.logits([ids], ablate=[(0, 2)]), dtype=np.float64)[
                0, -2
            ]  # predicts last
            logp = logits - np.log(np.exp(logits - logits.max()).sum()) - logits.max()
            scores.append(logp[ids[-1]])
        assert r.answer == it.choices[int(np.argmax(scores))]
    # batch size does not change results (left padding + attention mask; log-probs to rounding)
    (one,) = LMEvaluator(model, task, batch_size=1).evaluate_many(items, [((0, 2),)])
    assert [(r.item_id, r.correct, r.answer) for r in one] == [
        (r.item_id, r.correct, r.answer) for r in res
    ]
    assert [r.ref_logprob for r in one] == pytest.approx([r.ref_logprob for r in res], abs=1e-12)


# --------------------------------------------------------------------------- command line


def test_cli_theory_stages_and_resume(tmp_path, trained_theory, capsys):
    params, _ = trained_theory
    np.savez(tmp_path / "params.npz", K=params["K"], V=params["V"])
    base = [
        "localize",
        "--model",
        f"theory:{tmp_path / 'params.npz'}",
        "--task",
        "A",
        "--discovery",
        "60",
        "--heldout",
        "60",
        "--out",
        str(tmp_path / "run"),
        "--quiet",
    ]
    assert localize_cli(base + ["--stage", "screen"]) == 0
    assert (tmp_path / "run" / "screen.done.json").exists() and not (
        tmp_path / "run" / "joint.jsonl"
    ).exists()
    assert localize_cli(base) == 0
    out = capsys.readouterr().out
    assert "rank 1:" in out and "report.md" in out
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert list(report["primary"]["crosstask"]) == ["theory-B"]
    with pytest.raises(UserError, match="--stage must be one of"):
        localize_cli(base + ["--stage", "nope"])
    with pytest.raises(UserError, match="tasks A and B"):
        localize_cli(base[:4] + ["arithmetic"] + base[5:])


def test_cli_plan_refuses_what_the_run_refuses_before_its_first_evaluation(tmp_path):
    """`--plan` reads the model's tokenizer (not its weights) and makes the run's checks of the
    prompts: a model without tokenizer files, a prompt past the context, a chat task on a model
    without a chat template and a --batch-size past the memory are refused by the plan with the
    run's own message, not planned."""
    from helpers import copy_fixture, with_tokenizer

    bare = copy_fixture(tmp_path, "tiny_llama")
    (tmp_path / "with").mkdir()
    model = with_tokenizer(copy_fixture(tmp_path / "with", "tiny_llama"))
    n_ctx = json.loads((model / "config.json").read_text())["max_position_embeddings"]
    rows = [{"id": k, "prompt": f"Item {k} says", "choices": ["yes", "no"], "answer": k % 2}
            for k in range(20)]  # fmt: skip
    task = tmp_path / "tiny.jsonl"
    task.write_text("".join(json.dumps(r) + "\n" for r in rows))
    chat = tmp_path / "chat.jsonl"  # the tiny model has no chat template
    chat.write_text(json.dumps({"options": {"chat": True}}) + "\n" + task.read_text())
    long = tmp_path / "long.jsonl"
    rows[3]["prompt"] = " word" * (2 * n_ctx)
    long.write_text("".join(json.dumps(r) + "\n" for r in rows))

    def argv(model_dir, task_file, *extra):
        return ["localize", "--model", str(model_dir), "--task", str(task_file), "--discovery",
                "6", "--heldout", "8", "--cross-tasks", "none", "--out", str(tmp_path / "run"),
                "--quiet", "--workers", "1", *extra]  # fmt: skip

    assert localize_cli(argv(model, task, "--plan")) == 0
    for args, message in (
        (argv(bare, task), "the model has no tokenizer files"),
        (argv(model, long), "a prompt needs|at least [0-9,]+ tokens"),
        (argv(model, chat), "has no chat template"),
        (argv(model, task, "--batch-size", str(10**11)), "--batch-size 100000000000 needs"),
    ):
        for flags in (args, [*args, "--plan"]):  # the same refusal from the plan and the run
            with pytest.raises(UserError, match=message):
                localize_cli(flags)
    run = tmp_path / "run"  # made by the run (the command line removes it again), left empty
    assert run.is_dir() and not any(run.iterdir())


def test_cli_plan_counts_every_stage_and_writes_nothing(tmp_path, capsys):
    """`--plan` on the tiny Llama (2 layers x 4 heads, from its config.json) and a task file:
    the table before any work (nothing written), then after the screen: finished stages marked,
    the rest timed at the screen's recorded pace; bad --plan options are one line."""
    from helpers import copy_fixture, with_tokenizer

    model = with_tokenizer(copy_fixture(tmp_path, "tiny_llama"))
    config = json.loads((model / "config.json").read_text())
    n_heads = config["num_hidden_layers"] * config["num_attention_heads"]
    rows = [{"id": k, "prompt": f"Item {k} says", "choices": ["yes", "no"], "answer": k % 2}
            for k in range(20)]  # fmt: skip
    task = tmp_path / "tiny.jsonl"
    task.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "run"
    base = ["localize", "--model", str(model), "--task", str(task), "--discovery", "6",
            "--heldout", "8", "--null-sets", "3", "--cross-tasks", "none", "--out",
            str(out), "--quiet", "--workers", "1"]  # fmt: skip
    assert localize_cli(base + ["--plan"]) == 0
    table = capsys.readouterr().out
    assert not out.exists()
    budget = n_heads + math.comb(n_heads, 2) + math.comb(n_heads, 3) if n_heads < 10 else 175
    nominees = min(10, n_heads)
    want = {"baseline": (2, 6), "screen": (n_heads, 6), "joint": (budget - nominees, 6),
            "confirm": (11, 6), "heldout": (11, 8), "nulls": (3, 8)}  # fmt: skip
    for stage, (conditions, items) in want.items():
        line = next(x for x in table.splitlines() if x.startswith(stage + " "))
        assert f"{conditions} x {items}" in line and "to run" in line, line
    total = sum(c * i for c, i in want.values())
    assert next(x for x in table.splitlines() if x.startswith("total")).split()[-1] == f"{total:,}"
    assert "no pace known" in table

    assert localize_cli(base + ["--stage", "screen"]) == 0
    capsys.readouterr()
    assert localize_cli(base + ["--plan"]) == 0
    table = capsys.readouterr().out
    lines = {x.split()[0]: x for x in table.splitlines()}
    assert lines["baseline"].endswith("done") and lines["screen"].endswith("done")
    assert "about" in lines["joint"] and "time left" in table
    done = json.loads((out / "screen.done.json").read_text())
    pace = done["seconds"] / done["n_records"]
    assert f"at {pace:.3f} s of wall time per evaluation (the screen stage of {out}" in table
    left = total - 2 * 6 - n_heads * 6
    assert lines["left"].split()[-1] == f"{left:,}"

    with pytest.raises(OptionError, match="--pace-from .*: no finished screen or joint stage"):
        localize_cli(base + ["--plan", "--pace-from", str(tmp_path)])
    with pytest.raises(OptionError, match="describes a different run \\(panel_sizes"):
        localize_cli([*base[:6], "5", *base[7:], "--plan"])  # --discovery 5, not 6
    # another run's --out is refused, not counted as done: by task file, ablation, cross task,
    # screen, and (a copy whose manifest names another shape) by model
    other = tmp_path / "other.jsonl"
    other.write_text(task.read_text().replace("says", "reads"))
    for change, field in (
        ({"--task": str(other)}, "task"),
        ({"--ablation": "mean"}, "model.ablation"),
        ({"--cross-tasks": str(other)}, "panel_sizes.cross-other"),
        ({"--screen": "gradient"}, "screen"),
    ):
        flags = [*base, "--plan"]
        for option, value in change.items():
            if option in flags:
                flags[flags.index(option) + 1] = value
            else:
                flags += [option, value]
        with pytest.raises(OptionError, match=f"describes a different run \\({field}"):
            localize_cli(flags)
    reshaped = tmp_path / "reshaped"
    shutil.copytree(out, reshaped)
    manifest = json.loads((reshaped / "manifest.json").read_text())
    manifest["model"]["n_heads"] += 1
    (reshaped / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(OptionError, match="describes a different run \\(model.n_heads: "):
        localize_cli([*base[:-4], str(reshaped), *base[-3:], "--plan"])
    # its own run, with a cross task (its panel is in the manifest) and a second seed and
    # tie-break: the plan counts its stages, and refuses it with another tie-break
    crossed = [*base[:-4], str(tmp_path / "crossed"), *base[-3:]]
    crossed[crossed.index("--cross-tasks") + 1] = str(other)
    crossed += ["--tie-break", "coordinates", "--null-seed", "5"]
    assert localize_cli(crossed + ["--stage", "baseline"]) == 0
    capsys.readouterr()
    assert localize_cli(crossed + ["--plan"]) == 0
    assert "done" in next(x for x in capsys.readouterr().out.splitlines() if "baseline" in x)
    for option, value, field in (("--tie-break", "logprob", "tie_break"),
                                 ("--null-seed", "6", "null_sets.seed")):  # fmt: skip
        flags = list(crossed)
        flags[flags.index(option) + 1] = value
        with pytest.raises(OptionError, match=f"different run \\({field}: "):
            localize_cli(flags + ["--plan"])
    assert localize_cli(base + ["--plan", "--stage", "joint"]) == 0  # up to --stage only
    assert [x.split()[0] for x in capsys.readouterr().out.splitlines()[2:6]] == [
        "baseline", "screen", "joint", "total"
    ]  # fmt: skip
    with pytest.raises(OptionError, match="--pace-from goes with --plan"):
        localize_cli(base + ["--pace-from", str(out)])
    with pytest.raises(OptionError, match="--plan is for language models"):
        localize_cli(["localize", "--model", "theory", "--task", "A", "--out",
                      str(tmp_path / "t"), "--plan"])  # fmt: skip


def test_intact_memory_sets_each_evaluators_budget_and_leaves_results_alone(
    tmp_path, capsys, monkeypatch
):
    """--intact-memory GB reaches every evaluator (here 1e-9 GB: one byte, nothing kept, so the
    intact passes are recomputed in every chunk) and the records equal the default run's; the
    worker plan prices the model's activations, more for a task that generates its answers
    (the K/V kept for decoding)."""
    from helpers import copy_fixture, with_tokenizer

    from cel_numpy.localize import cli, evaluate

    seen = []
    real_init = evaluate.LMEvaluator.__init__

    def spy(self, *a, **kw):
        seen.append(kw.get("intact_cache_bytes"))
        real_init(self, *a, **kw)

    monkeypatch.setattr(evaluate.LMEvaluator, "__init__", spy)
    pools = []  # the budget also reaches the worker plan (--workers auto counts it per worker)
    real_pool = cli.make_worker_pool

    activations = []  # and the price of each worker's activations, from the model's shapes

    def pool_spy(*a, **kw):
        pools.append(kw.get("intact_gigabytes"))
        activations.append(kw.get("activations"))
        return real_pool(*a, **kw)

    monkeypatch.setattr(cli, "make_worker_pool", pool_spy)
    model = with_tokenizer(copy_fixture(tmp_path, "tiny_llama"))
    rows = [{"id": k, "prompt": f"Item {k} says", "choices": ["yes", "no"], "answer": k % 2}
            for k in range(20)]  # fmt: skip
    task = tmp_path / "tiny.jsonl"
    task.write_text("".join(json.dumps(r) + "\n" for r in rows))
    base = ["localize", "--model", str(model), "--task", str(task), "--discovery", "6",
            "--heldout", "8", "--cross-tasks", "none", "--workers", "1",
            "--stage", "screen"]  # fmt: skip
    assert localize_cli([*base, "--out", str(tmp_path / "default")]) == 0
    capsys.readouterr()
    n_default = len(seen)
    assert localize_cli([*base, "--out", str(tmp_path / "tiny"), "--intact-memory", "1e-9"]) == 0
    err = capsys.readouterr().err
    assert "each evaluator keeps up to 0.0 GB of intact passes (--intact-memory)" in err
    assert pools == [None, 1e-9]
    from cel_numpy.localize.workers import activation_bytes
    from cel_numpy.models.loaders import read_model_config

    assert activations == [activation_bytes(read_model_config(str(model)))] * 2
    assert n_default > 0 and len(seen) > n_default
    assert all(b != 1 for b in seen[:n_default]) and all(b == 1 for b in seen[n_default:])
    for stage in ("baseline", "screen"):
        records = [(tmp_path / d / f"{stage}.jsonl.gz").read_bytes() for d in ("default", "tiny")]
        assert records[0] == records[1], stage
    gen = tmp_path / "gen.jsonl"
    gen.write_text("".join(json.dumps({"id": k, "prompt": f"Item {k} says", "answer": " yes"})
                           + "\n" for k in range(20)))  # fmt: skip
    assert base[3:5] == ["--task", str(task)] and base[-2:] == ["--stage", "screen"]
    run = [*base[:4], str(gen), *base[5:-1], "baseline", "--out", str(tmp_path / "gen")]
    assert localize_cli(run) == 0
    config = read_model_config(str(model))
    assert activations[-1] == activation_bytes(config, generation=True) > activations[0]


def test_stage_pace_counts_only_what_the_finishing_process_evaluated(tmp_path):
    """A stage resumed over two processes: 1,000 records, 900 written by the first; the second
    took 10 s for the other 100, so the pace is 0.1 s, not 0.01 s per evaluation."""
    done = {"stage": "joint", "n_records": 1000, "seconds": 10.0, "records_resumed": 900}
    (tmp_path / "joint.done.json").write_text(json.dumps(done))
    assert stage_pace(tmp_path) == (pytest.approx(0.1), "joint")
    del done["records_resumed"]  # a done-file from before the field: all records count
    (tmp_path / "joint.done.json").write_text(json.dumps(done))
    assert stage_pace(tmp_path) == (pytest.approx(0.01), "joint")


def test_evaluation_plan_on_tiny_models_sizes_the_pool_by_the_largest_rank1_size():
    """With 4 heads the largest pool is of pairs (6 sets), with 2 heads of single heads (2),
    and a pool smaller than the budget is every set (no division by zero)."""
    from cel_numpy.localize.routine import evaluation_plan

    for n_heads, pool in ((4, 6), (2, 2), (1, 1)):
        rows = {s: (c, i) for s, c, i in evaluation_plan(n_heads, 5, 7, matched_null=20)}
        assert rows["matched-pool"] == (pool, 5)
        assert 1 <= rows["matched-null"][0] <= pool
