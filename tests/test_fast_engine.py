"""The fast screening engine is exact: it matches the plain forward and the naive evaluator.

float32 tolerance: logits agree to 1e-4 absolute on the fixtures (values of order 1; the plain
and fast paths sum in different orders and GELU is computed as h sigmoid(2u) instead of
0.5 h (1 + tanh u)); reference log-probabilities (sums of a few float64 log-softmaxes of those
logits) to 1e-3 on the fixtures and 2e-2 on SmolLM2 (logits of order 10-30). Generated tokens,
answers and verdicts must be identical.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from helpers import PlantedTask, planted_model

import cel_numpy as cn
from cel_numpy.errors import InvalidHeadError
from cel_numpy.localize.evaluate import LMEvaluator
from cel_numpy.models.fast import Stop, ablated_readout, forward, generate_conditions, prepare
from cel_numpy.tasks import TASKS, make_panels

HERE = Path(__file__).parent
FIXTURES = [
    HERE / "fixtures" / name
    for name in ("tiny_gpt2", "tiny_llama", "tiny_llama_tied", "tiny_qwen2", "tiny_gemma3")
]
ATOL = 1e-4


def _batch(model, rng, B=5, shared=0):
    """B random prompts of 3-8 tokens after `shared` common tokens, left-padded."""
    V = model.config.vocab_size
    head = list(rng.integers(0, V, size=shared))
    seqs = [head + list(rng.integers(0, V, size=int(rng.integers(3, 9)))) for _ in range(B)]
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
def test_fast_forward_with_attention_in_blocks_of_one_row_matches_plain(path, monkeypatch):
    """Long prompts run their attention a block of query rows at a time; forcing one row per
    block (every fixture, gemma3's sliding window included) changes no logit."""
    import cel_numpy.models.fast as fast

    model = cn.load_model(path)
    ids, mask = _batch(model, np.random.default_rng(1), shared=4)
    plain = model.logits(ids, attention_mask=mask)
    monkeypatch.setattr(fast, "ATTENTION_BLOCK_BYTES", 1)
    blocked = forward(prepare(model), ids, mask)
    valid = mask.astype(bool)
    np.testing.assert_allclose(blocked[valid], plain[valid], atol=ATOL, rtol=0)


def test_attention_in_blocks_bounds_memory_and_matches_one_call():
    """A 600-token causal prompt: in blocks under a 64 KiB budget the scores never take more than
    a few blocks' worth (one call takes 3 x 2.9 MB), and z equals the one-call z."""
    import tracemalloc

    from cel_numpy.attention import softmax_attention_forward
    from cel_numpy.models.fast import _attention_in_blocks

    rng = np.random.default_rng(0)
    R, H, G, T, E = 1, 2, 1, 600, 8
    q = rng.standard_normal((R, H, T, E)).astype(np.float32)
    k = rng.standard_normal((R, G, T, E)).astype(np.float32)
    v = rng.standard_normal((R, G, T, E)).astype(np.float32)
    causal = np.tril(np.ones((T, T), bool))[None, None]  # (1, 1, T, T)
    whole, _ = softmax_attention_forward(q, k, v, scale=0.35, mask=causal)
    tracemalloc.start()
    try:
        blocked = _attention_in_blocks(q, k, v, 0.35, causal, max_bytes=64 << 10)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    np.testing.assert_allclose(blocked, whole, atol=1e-6, rtol=0)
    scores_one_call = R * H * T * T * 4
    assert peak < scores_one_call / 2, (peak, scores_one_call)
    # a mask shared by every query row (a decode step's shape) is not sliced
    last = _attention_in_blocks(q, k, v, 0.35, np.ones((R, 1, 1, T), bool), max_bytes=1)
    np.testing.assert_allclose(
        last, softmax_attention_forward(q, k, v, scale=0.35)[0], atol=1e-6, rtol=0
    )


def _fill(model, ids, mask, ablation):
    """None (zero), the batch's mean z (mean), or per row the mean z of row (b + 2) mod B
    (a fill per row, as resample ablation makes)."""
    if ablation == "zero":
        return None
    if ablation == "mean":
        return model.mean_z(ids, mask)
    rows = [list(r[m.astype(bool)]) for r, m in zip(ids, mask)]
    return model.row_mean_z([rows[(b + 2) % len(rows)] for b in range(len(rows))])


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
@pytest.mark.parametrize("ablation", ["zero", "mean", "resample"])
@pytest.mark.parametrize("shared", [0, 4])
def test_ablated_readout_matches_one_forward_per_condition(path, ablation, shared):
    """With and without a common prefix (its own segment when shared > 0; never with a fill per
    row, whose rows each need their own), in small waves."""
    model = cn.load_model(path)
    rng = np.random.default_rng(1)
    ids, mask = _batch(model, rng, shared=shared)
    c = model.config
    conds = _conditions(c.n_layers, c.n_heads)
    mean_z = _fill(model, ids, mask, ablation)
    for share in (True, False):
        got = ablated_readout(
            prepare(model), ids, mask, conds, mean_z, readout=slice(-3, None),
            max_rows=3 * ids.size, share_prefix=share,
        )  # fmt: skip
        for cond, lg in zip(conds, got):
            ref = model.logits(
                ids, attention_mask=mask, ablate=list(cond) or None,
                ablation="zero" if mean_z is None else "mean", mean_z=mean_z,
            )  # fmt: skip
            np.testing.assert_allclose(lg, ref[:, -3:], atol=ATOL, rtol=0, err_msg=f"{cond}")


# --------------------------------------------------------------------------- greedy generation


def _greedy(model, prompts, cond, stop: Stop):
    """Plain greedy decoding (`Model.generate_ids`), cut by the stop rule: the reference."""
    out = []
    for row in model.generate_ids(prompts, stop.max_new_tokens, ablate=list(cond) or None,
                                  stop_at_eos=False):  # fmt: skip
        new = []
        for t in row:
            if t in stop.ids:
                break
            new.append(t)
            if stop.is_done is not None and stop.is_done(new):
                break
        out.append(new)
    return out


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_generate_conditions_equals_greedy_decoding_whatever_the_drafts(path):
    """Drafts that are the greedy answer, leave it mid-answer, stop too early, run past the stop,
    or are unrelated all give the plain greedy tokens; with and without a shared prefix and
    verification; a batch with a common prefix; waves small enough to split the conditions;
    decode caches small enough for one row each (the rows that leave their drafts decode one by
    one instead of together)."""
    model = cn.load_model(path)
    rng = np.random.default_rng(2)
    V = model.config.vocab_size
    head = list(rng.integers(0, V, size=4))
    prompts = [head + list(rng.integers(0, V, size=int(rng.integers(1, 6)))) for _ in range(5)]
    prompts.append([int(rng.integers(0, V))])  # a one-token prompt
    c = model.config
    conds = _conditions(c.n_layers, c.n_heads)[:9]
    stop = Stop(ids={3}, max_new_tokens=6, is_done=lambda ids: ids[-1] == 5)
    truth = {cond: _greedy(model, prompts, cond, stop) for cond in conds}
    intact = truth[()]
    diverge = [g[:2] + [(g[2] + 1) % V] if len(g) > 2 else [7, 8, 9] for g in intact]
    drafts = [
        [intact[b], diverge[b], intact[b][:1], intact[b] + [11, 12], list(rng.integers(0, V, 3))]
        for b in range(len(prompts))
    ]
    big = 1 << 30
    for d, verify, share, budget in [(drafts, True, True, big), (drafts, True, False, big),
                                     (drafts, False, True, big), (None, True, True, big),
                                     ([[x[1]] for x in drafts], True, True, big),
                                     (drafts, True, True, 1), (None, False, True, 1)]:  # fmt: skip
        got, _ = generate_conditions(
            prepare(model), prompts, conds, None, stop, drafts=d, verify=verify,
            share_prefix=share, max_rows=60, unembed_rows=50, decode_bytes=budget,
        )  # fmt: skip
        for cond, new in zip(conds, got):
            assert new == truth[cond], f"condition {cond}, verify={verify}, share={share}, " \
                f"decode bytes {budget}"  # fmt: skip


# 4 draft rows of 3 positions a condition; per GEMM: one draft row (1), two (7: a condition over
# two GEMMs), thirteen (40: a GEMM crossing conditions, one row into the next), every row (512)
@pytest.mark.parametrize("unembed_rows", [1, 7, 40, 512])
@pytest.mark.parametrize("per_row", [False, True])
@pytest.mark.parametrize("decode_bytes", [1, 1 << 30])
def test_generate_conditions_mean_ablation_and_draft_scores(unembed_rows, per_row, decode_bytes):
    """Mean ablation in the decode steps, one fill for all rows or one per row (resample: rows
    that finish early leave the decode cache with their fill; with a decode budget of one byte,
    one row per cache, each row takes its own fill); `score` sees each draft row's
    logits at its real positions, once, however the draft rows are grouped into unembedding
    GEMMs (within a condition or across conditions)."""
    model = cn.load_model(FIXTURES[1])
    rng = np.random.default_rng(5)
    V = model.config.vocab_size
    prompts = [list(rng.integers(0, V, size=int(rng.integers(2, 7)))) for _ in range(4)]
    mean_z = model.row_mean_z(prompts[::-1]) if per_row else model.mean_z(prompts)
    stop = Stop(ids=(), max_new_tokens=4)
    drafts = [[list(rng.integers(0, V, 2))] for _ in prompts]
    conds = [(), ((0, 1),), ((1, 2),), ((0, 0), (1, 3))]
    got, scores = generate_conditions(
        prepare(model), prompts, conds, mean_z, stop, drafts=drafts, score=lambda c, lg: (c, lg),
        unembed_rows=unembed_rows, decode_bytes=decode_bytes,
    )  # fmt: skip
    for cond, new, rows in zip(conds, got, scores):
        assert [c for c, _ in rows] == list(range(len(prompts)))  # each row scored once, as itself
        assert [r.shape for _, r in rows] == [(3, V)] * len(prompts)  # last prompt token, 2 drafted
        lg = np.stack([r for _, r in rows])  # (B, 3, V)
        kw = dict(ablate=list(cond) or None, ablation="mean", mean_z=mean_z)
        assert new == model.generate_ids(prompts, 4, stop_at_eos=False, **kw)
        ids, mask = model.pad([p + d[0] for p, d in zip(prompts, drafts)])
        ref = model.logits(ids, attention_mask=mask, **kw)  # (B, T, V) rows end at column -1
        np.testing.assert_allclose(lg[:, -3:], ref[:, -3:], atol=ATOL, rtol=0)


def test_decode_caches_stay_within_their_budget(monkeypatch):
    """The rows that leave their drafts decode in caches of at most `decode_bytes` (here 2.5
    rows' worth: groups of two rows), every row once, and give the greedy tokens; the cache's
    real K/V bytes are `decode_row_bytes` per row."""
    import cel_numpy.models.fast as mfast

    model = cn.load_model(FIXTURES[3])
    rng = np.random.default_rng(9)
    V = model.config.vocab_size
    prompts = [list(rng.integers(0, V, size=int(rng.integers(2, 7)))) for _ in range(5)]
    stop = Stop(ids=(), max_new_tokens=5)
    conds = [(), ((0, 1),), ((1, 0), (1, 2))]
    drafts = [[[int(rng.integers(0, V))]] for _ in prompts]  # a guess that rarely holds
    caches = []
    real_cache = mfast._decode_cache

    def spy(prep, segments, kv, resumes, draft_len, max_new):
        cache = real_cache(prep, segments, kv, resumes, draft_len, max_new)
        slots = cache.k[0].shape[2]
        row = mfast.decode_row_bytes(prep.config, slots, cache.k[0].itemsize)
        caches.append((len(resumes), sum(a.nbytes for a in cache.k + cache.v), row))
        return cache

    monkeypatch.setattr(mfast, "_decode_cache", spy)
    run = lambda budget: generate_conditions(
        prepare(model), prompts, conds, None, stop, drafts=drafts, decode_bytes=budget
    )[0]
    assert run(1 << 30) == [_greedy(model, prompts, c, stop) for c in conds]
    (rows, nbytes, row), *_ = caches  # one cache for the wave's every leaving row
    assert len(caches) == 1 and rows >= 5 and nbytes == rows * row
    caches.clear()
    assert run(int(2.5 * row)) == [_greedy(model, prompts, c, stop) for c in conds]
    assert [r for r, _, _ in caches] == [2] * (rows // 2) + [1] * (rows % 2)
    assert all(b <= 2.5 * row for _, b, _ in caches)


@pytest.mark.parametrize("path", [FIXTURES[1], FIXTURES[4]], ids=lambda p: p.name)
def test_kept_keys_and_values_hold_only_their_own_bytes(path):
    """The K/V `ablated_tree` keeps for decoding are arrays of their own, not slices that keep
    the fused QKV projection (or the stacked conditions) alive: the price counts 2 G E floats
    per token and layer."""
    from cel_numpy.models.fast import ablated_tree, continuation_tree, intact_tree

    model = cn.load_model(path)
    prep, rng = prepare(model), np.random.default_rng(4)
    V, c = model.config.vocab_size, model.config
    prompts = [list(rng.integers(0, V, size=int(rng.integers(2, 7)))) for _ in range(3)]
    drafts = [list(rng.integers(0, V, size=2)) for _ in prompts]
    segments = continuation_tree(prep, prompts, drafts, [0, 1, 2])
    intact = intact_tree(prep, segments, slice(None))
    conds = [(), ((0, 1),), ((1, 0), (1, 2))]
    _, kv = ablated_tree(prep, intact, conds, None, keep_kv=True)
    arrays = [a for cond in conds for layer in kv[cond] for k, v in layer for a in (k, v)]
    assert len(arrays) == len(conds) * c.n_layers * len(segments) * 2
    for a in arrays:
        base = a
        while isinstance(base.base, np.ndarray):
            base = base.base
        assert base.nbytes == a.nbytes
        assert a.shape[1] == c.n_kv_heads and a.shape[-1] == c.d_head


# ------------------------------------------------------------------------- evaluator: fast == naive


def assert_same_results(fast, naive, atol):
    """Same items, verdicts and answers; ref_logprob equal within atol (both filled)."""
    assert len(fast) == len(naive)
    for f_cond, n_cond in zip(fast, naive):
        assert [(r.item_id, r.correct, r.answer) for r in f_cond] == [
            (r.item_id, r.correct, r.answer) for r in n_cond
        ]
        f = np.array([r.ref_logprob for r in f_cond], dtype=float)
        n = np.array([r.ref_logprob for r in n_cond], dtype=float)
        assert np.isfinite(n).all() and np.isfinite(f).all()
        np.testing.assert_allclose(f, n, atol=atol, rtol=0)


@pytest.mark.parametrize("scoring", ["generate", "choice"])
@pytest.mark.parametrize("ablation", ["zero", "mean", "resample"])
def test_evaluator_fast_equals_naive_planted(scoring, ablation):
    model = planted_model(np.random.default_rng(3))
    task = PlantedTask(scoring)
    items = task.sample(np.random.default_rng(4), 11)
    conds = _conditions(model.config.n_layers, model.config.n_heads)
    kw = dict(
        ablation=ablation, reference_items=items if ablation == "mean" else None, batch_size=4
    )
    naive = LMEvaluator(model, task, fast=False, **kw).evaluate_many(items, conds)
    if ablation == "zero":  # removing the harmful head rescues items (a mean-ablated one does not)
        assert any(r.correct for res in naive for r in res) and not all(r.correct for r in naive[0])
    for switches in [{}, dict(share_prefix=False), dict(forced=False), dict(intact_drafts=False),
                     dict(intact_cache=False)]:  # fmt: skip
        ev = LMEvaluator(model, task, **kw, **switches)
        fast = ev.evaluate_many(items, conds[:5]) + ev.evaluate_many(items, conds[5:])
        assert_same_results(fast, naive, atol=1e-9)  # float64 model


@pytest.mark.parametrize("scoring", ["generate", "choice"])
@pytest.mark.parametrize("ablation", ["zero", "mean", "resample"])
def test_evaluator_on_no_items_gives_one_empty_list_per_condition(scoring, ablation):
    """An empty panel (or an empty slice of one) is nothing to evaluate, not a crash; a head
    outside the model is still refused."""
    model = planted_model(np.random.default_rng(3))
    task = PlantedTask(scoring)
    items = task.sample(np.random.default_rng(4), 6)
    conds = _conditions(model.config.n_layers, model.config.n_heads)[:3]
    for fast in (True, False):
        ev = LMEvaluator(model, task, fast=fast, ablation=ablation, reference_items=items)
        assert ev.evaluate_many([], conds) == [[], [], []]
        assert ev.evaluate_many(items, conds, rows=range(2, 2)) == [[], [], []]
        assert ev.evaluate_many(items, []) == []
        with pytest.raises(InvalidHeadError, match="is not in the model"):
            ev.evaluate_many([], [((model.config.n_layers, 0),)])


def test_theory_evaluator_on_no_items_gives_one_empty_list_per_condition():
    from cel_numpy.localize import TheoryEvaluator, TheoryTask
    from cel_numpy.theory import TrainConfig, train

    config = TrainConfig(steps=5, log_every=5)
    task = TheoryTask("A", config.world)
    ev = TheoryEvaluator(train(config, np.random.default_rng(0)).params, task)
    assert ev.evaluate_many([], [(), "L0H1"]) == [[], []]
    items = task.sample(np.random.default_rng(1), 4)
    assert ev.evaluate_many(items, [()], rows=range(0)) == [[]]
    with pytest.raises(InvalidHeadError, match="is not in the model"):
        ev.evaluate_many([], ["L1H0"])


def test_token_budget_chunks():
    from cel_numpy.localize.fast import token_budget_chunks

    spans = lambda *a, **k: [(r.start, r.stop) for r in token_budget_chunks(*a, **k)]
    assert spans([3, 3, 3, 3, 3], 2, max_tokens=100) == [(0, 2), (2, 4), (4, 5)]  # batch_size
    # padded size = rows x longest: [10, 10] = 20 fits 25, a third row (30) does not
    assert spans([10, 10, 10, 20], 16, max_tokens=25) == [(0, 2), (2, 3), (3, 4)]
    assert spans([5, 40, 5], 16, max_tokens=25) == [(0, 1), (1, 2), (2, 3)]  # 40 runs alone
    assert spans([], 4, max_tokens=10) == []


@pytest.mark.parametrize("scoring", ["generate", "choice"])
def test_evaluator_fast_equals_naive_with_a_small_token_budget(scoring, monkeypatch):
    """Batches cut by MAX_BATCH_TOKENS (here every prompt alone or in pairs) change no result."""
    import cel_numpy.localize.fast as lfast

    model = planted_model(np.random.default_rng(3))
    task = PlantedTask(scoring)
    items = task.sample(np.random.default_rng(4), 11)
    conds = _conditions(model.config.n_layers, model.config.n_heads)
    naive = LMEvaluator(model, task, fast=False, batch_size=4).evaluate_many(items, conds)
    longest = max(len(LMEvaluator(model, task).prompt_ids(it.prompt)) for it in items)
    monkeypatch.setattr(lfast, "MAX_BATCH_TOKENS", 2 * longest)
    fast = LMEvaluator(model, task, batch_size=4).evaluate_many(items, conds)
    assert_same_results(fast, naive, atol=1e-9)


class AsciiTokenizer:
    """One token per character of "\\n" and printable ASCII (96 ids, the fixtures' vocabulary)."""

    alphabet = "\n" + "".join(chr(i) for i in range(32, 127))
    bos_id = eos_id = None
    pad_id = 0
    add_bos = False
    # chat tasks (arithmetic_chat): a minimal template, and "~" ends the assistant's turn
    chat_template = (
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}~{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    stop_ids = frozenset({alphabet.index("~")})

    def encode(self, text, add_bos=False):
        return [self.alphabet.index(ch) for ch in text]

    def decode(self, ids):
        return "".join(self.alphabet[i] for i in ids)


def _fixture_with_text(path):
    """A fixture model with a character tokenizer and a 512-position context (gpt2: its 64
    learned positions repeated), so that every task's prompts fit."""
    model = cn.load_model(path)
    model.tokenizer = AsciiTokenizer()
    model.config = dataclasses.replace(model.config, n_ctx=512)
    if "pos_embed" in model.params:
        W_pos = model.params["pos_embed"]["W_pos"]  # (64, D)
        model.params["pos_embed"]["W_pos"] = np.concatenate([W_pos] * 8)  # (512, D)
    return model


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
@pytest.mark.parametrize("task_name", sorted(TASKS))
def test_evaluator_fast_equals_naive_every_task_on_fixtures(path, task_name):
    """Random weights: answers leave the reference at once or mid-answer and decode on."""
    model = _fixture_with_text(path)
    task = TASKS[task_name]
    items, _ = make_panels(task, 6, 1, 0)
    L, H = model.config.n_layers, model.config.n_heads
    conds = [(), ((0, 1),), ((L - 1, H - 1),), ((0, 0), (L - 1, 0))]
    naive = LMEvaluator(model, task, fast=False, batch_size=4).evaluate_many(items, conds)
    fast = LMEvaluator(model, task, batch_size=4).evaluate_many(items, conds)
    assert_same_results(fast, naive, atol=1e-3)


@pytest.mark.download  # fetches the benchmark data, a model or a vocabulary
@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
@pytest.mark.parametrize("task_name", ["hellaswag", "boolq"])
@pytest.mark.parametrize("ablation", ["zero", "mean", "resample"])
def test_evaluator_fast_equals_naive_benchmarks_on_fixtures(path, task_name, ablation):
    """The real data's shortest items (one character per token): HellaSwag's four multi-token
    endings after one context (the prefix-tree path; under resample ablation each item's
    context carries its own donor's fill), BoolQ's " no"/" yes"."""
    from cel_numpy.tasks import get_task

    model = _fixture_with_text(path)
    task = get_task(task_name)
    printable = [it for it in task.items if all(ch == "\n" or " " <= ch <= "~" for ch in it.prompt)]
    items = sorted(printable, key=lambda it: len(it.prompt) + max(map(len, it.choices)))[:4]
    L, H = model.config.n_layers, model.config.n_heads
    conds = [(), ((0, 1),), ((L - 1, H - 1),), ((0, 0), (L - 1, 0))]
    kw = dict(ablation=ablation, batch_size=4)
    if ablation == "mean":
        kw["reference_items"] = items
    if ablation == "resample":
        kw["resample_seed"] = 3
    naive = LMEvaluator(model, task, fast=False, **kw).evaluate_many(items, conds)
    fast = LMEvaluator(model, task, **kw).evaluate_many(items, conds)
    assert_same_results(fast, naive, atol=1e-3)


@pytest.mark.parametrize("task_name", ["capitals", "ioi", "arithmetic_chat"])
def test_evaluator_fast_equals_naive_resample_on_fixtures(task_name):
    """Resample ablation: each item's removed heads take its donor's mean z, in the decode steps
    and the teacher-forced reference alike; fast (no shared prefix then) equals naive."""
    model = _fixture_with_text(FIXTURES[1])
    task = TASKS[task_name]
    items, _ = make_panels(task, 8, 1, 0)
    L, H = model.config.n_layers, model.config.n_heads
    conds = [(), ((0, 1),), ((L - 1, H - 1),), ((0, 0), (L - 1, 0))]
    kw = dict(ablation="resample", resample_seed=3, batch_size=3)
    naive = LMEvaluator(model, task, fast=False, **kw).evaluate_many(items, conds)
    fast = LMEvaluator(model, task, **kw).evaluate_many(items, conds)
    assert_same_results(fast, naive, atol=1e-3)
    zero = LMEvaluator(model, task, fast=False, batch_size=3).evaluate_many(items, conds[1:])
    assert [r.ref_logprob for r in zero[0]] != [r.ref_logprob for r in naive[1]]


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
    for stage in ("screen", "joint"):
        fast, naive = runs[True][stage], runs[False][stage]
        assert fast["ranking"] == naive["ranking"]
        assert without_logprob(fast) == without_logprob(naive)
        np.testing.assert_allclose(  # float64: the two engines agree to rounding
            [c["logprob_change"] for c in fast["conditions"]],
            [c["logprob_change"] for c in naive["conditions"]],
            rtol=1e-9,
            atol=1e-12,
        )


def without_logprob(summary: dict) -> dict:
    """A stage summary with the float log-probability changes left out (compared apart)."""
    conditions = [
        {k: v for k, v in c.items() if k != "logprob_change"} for c in summary["conditions"]
    ]
    return {**summary, "conditions": conditions}


# -------------------------------------------------------------------- SmolLM2 (must fail, not skip)


@pytest.fixture(scope="module")
def smollm2():
    return cn.load_model("smollm2")


@pytest.mark.download
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


@pytest.mark.download
def test_smollm2_other_tokenizations_of_the_answer(smollm2):
    """Drafts spelling " Paris" in other tokens, or going on past it, give greedy's own tokens."""
    m = smollm2
    prompts = [m.encode("France: Paris\nJapan: Tokyo\nEgypt: Cairo\nItaly:"),
               m.encode("Japan: Tokyo\nItaly: Rome\nEgypt: Cairo\nFrance:")]  # fmt: skip
    stop = Stop(
        ids={m.tokenizer.eos_id}, max_new_tokens=6, is_done=lambda ids: "\n" in m.decode(ids)
    )
    spellings = [
        [m.encode(" Rome"), [m.encode(" Ro")[0], m.encode("me")[0]], m.encode(" Rome, Paris")],
        [m.encode(" Paris"), m.encode(" Par") + m.encode("is"), m.encode(" Lyon")],
    ]  # fmt: skip
    conds = [(), ((0, 0),), ((29, 8),)]
    truth = [_greedy(m, prompts, cond, stop) for cond in conds]
    for drafts in ([[s[0]] for s in spellings], [[s[1]] for s in spellings], spellings):
        got, _ = generate_conditions(prepare(m), prompts, conds, None, stop, drafts=drafts)
        assert got == truth
    assert [m.decode(ids) for ids in got[0]] == [" Rome\n", " Paris\n"]


@pytest.mark.download
@pytest.mark.parametrize(
    "task_name", ["arithmetic", "arithmetic_chat", "capitals", "ioi", "hellaswag", "boolq"]
)
def test_smollm2_evaluator_fast_equals_naive(smollm2, task_name):
    from cel_numpy.tasks import get_task

    task = get_task(task_name)
    items, _ = make_panels(task, 4, 1, 0)
    conds = [(), ((0, 3),), ((2, 1), (25, 0))]
    fast = LMEvaluator(smollm2, task, batch_size=4).evaluate_many(items, conds)
    naive = LMEvaluator(smollm2, task, batch_size=4, fast=False).evaluate_many(items, conds)
    assert_same_results(fast, naive, atol=2e-2)


def test_smollm2_resample_ablation_fast_equals_naive(smollm2):
    """Resample ablation on the real model: donors' mean z in the prompt, answer and decode."""
    from cel_numpy.tasks import get_task

    task = get_task("capitals")
    items, _ = make_panels(task, 4, 1, 0)
    conds = [(), ((2, 1), (25, 0))]
    kw = dict(ablation="resample", resample_seed=1, batch_size=4)
    fast = LMEvaluator(smollm2, task, **kw).evaluate_many(items, conds)
    naive = LMEvaluator(smollm2, task, fast=False, **kw).evaluate_many(items, conds)
    assert_same_results(fast, naive, atol=2e-2)


def test_keep_freed_memory_is_on_with_glibc_and_off_on_request():
    """`prepare` turns glibc's freed-memory reuse on (mallopt accepted); CEL_NUMPY_SYSTEM_MALLOC=1
    leaves the system's default, in a fresh process."""
    import os
    import platform
    import subprocess
    import sys

    from cel_numpy.models import fast

    prepare(cn.load_model(FIXTURES[0]))
    assert fast.keep_freed_memory() is (platform.libc_ver()[0] == "glibc")
    code = "from cel_numpy.models.fast import keep_freed_memory; print(keep_freed_memory())"
    env = {**os.environ, "CEL_NUMPY_SYSTEM_MALLOC": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "False", out.stderr


def test_intact_drafts_only_in_calls_that_pay_for_them():
    """A call with few ablated conditions (a test-heads held-out stage) skips the intact-answer
    pass; a screen-sized call makes it once per evaluator, and later calls of any size reuse it.
    Results are the same either way (the switch tests above)."""
    from cel_numpy.localize.fast import INTACT_DRAFTS_MIN_CONDITIONS

    model = planted_model(np.random.default_rng(3))
    task = PlantedTask("generate")
    items = task.sample(np.random.default_rng(4), 6)
    conds = _conditions(model.config.n_layers, model.config.n_heads)
    ev = LMEvaluator(model, task, batch_size=4)
    few = ev.evaluate_many(items, conds[:INTACT_DRAFTS_MIN_CONDITIONS])  # () + 3 ablated
    assert "_intact_memo" not in ev.__dict__
    ev.evaluate_many(items, conds[: INTACT_DRAFTS_MIN_CONDITIONS + 1])
    assert set(ev.__dict__["_intact_memo"]) == {it.id for it in items}
    assert_same_results(ev.evaluate_many(items, conds[:4]), few, atol=1e-9)


@pytest.mark.parametrize("scoring", ["generate", "choice"])
def test_intact_cache_keeps_what_fits_when_the_panel_does_not(scoring, monkeypatch):
    """A budget for about half of a panel's batches: each later call over the panel reuses the
    kept half (plain least-recently-used eviction would reuse none), results unchanged; a new
    panel replaces the old one's passes as it is walked."""
    import cel_numpy.models.fast as mfast

    model = planted_model(np.random.default_rng(3))
    task = PlantedTask(scoring)
    items = task.sample(np.random.default_rng(4), 16)
    other = task.sample(np.random.default_rng(5), 8)
    conds = _conditions(model.config.n_layers, model.config.n_heads)[:6]
    sizes, made = [], []
    real = mfast.intact_tree

    def counted(prep, segments, readout):
        tree = real(prep, segments, readout)
        sizes.append(tree.nbytes)
        made.append(1)
        return tree

    monkeypatch.setattr(mfast, "intact_tree", counted)
    monkeypatch.setattr(mfast, "available_memory", lambda: None)  # the budget alone decides

    def passes(ev, panel) -> int:  # intact passes one call makes
        made.clear()
        results.append(ev.evaluate_many(panel, conds))
        return len(made)

    results = []
    plain = LMEvaluator(model, task, batch_size=4, intact_cache=False)
    passes(plain, items)  # the first call also makes the intact drafts, once per evaluator
    sizes.clear()
    per_call = passes(plain, items)  # then one intact pass per batch, every call
    per_call_other = passes(plain, other)
    assert per_call >= 4 and per_call_other >= 2
    budget = sum(sorted(sizes[:per_call])[: per_call // 2])  # the smallest half of them fit
    ev = LMEvaluator(model, task, batch_size=4, intact_cache_bytes=budget)
    passes(ev, items)
    cache = ev._intact_cache
    kept = len(cache._trees)
    assert 1 <= kept < per_call and cache.nbytes <= budget
    assert passes(ev, items) == per_call - kept  # the kept passes reused, the rest recomputed
    assert passes(ev, items) == per_call - kept
    passes(ev, other)  # a new panel: its passes replace the old ones as it is walked
    assert passes(ev, other) < per_call_other
    assert cache.nbytes <= budget
    expected = results[1]
    for got in results[3:6]:
        assert_same_results(got, expected, atol=1e-9)  # float64 model: kept or not, the same


def test_intact_pass_keeps_only_the_bytes_it_counts():
    """IntactCache budgets by `IntactTree.nbytes`; a kept array that is a view of a larger one
    (K and V slice the fused QKV projection) would keep the whole base alive, so the memory
    held would exceed the budget (by 1.5x on SmolLM2 before the arrays were copied)."""
    import cel_numpy.models.fast as mfast

    model = planted_model(np.random.default_rng(3))
    task = PlantedTask("choice")
    ev = LMEvaluator(model, task, batch_size=4)
    ev.evaluate_many(task.sample(np.random.default_rng(4), 4), [((0, 1),)])
    ((tree, _, _),) = ev._intact_cache._trees.values()

    def base(a):
        while isinstance(a.base, np.ndarray):
            a = a.base
        return a

    kept = [a for layer in tree.resid_pre + tree.z for a in layer]
    kept += [a for layer in tree.kv for kv in layer for a in kv]
    held = {id(base(a)): base(a).nbytes for a in kept}
    assert sum(held.values()) == tree.nbytes == sum(a.nbytes for a in kept)
    assert isinstance(tree, mfast.IntactTree)


def test_intact_cache_stops_growing_when_the_machine_runs_short(monkeypatch):
    """The budget is sized once at start; a process started later may take the memory it
    counted on. Below the floor of available memory a new intact pass serves its batch and is
    not kept (the results do not change), and kept passes are reused; above it, passes are kept
    again."""
    import cel_numpy.models.fast as mfast

    model = planted_model(np.random.default_rng(3))
    task = PlantedTask("choice")
    items = task.sample(np.random.default_rng(4), 12)
    conds = _conditions(model.config.n_layers, model.config.n_heads)[:4]
    reference = LMEvaluator(model, task, batch_size=4, intact_cache=False)
    expected = reference.evaluate_many(items, conds)
    first_batch = [per_cond[:4] for per_cond in expected]

    available = {"bytes": mfast.INTACT_CACHE_FLOOR - 1}
    monkeypatch.setattr(mfast, "available_memory", lambda: available["bytes"])
    ev = LMEvaluator(model, task, batch_size=4)
    assert_same_results(ev.evaluate_many(items[:4], conds), first_batch, atol=1e-9)
    cache = ev._intact_cache
    assert cache.nbytes == 0 and not cache._trees  # short of the floor: nothing kept

    available["bytes"] = mfast.INTACT_CACHE_FLOOR
    assert_same_results(ev.evaluate_many(items[:4], conds), first_batch, atol=1e-9)
    kept = dict(cache._trees)
    assert len(kept) == 1 and cache.nbytes > 0  # at the floor: its one batch kept

    available["bytes"] = 0
    assert_same_results(ev.evaluate_many(items, conds), expected, atol=1e-9)
    assert cache._trees.keys() == kept.keys()  # the kept pass stays; no new one is added

    monkeypatch.setattr(mfast, "available_memory", lambda: None)  # no /proc/meminfo: budget only
    ev.evaluate_many(items, conds)
    assert len(cache._trees) == 3


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "naive"])
@pytest.mark.parametrize("ablation", ["zero", "resample"])
@pytest.mark.parametrize("task_name", ["capitals", "agreement"])
def test_a_panel_evaluated_slice_by_slice_equals_one_call(task_name, ablation, fast):
    """The routine computes a large panel in slices (`rows`): the slices' results, joined, are
    the whole panel's, resample donors included (drawn within the whole panel, not the slice),
    and they differ from evaluating each slice as a panel of its own."""
    model = _fixture_with_text(FIXTURES[1])
    task = TASKS[task_name]
    items, _ = make_panels(task, 9, 1, 0)
    L, H = model.config.n_layers, model.config.n_heads
    conds = [(), ((0, 1),), ((L - 1, H - 1), (0, 0))]
    kw = dict(ablation=ablation, resample_seed=3, batch_size=3, fast=fast)
    whole = LMEvaluator(model, task, **kw).evaluate_many(items, conds)
    sliced = LMEvaluator(model, task, **kw)
    parts = [sliced.evaluate_many(items, conds, rows=r) for r in (range(0, 4), range(4, 9))]
    joined = [a + b for a, b in zip(*parts)]
    assert_same_results(joined, whole, atol=1e-5)
    if ablation == "resample":  # a slice alone would draw its donors among its own items
        alone = LMEvaluator(model, task, **kw).evaluate_many(items[:4], conds[1:])
        assert [r.ref_logprob for r in alone[0]] != [r.ref_logprob for r in parts[0][1]]


def test_row_groups_cover_every_row_once_in_order_within_the_cap():
    """`row_groups` (the choice engine's unembedding GEMMs): consecutive runs whose sizes sum to
    at most the cap, a size above the cap alone, every index exactly once."""
    from cel_numpy.models.fast import row_groups

    assert row_groups([], 4) == []
    assert row_groups([9], 4) == [range(0, 1)]
    assert row_groups([1, 5, 1], 4) == [range(0, 1), range(1, 2), range(2, 3)]
    assert row_groups([4, 4], 4) == [range(0, 1), range(1, 2)]
    assert row_groups([2, 2, 3, 1], 4) == [range(0, 2), range(2, 4)]
    rng = np.random.default_rng(0)
    sizes = rng.integers(1, 30, size=200).tolist()
    groups = row_groups(sizes, 50)
    assert [i for g in groups for i in g] == list(range(200))
    assert all(sum(sizes[i] for i in g) <= 50 or len(g) == 1 for g in groups)
    # maximal: the next size would not have fitted
    assert all(sum(sizes[i] for i in g) + sizes[g.stop] > 50 for g in groups[:-1])
