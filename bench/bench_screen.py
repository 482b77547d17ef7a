"""Benchmark of the real workload: a singleton head screen of a generate task, ours vs torch.

    PYTHONPATH=. .venv-ref/bin/python bench/bench_screen.py                # with torch
    ... --tasks capitals --sizes 20,50 --sample-heads 10 --workers-heads 32
    ... --model qwen2.5-coder-0.5b --tasks arithmetic_chat --sizes 20 --workers-heads 0
    ... --sizes 20,50,100 --torch-max-size 50   # cost growth: ours alone at D = 100

Not a test: one invocation prints one table of times and ratios. Per task and discovery size D
(items from the task's discovery panel, seed 0), every timed path screens the same heads (10
spread over the layers by default, as the routine does: chunks of 8 conditions per
`evaluate_many`, a fresh evaluator each, so one-off work such as the intact drafts is counted):

  ours                 `LMEvaluator` fast path with its default savings (prefix tree, kept
                       intact passes, forced answers verified along the reference answer and
                       the intact model's answer, real rows only, freed memory kept)
  ours -<saving>       (at --variant-size only) the same with one saving switched off:
                       intact_cache (the intact pass redone per call), share_prefix,
                       intact_drafts (only the reference answer as a draft), forced (prompt
                       pass + KV-cache decoding, the engine before forced answers); batch32,
                       batch64: 32 or
                       64 prompts per forward instead of --batch-size; keep_memory:
                       glibc's default malloc (`fast.keep_freed_memory` off, in a spawned
                       process); a+b: both
  torch generate       transformers + torch as a user would screen: a forward pre-hook on
                       o_proj zeroing the head's slice of its input, batched greedy
                       `model.generate` (KV cache, left padding, same batch size) with the same
                       stop rule (eos, a StoppingCriteria for the stop text, max_new_tokens)
                       on the same token ids (a chat task's prompt rendered in the model's chat
                       template); a LlamaForCausalLM (Qwen2ForCausalLM) holding our dequantized
                       weights, so both sides run the same float32 numbers (checked before
                       timing: the next-token logits of the first prompt agree to 1e-3).
  verdicts             per head and item, ours == torch (answers and correctness), and
                       ours == every switched-off variant (answers, correctness, ref_logprob)
  all heads            estimated as the one-off work (intact drafts, first intact passes: timed
                       apart) plus the sampled heads' time scaled to every head; with
                       --all-heads also measured: ours screens every head once, in the
                       routine's order (layer by layer, chunks of 8), so that conditions at one
                       layer stack as they do in a real screen (the spread sample cannot show
                       that); its answers are checked equal to the sample's on the heads both ran
  FLOP floor           multiply-adds an exact screen cannot avoid, per head (l, h): W_O and the
                       MLP of layer l and every layer above at every distinct position of the
                       panel's prefix tree (prompts + the answers under that head; a prefix
                       that items share counted once), K/V only at the last layer except the
                       read-out positions, attention scores causal, the unembedding at the
                       read-out positions, plus one intact forward of the panel (positions
                       that only a head's answers hold: every layer); at the float32 GEMM peak
                       measured in this run (the best of its readings: one at the start,
                       one per workload, a low one being the other core's load). "x floor" =
                       the whole screen's estimated time / the whole screen's floor (the
                       intact forward once, the sampled heads' share scaled to every head, as
                       "all heads" is).
  workers              the sampled screen through a ProcessPoolExecutor (spawned processes, one
                       BLAS thread each, models loaded before timing): 2 workers vs 1.
  peak RSS             ru_maxrss of this process (ours) and of the torch side's process.
  torch's process      the torch sweep runs in a spawned process of its own (kept for the
                       whole bench): glibc's default malloc there, as a user's torch session
                       has it; ours turns on `fast.keep_freed_memory` in this process, which
                       would speed torch up too (--torch-in-process: share it).

The machine is shared: every path is timed --repeats times, interleaved (ours, each variant,
torch, then again), and the medians are compared; the load average is printed along the way.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import platform
import resource
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from bench_forward import gemm_peak, median_time, pin_threads, torch_llama_from

import cel_numpy as cn
from cel_numpy.localize.evaluate import BATCH_SIZE, LMEvaluator
from cel_numpy.localize.fast import INTACT_DRAFTS_MIN_CONDITIONS
from cel_numpy.localize.routine import evaluate_chunk
from cel_numpy.localize.scoring import stop_rule
from cel_numpy.models import fast
from cel_numpy.tasks import get_task, make_panels

try:
    import torch
    import transformers
except ImportError:  # ours only
    torch = transformers = None

CHUNK = 8  # conditions per evaluate_many call, as the routine's default chunk_size
TARGETS = {"capitals": 3, "arithmetic_chat": 8}  # the speed-up targets over torch


def spread(heads, k):
    if k <= 0 or k >= len(heads):
        return list(heads)
    return [heads[i] for i in np.linspace(0, len(heads) - 1, k).round().astype(int)]


def spawn_pool(workers: int = 1) -> ProcessPoolExecutor:
    """Worker processes started fresh (spawn: nothing inherited from this process's malloc,
    threads or loaded model)."""
    return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


# --------------------------------------------------------------------------- ours


def screen_ours(model, task, items, heads, default_batch, clock=time.perf_counter, **switches):
    """(one-off seconds, screen seconds, {head: [ExampleResult]}) through a fresh evaluator.

    One-off: what an evaluator does once per panel whatever the number of heads (the intact
    drafts; the first call's intact passes when they are kept), timed apart so that a sample of
    heads can be scaled to the whole screen. `clock`: what is measured (`counting_gemms` counts
    multiply-adds instead of seconds).
    """
    ev = LMEvaluator(model, task, **{"batch_size": default_batch, **switches})
    conds = [((l, h),) for l, h in heads]
    L, H = model.config.n_layers, model.config.n_heads
    t0 = clock()
    # a call with enough conditions for the intact drafts (as every chunk of a real screen):
    # computes them and keeps the intact passes of the tree they make; 4 last-layer heads,
    # which the sample's scaling counts again (a small overcount)
    ev.evaluate_many(items, [((L - 1, h),) for h in range(min(H, INTACT_DRAFTS_MIN_CONDITIONS))])
    once = clock() - t0
    t0 = clock()
    out = {}
    for i in range(0, len(conds), CHUNK):
        for c, res in zip(conds[i : i + CHUNK], ev.evaluate_many(items, conds[i : i + CHUNK])):
            out[c[0]] = res
    return once, clock() - t0, out


@contextlib.contextmanager
def counting_gemms():
    """Inside: the fast engine's matrix products counted (2 x multiply-adds: the QKV, W_O and
    MLP GEMMs, the attention scores and their weighted sum, the unembedding); yields a clock
    that reads the running count. Ours only, untimed."""
    count = [0.0]
    names = ("_linear", "_mlp_residual_", "_unembed", "softmax_attention_forward")
    saved = {n: getattr(fast, n) for n in names}

    def linear(x2, W, b):
        count[0] += 2.0 * x2.shape[0] * W.shape[0] * W.shape[1]
        return saved["_linear"](x2, W, b)

    def mlp(lw, x, config, real=None):  # the up GEMM goes through _linear; here the down one
        n = x.size // x.shape[-1] if real is None else int(real.sum())
        count[0] += 2.0 * n * lw.W_out.shape[0] * lw.W_out.shape[1]
        return saved["_mlp_residual_"](lw, x, config, real)

    def unembed(prep, x, columns):
        V = prep.params["unembed"]["W_U"].shape[1] if columns is None else len(columns)
        count[0] += 2.0 * (x.size // x.shape[-1]) * x.shape[-1] * V
        return saved["_unembed"](prep, x, columns)

    def attention(q, k, v, **kw):
        B, H, T, E = q.shape
        count[0] += 2.0 * B * H * T * k.shape[2] * (E + v.shape[-1])
        return saved["softmax_attention_forward"](q, k, v, **kw)

    for n, f in zip(names, (linear, mlp, unembed, attention)):
        setattr(fast, n, f)
    try:
        yield lambda: count[0]
    finally:
        for n, f in saved.items():
            setattr(fast, n, f)


def _warm(ev, items):
    evaluate_chunk(ev, items, [()])  # the model and the intact drafts, before timing
    time.sleep(3)  # keep this worker busy so that the other warm-up goes to another worker
    return os.getpid()


def screen_workers(spec, task_name, items, heads, workers: int, batch_size: int) -> float:
    """Seconds of the screen through `workers` spawned processes, one BLAS thread each."""
    os.environ.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    task = get_task(task_name)
    model = cn.load_model(spec)
    ev = LMEvaluator(model, task, batch_size=batch_size, spec=spec)
    conds = [((l, h),) for l, h in heads]
    with spawn_pool(workers) as pool:
        pids = {f.result() for f in [pool.submit(_warm, ev, items) for _ in range(workers)]}
        assert len(pids) == workers, "a worker was not warmed up"
        t0 = time.perf_counter()
        futures = [
            pool.submit(evaluate_chunk, ev, items, conds[i : i + CHUNK])
            for i in range(0, len(conds), CHUNK)
        ]
        for f in futures:
            f.result()
        return time.perf_counter() - t0


_PEAKS: list[tuple[float, str]] = []  # every GEMM peak measured in this invocation


def best_gemm_peak() -> tuple[float, str]:
    """The best float32 GEMM rate measured so far in this invocation (one more measurement
    now): the machine's peak does not change, a lower reading is the other core's load."""
    _PEAKS.append(gemm_peak(3))
    return max(_PEAKS)


def unembed_rates(model, rows=(20, 60, 150, 400, 512), repeats: int = 7) -> str:
    """GFLOP/s of (N, D) @ the model's (D, V) unembedding for a few row counts N: why the
    engine unembeds several conditions' draft rows in one GEMM (`unembed_rows`)."""
    W_U = model.params["unembed"]["W_U"]
    rng = np.random.default_rng(0)
    rates = []
    for n in rows:
        x = rng.standard_normal((n, W_U.shape[0]), dtype=W_U.dtype)
        x @ W_U
        t = median_time(lambda: x @ W_U, repeats)  # noqa: B023 - called within this iteration
        rates.append(f"{2 * x.size * W_U.shape[1] / t / 1e9:.0f}")
    return f"{'/'.join(rates)} GFLOP/s at {'/'.join(map(str, rows))} rows"


