"""The fast screening engine is exact: it matches the plain forward and the naive evaluator.

float32 tolerance: logits agree to 1e-4 absolute on the fixtures (values of order 1; the plain
and fast paths sum in different orders and GELU is computed as h sigmoid(2u) instead of
0.5 h (1 + tanh u)). Answers and correctness must be identical.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import PlantedTask, planted_model

import cel_numpy as cn
from cel_numpy.localize.evaluate import LMEvaluator
from cel_numpy.models.fast import ablated_readout, forward, generate_conditions, prepare

HERE = Path(__file__).parent

FIXTURES = [HERE / "fixtures" / name for name in ("tiny_gpt2", "tiny_llama", "tiny_llama_tied")]
ATOL = 1e-4


def _batch(model, rng, B=5):
    seqs = [
        list(rng.integers(0, model.config.vocab_size, size=int(rng.integers(3, 9))))
        for _ in range(B)
    ]
    return model.pad(seqs)


def _conditions(L, H):
    singles = [((l, h),) for l in range(L) for h in range(H)]
    joint = [((0, 0), (L - 1, H - 1)), ((0, 0), (0, 1)), ((0, 1), (L - 1, 0))]
    if L > 2:
        joint += [((0, 0), (1, 1), (2, 0)), ((0, 0), (1, 1), (2, 1)), ((1, 0), (1, 1), (L - 1, 0))]
    return [()] + singles + joint


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_fast_forward_matches_plain(path):
    model = cn.load_model(path)
    ids, mask = _batch(model, np.random.default_rng(0))
    plain = model.logits(ids, attention_mask=mask)
    fast = forward(prepare(model), ids, mask)
    valid = mask.astype(bool)
    assert fast.dtype == np.float32
    np.testing.assert_allclose(fast[valid], plain[valid], atol=ATOL, rtol=0)
    cols = np.array([3, 1, 7])
    last = forward(prepare(model), ids, mask, positions=slice(-1, None), columns=cols)
    np.testing.assert_allclose(last, plain[:, -1:, cols], atol=ATOL, rtol=0)


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
@pytest.mark.parametrize("ablation", ["zero", "mean"])
def test_ablated_readout_matches_one_forward_per_condition(path, ablation):
    model = cn.load_model(path)
    rng = np.random.default_rng(1)
    ids, mask = _batch(model, rng)
    c = model.config
    conds = _conditions(c.n_layers, c.n_heads)
    mean_z = model.mean_z(ids, mask) if ablation == "mean" else None
    # small waves so that waves, stacking and prefix sharing are all exercised
    got = ablated_readout(
        prepare(model), ids, mask, conds, mean_z, readout=slice(-3, None), max_rows=3 * ids.size
    )
    for cond, lg in zip(conds, got):
        ref = model.logits(
            ids, attention_mask=mask, ablate=list(cond) or None, ablation=ablation, mean_z=mean_z
        )
        np.testing.assert_allclose(lg, ref[:, -3:], atol=ATOL, rtol=0, err_msg=f"condition {cond}")


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_generate_conditions_matches_generate_ids(path):
    model = cn.load_model(path)
    rng = np.random.default_rng(2)
    prompts = [
        list(rng.integers(0, model.config.vocab_size, size=int(rng.integers(2, 7))))
        for _ in range(4)
    ]
    c = model.config
    conds = _conditions(c.n_layers, c.n_heads)[:8]
    stop = lambda ids: ids[-1] == 5
    got = generate_conditions(
        prepare(model), prompts, model.pad_id, conds, None, 6, eos=3, is_done=stop, max_rows=40
    )
    for cond, new in zip(conds, got):
        ref = model.generate_ids(prompts, 6, ablate=list(cond) or None, stop_at_eos=False)
        for r, g in zip(ref, new):
            r = [t for t in r]
            cut = next((i for i, t in enumerate(r) if t == 3), len(r))  # eos ends the row, excluded
            r = r[:cut]
            cut = next(
                (i + 1 for i, t in enumerate(r) if t == 5), len(r)
            )  # stop test: the token is kept
            assert g == r[:cut], f"condition {cond}"


# --------------------------------------------------------------------------- evaluator: fast == naive


@pytest.mark.parametrize("scoring", ["generate", "choice"])
@pytest.mark.parametrize("ablation", ["zero", "mean"])
def test_evaluator_fast_equals_naive_planted(scoring, ablation):
    model = planted_model(np.random.default_rng(3))
    task = PlantedTask(scoring)
    items = task.sample(np.random.default_rng(4), 11)
    conds = _conditions(model.config.n_layers, model.config.n_heads)
    kw = dict(
        ablation=ablation, reference_items=items if ablation == "mean" else None, batch_size=4
    )
    fast = LMEvaluator(model, task, **kw).evaluate_many(items, conds)
    naive = LMEvaluator(model, task, fast=False, **kw).evaluate_many(items, conds)
    assert fast == naive


def test_localization_ranking_fast_equals_naive(tmp_path):
    from cel_numpy.localize.routine import localize

    model = planted_model(np.random.default_rng(0))
    task = PlantedTask("generate")
    runs = {}
    for fast in (True, False):
        make = lambda t, ref, fast=fast: LMEvaluator(model, t, batch_size=7, fast=fast)
        runs[fast] = localize(
            tmp_path / str(fast),
            make,
            task,
            n_discovery=20,
            n_heldout=20,
            seed=0,
            progress=False,
            command="test",
            until="joint",
        )
    assert runs[True]["screen"] == runs[False]["screen"]
    assert runs[True]["joint"] == runs[False]["joint"]


# --------------------------------------------------------------------------- SmolLM2 (must fail, not skip)


@pytest.fixture(scope="module")
def smollm2():
    return cn.load_model("smollm2")


def test_smollm2_fast_forward_and_ablations(smollm2):
    m = smollm2
    prompts = [
        m.encode(p) for p in ["The capital of France is", "Question: What is 48 plus 76?\nAnswer:"]
    ]
    ids, mask = m.pad(prompts)
    plain = m.logits(ids, attention_mask=mask)
    fast = forward(prepare(m), ids, mask)
    valid = mask.astype(bool)
    np.testing.assert_allclose(
        fast[valid], plain[valid], atol=2e-3, rtol=0
    )  # logits of order 10-30
    conds = [(), ((0, 0),), ((14, 4),), ((29, 8),), ((3, 1), (20, 2)), ((3, 1), (20, 5), (27, 0))]
    got = ablated_readout(prepare(m), ids, mask, conds, readout=slice(-1, None))
    for cond, lg in zip(conds, got):
        ref = m.next_token_logits(ids, mask, ablate=list(cond) or None)
        np.testing.assert_allclose(lg[:, 0], ref, atol=2e-3, rtol=0, err_msg=f"condition {cond}")
        assert np.array_equal(lg[:, 0].argmax(-1), ref.argmax(-1))


@pytest.mark.parametrize("task_name", ["arithmetic", "ioi"])
def test_smollm2_evaluator_fast_equals_naive(smollm2, task_name):
    from cel_numpy.tasks import get_task
    from cel_numpy.tasks.panels import make_panels

    task = get_task(task_name)
    items, _ = make_panels(task, 4, 1, 0)
    conds = [(), ((0, 3),), ((29, 1),), ((2, 1), (25, 0))]
    fast = LMEvaluator(smollm2, task, batch_size=4).evaluate_many(items, conds)
    naive = LMEvaluator(smollm2, task, batch_size=4, fast=False).evaluate_many(items, conds)
    assert fast == naive
