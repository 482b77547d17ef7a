"""Evaluators: how the routine asks "which examples does this model get right under this ablation?".

The routine never touches a model. It hands an `Evaluator` a list of items and a list of
*conditions* and gets back, per condition, one `ExampleResult` per item:

    condition  = tuple of (layer, head) pairs, sorted; () is the intact model
    evaluate_many(items, [c_1, ..., c_K])
        -> [[ExampleResult, ...] (one per item), ...] (one per c_k)

Many conditions at once is deliberate: a fast evaluator can share work across conditions
(the residual stream below the lowest ablated layer is the intact one). The implementations
here are the *naive reference*: every condition is one independent evaluation
(`evaluate_naive`), simple enough to be obviously right, so a fast path can be tested
against them result for result.

Evaluators
    LMEvaluator      a real language model (`cel_numpy.models`) on a task from `cel_numpy.tasks`:
                     "generate" tasks by greedy continuation (KV cache, ablation applied at every
                     step) until the task's stop rule (`scoring.stop_rule`: a stop token, the
                     stop text -- a newline by default -- or the token cap); "choice" tasks by
                     the total log-probability of each candidate continuation. Every result
                     carries `ref_logprob`, the reference answer's log-probability (generate: its
                     tokens after the prompt, teacher-forced; choice: the correct candidate's).
    TheoryEvaluator  the trained theory model on a `TheoryTask` (items are fixed samples of the
                     theory world, stored as ordinary `Item`s); see `TheoryTask` for the score.
"""

from __future__ import annotations

import hashlib
import json
import pickle
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from cel_numpy.localize.conditions import (
    Condition,
    ExampleResult,
    check_heads,
    condition_name,
    normalize_condition,
)
from cel_numpy.localize.resample import resample_donors, rows_of
from cel_numpy.localize.scoring import (
    choice_results,
    continuation_logprob,
    reference_ids,
    stop_rule,
)
from cel_numpy.models.fast import INTACT_CACHE_BYTES
from cel_numpy.tasks.base import Item


class Evaluator(Protocol):
    n_layers: int
    n_heads: int

    def identity(self) -> dict:
        """JSON-able description of exactly what is evaluated (model file hash,
        ablation kind...)."""
        ...

    def evaluate_many(
        self, items: Sequence[Item], conditions: Sequence[Condition], rows: range | None = None
    ) -> list[list[ExampleResult]]:
        """Per condition, one result per item of `items[rows]` (every item when rows is None).
        `items` is the whole panel: an ablation that draws on the panel (resample donors) draws
        on all of it, so a panel evaluated slice by slice gives the results of one call.
        Optional: the routine splits a large panel into slices only for an evaluator whose
        evaluate_many takes `rows` (`takes_rows`)."""
        ...


def takes_rows(evaluator) -> bool:
    """Whether `evaluator.evaluate_many` accepts `rows` (evaluates a slice of a panel)."""
    import inspect

    try:
        return "rows" in inspect.signature(evaluator.evaluate_many).parameters
    except (TypeError, ValueError):
        return False


def no_results(conditions: Sequence[Condition], n_layers: int, n_heads: int) -> list[list]:
    """`evaluate_many` on no items: one empty list per condition, each condition's heads still
    checked against the model (an impossible head is refused with or without items)."""
    for cond in conditions:
        check_heads(normalize_condition(cond), n_layers, n_heads)
    return [[] for _ in conditions]


def evaluate_naive(
    evaluate_one: Callable[[Sequence[Item], Condition], list[ExampleResult]],
    items: Sequence[Item],
    conditions: Sequence[Condition],
) -> list[list[ExampleResult]]:
    """The reference semantics of `evaluate_many`: each condition evaluated on its own."""
    out = []
    for cond in conditions:
        results = evaluate_one(items, normalize_condition(cond))
        if [r.item_id for r in results] != [it.id for it in items]:
            raise RuntimeError(
                f"evaluator returned results out of item order for {condition_name(cond)}"
            )
        out.append(results)
    return out


# =========================================================================== real language models

# Prompts per forward: what LMEvaluator and the localize/test-heads commands use unless told.
BATCH_SIZE = 16

# What a removed head becomes: 0, its mean over the discovery prompts, or another item's mean
# over that item's prompt (`cel_numpy.localize.resample`).
ABLATIONS = ("zero", "mean", "resample")