# --------------------------------------------------------------------------- torch


def o_proj_hook(ref, layer: int, head: int, d_head: int):
    """A forward pre-hook on o_proj zeroing the head's slice of its input (its z); returns the
    handle (remove it when done)."""

    def pre_hook(module, inputs):
        x = inputs[0].clone()
        x[..., head * d_head : (head + 1) * d_head] = 0
        return (x,)

    return ref.model.layers[layer].self_attn.o_proj.register_forward_pre_hook(pre_hook)


def screen_torch_choice(model, ref, task, items, heads, batch_size):
    """(seconds, {head: [(answer, correct)]}) of a choice task scored as lm-eval scores it: each
    (context + candidate) a sequence of its own, batch_size sequences per forward (left padded,
    position ids from the mask), the candidate's tokens' log-probabilities summed
    (log_softmax over the vocabulary) and compared by `choice_scores` (acc_norm for HellaSwag).
    The token ids are ours (`continuation_ids`), made once before the clock starts."""
    from cel_numpy.localize.scoring import choice_results

    ev = LMEvaluator(model, task)
    rows = [(i, j, *ev.continuation_ids(it.prompt, ch))
            for i, it in enumerate(items) for j, ch in enumerate(it.choices)]  # fmt: skip
    n_choices = max(len(it.choices) for it in items)

    def score_all():
        scores = np.full((len(items), n_choices), -np.inf)
        for b in range(0, len(rows), batch_size):
            chunk = rows[b : b + batch_size]
            ids, mask = model.pad([r[2] for r in chunk])
            ids, mask = torch.from_numpy(ids), torch.from_numpy(mask)
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            logits = ref(input_ids=ids, attention_mask=mask, position_ids=positions).logits
            logp = torch.log_softmax(logits.float(), dim=-1)
            T = ids.shape[1]
            for k, (i, j, seq, start) in enumerate(chunk):
                n = len(seq) - start  # scored tokens, the last n of the row
                target = torch.tensor(seq[start:])
                rows_logp = logp[k, T - n - 1 : T - 1]
                scores[i, j] = float(rows_logp.gather(1, target[:, None]).sum())
        return scores

    results = {}
    t0 = time.perf_counter()
    for l, h in heads:
        handle = o_proj_hook(ref, l, h, model.config.d_head)
        try:
            with torch.inference_mode():
                scores = score_all()
        finally:
            handle.remove()
        res = choice_results(task, items, scores)
        results[(l, h)] = [(r.answer, r.correct) for r in res]
    return time.perf_counter() - t0, results


