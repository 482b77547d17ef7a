"""The one multi-head softmax attention of cel-numpy: forward and backward.

The theory model trains with these functions and the real language models run with them;
there is no second attention implementation.

Layers of the API, each a forward/backward pair:

    softmax_attention_*   q, k, v already projected -> per-head outputs z
    head_mask_*           z -> m_h * z_h (+ (1 - m_h) * fill_h): zero or mean ablation of heads
    rotary_*              rotary position embedding of q or k (half-split layout, as HF Llama)
    attention_*           the whole block: projections, rotary, attention, head mask, W_O

Glossary: B batch, T query positions, S key positions, D d_model, H query heads,
G key/value heads (grouped-query attention; query head h reads kv group h // (H // G)),
E d_head (Ev for values when it differs).

Parameters of `attention_forward` (a dict; `grads` has the same keys and shapes):
    W_Q (H, D, E)   W_K (G, D, E)   W_V (G, D, E)   W_O (H, E, D)
    b_Q (H, E)      b_K (G, E)      b_V (G, E)      b_O (D,)        biases optional
    q_norm.w (E,)   k_norm.w (E,)   optional (Gemma 3): RMSNorm of each head's q and k
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from cel_numpy.ops import (
    RMSNormCache,
    SoftmaxCache,
    rms_norm_backward,
    rms_norm_forward,
    softmax_backward,
    softmax_forward,
)

# --------------------------------------------------------------------------- masks


def causal_mask(T: int, S: int | None = None) -> np.ndarray:
    """Boolean (T, S): query t (the last T of S positions) may attend to keys s <= its position."""
    S = T if S is None else S
    past = S - T
    return np.arange(S)[None, :] <= (np.arange(T)[:, None] + past)  # (T, S)


def padded_causal_mask(key_valid: np.ndarray, T: int) -> np.ndarray:
    """Causal mask that also hides padding keys.  key_valid (B, S) bool -> (B, 1, T, S) bool.

    The T queries are the last T of the S positions. Every query keeps its own position, so no
    row is fully masked even for a padding query (its output is garbage and must be ignored).
    """
    B, S = key_valid.shape
    causal = causal_mask(T, S)  # (T, S)
    own = np.arange(S)[None, :] == (np.arange(T)[:, None] + S - T)  # (T, S)
    allowed = (causal[None] & key_valid[:, None, :]) | own[None]  # (B, T, S)
    return allowed[:, None]  # (B, 1, T, S)


# --------------------------------------------------------------------------- softmax attention


@dataclass(frozen=True)
class SoftmaxAttentionCache:
    q: np.ndarray  # (B, H, T, E)
    k: np.ndarray  # (B, Gk, S, E)
    v: np.ndarray  # (B, Gv, S, Ev)
    probs: np.ndarray  # (B, H, T, S); masked entries exactly 0
    softmax: SoftmaxCache
    scale: float


def _fold(a: np.ndarray, G: int) -> np.ndarray:
    """(B, H, T, X) -> (B, G, (H // G) * T, X): the heads sharing group g stacked along T.

    Query head h = g * (H // G) + r lives in group g. Stacking a group's heads along the row
    axis turns H/G small matrix products into one larger one per (batch, group): the same
    numbers in fewer, larger matrix products, for GQA and the theory model's shared keys.
    """
    B, H, T, X = a.shape
    return a.reshape(B, G, (H // G) * T, X)


def _check_groups(H: int, G: int, what: str) -> None:
    if G < 1 or H % G:
        raise ValueError(f"{what} has {G} heads, which must divide the {H} query heads")


def softmax_attention_forward(q, k, v, *, scale: float, mask: np.ndarray | None = None):
    """z_h = softmax(scale * q_h k_g^T, masked) v_g for every query head h, g = h // (H/G).

    q (B, H, T, E), k (B, Gk, S, E), v (B, Gv, S, Ev); Gk and Gv divide H (1 = multi-query,
    H = plain multi-head). mask: bool broadcastable to (B, H, T, S), True = may attend.
    Returns z (B, H, T, Ev) and a cache.
    """
    B, H, T, E = q.shape
    Gk, S = k.shape[1], k.shape[2]
    Gv = v.shape[1]
    _check_groups(H, Gk, "k")
    _check_groups(H, Gv, "v")
    # (B, Gk, H/Gk*T, E) @ (B, Gk, E, S) -> (B, Gk, H/Gk*T, S)
    scores = _fold(q, Gk) @ k.swapaxes(-1, -2)
    scores = scores.reshape(B, H, T, S) * scale  # (B, H, T, S)
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    probs, sm_cache = softmax_forward(scores, axis=-1)  # (B, H, T, S)
    z = _fold(probs, Gv) @ v  # (B, Gv, H/Gv*T, S) @ (B, Gv, S, Ev) -> (B, Gv, H/Gv*T, Ev)
    z = z.reshape(B, H, T, v.shape[-1])  # (B, H, T, Ev)
    return z, SoftmaxAttentionCache(q=q, k=k, v=v, probs=probs, softmax=sm_cache, scale=scale)


def softmax_attention_backward(
    dz: np.ndarray, cache: SoftmaxAttentionCache, *, need_dk: bool = True
):
    """dz (B, H, T, Ev) -> dq (B, H, T, E), dk (B, Gk, S, E), dv (B, Gv, S, Ev).

    need_dk=False skips the key gradient and returns None for it (the theory model's keys are
    fixed one-hot types; the key gradient would be a third of its training step).
    """
    q, k, v, probs = cache.q, cache.k, cache.v, cache.probs
    B, H, T, E = q.shape
    S = k.shape[2]
    Gk, Gv = k.shape[1], v.shape[1]
    dz_f = _fold(dz, Gv)  # (B, Gv, H/Gv*T, Ev)
    dprobs = dz_f @ v.swapaxes(-1, -2)  # (B, Gv, H/Gv*T, Ev) @ (B, Gv, Ev, S) -> (B, Gv, H/Gv*T, S)
    # (B, Gv, S, H/Gv*T) @ (.., H/Gv*T, Ev) -> (B, Gv, S, Ev)
    dv = _fold(probs, Gv).swapaxes(-1, -2) @ dz_f
    # (B, H, T, S); 0 where masked
    dscores = softmax_backward(dprobs.reshape(B, H, T, S), cache.softmax)
    dscores = dscores * cache.scale
    dscores_f = _fold(dscores, Gk)  # (B, Gk, H/Gk*T, S)
    dq = (dscores_f @ k).reshape(B, H, T, E)  # (B, Gk, H/Gk*T, S) @ (B, Gk, S, E) -> (B, H, T, E)
    dk = None
    if need_dk:
        # (B, Gk, S, H/Gk*T) @ (.., H/Gk*T, E) -> (B, Gk, S, E)
        dk = dscores_f.swapaxes(-1, -2) @ _fold(q, Gk)
    return dq, dk, dv


# --------------------------------------------------------------------------- head mask


@dataclass(frozen=True)
class HeadMaskCache:
    z: np.ndarray  # (B, H, T, E) per-head outputs before the mask
    head_mask: np.ndarray  # (H,)
    fill: np.ndarray | None  # (H, E) or per row (B, H, E): what an ablated head becomes; None = 0


def head_mask_forward(z: np.ndarray, head_mask: np.ndarray, fill: np.ndarray | None = None):
    """z'_h = m_h z_h + (1 - m_h) fill_h.   z (B, H, T, E), head_mask (H,), fill (H, E) or None.

    m_h = 1 keeps head h, m_h = 0 removes it: zero ablation without `fill`, mean ablation with
    fill = the head's mean output; a fill per row (B, H, E) gives each row its own value
    (resample ablation: another item's mean output). A mask of ones without fill returns z
    bitwise unchanged.
    """
    H = z.shape[1]
    if head_mask.shape != (H,):
        raise ValueError(f"head_mask must have shape ({H},) for {H} heads, got {head_mask.shape}")
    m = head_mask[:, None, None]  # (H, 1, 1)
    out = z * m  # (B, H, T, E)
    if fill is not None:
        out = out + (1.0 - m) * np.expand_dims(fill, -2)  # (H, 1, E) or (B, H, 1, E)
    return out, HeadMaskCache(z=z, head_mask=head_mask, fill=fill)


def head_mask_backward(dout: np.ndarray, cache: HeadMaskCache):
    """dout (B, H, T, E) -> dz (B, H, T, E), dhead_mask (H,)."""
    m = cache.head_mask[:, None, None]  # (H, 1, 1)
    dz = dout * m
    contribution = cache.z if cache.fill is None else cache.z - np.expand_dims(cache.fill, -2)
    dhead_mask = np.einsum("bhte,bhte->h", dout, contribution)  # (H,)
    return dz, dhead_mask


# --------------------------------------------------------------------------- rotary


@dataclass(frozen=True)
class Rotary:
    """Rotary tables for one batch of positions (half-split layout: pairs (x_i, x_{i+E/2}))."""

    cos: np.ndarray  # (B, 1, T, E/2)
    sin: np.ndarray  # (B, 1, T, E/2)


def rotary_tables(positions: np.ndarray, d_head: int, base: float, dtype=np.float64) -> Rotary:
    """positions (B, T) int -> Rotary with angle pos * base^(-2i/E), i < E/2 (as HF Llama)."""
    inv_freq = 1.0 / (base ** (np.arange(0, d_head, 2, dtype=np.float64) / d_head))  # (E/2,)
    angles = positions[:, None, :, None].astype(np.float64) * inv_freq  # (B, 1, T, E/2)
    return Rotary(cos=np.cos(angles).astype(dtype), sin=np.sin(angles).astype(dtype))


def rotary_forward(x: np.ndarray, rot: Rotary) -> np.ndarray:
    """Rotate each pair (x1_i, x2_i) by its angle.  x (B, H, T, E) -> (B, H, T, E)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * rot.cos - x2 * rot.sin, x2 * rot.cos + x1 * rot.sin], axis=-1)


def rotary_backward(dout: np.ndarray, rot: Rotary) -> np.ndarray:
    """A rotation's transpose is the rotation by the opposite angle."""
    half = dout.shape[-1] // 2
    d1, d2 = dout[..., :half], dout[..., half:]
    return np.concatenate([d1 * rot.cos + d2 * rot.sin, d2 * rot.cos - d1 * rot.sin], axis=-1)


# --------------------------------------------------------------------------- full block


@dataclass(frozen=True)
class AttentionCache:
    x: np.ndarray  # (B, T, D) block input
    q: np.ndarray  # (B, H, T, E) after rotary
    k: np.ndarray  # (B, G, S, E) after rotary, past keys included (the KV cache)
    v: np.ndarray  # (B, G, S, E) past values included
    core: SoftmaxAttentionCache  # holds probs (B, H, T, S): the attention pattern
    z: np.ndarray  # (B, H, T, E) per-head outputs before the head mask
    head: HeadMaskCache | None  # None when no head mask was given
    z_masked: np.ndarray  # (B, H, T, E) what W_O reads
    rotary: Rotary | None
    n_past: int  # number of cached key positions before this call
    q_norm: RMSNormCache | None = None  # of q (B, H, T, E) before rotary (Gemma 3)
    k_norm: RMSNormCache | None = None  # of this call's k (B, G, T, E) before rotary

    @property
    def probs(self) -> np.ndarray:  # (B, H, T, S)
        return self.core.probs


def project_heads(x: np.ndarray, W: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    """x (B, T, D), W (H, D, E), b (H, E) or None -> (B, H, T, E), as one matrix multiply."""
    B, T, D = x.shape
    H, _, E = W.shape
    W_flat = W.transpose(1, 0, 2).reshape(D, H * E)  # (D, H*E)
    y = x.reshape(B * T, D) @ W_flat  # (B*T, H*E)
    if b is not None:
        y += b.reshape(H * E)
    return y.reshape(B, T, H, E).transpose(0, 2, 1, 3)  # (B, H, T, E)


def project_heads_backward(dy: np.ndarray, x: np.ndarray, W: np.ndarray, has_bias: bool):
    """dy (B, H, T, E) -> dx (B, T, D), dW (H, D, E), db (H, E) or None."""
    B, T, D = x.shape
    H, _, E = W.shape
    dy_flat = dy.transpose(0, 2, 1, 3).reshape(B * T, H * E)  # (B*T, H*E)
    dx = (dy_flat @ W.transpose(1, 0, 2).reshape(D, H * E).T).reshape(B, T, D)
    dW = (x.reshape(B * T, D).T @ dy_flat).reshape(D, H, E).transpose(1, 0, 2)  # (H, D, E)
    db = dy_flat.sum(axis=0).reshape(H, E) if has_bias else None
    return dx, dW, db


def attention_forward(
    params: dict,
    x: np.ndarray,
    *,
    mask: np.ndarray | None,
    rotary: Rotary | None = None,
    head_mask: np.ndarray | None = None,
    head_fill: np.ndarray | None = None,
    past_kv: tuple[np.ndarray, np.ndarray] | None = None,
    scale: float | None = None,
    norm_eps: float | None = None,
):
    """One attention block: out = sum_h mask_h(softmax(scale q_h k^T) v) W_O[h] + b_O.

    x (B, T, D) -> out (B, T, D). `mask` bool broadcastable to (B, 1, T, S), True = may attend
    (see `padded_causal_mask`). `head_mask` (H,) multiplies each head's z before W_O;
    `head_fill` (H, E) is what a removed head is replaced by (mean ablation). `past_kv`
    = (k, v) of earlier positions, each (B, G, S_past, E), for incremental decoding; the cache's
    k and v include them, so `(cache.k, cache.v)` is the next call's `past_kv`.
    `scale` defaults to 1/sqrt(E). With `q_norm`/`k_norm` in params (Gemma 3), q and k are
    RMS-normed over E (epsilon `norm_eps`) before rotary.
    """
    W_Q, W_K, W_V, W_O = params["W_Q"], params["W_K"], params["W_V"], params["W_O"]
    E = W_Q.shape[-1]
    q = project_heads(x, W_Q, params.get("b_Q"))  # (B, H, T, E)
    k = project_heads(x, W_K, params.get("b_K"))  # (B, G, T, E)
    v = project_heads(x, W_V, params.get("b_V"))  # (B, G, T, E)
    q_norm = k_norm = None
    if "q_norm" in params:
        q, q_norm = rms_norm_forward(q, params["q_norm"]["w"], norm_eps)  # (B, H, T, E)
        k, k_norm = rms_norm_forward(k, params["k_norm"]["w"], norm_eps)  # (B, G, T, E)
    if rotary is not None:
        q = rotary_forward(q, rotary)
        k = rotary_forward(k, rotary)
    n_past = 0
    if past_kv is not None:
        n_past = past_kv[0].shape[2]
        k = np.concatenate([past_kv[0], k], axis=2)  # (B, G, S, E)
        v = np.concatenate([past_kv[1], v], axis=2)  # (B, G, S, E)
    scale = 1.0 / math.sqrt(E) if scale is None else scale
    # (B, H, T, E)
    z, core = softmax_attention_forward(q, k, v, scale=scale, mask=mask)
    head = None
    z_masked = z
    if head_mask is not None:
        z_masked, head = head_mask_forward(z, head_mask, head_fill)
    B, H, T, _ = z.shape
    D = W_O.shape[-1]
    out = z_masked.transpose(0, 2, 1, 3).reshape(B * T, H * E) @ W_O.reshape(H * E, D)  # (B*T, D)
    if "b_O" in params:
        out += params["b_O"]
    out = out.reshape(B, T, D)
    cache = AttentionCache(
        x=x,
        q=q,
        k=k,
        v=v,
        core=core,
        z=z,
        head=head,
        z_masked=z_masked,
        rotary=rotary,
        n_past=n_past,
        q_norm=q_norm,
        k_norm=k_norm,
    )
    return out, cache


def attention_backward(
    dout: np.ndarray, params: dict, cache: AttentionCache, *, fill: np.ndarray | None = None
):
    """dout (B, T, D) -> dx (B, T, D), grads (same keys as params), dhead_mask (H,).

    dhead_mask_h = dLoss/dm_h = sum(dz'_h * (z_h - fill_h)). A forward run without a head mask
    is the mask of ones; its removed value is `fill` (H, E) here (zero when None), since the
    forward had none to keep. With past_kv, gradients flow to this call's positions only
    (the past is a constant).
    """
    W_O = params["W_O"]
    B, H, T, E = cache.z.shape
    D = W_O.shape[-1]
    grads = {}
    dout_flat = dout.reshape(B * T, D)  # (B*T, D)
    z_flat = cache.z_masked.transpose(0, 2, 1, 3).reshape(B * T, H * E)  # (B*T, H*E)
    grads["W_O"] = (z_flat.T @ dout_flat).reshape(H, E, D)  # (H, E, D)
    if "b_O" in params:
        grads["b_O"] = dout_flat.sum(axis=0)  # (D,)
    dz_masked = (dout_flat @ W_O.reshape(H * E, D).T).reshape(B, T, H, E).transpose(0, 2, 1, 3)
    if cache.head is not None:
        dz, dhead_mask = head_mask_backward(dz_masked, cache.head)
    else:  # mask of ones: z' = z, and z' would move towards fill as m_h leaves 1
        ones = HeadMaskCache(z=cache.z, head_mask=np.ones(H, dtype=cache.z.dtype), fill=fill)
        dz, dhead_mask = head_mask_backward(dz_masked, ones)
    dq, dk, dv = softmax_attention_backward(dz, cache.core)  # (B,H,T,E), (B,G,S,E), (B,G,S,E)
    dk = dk[:, :, cache.n_past :]  # (B, G, T, E)
    dv = dv[:, :, cache.n_past :]  # (B, G, T, E)
    if cache.rotary is not None:
        dq = rotary_backward(dq, cache.rotary)
        dk = rotary_backward(dk, cache.rotary)
    if cache.q_norm is not None:
        dq, grads["q_norm"] = rms_norm_backward(dq, cache.q_norm)  # (B, H, T, E), {"w": (E,)}
        dk, grads["k_norm"] = rms_norm_backward(dk, cache.k_norm)  # (B, G, T, E), {"w": (E,)}
    dx = np.zeros_like(cache.x)
    for name, dy in (("Q", dq), ("K", dk), ("V", dv)):
        has_bias = f"b_{name}" in params
        dx_part, dW, db = project_heads_backward(dy, cache.x, params[f"W_{name}"], has_bias)
        dx += dx_part
        grads[f"W_{name}"] = dW
        if has_bias:
            grads[f"b_{name}"] = db
    return dx, grads, dhead_mask
