"""The theory model: one attention layer with H heads and a fixed query, on the shared attention.

Head h owns a query/key vector K_h in R^T that acts on the one-hot token types, and a
value/readout vector V_h in R^m:

    S[h, i] = K_h[t_i]                 a[h, :] = softmax_i S[h, :]
    o_h     = sum_i a[h, i] (V_h . z_i)
    y_hat   = sum_h m_h o_h            loss = 1/2 mean (y_hat - y)^2

Built from `cel_numpy.attention` as: queries q = K (B, H, 1, T), keys k = onehot(types)
(B, 1, N, T) shared by all heads (Gk = 1), one-dimensional values v_h = V_h . z_i
(B, H, N, 1) (Gv = H), scale 1, no mask. The per-head outputs z (B, H, 1, 1) go through
`head_mask_forward`, so an ablation is the same argument the real models take.

Parameters: {"K": (H, T), "V": (H, m)}; `grads` has the same keys and shapes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cel_numpy.attention import (
    HeadMaskCache,
    SoftmaxAttentionCache,
    head_mask_backward,
    head_mask_forward,
    softmax_attention_backward,
    softmax_attention_forward,
)
from cel_numpy.theory.data import Batch


def init_params(
    rng: np.random.Generator, n_heads: int, n_types: int, d_content: int, init_scale: float
) -> dict:
    """K, V ~ N(0, init_scale^2), float64:  {"K": (H, T), "V": (H, m)}."""
    return {
        "K": init_scale * rng.standard_normal((n_heads, n_types)),  # (H, T)
        "V": init_scale * rng.standard_normal((n_heads, d_content)),  # (H, m)
    }


@dataclass(frozen=True)
class TheoryCache:
    onehot: np.ndarray  # (B, 1, N, T) keys: one-hot token types, shared by all heads
    z_content: np.ndarray  # (B, N, m) token contents
    attention: SoftmaxAttentionCache  # probs (B, H, 1, N) = a[h, i]
    head_outputs: np.ndarray  # (B, H) o_h before the head mask
    head_mask: HeadMaskCache


def theory_forward(params: dict, batch: Batch, head_mask: np.ndarray | None = None):
    """y_hat = sum_h m_h sum_i softmax_i(K_h[t_i]) (V_h . z_i).

    params {"K": (H, T), "V": (H, m)}, batch with types (B, N) and z (B, N, m),
    head_mask (H,) of 0/1 (None = all ones) -> y_hat (B,), TheoryCache.
    """
    K, V = params["K"], params["V"]
    H, T = K.shape
    B, N = batch.types.shape
    if head_mask is None:
        head_mask = np.ones(H)
    # (B, N) -> (B, 1, N, T)
    onehot = (batch.types[:, None, :, None] == np.arange(T)).astype(K.dtype)
    q = np.broadcast_to(K[None, :, None, :], (B, H, 1, T))  # (H, T) -> (B, H, 1, T)
    m = V.shape[1]
    v = (batch.z.reshape(B * N, m) @ V.T).reshape(B, N, H)  # (B*N, m) @ (m, H) -> (B, N, H)
    v = v.transpose(0, 2, 1)[..., None]  # (B, N, H) -> (B, H, N, 1)
    z_heads, att_cache = softmax_attention_forward(q, onehot, v, scale=1.0)  # (B, H, 1, 1)
    y_hat, hm_cache = readout(z_heads, head_mask)  # (B,)
    cache = TheoryCache(
        onehot=onehot,
        z_content=batch.z,
        attention=att_cache,
        head_outputs=z_heads[:, :, 0, 0],
        head_mask=hm_cache,
    )
    return y_hat, cache


def readout(z_heads: np.ndarray, head_mask: np.ndarray):
    """y_hat = sum_h m_h o_h.   z_heads (B, H, 1, 1), head_mask (H,) -> y_hat (B,), HeadMaskCache.

    The last step of `theory_forward`, on its own so ablations can reuse the intact per-head
    outputs (`cache.head_mask.z`): everything before the mask is unchanged by an ablation.
    """
    z_masked, hm_cache = head_mask_forward(z_heads, head_mask)  # (B, H, 1, 1)
    y_hat = z_masked[:, :, 0, 0].sum(axis=1)  # (B, H) -> (B,)
    return y_hat, hm_cache


def theory_backward(dy_hat: np.ndarray, cache: TheoryCache):
    """dy_hat (B,) -> grads {"K": (H, T), "V": (H, m)}, dhead_mask (H,)."""
    B, H = cache.head_outputs.shape
    dz_masked = np.broadcast_to(dy_hat[:, None, None, None], (B, H, 1, 1))  # (B,) -> (B, H, 1, 1)
    dz_heads, dhead_mask = head_mask_backward(dz_masked, cache.head_mask)  # (B, H, 1, 1), (H,)
    # (B,H,1,T), -, (B,H,N,1)
    dq, _, dv = softmax_attention_backward(dz_heads, cache.attention, need_dk=False)
    dK = dq[:, :, 0, :].sum(axis=0)  # (B, H, 1, T) -> (H, T): q broadcast K over the batch
    # (B, H, N),(B, N, m) -> (H, m)
    dV = np.tensordot(dv[..., 0], cache.z_content, axes=([0, 2], [0, 1]))
    return {"K": dK, "V": dV}, dhead_mask


@dataclass(frozen=True)
class MSECache:
    diff: np.ndarray  # (B,) y_hat - y


def mse_forward(y_hat: np.ndarray, y: np.ndarray):
    """loss = 1/2 mean (y_hat - y)^2.   y_hat (B,), y (B,) -> scalar."""
    diff = y_hat - y  # (B,)
    loss = 0.5 * float(np.mean(diff * diff))
    return loss, MSECache(diff=diff)


def mse_backward(dloss: float, cache: MSECache) -> np.ndarray:
    """dy_hat = dloss * (y_hat - y) / B."""
    return dloss * cache.diff / cache.diff.shape[0]  # (B,)


def loss_and_grads(params: dict, batch: Batch, head_mask: np.ndarray | None = None):
    """One forward and backward through model and loss -> (loss, grads {"K", "V"})."""
    y_hat, cache = theory_forward(params, batch, head_mask)
    loss, mse_cache = mse_forward(y_hat, batch.y)
    dy_hat = mse_backward(1.0, mse_cache)
    grads, _dhead_mask = theory_backward(dy_hat, cache)
    return loss, grads


def loss_of(params: dict, batch: Batch, head_mask: np.ndarray | None = None) -> float:
    """1/2 mean (y_hat - y)^2 on `batch` (forward only)."""
    y_hat, _ = theory_forward(params, batch, head_mask)
    return mse_forward(y_hat, batch.y)[0]
