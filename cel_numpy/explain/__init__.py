"""Why removing a head helps: where it looks, what it writes, and what undoes its removal.

    report = explain(model, task, "L13H2+L8H1", items)    # items: a panel of the task
    write_explanation(report, "runs/explain")            # report.json, report.md, explain.png

For a head set S and a panel, the items are split by what removing S does (rescued: wrong intact,
right without S; damaged: the reverse). Per head h of S, all at the answer position (the last
prompt token, whose logits give the answer's first token):

  attention shares   how the intact head's attention from the answer position splits over the
                     prompt's token roles (the task's `roles(item)`: the query, the shots'
                     answers, separators...; "first" is position 0, BOS where the tokenizer adds
                     one, where attention sinks park; "other" the rest), mean over items.
  OV copying score   the eigenvalue score of the head's full OV circuit W_E W_V W_O W_U
                     (`ov_copying_scores`): +1 when every token it attends to is pushed up
                     (a pure copier), -1 when pushed down; plus `attended lift`, the same
                     question asked of the panel itself: how far above the vocabulary's mean
                     the head's direct logit contribution lifts the tokens it attends to.
  direct logit attribution  the head's output z_h W_O[h] read straight through the final norm
                     and W_U, with the final norm's scale frozen at its value in the intact run
                     (so the components of the residual stream add up exactly to the logits:
                     `direct_logit_attribution`), for the reference answer's first token and
                     the competitor's: the intact model's first token on rescued items, the
                     removed model's on damaged items (the other candidate for choice tasks;
                     when that token equals the reference's, the best other token).
  restoring          activation patching of z: S removed, but head h's z put back to its intact
                     value at every position (`forward_patched`); on rescued items, how much of
                     the removal's change in the logit difference (reference - intact's token)
                     that one head undoes, and how often the intact (wrong) first token returns.

The copying scores follow the idea TransformerLens computes for a head's OV circuit (the share of
positive eigenvalue mass of the token-to-token map, from Elhage et al.'s "mathematical framework"
for transformer circuits); here the norms enter through their weights only, the scales of RMS/
LayerNorm left out (a positive scale does not change the score), and LayerNorm's centering too.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from cel_numpy.attention import attention_forward
from cel_numpy.heads import Head, head_name, heads_name, parse_heads
from cel_numpy.models.transformer import (
    embed,
    mlp_forward,
    norm_forward,
    prepare_inputs,
    unembed,
)

FIRST, OTHER = "first", "other"
KINDS = ("rescued", "damaged")

# --------------------------------------------------------------------------- token roles


def token_char_spans(tokenizer, ids: Sequence[int]) -> list[tuple[int, int]]:
    """[start, end) in decode(ids) of each token, from the decoded lengths of its prefixes."""
    ends = [len(tokenizer.decode(list(ids[: i + 1]))) for i in range(len(ids))]
    return [(0 if i == 0 else ends[i - 1], end) for i, end in enumerate(ends)]


def token_roles(
    spans: list[tuple[int, int]], roles: dict[str, list[tuple[int, int]]], offset: int
) -> list[str]:
    """The role of each token: the first role (in `roles`' order) whose character span, shifted by
    `offset`, overlaps the token's; position 0 is always FIRST; no overlap: OTHER."""
    out = []
    for i, (start, end) in enumerate(spans):
        role = FIRST if i == 0 else OTHER
        if i > 0:
            for name, ranges in roles.items():
                if any(start < b + offset and a + offset < end for a, b in ranges):
                    role = name
                    break
        out.append(role)
    return out


def role_shares(pattern: np.ndarray, roles: list[str], names: Sequence[str]) -> dict[str, float]:
    """pattern (S,) attention of one query over the S prompt tokens -> share per role name."""
    return {n: float(sum(p for p, r in zip(pattern, roles) if r == n)) for n in names}


# --------------------------------------------------------------------------- direct attribution


def final_norm_scale(model, resid: np.ndarray) -> np.ndarray:
    """The final norm's 1/rms (llama) or 1/std (gpt2) of residual vectors (..., D) -> (..., 1):
    the scale `direct_logit_attribution` freezes."""
    _, cache = norm_forward(model.params["ln_final"], resid, model.config)
    return cache.rstd


def through_final_norm(model, vectors: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Component vectors (C, D) as the final norm passes them on with its scale frozen (a linear
    map): c * scale * w, centred first for LayerNorm. The norm's bias is not included."""
    if model.config.family == "gpt2":
        vectors = vectors - vectors.mean(axis=-1, keepdims=True)  # (C, D)
    return vectors * scale * model.params["ln_final"]["w"]  # (C, D)


def residual_components(model, cache, b: int, t: int) -> tuple[list[str], np.ndarray]:
    """The residual stream at (b, t) after the last block as a sum of named parts -> names, (C, D).

    embed (with positions for gpt2), every head's z W_O[h] ("L3H1", what W_O reads, so a removed
    head contributes 0), each layer's output bias ("L3 b_O") when present, each MLP ("L3 mlp").
    """
    names, parts = ["embed"], [cache["embed"][b, t]]
    for l, block in enumerate(model.params["blocks"]):
        z = cache[f"blocks.{l}.attn.z_ablated"][b, :, t]  # (H, E)
        per_head = np.einsum("he,hed->hd", z, block["attn"]["W_O"])  # (H, D)
        names += [head_name((l, h)) for h in range(per_head.shape[0])]
        parts += list(per_head)
        if "b_O" in block["attn"]:
            names.append(f"L{l} b_O")
            parts.append(block["attn"]["b_O"])
        names.append(f"L{l} mlp")
        parts.append(cache[f"blocks.{l}.mlp.out"][b, t])
    return names, np.stack(parts)


def direct_logit_attribution(
    model, cache, b: int, t: int, tokens: Sequence[int], scale: np.ndarray | None = None
) -> tuple[list[str], np.ndarray]:
    """Each residual component's direct contribution to the logits of `tokens` at (b, t).

    -> names (C + 1), contributions (C + 1, K): the components of `residual_components`, read
    through the final norm with its scale frozen (default: this run's own scale at (b, t), so the
    rows sum to the logits exactly), then a last row "bias" (the norm's and W_U's biases).
    """
    names, parts = residual_components(model, cache, b, t)  # (C, D)
    if scale is None:
        scale = final_norm_scale(model, parts.sum(axis=0))  # (1,)
    W_U = model.params["unembed"]["W_U"][:, list(tokens)]  # (D, K)
    contributions = through_final_norm(model, parts, scale) @ W_U  # (C, K)
    bias = np.zeros(len(tokens), dtype=contributions.dtype)  # (K,)
    if "b" in model.params["ln_final"]:
        bias = bias + model.params["ln_final"]["b"] @ W_U
    if "b_U" in model.params["unembed"]:
        bias = bias + model.params["unembed"]["b_U"][list(tokens)]
    return names + ["bias"], np.vstack([contributions, bias[None]])


def head_logit_vector(model, z: np.ndarray, layer: int, head: int, scale) -> np.ndarray:
    """One head's direct contribution to every logit: z (E,) -> (V,), frozen final-norm scale."""
    out = z @ model.params["blocks"][layer]["attn"]["W_O"][head]  # (D,)
    return through_final_norm(model, out[None], scale)[0] @ model.params["unembed"]["W_U"]


def attended_lift(logit_vector: np.ndarray, pattern: np.ndarray, ids: Sequence[int]) -> float:
    """How far the head lifts the tokens it attends to, in standard deviations of its logit
    vector (V,) over the vocabulary: sum_s a_s z(ids[s]) / sum_s a_s over s >= 1 (position 0,
    the sink, left out), z = (logit - mean) / std."""
    zscores = (logit_vector - logit_vector.mean()) / max(float(logit_vector.std()), 1e-30)  # (V,)
    weights = pattern[1:]  # (S - 1,)
    if weights.sum() <= 0:
        return 0.0
    return float((weights * zscores[np.asarray(ids[1:])]).sum() / weights.sum())


def attended_lifts(model, cache, b: int, ids: Sequence[int]) -> np.ndarray:
    """`attended_lift` of every head at the last position of row b -> (L, H), all heads' logit
    vectors in one product; ids: the row's real tokens (the last len(ids) columns)."""
    c = model.config
    T = cache["blocks.0.attn.z"].shape[2]
    real = slice(T - len(ids), T)
    resid = cache[f"blocks.{c.n_layers - 1}.resid_post"][b, -1]  # (D,)
    scale = final_norm_scale(model, resid)  # (1,)
    # (L * H, D)
    outs = np.stack(
        [
            np.einsum("he,hed->hd", cache[f"blocks.{l}.attn.z"][b, :, -1], blk["attn"]["W_O"])
            for l, blk in enumerate(model.params["blocks"])
        ]
    ).reshape(-1, c.d_model)
    vectors = through_final_norm(model, outs, scale) @ model.params["unembed"]["W_U"]  # (LH, V)
    patterns = np.stack(
        [cache[f"blocks.{l}.attn.pattern"][b, :, -1, real] for l in range(c.n_layers)]
    ).reshape(-1, len(ids))
    lifts = [attended_lift(v, p, ids) for v, p in zip(vectors, patterns)]
    return np.array(lifts).reshape(c.n_layers, c.n_heads)


# --------------------------------------------------------------------------- OV circuit


def ov_circuit(model, layer: int, head: int, vocab: np.ndarray | None = None) -> np.ndarray:
    """The head's full OV circuit as a (V', V') matrix (rows: attended token, columns: logit):
    W_E diag(ln1.w) W_V W_O diag(ln_final.w) W_U over the token ids `vocab` (default all).
    Only for small vocabularies (tests, pictures); `ov_copying_scores` never builds it."""
    p, c = model.params, model.config
    block = p["blocks"][layer]
    g = head // (c.n_heads // c.n_kv_heads)
    vocab = np.arange(c.vocab_size) if vocab is None else vocab
    left = (p["embed"]["W_E"][vocab] * block["ln1"]["w"]) @ block["attn"]["W_V"][g]  # (V', E)
    right = block["attn"]["W_O"][head] @ (p["ln_final"]["w"][:, None] * p["unembed"]["W_U"])
    return left @ right[:, vocab]  # (V', V')


def copying_score(eigenvalues: np.ndarray) -> float:
    """sum(eigenvalues).real / sum |eigenvalues|: +1 all positive (copying), -1 all negative."""
    total = float(np.abs(eigenvalues).sum())
    return float(eigenvalues.sum().real) / total if total > 0 else 0.0


def ov_copying_scores(model) -> np.ndarray:
    """(L, H) copying score of every head's full OV circuit (`ov_circuit` over the real tokens).

    The (V, V) circuit A B with A = W_E diag(w1) W_V (V, E), B = W_O diag(wf) W_U (E, V) has the
    nonzero eigenvalues of B A (E, E) = W_O [diag(wf) W_U W_E] diag(w1) W_V, so one (D, D) product
    over the vocabulary serves every head.
    """
    p, c = model.params, model.config
    real = np.setdiff1d(np.arange(c.vocab_size), model.padding_ids)
    W_E = p["embed"]["W_E"][real].astype(np.float64)  # (V, D)
    W_U = p["unembed"]["W_U"][:, real].astype(np.float64)  # (D, V)
    loop = (p["ln_final"]["w"][:, None] * W_U) @ W_E  # (D, D)
    group = c.n_heads // c.n_kv_heads
    scores = np.zeros((c.n_layers, c.n_heads))
    for l, block in enumerate(p["blocks"]):
        a = block["attn"]
        for h in range(c.n_heads):
            inner = a["W_O"][h] @ loop @ (block["ln1"]["w"][:, None] * a["W_V"][h // group])
            scores[l, h] = copying_score(np.linalg.eigvals(inner))  # inner (E, E)
    return scores


# --------------------------------------------------------------------------- activation patching


def _patched_block(p, x, config, inputs, head_mask, patches: dict[int, np.ndarray]):
    """One block (as `transformer.block_forward`) whose heads in `patches` output the given z
    (B, T, E) instead of their own; x (B, T, D) -> (B, T, D). Kept here, not in the forward, so
    the forward stays free of patching branches."""
    ln1_out, _ = norm_forward(p["ln1"], x, config)  # (B, T, D)
    # (B, T, D); the patched heads are zeroed by head_mask, then added back below
    attn_out, _ = attention_forward(
        p["attn"], ln1_out, mask=inputs.mask, rotary=inputs.rotary, head_mask=head_mask
    )
    for h, z in patches.items():
        attn_out = attn_out + z @ p["attn"]["W_O"][h]  # (B, T, E) @ (E, D)
    resid_mid = x + attn_out  # (B, T, D)
    ln2_out, _ = norm_forward(p["ln2"], resid_mid, config)  # (B, T, D)
    mlp_out, _ = mlp_forward(p["mlp"], ln2_out, config)  # (B, T, D)
    return resid_mid + mlp_out


def forward_patched(
    model, ids: np.ndarray, mask: np.ndarray, ablate, patches: dict[Head, np.ndarray]
) -> np.ndarray:
    """Next-token logits (B, V) with the heads `ablate` zero-ablated and each head in `patches`
    given that z (B, T, E) at every position (activation patching; a head may be in both: the
    patch wins). ids, mask (B, T) left-padded."""
    c = model.config
    head_mask = np.ones((c.n_layers, c.n_heads), dtype=model.dtype)
    for l, h in list(parse_heads(ablate)) + list(patches):
        head_mask[l, h] = 0
    inputs = prepare_inputs(c, mask, ids.shape[1], model.dtype)
    x = embed(model.params, c, ids, inputs.positions)  # (B, T, D)
    for l, block in enumerate(model.params["blocks"]):
        here = {h: z for (layer, h), z in patches.items() if layer == l}
        hm = None if np.all(head_mask[l] == 1) else head_mask[l]
        x = _patched_block(block, x, c, inputs, hm, here)
    logits, _ = unembed(model.params, c, x[:, -1:])  # (B, 1, V)
    return model.mask_padding(logits[:, -1])


# --------------------------------------------------------------------------- the analysis


@dataclass
class ItemRecord:
    item_id: str
    prompt: str
    answer: str
    status: str  # rescued, damaged, both right, both wrong
    intact: str  # the intact model's answer
    removed: str  # the answer without the head set
    reference_token: int  # first token of the reference answer
    competitor_token: int  # see the module docstring
    logit_diff_intact: float  # logit(reference) - logit(competitor), intact
    logit_diff_removed: float
    dla: dict[str, list[float]] = field(default_factory=dict)  # head -> [to ref, to competitor]
    restored: dict[str, float] = field(default_factory=dict)  # head -> logit diff, h restored
    restored_token: dict[str, int] = field(default_factory=dict)  # head -> argmax, h restored


@dataclass
class HeadSummary:
    head: str
    ov_copying: float
    attended_lift: float  # mean over the panel
    shares: dict[str, float]  # role -> mean attention share, whole panel
    shares_rescued: dict[str, float]  # the same on rescued items
    dla: dict[str, dict[str, float]]  # kind -> {reference, competitor, difference, n}
    restore: dict[str, float]  # on rescued items (see summarize_restore)


@dataclass
class Explanation:
    model: str
    task: str
    heads: str
    n_items: int
    counts: dict[str, int]
    roles: list[str]
    per_head: list[HeadSummary]
    items: list[ItemRecord]

    def to_dict(self) -> dict:
        return asdict(self)


def _status(intact: bool, removed: bool) -> str:
    if intact == removed:
        return "both right" if intact else "both wrong"
    return "rescued" if removed else "damaged"


def _best_other(logits: np.ndarray, avoid: int) -> int:
    """argmax of logits (V,), or the best other token when the argmax is `avoid`."""
    order = np.argsort(logits)[::-1][:2]
    return int(order[1] if order[0] == avoid else order[0])


def _answer_tokens(ev, task, item) -> tuple[list[int], int, int | None]:
    """(prompt ids, reference first token, fixed competitor or None) of an item."""
    from cel_numpy.localize.scoring import reference_ids

    prompt = ev.prompt_ids(item.prompt)
    if task.scoring == "choice":
        firsts = {}
        for choice in item.choices:
            ids, start = ev.continuation_ids(item.prompt, choice)
            firsts[choice] = ids[start]
        other = next(c for c in item.choices if c != item.answer)
        return prompt, firsts[item.answer], firsts[other]
    return prompt, reference_ids(ev, item)[1][0], None


def _roles_of(ev, task, item, ids) -> list[str]:
    roles_fn = getattr(task, "roles", None)
    spans = token_char_spans(ev.model.tokenizer, ids)
    if roles_fn is None:
        return token_roles(spans, {}, 0)
    decoded = ev.model.tokenizer.decode(list(ids))
    offset = max(decoded.rfind(item.prompt), 0)  # chat templates wrap the prompt
    return token_roles(spans, roles_fn(item), offset)


def explain(
    model,
    task,
    heads,
    items: Sequence,
    *,
    batch_size: int = 8,
    spec: str = "",
    progress: Callable[[str], None] | None = None,
) -> Explanation:
    """The per-head analysis of the module docstring for head set `heads` on `items`."""
    from cel_numpy.localize.evaluate import LMEvaluator

    say = progress or (lambda line: None)
    cond = parse_heads(heads, what="heads")
    ev = LMEvaluator(model, task, batch_size=batch_size)
    say(f"evaluating {len(items)} items intact and without {heads_name(cond)}")
    intact_results, removed_results = ev.evaluate_many(items, [(), cond])
    role_names = list(getattr(task, "roles", lambda it: {})(items[0])) + [FIRST, OTHER]
    say("OV copying scores of every head")
    ov = ov_copying_scores(model)
    records: list[ItemRecord] = []
    shares = {head_name(h): [] for h in cond}
    lifts = {head_name(h): [] for h in cond}
    for start in range(0, len(items), batch_size):
        chunk = items[start : start + batch_size]
        say(f"items {start + 1}-{start + len(chunk)} of {len(items)}")
        prepared = [_answer_tokens(ev, task, it) for it in chunk]
        ids, mask = model.pad([p for p, _, _ in prepared])  # (B, T)
        _, cache = model.run_with_cache(ids, mask)
        removed_logits = forward_patched(model, ids, mask, cond, {})  # (B, V)
        resid = cache["blocks." + str(model.config.n_layers - 1) + ".resid_post"][:, -1]  # (B, D)
        scales = final_norm_scale(model, resid)  # (B, 1)
        intact_logits = model.mask_padding(cache["logits"][:, -1].copy())  # (B, V)
        chunk_records = []
        for b, (it, (prompt, ref, fixed)) in enumerate(zip(chunk, prepared)):
            r_int, r_rem = intact_results[start + b], removed_results[start + b]
            status = _status(r_int.correct, r_rem.correct)
            source = removed_logits[b] if status == "damaged" else intact_logits[b]
            comp = fixed if fixed is not None else _best_other(source, ref)
            rec = ItemRecord(
                it.id,
                it.prompt,
                it.answer,
                status,
                r_int.answer,
                r_rem.answer,
                int(ref),
                int(comp),
                float(intact_logits[b, ref] - intact_logits[b, comp]),
                float(removed_logits[b, ref] - removed_logits[b, comp]),
            )
            T = ids.shape[1]
            real = slice(T - len(prompt), T)
            roles = _roles_of(ev, task, it, prompt)
            # (C + 1, 2)
            names, contrib = direct_logit_attribution(
                model, cache, b, T - 1, [ref, comp], scales[b]
            )
            for l, h in cond:
                name = head_name((l, h))
                rec.dla[name] = [float(x) for x in contrib[names.index(name)]]
                pattern = cache[f"blocks.{l}.attn.pattern"][b, h, -1, real]  # (S,)
                shares[name].append((status, role_shares(pattern, roles, role_names)))
                z = cache[f"blocks.{l}.attn.z"][b, h, -1]  # (E,)
                lifts[name].append(
                    attended_lift(head_logit_vector(model, z, l, h, scales[b]), pattern, prompt)
                )
            chunk_records.append(rec)
        rescued = [b for b, r in enumerate(chunk_records) if r.status == "rescued"]
        if rescued:
            for l, h in cond:
                name = head_name((l, h))
                z = cache[f"blocks.{l}.attn.z"][rescued, h]  # (R, T, E)
                logits = forward_patched(model, ids[rescued], mask[rescued], cond, {(l, h): z})
                for k, b in enumerate(rescued):
                    r = chunk_records[b]
                    r.restored[name] = float(
                        logits[k, r.reference_token] - logits[k, r.competitor_token]
                    )
                    r.restored_token[name] = int(np.argmax(logits[k]))
        records += chunk_records
    counts = {s: sum(r.status == s for r in records) for s in (*KINDS, "both right", "both wrong")}
    per_head = [
        HeadSummary(
            head=head_name(h),
            ov_copying=float(ov[h]),
            attended_lift=float(np.mean(lifts[head_name(h)])),
            shares=_mean_shares(shares[head_name(h)], role_names, None),
            shares_rescued=_mean_shares(shares[head_name(h)], role_names, "rescued"),
            dla={kind: summarize_dla(records, head_name(h), kind) for kind in KINDS},
            restore=summarize_restore(records, head_name(h), model),
        )
        for h in cond
    ]
    return Explanation(
        model=spec or getattr(model, "source", ""),
        task=task.name,
        heads=heads_name(cond),
        n_items=len(items),
        counts=counts,
        roles=role_names,
        per_head=per_head,
        items=records,
    )


def _mean_shares(entries, names, status) -> dict[str, float]:
    rows = [s for st, s in entries if status is None or st == status]
    return {n: float(np.mean([r[n] for r in rows])) if rows else float("nan") for n in names}


def summarize_dla(records: Sequence[ItemRecord], head: str, kind: str) -> dict[str, float]:
    """Mean direct logit attribution of `head` on the `kind` items: to the reference's first
    token, to the competitor's, and their difference (positive: the head favours the answer)."""
    rows = np.array([r.dla[head] for r in records if r.status == kind]).reshape(-1, 2)
    if not len(rows):
        return {
            "reference": float("nan"),
            "competitor": float("nan"),
            "difference": float("nan"),
            "n": 0,
        }
    ref, comp = rows.mean(axis=0)
    return {
        "reference": float(ref),
        "competitor": float(comp),
        "difference": float(ref - comp),
        "n": len(rows),
    }


def summarize_restore(records: Sequence[ItemRecord], head: str, model) -> dict[str, float]:
    """Restoring only `head` on the rescued items: mean logit difference (reference -
    competitor) intact, removed, restored; the share of the removal's change it undoes
    ((removed - restored) / (removed - intact), of the means); how often the intact model's
    first token comes back."""
    rows = [r for r in records if r.status == "rescued" and head in r.restored]
    if not rows:
        return {"n": 0}
    intact = float(np.mean([r.logit_diff_intact for r in rows]))
    removed = float(np.mean([r.logit_diff_removed for r in rows]))
    restored = float(np.mean([r.restored[head] for r in rows]))
    change = removed - intact
    return {
        "n": len(rows),
        "logit_diff_intact": intact,
        "logit_diff_removed": removed,
        "logit_diff_restored": restored,
        "undone": (removed - restored) / change if change else float("nan"),
        "intact_token_returns": float(
            np.mean([r.restored_token[head] == r.competitor_token for r in rows])
        ),
    }


# --------------------------------------------------------------------------- output


def render_markdown(report: dict) -> str:
    c = report["counts"]
    lines = [
        f"# Why removing {report['heads']} changes {report['task']}",
        "",
        f"Model {report['model']}, {report['n_items']} items: {c['rescued']} rescued, "
        f"{c['damaged']} damaged, {c['both right']} right both ways, {c['both wrong']} wrong "
        "both ways. Attention and direct logit attribution are read at the answer position of "
        "the intact run, through the final norm's scale frozen at its intact value.",
        "",
        "| head | OV copying | attended lift | top attention (panel) | DLA diff rescued | "
        "DLA diff damaged | restoring it undoes | intact token returns |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for h in report["per_head"]:
        top = sorted(h["shares"].items(), key=lambda kv: -kv[1])[:3]
        rs = h["restore"]
        lines.append(
            f"| {h['head']} | {h['ov_copying']:+.2f} | {h['attended_lift']:+.2f} | "
            + ", ".join(f"{k} {v:.2f}" for k, v in top)
            + f" | {h['dla']['rescued']['difference']:+.2f} (n={h['dla']['rescued']['n']}) | "
            f"{h['dla']['damaged']['difference']:+.2f} (n={h['dla']['damaged']['n']}) | "
            + (
                f"{rs['undone']:.0%} | {rs['intact_token_returns']:.0%} |"
                if rs.get("n")
                else "- | - |"
            )
        )
    lines += [
        "",
        "OV copying: eigenvalue score of W_E W_V W_O W_U (+1 copies). Attended lift: the head's "
        "direct logit contribution to the tokens it attends to, in standard deviations over the "
        "vocabulary. DLA diff: the head's direct contribution to logit(reference) - "
        "logit(competitor) (competitor: the intact model's first token on rescued items, the "
        "removed model's on damaged ones); negative = the head pushes away from the answer. "
        "Restoring: the whole set removed but this head's intact z patched back at every "
        "position, on rescued items.",
    ]
    return "\n".join(lines) + "\n"


def write_explanation(report: Explanation, out: str | os.PathLike) -> dict:
    """report.json, report.md and explain.png (cel_numpy.plots.plot_explanation) in `out`."""
    from cel_numpy.plots import plot_explanation

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    data = report.to_dict()
    (out / "report.json").write_text(json.dumps(data, indent=1, allow_nan=True) + "\n")
    (out / "report.md").write_text(render_markdown(data))
    plot_explanation(data, out / "explain.png")
    return data
