"""Parallel evaluation gives records identical to the sequential run: process pool,
Dask cluster, CLI."""

from __future__ import annotations

import pickle
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pytest
from helpers import PlantedTask, planted_model

from cel_numpy.localize.evaluate import LMEvaluator, TheoryEvaluator, TheoryTask
from cel_numpy.localize.routine import localize

STAGES = ("baseline", "screen", "joint")


def _same_records(a, b):
    for stage in STAGES:
        assert (a / f"{stage}.jsonl").read_bytes() == (b / f"{stage}.jsonl").read_bytes(), stage


@pytest.fixture(scope="module")
def theory():
    from cel_numpy.theory import TrainConfig, train

    config = TrainConfig(steps=300, log_every=300)
    return train(config, np.random.default_rng(0)).params, config.world


def _theory_run(out, theory, executor=None):
    params, world = theory
    make = lambda task, reference_items: TheoryEvaluator(params, task)
    return localize(
        out,
        make,
        TheoryTask("A", world),
        n_discovery=60,
        n_heldout=20,
        seed=0,
        until="joint",
        progress=False,
        command="test",
        executor=executor,
        chunk_size=2,
        n_nominees=3,
    )


def test_process_pool_lm_records_identical(tmp_path):
    model = planted_model(np.random.default_rng(0))
    task = PlantedTask("generate")
    make = lambda t, ref: LMEvaluator(model, t, batch_size=7)
    kw = dict(
        n_discovery=20,
        n_heldout=10,
        seed=0,
        until="joint",
        progress=False,
        command="test",
        chunk_size=2,
    )
    localize(tmp_path / "seq", make, task, **kw)
    with ProcessPoolExecutor(max_workers=2) as pool:
        localize(tmp_path / "par", make, task, executor=pool, **kw)
    _same_records(tmp_path / "seq", tmp_path / "par")


def test_dask_local_cluster_records_identical(tmp_path, theory):
    # the [test] extra, installed by `make test`: fails, not skips
    import dask.distributed as distributed

    _theory_run(tmp_path / "seq", theory)
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster:
        with distributed.Client(cluster) as client:
            _theory_run(tmp_path / "dask", theory, executor=client.get_executor())
    _same_records(tmp_path / "seq", tmp_path / "dask")


@pytest.mark.download
def test_lm_evaluator_pickles_as_its_spec():
    from cel_numpy.models.loaders import load_model
    from cel_numpy.tasks import get_task
    from cel_numpy.tasks.panels import make_panels

    model = load_model("smollm2")
    task = get_task("ioi")
    items, _ = make_panels(task, 3, 1, 0)
    ev = LMEvaluator(model, task, spec="smollm2", ablation="mean", reference_items=items)
    blob = pickle.dumps(ev)
    assert len(blob) < 1 << 20  # the spec, not 500 MB of weights
    clone = pickle.loads(blob)
    assert clone.identity() == ev.identity()
    conds = [(), ((3, 1),)]
    assert clone.evaluate_many(items, conds) == ev.evaluate_many(items, conds)


@pytest.mark.download  # fetches the benchmark data, a model or a vocabulary
def test_a_worker_keeps_its_evaluator_across_chunks():
    """Every chunk arrives as a new pickle of the same evaluator: the worker reuses the one it
    built (its intact answers stay computed), and another evaluator gets a new one."""
    from cel_numpy.models.loaders import load_model
    from cel_numpy.tasks import get_task
    from cel_numpy.tasks.panels import make_panels

    model = load_model("smollm2")
    task = get_task("capitals")
    items, _ = make_panels(task, 3, 1, 0)
    ev = LMEvaluator(model, task, spec="smollm2")
    first = pickle.loads(pickle.dumps(ev))
    conds = [((29, h),) for h in range(4)]  # enough conditions for the intact answers
    assert first.evaluate_many(items, conds) == ev.evaluate_many(items, conds)
    assert "_intact_memo" in first.__dict__
    assert pickle.loads(pickle.dumps(ev)) is first
    other = LMEvaluator(model, task, spec="smollm2", batch_size=3)
    assert pickle.loads(pickle.dumps(other)) is not first
    roomy = LMEvaluator(model, task, spec="smollm2", intact_cache_bytes=5 << 30)
    assert pickle.loads(pickle.dumps(roomy)).intact_cache_bytes == 5 << 30  # the budget travels


@pytest.mark.parametrize(("value", "expected"), [("auto", "auto"), ("3", 3), ("1", 1)])
def test_workers_option_reads_auto_or_a_number(value, expected):
    from cel_numpy.localize.cli import workers_option

    assert workers_option(value) == expected


def test_workers_option_refuses_other_words(tmp_path):
    from helpers import run_cli

    status, err = run_cli(
        ["localize", "--model", "theory", "--task", "A", "--out", str(tmp_path / "r"),
         "--workers", "many"]
    )  # fmt: skip
    assert status == 2
    assert "argument --workers: expected a number of processes or auto, got 'many'" in err
