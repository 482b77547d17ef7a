"""The backward pass of the whole transformer (GPT-2 and Llama), for a debugger and a head screen.

    logits, cache = transformer_forward(params, config, ids, mask, head_mask=m)  # keep_activations
    loss, dlogits = cross_entropy_loss(logits, targets)                          # or any dM/dlogits
    grads, dhead_mask = transformer_backward(dlogits, params, config, cache, ids)

It mirrors `transformer_forward` in reverse, one block at a time, composed from the ops'
backward functions (`cel_numpy.ops`, `cel_numpy.attention`). The forward's named activations
(`ForwardCache`) are its cache: the norms' statistics are recomputed from the residual stream
they read (two reductions per norm), so the forward keeps nothing extra.

`grads` has exactly the keys and shapes of `params`. A tied unembedding (W_U stored as a view of
W_E.T) is one tensor reached under two keys, so both keys hold its total gradient (embedding use
plus unembedding use): perturbing either key perturbs both, and that is what a finite difference
sees. `dhead_mask` (L, H) is dLoss/dm at the forward's head mask (ones where none was given);
for mean ablation pass the same `head_fill` (L, H, E) as to the forward.
"""

from __future__ import annotations

import numpy as np

from cel_numpy.attention import attention_backward
from cel_numpy.models.config import ModelConfig
from cel_numpy.models.transformer import (
    GATE_ACTIVATIONS,
    BlockCache,
    ForwardCache,
    MLPActivations,
    norm_forward,
)
from cel_numpy.ops import (
    LinearCache,
    cross_entropy_backward,
    cross_entropy_forward,
    gelu_backward,
    gelu_forward,
    layer_norm_backward,
    linear_backward,
    rms_norm_backward,
    silu_backward,
)

GATE_BACKWARDS = {"silu": silu_backward, "gelu_tanh": gelu_backward}  # config.mlp_act -> op

IGNORE = -1  # a target below 0 is not scored (padding, prompt tokens)


# --------------------------------------------------------------------------- loss


def cross_entropy_loss(logits: np.ndarray, targets: np.ndarray):
    """Mean next-token loss over the scored positions.  logits (B, T, V), targets (B, T) int.

    targets[b, t] is the token that logits[b, t] should predict; targets < 0 are not scored.
    Returns loss (float) and dloss/dlogits (B, T, V), zero at unscored positions.
    """
    targets = np.asarray(targets)
    if targets.shape != logits.shape[:2]:
        raise ValueError(
            f"targets must be (B, T) = {logits.shape[:2]} like the logits, got {targets.shape}"
        )
    scored = targets >= 0  # (B, T)
    if not scored.any():
        raise ValueError("no scored position: every target is negative (ignored)")
    loss, ce = cross_entropy_forward(logits[scored], targets[scored])  # (N, V), (N,) -> scalar
    dlogits = np.zeros_like(logits)  # (B, T, V)
    dlogits[scored] = cross_entropy_backward(1.0, ce)  # (N, V)
    return float(loss), dlogits


# --------------------------------------------------------------------------- pieces


def norm_backward(dout: np.ndarray, p: dict, x: np.ndarray, config: ModelConfig):
    """Backward of `norm_forward(p, x)`, its statistics recomputed from x (..., D).

    -> dx (..., D), grads {"w"[, "b"]}.
    """
    _, cache = norm_forward(p, x, config)
    if config.family == "gpt2":
        return layer_norm_backward(dout, cache)
    return rms_norm_backward(dout, cache)


def _linear_backward(dout: np.ndarray, x: np.ndarray, W: np.ndarray, b: np.ndarray | None):
    """Backward of x (B, T, D_in) @ W (D_in, D_out) + b -> dx (B, T, D_in), dW, db or None."""
    dx, g = linear_backward(dout, LinearCache(x=x, W=W, has_bias=b is not None))
    return dx, g["W"], g.get("b")


def mlp_backward(
    dout: np.ndarray, p: dict, x: np.ndarray, act: MLPActivations, config: ModelConfig
):
    """Backward of `mlp_forward(p, x)`.  dout (B, T, D) -> dx (B, T, D), grads (keys of p)."""
    grads = {}
    # (B, T, F)
    dpost, grads["W_out"], db = _linear_backward(dout, act.post, p["W_out"], p.get("b_out"))
    if db is not None:
        grads["b_out"] = db
    if config.family == "gpt2":
        _, gelu_cache = gelu_forward(act.pre)
        dpre = gelu_backward(dpost, gelu_cache)  # (B, T, F)
        dx, grads["W_in"], db = _linear_backward(dpre, x, p["W_in"], p.get("b_in"))  # (B, T, D)
        if db is not None:
            grads["b_in"] = db
        return dx, grads
    gate, gate_cache = GATE_ACTIVATIONS[config.mlp_act](act.pre)  # (B, T, F)
    dgate = dpost * act.up  # post = gate * up
    dup = dpost * gate
    dpre = GATE_BACKWARDS[config.mlp_act](dgate, gate_cache)  # (B, T, F)
    dx, grads["W_gate"], db_gate = _linear_backward(dpre, x, p["W_gate"], p.get("b_gate"))
    dx_up, grads["W_in"], db_in = _linear_backward(dup, x, p["W_in"], p.get("b_in"))
    dx += dx_up  # x fans out to the gate and the up projection
    for name, db in (("b_gate", db_gate), ("b_in", db_in)):
        if db is not None:
            grads[name] = db
    return dx, grads