def _check_ablation(ablation: str, reference_items) -> None:
    if ablation not in ABLATIONS:
        raise ValueError(f"ablation must be one of {', '.join(ABLATIONS)}, got {ablation!r}")
    if ablation == "mean" and not reference_items:
        raise ValueError(
            "mean ablation needs reference_items (the prompts whose mean z replaces a head)"
        )


class LMEvaluator:
    """A `cel_numpy.models` model on a `cel_numpy.tasks` task (naive: one pass per condition).

    model           a loaded `Model` (`cel_numpy.models.loaders.load_model(spec)`)
    task            its `scoring` says how to get an answer; `is_correct` scores it
    ablation        "zero" (the head's z set to 0), "mean" (z replaced by its mean over every
                    position of `reference_items`' prompts, intact model: `Model.mean_z`) or
                    "resample" (item i's z replaced by the mean z of a donor item of the panel
                    being evaluated, from another cluster: `cel_numpy.localize.resample`)
    reference_items required for mean ablation (the routine passes the discovery panel)
    resample_seed   the seed of the resample donors (the CLI passes the panel seed)
    batch_size      prompts per forward; results do not depend on it (left padding + mask)
    spec, file_identity  recorded in `identity()` (the CLI passes the file's sha256 and size)
    fast            True (default): `evaluate_many` shares work across conditions
                    (`cel_numpy.localize.fast`, exact); False: the naive reference, one independent
                    evaluation per condition (`evaluate_naive`). Same results either way.
    The fast path's savings can be switched off one by one (same results; for benchmarks):
    share_prefix (a batch's common prompt prefix runs once), forced (greedy tokens verified
    along draft answers in one forward), intact_drafts (the intact model's answer as a second
    draft: rows that keep the intact answer under a condition are settled in the forward, their
    layers below the ablated head taken from the intact pass, instead of decoded through every
    layer; `bench/bench_screen.py` measures its effect on a screen; used by calls with at least
    `fast.INTACT_DRAFTS_MIN_CONDITIONS` ablated conditions, or once the intact answers are
    known: a 2-condition call would pay their extra pass for nothing), intact_cache (a batch's
    intact pass kept across calls, up to intact_cache_bytes).
    """

    def __init__(
        self,
        model,
        task,
        *,
        ablation: str = "zero",
        reference_items=None,
        batch_size: int = BATCH_SIZE,
        spec: str = "",
        file_identity: dict | None = None,
        fast: bool = True,
        share_prefix: bool = True,
        forced: bool = True,
        intact_drafts: bool = True,
        intact_cache: bool = True,
        intact_cache_bytes: int = INTACT_CACHE_BYTES,
        resample_seed: int = 0,
    ):
        _check_ablation(ablation, reference_items)
        self.resample_seed = int(resample_seed)
        self.model = model
        self.task = task
        self.ablation = ablation
        self.batch_size = int(batch_size)
        self.fast = bool(fast)
        self.share_prefix, self.forced = bool(share_prefix), bool(forced)
        self.intact_drafts = bool(intact_drafts) and self.forced
        self.intact_cache, self.intact_cache_bytes = bool(intact_cache), int(intact_cache_bytes)
        self.n_layers = int(model.config.n_layers)
        self.n_heads = int(model.config.n_heads)
        self.spec = spec
        self.file_identity = dict(file_identity or {})
        self.mean_z = None
        self.reference_ids: list[str] = []
        if ablation == "mean":
            # (L, H, E)
            self.mean_z = model.mean_z([self.prompt_ids(it.prompt) for it in reference_items])
            self.reference_ids = [it.id for it in reference_items]

    def __reduce__(self):
        """Pickle a model loaded from a spec as the spec (a worker loads it once and caches it);
        a model built in memory travels by value. Mean ablation ships its mean z."""
        if self.spec and getattr(self.model, "source", None) and self.model.tokenizer is not None:
            state = dict(
                spec=self.spec,
                task=self.task,
                ablation=self.ablation,
                batch_size=self.batch_size,
                file_identity=self.file_identity,
                fast=self.fast,
                switches=(self.share_prefix, self.forced, self.intact_drafts, self.intact_cache),
                intact_cache_bytes=self.intact_cache_bytes,
                mean_z=self.mean_z,
                reference_ids=self.reference_ids,
                resample_seed=self.resample_seed,
            )
            return (_lm_evaluator_from_spec, (state,))
        return object.__reduce__(self)

    def identity(self) -> dict:
        ident = {
            "kind": "lm",
            "spec": self.spec,
            "source": getattr(self.model, "source", ""),
            "family": getattr(self.model.config, "family", ""),
            "n_layers": self.n_layers,
            "n_heads": self.n_heads,
            "dtype": str(getattr(self.model, "dtype", "")),
            "ablation": self.ablation,
            **self.file_identity,
        }
        if self.ablation == "mean":
            ident["mean_reference_sha256"] = hashlib.sha256(
                "\n".join(self.reference_ids).encode()
            ).hexdigest()
        if self.ablation == "resample":
            ident["resample_seed"] = self.resample_seed
        return ident

    def fill_for(self, items: Sequence[Item]) -> np.ndarray | None:
        """What a removed head becomes on these items: None (zero), the mean z (L, H, E)
        (mean), or per item its donor's mean z over the donor's prompt (L, N, H, E)
        (resample; donors drawn within `items`, kept per panel)."""
        if self.ablation != "resample":
            return self.mean_z
        return self._resample_fill(items, range(len(items)))

    def _resample_fill(self, panel: Sequence[Item], rows: range) -> np.ndarray:
        """(L, len(rows), H, E): for each item of panel[rows], its donor's mean z, the donors
        drawn within the whole panel. Remembered under the evaluated items' ids (the panels of
        a run are disjoint, so a slice's ids never name another panel)."""
        key = tuple(panel[i].id for i in rows)
        memo = self.__dict__.setdefault("_resample_fills", {})
        if key not in memo:
            donors = resample_donors([it.cluster for it in panel], self.resample_seed)[rows]
            prompts = [self.prompt_ids(panel[d].prompt) for d in donors]
            memo[key] = self.model.row_mean_z(prompts, batch_size=self.batch_size)
        return memo[key]

    # ------------------------------------------------------------------ helpers

    def _encode(self, text: str) -> list[int]:
        return list(self.model.tokenizer.encode(text))  # adds BOS iff the tokenizer says so

    def model_text(self, prompt: str, task=None) -> str:
        """The text the model reads for a prompt: a chat task's prompt (`Task.chat`) is one user
        message, written in the model's chat template with the generation prompt, then the
        task's `prefill` (the assistant's first words, e.g. MBPP's "[BEGIN]\\n"), if any."""
        task = task or self.task
        if getattr(task, "chat", False):
            text = self.model.chat([{"role": "user", "content": prompt}])
            return text + getattr(task, "prefill", "")
        return prompt

    def prompts_sha256(self, task, items: Sequence[Item]) -> str:
        """sha256 of the texts the model reads for `items` of `task`, in order (for a chat task
        the rendered conversations: a template that calls strftime_now renders differently on
        another day, and a resumed run must not mix the two)."""
        digest = hashlib.sha256()
        for it in items:
            digest.update(self.model_text(it.prompt, task).encode("utf-8", "surrogatepass"))
            digest.update(b"\0")
        return digest.hexdigest()

    def prompt_ids(self, prompt: str) -> list[int]:
        """Token ids of an item's prompt as the model reads it (what generation continues)."""
        if getattr(self.task, "chat", False):
            return self.model.encode_chat_text(self.model_text(prompt))
        return self._encode(prompt)

    @staticmethod
    def _ablate_kwargs(cond: Condition, fill: np.ndarray | None) -> dict:
        """Model keyword arguments: the heads, and what they become (a fill per row is a mean
        per row: resample ablation)."""
        kind = "zero" if fill is None else "mean"
        return {"ablate": list(cond), "ablation": kind, "mean_z": fill}

    def evaluate_many(self, items, conditions, rows: range | None = None):
        if not items or rows is not None and not rows:
            return no_results(conditions, self.n_layers, self.n_heads)
        if rows is not None:
            if self.ablation == "resample":
                self._resample_fill(items, rows)  # donors from the whole panel, remembered
            items = [items[i] for i in rows]
        if self.fast:
            from cel_numpy.localize.fast import evaluate_many_fast

            return evaluate_many_fast(self, items, conditions)
        return evaluate_naive(self.evaluate_condition, items, conditions)

    def evaluate_condition(self, items: Sequence[Item], cond: Condition) -> list[ExampleResult]:
        cond = normalize_condition(cond)  # any spelling of cel_numpy.heads: "L3H1+L5H0", pairs
        check_heads(cond, self.n_layers, self.n_heads)
        if self.task.scoring == "generate":
            return self._generate(items, cond)
        if self.task.scoring == "choice":
            return self._choice(items, cond)
        raise ValueError(f"task {self.task.name!r} has unknown scoring {self.task.scoring!r}")

    def _generate(self, items, cond):
        tok = self.model.tokenizer
        rule = stop_rule(self.task, tok)
        fill = self.fill_for(items)
        out = []
        for start in range(0, len(items), self.batch_size):
            chunk = items[start : start + self.batch_size]
            kwargs = self._ablate_kwargs(cond, rows_of(fill, slice(start, start + len(chunk))))
            refs = [reference_ids(self, it) for it in chunk]  # (prompt ids, answer ids)
            new_ids = self.model.generate_ids(
                [p for p, _ in refs], rule.max_new_tokens, stop_at_eos=False, **kwargs
            )
            ids, mask = self.model.pad([p + a for p, a in refs])  # teacher-forced reference
            logits = self.model.logits(ids, attention_mask=mask, **kwargs)
            for k, (it, new, (_, answer)) in enumerate(zip(chunk, new_ids, refs)):
                text = rule.text_of(tok, rule.cut_ids(new))
                logprob = continuation_logprob(logits[k], answer)
                out.append(
                    ExampleResult(it.id, bool(self.task.is_correct(it, text)), text, logprob)
                )
        return out

    def continuation_ids(self, prompt: str, choice: str) -> tuple[list[int], int]:
        """Token ids of prompt+choice, and where the scored continuation starts.

        Tokenizer-aware: the text is encoded whole (so a merge across the prompt/choice boundary
        happens as in real use), and the continuation is everything after the longest common
        prefix with the prompt's own encoding. At least one token is always scored.
        """
        if getattr(self.task, "chat", False):  # the answer follows the assistant prompt
            full = self.model.encode_chat_text(self.model_text(prompt) + choice)
        else:
            full = self._encode(prompt + choice)
        alone = self.prompt_ids(prompt)
        n = 0
        while n < min(len(full), len(alone)) and full[n] == alone[n]:
            n += 1
        n = min(n, len(full) - 1)
        return full, max(n, 1)

    def choice_logprobs(self, items: Sequence[Item], conditions) -> np.ndarray:
        """Total log-probability of every candidate of a choice task's items under each
        condition: (n_conditions, n_items, max choices), -inf past an item's last choice; what
        `evaluate_many` compares (through `scoring.choice_scores`) before it picks."""
        if self.task.scoring != "choice":
            raise ValueError(f"task {self.task.name!r} is not a choice task: no choices to score")
        conds = [normalize_condition(c) for c in conditions]
        for c in conds:
            check_heads(c, self.n_layers, self.n_heads)
        if self.fast:
            from cel_numpy.localize.fast import choice_logprobs_fast

            return choice_logprobs_fast(self, items, conds)
        if not conds:
            return np.full((0, len(items), max((len(it.choices) for it in items), default=0)), 0.0)
        return np.stack([self._choice_logprobs(items, c) for c in conds])

    def _choice(self, items, cond):
        return choice_results(self.task, items, self._choice_logprobs(items, cond))

    def _choice_logprobs(self, items, cond) -> np.ndarray:
        """(n_items, max choices) total log-probability of each candidate, one condition."""
        rows = []  # (item index, choice index, ids, start)
        for i, it in enumerate(items):
            if not it.choices:
                raise ValueError(f"choice task item {it.id} has no choices")
            for j, ch in enumerate(it.choices):
                ids, start = self.continuation_ids(it.prompt, ch)
                rows.append((i, j, ids, start))
        scores = np.full((len(items), max(len(it.choices) for it in items)), -np.inf)
        fill = self.fill_for(items)
        for b in range(0, len(rows), self.batch_size):
            chunk = rows[b : b + self.batch_size]
            ids, mask = self.model.pad([r[2] for r in chunk])
            kwargs = self._ablate_kwargs(cond, rows_of(fill, [r[0] for r in chunk]))
            logits = self.model.logits(ids, attention_mask=mask, **kwargs)
            for k, (i, j, seq, start) in enumerate(chunk):
                scores[i, j] = continuation_logprob(logits[k], seq[start:])  # rows end at column -1
        return scores