def screen_torch(model, ref, task, items, heads, batch_size):
    """(seconds, {head: [(answer, correct)]}) of the hook + generate sweep (a choice task: the
    hook + likelihood sweep, `screen_torch_choice`)."""
    if task.scoring == "choice":
        return screen_torch_choice(model, ref, task, items, heads, batch_size)
    tok = model.tokenizer
    rule = stop_rule(task, tok)
    E = model.config.d_head
    prompts = [prompt_ids(model, task, it) for it in items]
    pad = model.pad_id

    class StopText(transformers.StoppingCriteria):
        def __init__(self, start):
            self.start = start

        def __call__(self, input_ids, scores, **kwargs):
            rows = input_ids[:, self.start :].tolist()
            return torch.tensor([rule.text in tok.decode(r) for r in rows], dtype=torch.bool)

    def generate(chunk):
        ids, mask = model.pad(chunk)
        stopping = transformers.StoppingCriteriaList([StopText(ids.shape[1])] if rule.text else [])
        out = ref.generate(
            input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
            max_new_tokens=rule.max_new_tokens, do_sample=False, eos_token_id=sorted(rule.ids),
            pad_token_id=pad, stopping_criteria=stopping,
        )  # fmt: skip
        return [rule.cut_ids(row) for row in out[:, ids.shape[1] :].tolist()]

    results = {}
    t0 = time.perf_counter()
    for l, h in heads:
        handle = o_proj_hook(ref, l, h, E)
        try:
            with torch.inference_mode():
                new = [g for i in range(0, len(prompts), batch_size)
                       for g in generate(prompts[i : i + batch_size])]  # fmt: skip
        finally:
            handle.remove()
        texts = [rule.text_of(tok, ids) for ids in new]
        results[(l, h)] = [(t, bool(task.is_correct(it, t))) for it, t in zip(items, texts)]
    return time.perf_counter() - t0, results