def block_backward(
    dout: np.ndarray, p: dict, cache: BlockCache, config: ModelConfig, fill: np.ndarray | None
):
    """Backward of one pre-norm block.
    dout (B, T, D) -> dx (B, T, D), grads (keys of p), dhead_mask (H,).

    Forward: mid = x + attn(ln1(x)); out = mid + mlp(ln2(mid)); with sandwich norms (gemma3)
    mid = x + ln1_post(attn(ln1(x))); out = mid + ln2_post(mlp(ln2(mid))).
    """
    grads = {}
    dresid_mid = dout.copy()  # out = mid + ...
    dmlp_out = dout  # (B, T, D)
    if config.sandwich_norms:
        dmlp_out, grads["ln2_post"] = norm_backward(dout, p["ln2_post"], cache.mlp_out_raw, config)
    # (B, T, D)
    dln2_out, grads["mlp"] = mlp_backward(dmlp_out, p["mlp"], cache.ln2_out, cache.mlp, config)
    dmid_via_ln2, grads["ln2"] = norm_backward(dln2_out, p["ln2"], cache.resid_mid, config)
    dresid_mid += dmid_via_ln2
    dattn_out = dresid_mid  # (B, T, D)
    if config.sandwich_norms:
        dattn_out, grads["ln1_post"] = norm_backward(
            dresid_mid, p["ln1_post"], cache.attn_out_raw, config
        )
    # (B, T, D)
    dln1_out, grads["attn"], dhead_mask = attention_backward(
        dattn_out, p["attn"], cache.attn, fill=fill
    )
    dx_via_ln1, grads["ln1"] = norm_backward(dln1_out, p["ln1"], cache.resid_pre, config)
    dx = dresid_mid + dx_via_ln1  # mid = x + ...
    return dx, grads, dhead_mask


# --------------------------------------------------------------------------- whole model


def transformer_backward(
    dlogits: np.ndarray,
    params: dict,
    config: ModelConfig,
    cache: ForwardCache,
    ids: np.ndarray,
    *,
    head_fill: np.ndarray | None = None,
):
    """dlogits (B, T, V) for a forward over all T positions -> grads (keys of params),
    dhead_mask (L, H).

    `cache` is that forward's ForwardCache with activations kept (keep_activations=True, no
    logit_positions or logit_columns, no past). head_fill (L, H, E): the forward's, for mean
    ablation (the gradient at m = 1 points from z_h towards fill_h).
    """
    if not cache.blocks:
        raise ValueError("the forward kept no activations: run it with keep_activations=True")
    if cache.kv and cache.inputs.n_past:
        raise ValueError(
            "backward through a KV-cached forward is not supported: run the whole sequence"
        )
    B, T = np.shape(ids)
    if dlogits.shape[:2] != (B, T) or cache.ln_final_out.shape[:2] != (B, T):
        raise ValueError(
            f"dlogits must cover every position: (B, T, V) with (B, T) = {(B, T)}, "
            f"got {dlogits.shape}"
        )
    L = config.n_layers
    grads: dict = {}

    # logits = ln_final(x_L) @ W_U + b_U
    x_final = cache.blocks[-1].resid_post  # (B, T, D)
    dxn, dW_U, db_U = _linear_backward(
        dlogits, cache.ln_final_out, params["unembed"]["W_U"], params["unembed"].get("b_U")
    )
    grads["unembed"] = {"W_U": dW_U} if db_U is None else {"W_U": dW_U, "b_U": db_U}
    dx, grads["ln_final"] = norm_backward(dxn, params["ln_final"], x_final, config)  # (B, T, D)

    blocks: list = [None] * L
    dhead_mask = np.zeros((L, config.n_heads), dtype=dlogits.dtype)
    for layer in reversed(range(L)):
        fill = None if head_fill is None else head_fill[layer]  # (H, E)
        dx, blocks[layer], dhead_mask[layer] = block_backward(
            dx, params["blocks"][layer], cache.blocks[layer], config, fill
        )
    grads["blocks"] = blocks

    # x_0 = W_E[ids] * embed_scale (+ W_pos[positions]): scatter-add the rows back
    dW_E = np.zeros_like(params["embed"]["W_E"])  # (V, D)
    np.add.at(dW_E, ids, dx * config.embed_scale if config.embed_scale != 1.0 else dx)
    if "pos_embed" in params:
        dW_pos = np.zeros_like(params["pos_embed"]["W_pos"])  # (n_ctx, D)
        np.add.at(dW_pos, cache.inputs.positions, dx)
        grads["pos_embed"] = {"W_pos": dW_pos}
    # tied: one tensor, two uses
    if np.shares_memory(params["embed"]["W_E"], params["unembed"]["W_U"]):
        dW_E += grads["unembed"]["W_U"].T
        grads["unembed"]["W_U"] = dW_E.T
    grads["embed"] = {"W_E": dW_E}
    return {k: grads[k] for k in params}, dhead_mask