_WORKER_MODELS: dict = {}  # spec -> Model, one load per worker process
# The evaluator a worker last unpickled, by the digest of its pickled state: every chunk of a
# stage arrives as a new pickle of the same evaluator, and rebuilding it would redo its one-off
# work (the intact answers and intact passes of `cel_numpy.localize.fast`) once per chunk
# instead of once per worker. One is kept (the stage's current panel), so memory stays bounded.
_WORKER_EVALUATOR: dict = {}


def _lm_evaluator_from_spec(state: dict) -> LMEvaluator:
    key = hashlib.sha256(pickle.dumps(state)).hexdigest()
    if key not in _WORKER_EVALUATOR:
        _WORKER_EVALUATOR.clear()
        _WORKER_EVALUATOR[key] = _new_lm_evaluator(state)
    return _WORKER_EVALUATOR[key]


def _new_lm_evaluator(state: dict) -> LMEvaluator:
    from cel_numpy.models.loaders import load_model

    spec = state["spec"]
    if spec not in _WORKER_MODELS:
        _WORKER_MODELS[spec] = load_model(spec)
    ev = LMEvaluator(
        _WORKER_MODELS[spec],
        state["task"],
        batch_size=state["batch_size"],
        spec=spec,
        file_identity=state["file_identity"],
        fast=state["fast"],
        intact_cache_bytes=state["intact_cache_bytes"],
    )
    ev.share_prefix, ev.forced, ev.intact_drafts, ev.intact_cache = state["switches"]
    ev.resample_seed = state["resample_seed"]
    ev.ablation, ev.mean_z, ev.reference_ids = (
        state["ablation"],
        state["mean_z"],
        state["reference_ids"],
    )
    return ev


