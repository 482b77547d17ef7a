"""The label-bias control (cel_numpy.localize.label_bias) against brute force, and the choice
log-probabilities it reads (LMEvaluator.choice_logprobs) against the routine's own picks."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from helpers import PlantedTask, planted_model

from cel_numpy.localize.label_bias import (
    best_offset,
    correct_with_offset,
    label_margins,
    offset_for_picks,
    picks_second,
    roc_auc,
)
from cel_numpy.tasks.base import Item


def _random_panel(rng, n, ties=False):
    margins = rng.normal(size=n)
    if ties:
        margins = np.round(margins, 1)  # many equal margins
    is_second = rng.random(n) < 1 / (1 + np.exp(-2 * margins))  # informative, not perfectly
    return margins, is_second


@pytest.mark.parametrize("ties", [False, True])
def test_roc_auc_is_the_share_of_ordered_pairs(ties):
    rng = np.random.default_rng(0)
    m, pos = _random_panel(rng, 60, ties)
    pairs = [(a, b) for a, b in itertools.product(m[pos], m[~pos])]
    want = np.mean([1.0 if a > b else 0.5 if a == b else 0.0 for a, b in pairs])
    assert roc_auc(m, pos) == pytest.approx(want, abs=1e-12)
    # a constant moves every margin alike: the ranking, and so the AUC, does not change
    assert roc_auc(m + 3.7, pos) == pytest.approx(want, abs=1e-12)
    assert roc_auc(m, ~pos) == pytest.approx(1 - want, abs=1e-12)
    with pytest.raises(ValueError, match="both labels"):
        roc_auc(m, np.ones(len(m), bool))


@pytest.mark.parametrize("seed", range(5))
def test_best_offset_beats_every_constant_on_a_fine_grid(seed):
    rng = np.random.default_rng(seed)
    m, pos = _random_panel(rng, 40, ties=seed % 2 == 1)
    m = m - 1.0  # a model biased toward the first label, as SmolLM2 is toward " no"
    b = best_offset(m, pos)
    got = correct_with_offset(m, pos, b).sum()
    grid = np.linspace(-6, 6, 24001)
    best_on_grid = max(correct_with_offset(m, pos, g).sum() for g in grid)
    assert got == best_on_grid
    assert not np.any(np.isclose(m + b, 0.0))  # never on the boundary


def test_best_offset_is_zero_when_nothing_beats_it_and_the_nearest_otherwise():
    m = np.array([-2.0, -1.0, 1.0, 2.0])
    assert best_offset(m, np.array([False, False, True, True])) == 0.0
    # all second-label items: any constant above 2 makes all right; the nearest is (beyond 2)
    b = best_offset(m, np.ones(4, bool))
    assert correct_with_offset(m, np.ones(4, bool), b).all() and b == 3.0
    # the references reversed from the ranking: 0 gets none right, all-first or all-second 2
    reversed_ = np.array([True, True, False, False])
    assert abs(best_offset(m, reversed_)) == 3.0
    assert correct_with_offset(m, reversed_, best_offset(m, reversed_)).sum() == 2


def test_offset_for_picks_gives_exactly_that_many_second_label_picks():
    rng = np.random.default_rng(3)
    m = rng.normal(size=25)
    for k in range(26):
        assert picks_second(m, offset_for_picks(m, k)).sum() == k
    with pytest.raises(ValueError, match="tie"):
        offset_for_picks(np.array([0.0, 1.0, 1.0, 2.0]), 2)
    with pytest.raises(ValueError, match="0..4"):
        offset_for_picks(np.zeros(4), 5)


def test_picks_follow_the_first_maximum_rule():
    assert picks_second(np.array([-0.1, 0.0, 0.1])).tolist() == [False, False, True]


def test_label_margins_need_one_fixed_pair_of_labels():
    items = [
        Item("t", "s", "p1", " yes", (" no", " yes")),
        Item("t", "s", "p2", " no", (" no", " yes")),
    ]
    margins, second = label_margins(items, np.array([[-1.0, -3.0], [-2.0, -0.5]]))
    assert margins.tolist() == [-2.0, 1.5] and second.tolist() == [True, False]
    other = [items[0], Item("t", "s", "p3", " yes", (" yes", " no"))]
    with pytest.raises(ValueError, match="same two choices"):
        label_margins(other, np.zeros((2, 2)))
    with pytest.raises(ValueError, match=r"\(2, 2\)"):
        label_margins(items, np.zeros((2, 3)))
    with pytest.raises(ValueError, match="not finite"):
        label_margins(items, np.array([[0.0, -np.inf], [0.0, 0.0]]))


@pytest.mark.parametrize("fast", [True, False])
def test_choice_logprobs_are_what_the_routine_picks_from(fast):
    """The scores behind evaluate_many: their first maximum is its pick, the reference's entry
    is its recorded log-probability, and the fast engine equals the plain forward."""
    from cel_numpy.localize.evaluate import LMEvaluator

    model = planted_model(np.random.default_rng(1))
    task = PlantedTask("choice")
    items = task.sample(np.random.default_rng(2), 7)
    conds = [(), ((1, 1),), ((0, 0), (1, 1))]
    ev = LMEvaluator(model, task, batch_size=3, fast=fast)
    scores = ev.choice_logprobs(items, conds)
    assert scores.shape == (3, 7, 2)
    plain = LMEvaluator(model, task, batch_size=2, fast=False).choice_logprobs(items, conds)
    np.testing.assert_allclose(scores, plain, atol=1e-6, rtol=0)
    results = ev.evaluate_many(items, conds)
    for k, res in enumerate(results):
        for i, r in enumerate(res):
            assert r.answer == items[i].choices[int(np.argmax(scores[k, i]))]
            assert r.ref_logprob == pytest.approx(scores[k, i, 0], abs=1e-9)
    # the planted bad head pushes toward "b": removing it raises "a" on every item
    assert np.all(scores[1, :, 0] > scores[0, :, 0])
    with pytest.raises(ValueError, match="not a choice task"):
        LMEvaluator(model, PlantedTask("generate")).choice_logprobs(items, conds)


def test_auc_difference_interval_is_zero_for_a_bias_shift_and_positive_for_a_better_reader():
    from cel_numpy.localize.label_bias import auc_difference_interval

    rng = np.random.default_rng(4)
    m, pos = _random_panel(rng, 120)
    clusters = [f"c{i // 2}" for i in range(120)]  # pairs of items share a cluster
    # a constant, or any increasing transform, keeps the ranking: the difference is exactly 0
    assert auc_difference_interval(clusters, m, m - 2.0, pos, n_resamples=200) == (0.0, 0.0)
    assert auc_difference_interval(clusters, m, np.exp(m), pos, n_resamples=200) == (0.0, 0.0)
    # a reader that ranks every second-label item first: AUC 1, above the noisy one's
    perfect = np.where(pos, 1.0, -1.0) + 0.01 * m
    lo, hi = auc_difference_interval(clusters, m, perfect, pos, n_resamples=200)
    assert 0 < lo <= hi <= 1 - roc_auc(m, pos) + 0.2


def test_edge_cases_refuse_instead_of_lying():
    from cel_numpy.localize.label_bias import auc_difference_interval

    m = np.array([0.3, -0.2, 0.1, 0.5])
    with pytest.raises(ValueError, match="both labels"):
        auc_difference_interval(list("aabb"), m, m, np.ones(4, bool), n_resamples=5)
    x = 0.3  # m + b rounds so that neither or both sides pass for this x (1.0 happens to work)
    adjacent = np.array([np.nextafter(x, np.inf), x, x - 5])  # no float between the first two
    with pytest.raises(ValueError, match="one float apart"):
        offset_for_picks(adjacent, 1)
    # a margin of exactly 0 picks the first label; best_offset keeps 0 when nothing beats it
    zero = np.array([-1.0, 0.0, 1.0])
    assert best_offset(zero, np.array([False, False, True])) == 0.0


def test_picks_equal_the_routines_first_maximum_on_exact_ties():
    from cel_numpy.localize.scoring import choice_results

    items = [Item("t", "s", f"p{i}", " yes", (" no", " yes")) for i in range(3)]
    scores = np.array([[-1.0, -1.0], [-2.0, -1.0], [-1.0, -2.0]])  # a tie, yes, no
    task = PlantedTask("choice")
    picked = [r.answer == " yes" for r in choice_results(task, items, scores)]
    margins, _ = label_margins(items, scores)
    assert picks_second(margins).tolist() == picked == [False, True, False]


def test_choice_logprobs_multi_token_choices_and_no_conditions():
    """Multi-token candidates (the prefix-tree path) with references on either side: the fast
    engine equals the plain forward, and the reference's score is the recorded log-prob."""
    from cel_numpy.localize.evaluate import LMEvaluator

    model = planted_model(np.random.default_rng(5))
    task = PlantedTask("choice")
    prompts = ["xyx", "yyxy", "xxxyy", "yx", "xyyxyx"]
    items = [Item(task.name, "s", p, ("ab", "bba")[k % 2], ("ab", "bba")) for k, p in
             enumerate(prompts)]  # fmt: skip
    conds = [(), ((1, 1),)]
    fast = LMEvaluator(model, task, batch_size=2).choice_logprobs(items, conds)
    plain = LMEvaluator(model, task, batch_size=3, fast=False).choice_logprobs(items, conds)
    np.testing.assert_allclose(fast, plain, atol=1e-6, rtol=0)
    results = LMEvaluator(model, task, fast=False).evaluate_many(items, conds)
    for k, res in enumerate(results):
        for it, r, row in zip(items, res, fast[k]):
            assert r.ref_logprob == pytest.approx(row[it.choices.index(it.answer)], abs=1e-6)
    for f in (True, False):
        empty = LMEvaluator(model, task, fast=f).choice_logprobs(items, [])
        assert empty.shape == (0, 5, 2)