_TORCH: dict = {}  # the model and its torch copy, loaded once per process


def torch_job(spec, threads, task_name, D, heads, batch_size):
    """(max |dlogits| of the first prompt, seconds, results, peak RSS MiB) of the torch sweep in
    this process; the model and its torch copy are loaded on the first call (not timed)."""
    if not _TORCH:
        pin_threads(threads)
        torch.set_grad_enabled(False)
        model = cn.load_model(spec)
        _TORCH.update(model=model, ref=torch_llama_from(model))
    model, ref = _TORCH["model"], _TORCH["ref"]
    task = get_task(task_name)
    items, _ = make_panels(task, D, 1, 0)
    dlogits = check_reference(model, ref, prompt_ids(model, task, items[0]))
    t, results = screen_torch(model, ref, task, items, heads, batch_size)
    return dlogits, t, results, rss_mib()


class TorchSide:
    """Where the torch sweep runs: by default in one spawned process kept for the whole bench,
    with glibc's default malloc as a user's torch session has it (this process runs ours, and
    ours turns on `fast.keep_freed_memory`, which speeds up torch as well); with
    --torch-in-process, here, sharing that setting."""

    def __init__(self, args):
        self.args = args
        self.pool = None
        if not args.torch_in_process:
            self.pool = spawn_pool()

    def close(self):
        if self.pool is not None:
            self.pool.shutdown()

    def sweep(self, task_name, D, heads):
        a = self.args
        job = (a.model, a.threads, task_name, D, heads, a.batch_size)
        if self.pool is None:
            return torch_job(*job)
        return self.pool.submit(torch_job, *job).result()