# =========================================================================== theory world


class TheoryTask:
    """Task A or B of the theory world as a `Task`, so the routine runs on it unchanged.

    Items are fixed samples of the theory data generator. `Item.prompt` is the sample itself,
    JSON {"types": [N ints], "z": [N x m floats]} (floats written with Python's round-trip repr,
    so decoding is exact); `Item.answer` is the target y, likewise exact; `Item.subtask` is "A"/"B".

    Score (accuracy style): the model's answer is its prediction y_hat, and an example is
    correct iff |y_hat - y| < tau, with tau = 1.0 by default. Why 1.0: with u = w_s.z_s and
    r = w_c.z_c standard normal, the trained model predicts about u + delta r (delta = p_A - p_B
    = -0.4), so on task A its error is (1 - delta) r, sd 1.4, and once the c-head is removed it
    predicts about u with error r, sd 1. The tau that best separates these two (maximising
    P(|r| < tau) - P(|1.4 r| < tau)) solves ln 1.4 = tau^2 (1 - 1/1.96) / 2, tau = 1.17; 1.0 is
    the round number next to it, and "within one unit of a target whose sd is sqrt 2" is easy to
    say. Expected accuracies: task A 0.52 intact -> 0.68 without the c-head; task B 0.90 -> 0.68.
    """

    scoring = "generate"
    max_new_tokens = 1

    def __init__(self, which: str, world, tau: float = 1.0):
        from cel_numpy.theory.data import TASK_A, TASK_B

        which = which.upper().removeprefix("THEORY-")
        if which not in ("A", "B"):
            raise ValueError(f"theory task must be 'A' or 'B', got {which!r}")
        self.which = which
        self.task_id = TASK_A if which == "A" else TASK_B
        self.world = world
        self.tau = float(tau)
        self.name = f"theory-{which}"

    def sample(self, rng: np.random.Generator, n: int) -> list[Item]:
        from cel_numpy.theory.data import sample_batch

        batch = sample_batch(rng, self.world, n, task=self.task_id)
        return [
            Item(
                task=self.name,
                subtask=self.which,
                prompt=json.dumps({"types": batch.types[b].tolist(), "z": batch.z[b].tolist()}),
                answer=repr(float(batch.y[b])),
            )
            for b in range(n)
        ]

    def is_correct(self, item: Item, output: str) -> bool:
        return abs(float(output) - float(item.answer)) < self.tau