def test_script_reproduces_a_run_and_refuses_another_model(tmp_path):
    """scripts/measure_label_bias.py on a test-heads run of the tiny Llama fixture with a yes/no
    task file: its raw gain is the run's, every held-out pick and reference log-prob matches
    the records, the pick-matched constant gives the intact model the set's number of "yes"
    picks; with the weights changed it refuses."""
    import json
    import runpy
    from pathlib import Path

    from helpers import copy_fixture, rewrite_safetensors, run_cli, with_tokenizer

    model = with_tokenizer(copy_fixture(tmp_path, "tiny_llama"))
    rows = [{"options": {"separator": " "}}]
    rows += [{"id": k, "prompt": f"Item {k} is {'odd' if k % 2 else 'even'}?",
              "choices": ["no", "yes"], "answer": k % 2} for k in range(40)]  # fmt: skip
    task = tmp_path / "yesno.jsonl"
    task.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = tmp_path / "run"
    argv = ["test-heads", "--model", str(model), "--task", str(task), "--heads", "L0H1+L1H0",
            "--discovery", "10", "--heldout", "30", "--workers", "1", "--out", str(run),
            "--quiet"]  # fmt: skip
    status, err = run_cli(argv)
    assert status == 0, err
    script = runpy.run_path(str(Path(__file__).parents[1] / "scripts" / "measure_label_bias.py"))
    out = tmp_path / "bias.json"
    script["main"]([str(run), "--json", str(out)])
    got = json.loads(out.read_text())
    ho = json.loads((run / "report.json").read_text())["primary"]["heldout"]
    assert got["set"] == "L0H1+L1H0" and got["labels"] == [" no", " yes"]
    h = got["heldout"]
    assert (h["correct"]["intact"], h["correct"]["ablated"]) == (
        ho["intact_correct"],
        ho["correct"],
    )
    assert h["gain"]["p_value"] == ho["p_value"]
    assert "heldout intact: 30 picks and reference log-probs match" in " ".join(got["checks"])
    assert "heldout L0H1+L1H0: 30 picks" in " ".join(got["checks"])
    m = np.array(got["margins"]["heldout"]["intact"])
    assert (m + h["pick_matched_offset"] > 0).sum() == h["picks_second"]["ablated"]

    def scale(tensors):
        for name in tensors:
            if "o_proj" in name or "down_proj" in name:
                tensors[name] = tensors[name] * 3.0

    rewrite_safetensors(model, scale)
    with pytest.raises(SystemExit, match="the model or code differs from the run's"):
        script["main"]([str(run)])