def check_reference(model, ref, ids: list[int]) -> float:
    """Max |logits ours - torch| over one prompt; fails loudly when the two models differ."""
    x = np.array([ids])
    with torch.inference_mode():
        theirs = ref(input_ids=torch.from_numpy(x)).logits.numpy()
    diff = float(np.abs(model.logits(x) - theirs).max())
    if not diff < 1e-3:
        raise SystemExit(f"the torch reference is not our model: max |dlogits| = {diff:.3g}")
    return diff


def prompt_ids(model, task, item) -> list[int]:
    """The token ids our evaluator feeds for `item` (a chat task: one user message, templated)."""
    return list(LMEvaluator(model, task).prompt_ids(item.prompt))


# --------------------------------------------------------------------------- FLOP floor


def trie_positions(seqs: list[list[int]]) -> tuple[int, int]:
    """(distinct positions, sum of their causal spans) of token sequences, a shared prefix counted
    once: what a forward over the sequences' prefix tree computes."""
    nodes = {tuple(s[: t + 1]) for s in seqs for t in range(len(s))}
    return len(nodes), sum(len(n) for n in nodes)


def floor_flops(model, task, items, heads, answers: dict) -> float:
    """Multiply-adds x 2 that an exact singleton screen of `heads` cannot avoid (docstring): per
    condition, every distinct position of the panel's prefix tree (prompt + that condition's
    answer) once, from the ablated layer up."""
    c = model.config
    H, G, E, D, F, V, L = (c.n_heads, c.n_kv_heads, c.d_head, c.d_model, c.d_mlp,
                           c.vocab_size, c.n_layers)  # fmt: skip
    n_mlp = 3 if c.family != "gpt2" else 2
    qkv, kv, wo, mlp = D * (H + 2 * G) * E, D * 2 * G * E, H * E * D, n_mlp * D * F
    prompts = [prompt_ids(model, task, it) for it in items]

    def tree(key):  # (positions, their spans, read-out positions, their spans) under `key`
        n, span = trie_positions([p + a for p, a in zip(prompts, answers[key])])
        # read-outs: the last prompt token and every answer token (their logits give the answer
        # and its stop); their spans run from len(prompt) to len(prompt) + len(answer)
        reads = [range(len(p), len(p) + len(a) + 1) for p, a in zip(prompts, answers[key])]
        return n, span, sum(len(r) for r in reads), sum(sum(r) for r in reads)

    n, span, n_read, _ = tree(None)  # one intact forward of the panel
    total = n * L * (qkv + wo + mlp) + L * 2 * H * E * span + n_read * D * V
    intact_seqs = [p + a for p, a in zip(prompts, answers[None])]
    for l, h in heads:
        n, span, n_read, read_span = tree((l, h))
        # positions the intact forward never saw (tokens generated only under this head) need
        # the layers below l too: their input is a new token
        both, _ = trie_positions(intact_seqs + [p + a for p, a in zip(prompts, answers[(l, h)])])
        total += (both - tree(None)[0]) * l * (qkv + wo + mlp)
        for layer in range(l, L):
            if layer == l:  # its attention input is intact: W_O and the MLP
                total += (n_read if layer == L - 1 else n) * (wo + mlp)
            elif layer < L - 1:
                total += n * (qkv + wo + mlp) + 2 * H * E * span
            else:  # last layer: K/V everywhere, the rest at the read-out positions
                total += n * kv + n_read * (qkv - kv + wo + mlp) + 2 * H * E * read_span
        total += n_read * D * V
    return 2.0 * total


# --------------------------------------------------------------------------- main


LABELS = {"batch32": "batch 32", "batch64": "batch 64"}
VARIANTS = {
    "batch32": dict(batch_size=32),  # prompts per forward (ours only; the default is BATCH_SIZE)
    "batch64": dict(batch_size=64),
    "intact_cache": dict(intact_cache=False),
    "share_prefix": dict(share_prefix=False),
    "intact_drafts": dict(intact_drafts=False),
    "forced": dict(forced=False),
    # glibc's default malloc (freed activations unmapped, page-faulted again when reused): ours
    # in a spawned process with CEL_NUMPY_SYSTEM_MALLOC=1 (`fast.keep_freed_memory` off)
    "keep_memory": dict(_env={"CEL_NUMPY_SYSTEM_MALLOC": "1"}),
}