def items_to_batch(items: Sequence[Item]):
    """Decode `TheoryTask` items into a theory `Batch` (exact round trip)."""
    from cel_numpy.theory.data import TASK_A, TASK_B, Batch

    decoded = [json.loads(it.prompt) for it in items]
    types = np.array([d["types"] for d in decoded], dtype=np.int64)  # (B, N)
    z = np.array([d["z"] for d in decoded], dtype=np.float64)  # (B, N, m)
    task = np.array([TASK_A if it.subtask == "A" else TASK_B for it in items])  # (B,)
    y = np.array([float(it.answer) for it in items])  # (B,)
    return Batch(types=types, z=z, task=task, y=y)


class TheoryEvaluator:
    """The theory model (one layer, H heads) under head ablations, scored by a `TheoryTask`.

    Heads are addressed as (0, h). ablation "zero" sets head h's output o_h to 0 (the model's own
    head_mask); "mean" replaces it by its mean over `reference_items`; "resample" by its output
    on a donor sample of the evaluated items (`cel_numpy.localize.resample`, `resample_seed`).
    """

    n_layers = 1

    def __init__(
        self,
        params: dict,
        task: TheoryTask,
        *,
        ablation: str = "zero",
        reference_items=None,
        label: str = "theory",
        resample_seed: int = 0,
    ):
        _check_ablation(ablation, reference_items)
        self.resample_seed = int(resample_seed)
        self.params = {k: np.array(v, dtype=np.float64) for k, v in params.items()}
        self.task = task
        self.ablation = ablation
        self.label = label
        self.n_heads = int(self.params["K"].shape[0])
        self.fill = np.zeros(self.n_heads)  # (H,) what an ablated head outputs
        # last panel decoded (ids, Batch)
        self._decoded: tuple[tuple[str, ...], object] = (
            (),
            None,
        )
        if ablation == "mean":
            from cel_numpy.theory.model import theory_forward

            _, cache = theory_forward(self.params, items_to_batch(reference_items))
            self.fill = cache.head_outputs.mean(axis=0)  # (B, H) -> (H,)

    def identity(self) -> dict:
        digest = hashlib.sha256()
        for k in sorted(self.params):
            digest.update(k.encode())
            digest.update(np.ascontiguousarray(self.params[k]).tobytes())
        return {
            "kind": "theory",
            "spec": self.label,
            "params_sha256": digest.hexdigest(),
            "n_layers": 1,
            "n_heads": self.n_heads,
            "dtype": "float64",
            "ablation": self.ablation,
            "tau": self.task.tau,
            **({"resample_seed": self.resample_seed} if self.ablation == "resample" else {}),
        }

    def _batch(self, items: Sequence[Item]):
        ids = tuple(it.id for it in items)
        if self._decoded[0] != ids:
            self._decoded = (ids, items_to_batch(items))
        return self._decoded[1]

    def predict(self, items: Sequence[Item], cond: Condition) -> np.ndarray:
        """y_hat (B,) with the heads of `cond` ablated."""
        from cel_numpy.theory.model import theory_forward

        cond = normalize_condition(cond)
        check_heads(cond, 1, self.n_heads)
        keep = np.ones(self.n_heads)
        for _, h in cond:
            keep[h] = 0.0
        if self.ablation == "zero":
            y_hat, _ = theory_forward(self.params, self._batch(items), head_mask=keep)  # (B,)
            return y_hat
        _, cache = theory_forward(self.params, self._batch(items))
        o = cache.head_outputs  # (B, H)
        fill = self.fill  # (H,)
        if self.ablation == "resample":
            fill = o[resample_donors([it.cluster for it in items], self.resample_seed)]  # (B, H)
        return (o * keep + fill * (1.0 - keep)).sum(axis=1)  # (B, H) -> (B,)

    def evaluate_condition(self, items: Sequence[Item], cond: Condition) -> list[ExampleResult]:
        y_hat = self.predict(items, cond)
        out = []
        for it, yh in zip(items, y_hat):
            answer = repr(float(yh))
            out.append(ExampleResult(it.id, bool(self.task.is_correct(it, answer)), answer))
        return out

    def evaluate_many(self, items, conditions, rows: range | None = None):
        if not items or rows is not None and not rows:
            return no_results(conditions, self.n_layers, self.n_heads)
        # resample donors come from the whole panel: evaluate it all, keep the rows asked for
        results = evaluate_naive(self.evaluate_condition, items, conditions)
        return results if rows is None else [[res[i] for i in rows] for res in results]