def _screen_spawned(spec, task_name, D, heads, batch_size, threads, env, switches):
    """`screen_ours` in this (spawned) process with `env` set first; the model loaded and the
    engine warmed up before timing."""
    os.environ.update(env)
    pin_threads(threads)
    model = cn.load_model(spec)
    task = get_task(task_name)
    items, _ = make_panels(task, D, 1, 0)
    screen_ours(model, task, items[:4], heads[:2], batch_size)
    return screen_ours(model, task, items, heads, batch_size, **switches)


def screen_variant(args, task_name, D, model, task, items, heads, switches):
    """(once, seconds, results) of one path: in this process, or spawned when it sets `_env`."""
    if "_env" not in switches:
        return screen_ours(model, task, items, heads, args.batch_size, **switches)
    rest = {k: v for k, v in switches.items() if k != "_env"}
    with spawn_pool() as pool:
        return pool.submit(
            _screen_spawned, args.model, task_name, D, heads, args.batch_size, args.threads,
            switches["_env"], rest,
        ).result()  # fmt: skip


def bench_task(model, torch_side, task_name, D, args, rows):
    task = get_task(task_name)
    items, _ = make_panels(task, D, 1, 0)
    L, H = model.config.n_layers, model.config.n_heads
    heads = [(l, h) for l in range(L) for h in range(H)]
    sample = spread(heads, args.sample_heads)
    scale = len(heads) / len(sample)
    tag = f"{task_name} D={D}"
    print(f"\n== {tag}: {len(sample)} heads sampled of {len(heads)} (load {load()})", flush=True)
    variants = {"ours": {}}
    if D == args.variant_size:
        for k in filter(None, args.variants.split(",")):  # "a+b": both switched
            label = " ".join(LABELS.get(p, "-" + p) for p in k.split("+"))
            variants[f"ours {label}"] = {
                n: v for part in k.split("+") for n, v in VARIANTS[part].items()
            }
    times: dict[str, list] = {name: [] for name in variants}
    results: dict[str, dict] = {}
    t_torch, theirs = [], None
    for rep in range(args.repeats):  # interleaved, so that load changes hit every path alike
        for name, sw in variants.items():
            once, t, res = screen_variant(args, task_name, D, model, task, items, sample, sw)
            times[name].append((once, t))
            results[name] = res
            print(
                f"[{rep}] {name}: once {once:.1f} s, sample {t:.1f} s (load {load()})", flush=True
            )
        if torch_side is not None and D <= args.torch_max_size:
            dlogits, t, theirs, torch_rss = torch_side.sweep(task_name, D, sample)
            assert dlogits < 1e-3, f"torch reference differs from ours: max |dlogits| {dlogits}"
            t_torch.append(t)
            print(f"[{rep}] torch: {t:.1f} s, max |dlogits| {dlogits:.1e} (load {load()})",
                  flush=True)  # fmt: skip

    med = lambda xs: float(np.median(xs))
    ours = results["ours"]
    once, t_ours = med([o for o, _ in times["ours"]]), med([t for _, t in times["ours"]])
    full = once + scale * t_ours  # the whole screen: one-off work once, the heads scaled
    n = len(sample) * D
    rows.append((tag, f"ours, {len(sample)} heads (median of {args.repeats})", f"{t_ours:.1f} s",
                 f"{1e3 * t_ours / n:.1f} ms per (condition x item); "
                 f"one-off per panel {once:.1f} s"))  # fmt: skip
    rows.append((tag, f"ours, all {len(heads)} heads (estimated)", f"{full:.0f} s",
                 f"{1e3 * full / (len(heads) * D):.1f} ms per (condition x item)"))  # fmt: skip
    measured = None
    if args.all_heads:
        once_all, t_all, res_all = screen_ours(model, task, items, heads, args.batch_size)
        measured = once_all + t_all
        print(f"all heads: once {once_all:.1f} s, screen {t_all:.1f} s (load {load()})", flush=True)
        same = all(
            [(r.answer, r.correct) for r in res_all[hd]]
            == [(r.answer, r.correct) for r in ours[hd]]
            for hd in sample
        )
        note = f"{measured / full:.2f}x the estimate; same answers on the sample: {same}"
        rows.append((tag, f"ours, all {len(heads)} heads (measured, one run)",
                     f"{measured:.0f} s", note))  # fmt: skip
    for name in variants:
        if name == "ours":
            continue
        o, t = med([o for o, _ in times[name]]), med([t for _, t in times[name]])
        same = all(
            [(r.answer, r.correct) for r in results[name][hd]]
            == [(r.answer, r.correct) for r in ours[hd]]
            and np.allclose([r.ref_logprob for r in results[name][hd]],
                            [r.ref_logprob for r in ours[hd]], atol=1e-3)
            for hd in sample
        )  # fmt: skip
        rows.append((tag, name, f"{o + scale * t:.0f} s",
                     f"{(o + scale * t) / full:.2f}x ours (all heads, est.); "
                     f"same results: {same}"))  # fmt: skip

    # the answers' tokens for the floor: each sampled head's, and the intact ones
    tok = model.tokenizer
    intact = LMEvaluator(model, task).evaluate_many(items, [()])[0]
    answers = {None: [tok.encode(r.answer) for r in intact]}
    for hd in sample:
        answers[hd] = [tok.encode(r.answer) for r in ours[hd]]
    peak, shape = best_gemm_peak()
    # The floor of the whole screen, on the same footing as `full`: the panel's intact forward
    # once (the one-off part), the sampled heads' share scaled to every head.
    floor_once = floor_flops(model, task, items, [], answers) / (peak * 1e9)
    floor_sample = floor_flops(model, task, items, sample, answers) / (peak * 1e9) - floor_once
    floor = floor_once + scale * floor_sample
    rows.append((tag, "FLOP floor, all heads (est.)", f"{floor:.0f} s",
                 f"GEMM peak {peak:.0f} GFLOP/s ({shape}); "
                 f"ours {full / floor:.2f}x floor (target <= 1.7)"
                 + (f"; measured: {measured / floor:.2f}x" if measured else "")))  # fmt: skip
    # what ours multiplies, counted on the same sample (untimed): how much of "x floor" is
    # work the floor does not count, how much is the rate at which the work runs
    with counting_gemms() as flops:
        c_once, c_sample, _ = screen_ours(model, task, items, sample, args.batch_size, flops)
    ours_flops = c_once + scale * c_sample
    rows.append((tag, "ours' matrix products, all heads (counted, est.)",
                 f"{ours_flops / 1e12:.1f} TFLOP",
                 f"{ours_flops / (floor * peak * 1e9):.2f}x the floor's; at "
                 f"{ours_flops / 1e9 / full:.0f} GFLOP/s on average over the screen's time "
                 f"({ours_flops / 1e9 / full / peak:.0%} of the peak)"))  # fmt: skip
    if t_torch:
        tt = med(t_torch)
        same = all([(r.answer, r.correct) for r in ours[hd]] == theirs[hd] for hd in sample)
        n_diff = sum(
            a != (r.answer, r.correct) for hd in sample for a, r in zip(theirs[hd], ours[hd])
        )
        rows.append((tag, f"torch hook + generate, {len(sample)} heads", f"{tt:.1f} s",
                     f"{scale * tt / floor:.2f}x floor (all heads, est.); "
                     f"ours {tt / t_ours:.2f}x faster on the sample"))  # fmt: skip
        rows.append((tag, "torch, all heads (scaled)", f"{scale * tt:.0f} s",
                     f"ours **{scale * tt / full:.2f}x** faster "
                     f"(target >= {TARGETS.get(task_name, 3)})"))  # fmt: skip
        if measured is not None:
            rows.append((tag, "torch (scaled) / ours all heads (measured)",
                         f"{scale * tt / measured:.2f}x", "ours faster by this much"))  # fmt: skip
        rows.append(
            (tag, "answers and verdicts ours == torch", str(same), f"{n_diff} of {n} differ")
        )
    rows.append(
        (
            tag,
            "peak RSS so far",
            f"{rss_mib():.0f} MiB",
            "this process (ours)",
        )
    )
    if t_torch:
        where = "in this process" if args.torch_in_process else "its own process"
        rows.append((tag, "peak RSS, torch side", f"{torch_rss:.0f} MiB", where))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default="smollm2", help="smollm2 or qwen2.5-coder-0.5b")
    ap.add_argument("--tasks", default="capitals")
    ap.add_argument("--sizes", default="20,50")
    ap.add_argument("--sample-heads", type=int, default=10)
    ap.add_argument("--variants", default="intact_cache,share_prefix,intact_drafts,forced")
    ap.add_argument("--variant-size", type=int, default=20, help="D at which variants run")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved repeats (medians)")
    ap.add_argument(
        "--workers-heads", type=int, default=32, help="heads for the workers row (0: skip)"
    )
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument(
        "--all-heads", action="store_true",
        help="also time ours on every head once (the routine's order) beside the estimate",
    )  # fmt: skip
    ap.add_argument(
        "--torch-max-size", type=int, default=10**9, metavar="D",
        help="run the torch sweep only at sizes <= D (ours alone above: the cost-growth rows)",
    )  # fmt: skip
    ap.add_argument(
        "--batch-size", type=int, default=BATCH_SIZE,
        help="prompts per forward on both sides (default: the evaluator's)",
    )  # fmt: skip
    ap.add_argument("--threads", type=int, default=2, help="threads of each side (default 2)")
    ap.add_argument(
        "--torch-in-process", action="store_true",
        help="run the torch sweep in this process (sharing ours' malloc setting), not spawned",
    )  # fmt: skip
    args = ap.parse_args(argv)
    threads = pin_threads(args.threads)
    load_before = load()
    best_gemm_peak()  # before any model is loaded
    model = cn.load_model(args.model)
    torch_side = TorchSide(args) if torch is not None and not args.no_torch else None
    rows: list = []
    for task_name in args.tasks.split(","):
        for D in [int(x) for x in args.sizes.split(",") if x]:
            bench_task(model, torch_side, task_name, D, args, rows)
    rows.append(("unembedding", f"(N, {model.config.d_model}) @ (D, V) GEMM rate", "",
                 unembed_rates(model)))  # fmt: skip
    if args.workers_heads:
        task_name = args.tasks.split(",")[0]
        items, _ = make_panels(get_task(task_name), 20, 1, 0)
        heads = [(l, h) for l in range(model.config.n_layers) for h in range(model.config.n_heads)]
        sample = spread(heads, args.workers_heads)
        sample = sample[0::2] + sample[1::2]  # chunks of 8 mixing low and high layers (balanced)
        t1 = screen_workers(args.model, task_name, items, sample, 1, args.batch_size)
        t2 = screen_workers(args.model, task_name, items, sample, 2, args.batch_size)
        tag = f"{task_name} D=20"
        rows.append(
            (tag, f"workers: 1 process, 1 BLAS thread, {len(sample)} heads", f"{t1:.1f} s", "")
        )
        rows.append(
            (
                tag,
                "workers: 2 processes, 1 BLAS thread each",
                f"{t2:.1f} s",
                f"{t1 / t2:.2f}x one worker (target >= 1.7)",
            )
        )
    print(
        f"\nmachine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"numpy {np.__version__}"
        + (f", torch {torch.__version__}, transformers {transformers.__version__}"
           if torch_side is not None else "")
        + f"; threads: {threads}; load average (1, 5, 15 min) before {load_before}, after {load()}"
    )  # fmt: skip
    if torch_side is not None:
        torch_side.close()
    w = max(len(r[1]) for r in rows)
    print(f"\n| workload | {'measure':<{w}} | value | note |\n|---|---|---|---|")
    for tag, what, val, note in rows:
        print(f"| {tag} | {what:<{w}} | {val} | {note} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
