"""Forward/backward pairs for the differentiable building blocks.

Every op is two plain functions:

    out, cache = foo_forward(x, ...)
    dx, grads  = foo_backward(dout, cache)     # ops with parameters
    dx         = foo_backward(dout, cache)     # ops without parameters

`grads` has exactly the keys of the op's parameters. Caches are frozen dataclasses so a
debugger shows named fields. Shapes use the glossary of docs/design.md#shapes-and-names: `...`
is any leading batch shape (usually (B, T)), D the feature size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# A Python float, not np.float64: NumPy 2 would promote float32 arrays multiplied by a NumPy scalar.
GELU_C = math.sqrt(2.0 / math.pi)  # GPT-2's tanh approximation constant


# --------------------------------------------------------------------------- linear


@dataclass(frozen=True)
class LinearCache:
    x: np.ndarray  # (..., D_in)
    W: np.ndarray  # (D_in, D_out)
    has_bias: bool


def linear_forward(x: np.ndarray, W: np.ndarray, b: np.ndarray | None = None):
    """y = x W + b.   x (..., D_in), W (D_in, D_out), b (D_out,) -> y (..., D_out)."""
    out = x @ W  # (..., D_out)
    if b is not None:
        out += b
    return out, LinearCache(x=x, W=W, has_bias=b is not None)


def linear_backward(dout: np.ndarray, cache: LinearCache):
    """dout (..., D_out) -> dx (..., D_in), grads {"W": (D_in, D_out)[, "b": (D_out,)]}."""
    x2 = cache.x.reshape(-1, cache.x.shape[-1])  # (N, D_in)
    dout2 = dout.reshape(-1, dout.shape[-1])  # (N, D_out)
    dx = dout @ cache.W.T  # (..., D_in)
    grads = {"W": x2.T @ dout2}  # (D_in, D_out)
    if cache.has_bias:
        grads["b"] = dout2.sum(axis=0)  # (D_out,)
    return dx, grads


# --------------------------------------------------------------------------- layer norm


@dataclass(frozen=True)
class LayerNormCache:
    xhat: np.ndarray  # (..., D) normalised input
    rstd: np.ndarray  # (..., 1) 1 / sqrt(var + eps)
    w: np.ndarray  # (D,)


def layer_norm_forward(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float):
    """y = (x - mean) / sqrt(var + eps) * w + b over the last axis.  x (..., D) -> y (..., D)."""
    mean = x.mean(axis=-1, keepdims=True)  # (..., 1)
    xc = x - mean  # (..., D)
    var = np.mean(xc * xc, axis=-1, keepdims=True)  # (..., 1)
    rstd = 1.0 / np.sqrt(var + eps)  # (..., 1)
    xhat = xc * rstd  # (..., D)
    out = xhat * w + b  # (..., D)
    return out, LayerNormCache(xhat=xhat, rstd=rstd, w=w)


def layer_norm_backward(dout: np.ndarray, cache: LayerNormCache):
    """dout (..., D) -> dx (..., D), grads {"w": (D,), "b": (D,)}."""
    D = dout.shape[-1]
    lead = tuple(range(dout.ndim - 1))
    dw = np.sum(dout * cache.xhat, axis=lead)  # (D,)
    db = np.sum(dout, axis=lead)  # (D,)
    dxhat = dout * cache.w  # (..., D)
    dxhat_mean = dxhat.mean(axis=-1, keepdims=True)  # (..., 1)
    dxhat_xhat_mean = np.sum(dxhat * cache.xhat, axis=-1, keepdims=True) / D  # (..., 1)
    dx = cache.rstd * (dxhat - dxhat_mean - cache.xhat * dxhat_xhat_mean)  # (..., D)
    return dx, {"w": dw, "b": db}


# --------------------------------------------------------------------------- RMS norm


@dataclass(frozen=True)
class RMSNormCache:
    xhat: np.ndarray  # (..., D) x / rms(x)
    rstd: np.ndarray  # (..., 1) 1 / sqrt(mean(x^2) + eps)
    w: np.ndarray  # (D,)


def rms_norm_forward(x: np.ndarray, w: np.ndarray, eps: float):
    """y = x / sqrt(mean(x^2) + eps) * w over the last axis (Llama).  x (..., D) -> y (..., D)."""
    rstd = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)  # (..., 1)
    xhat = x * rstd  # (..., D)
    out = xhat * w  # (..., D)
    return out, RMSNormCache(xhat=xhat, rstd=rstd, w=w)


def rms_norm_backward(dout: np.ndarray, cache: RMSNormCache):
    """dout (..., D) -> dx (..., D), grads {"w": (D,)}."""
    lead = tuple(range(dout.ndim - 1))
    dw = np.sum(dout * cache.xhat, axis=lead)  # (D,)
    dxhat = dout * cache.w  # (..., D)
    dxhat_xhat_mean = np.mean(dxhat * cache.xhat, axis=-1, keepdims=True)  # (..., 1)
    dx = cache.rstd * (dxhat - cache.xhat * dxhat_xhat_mean)  # (..., D)
    return dx, {"w": dw}


# --------------------------------------------------------------------------- GELU (tanh)


@dataclass(frozen=True)
class GeluCache:
    x: np.ndarray  # (...)
    tanh_u: np.ndarray  # (...) tanh(c (x + 0.044715 x^3))


def gelu_forward(x: np.ndarray):
    """GPT-2's GELU: 0.5 x (1 + tanh(c (x + 0.044715 x^3))), c = sqrt(2/pi).

    `x * x * x`, not `x ** 3`: the power is ~70x slower on float32 arrays with negatives.
    """
    u = GELU_C * (x + 0.044715 * (x * x * x))
    tanh_u = np.tanh(u)
    out = 0.5 * x * (1.0 + tanh_u)
    return out, GeluCache(x=x, tanh_u=tanh_u)


def gelu_backward(dout: np.ndarray, cache: GeluCache) -> np.ndarray:
    x, t = cache.x, cache.tanh_u
    du_dx = GELU_C * (1.0 + 3 * 0.044715 * (x * x))
    dx = dout * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du_dx)
    return dx


# --------------------------------------------------------------------------- SiLU


@dataclass(frozen=True)
class SiluCache:
    x: np.ndarray  # (...)
    sig: np.ndarray  # (...) sigmoid(x)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """Overflow-free logistic function."""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def silu_forward(x: np.ndarray):
    """SiLU (swish): x * sigmoid(x)."""
    sig = sigmoid(x)
    return x * sig, SiluCache(x=x, sig=sig)


def silu_backward(dout: np.ndarray, cache: SiluCache) -> np.ndarray:
    x, s = cache.x, cache.sig
    return dout * (s * (1.0 + x * (1.0 - s)))


# --------------------------------------------------------------------------- softmax


@dataclass(frozen=True)
class SoftmaxCache:
    probs: np.ndarray  # (..., K); masked entries exactly 0
    axis: int


def softmax_forward(x: np.ndarray, axis: int = -1):
    """Stable softmax. Entries equal to -inf get probability exactly 0.

    A slice that is entirely -inf has no distribution: callers must never build one
    (the attention masks always keep at least the diagonal).
    """
    x_max = np.max(x, axis=axis, keepdims=True)
    probs = np.exp(x - x_max)
    probs /= np.sum(probs, axis=axis, keepdims=True)  # in place: one temporary fewer
    return probs, SoftmaxCache(probs=probs, axis=axis)


def softmax_backward(dout: np.ndarray, cache: SoftmaxCache) -> np.ndarray:
    """dx = p * (dout - sum(dout * p))."""
    p = cache.probs
    return p * (dout - np.sum(dout * p, axis=cache.axis, keepdims=True))


def log_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Stable log-softmax (no backward needed on its own: see cross_entropy)."""
    x_max = np.max(x, axis=axis, keepdims=True)
    shifted = x - x_max
    return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))


# --------------------------------------------------------------------------- cross-entropy


@dataclass(frozen=True)
class CrossEntropyCache:
    probs: np.ndarray  # (N, V) softmax of the logits
    targets: np.ndarray  # (N,) int


def cross_entropy_forward(logits: np.ndarray, targets: np.ndarray):
    """Mean negative log-likelihood.  logits (N, V), targets (N,) int -> scalar loss.

    loss = -1/N sum_n log softmax(logits_n)[targets_n]
    """
    if logits.ndim != 2 or targets.shape != logits.shape[:1]:
        raise ValueError(
            f"cross_entropy: logits (N, V) and targets (N,), got {logits.shape} and {targets.shape}"
        )
    logp = log_softmax(logits, axis=-1)  # (N, V)
    N = logits.shape[0]
    loss = -np.mean(logp[np.arange(N), targets])
    return loss, CrossEntropyCache(probs=np.exp(logp), targets=targets)


def cross_entropy_backward(dloss: float, cache: CrossEntropyCache) -> np.ndarray:
    """dlogits = dloss * (softmax - onehot) / N."""
    N = cache.probs.shape[0]
    dlogits = cache.probs.copy()  # (N, V)
    dlogits[np.arange(N), cache.targets] -= 1.0
    return dlogits * (dloss / N)


def finite_argmax(logits: np.ndarray) -> np.ndarray:
    """argmax over the last axis of logits that must be finite (NonFiniteError otherwise: a
    NaN or Inf logit is a broken forward pass, never a prediction)."""
    if not np.isfinite(logits).all():
        from cel_numpy.errors import NonFiniteError

        raise NonFiniteError(NON_FINITE_LOGITS)
    return logits.argmax(axis=-1)


NON_FINITE_LOGITS = (
    "the model produced non-finite logits (NaN or Inf), which are never scored: its weights "
    "overflow in this dtype (try float64: generate and attention --dtype float64, or "
    "load_model(..., dtype='float64')) or the model file is damaged"
)


def check_finite_scores(scores: np.ndarray, items) -> None:
    """scores[i, :len(items[i].choices)] (log-probabilities of each item's choices) must be
    finite: NonFiniteError naming the item otherwise (never a score)."""
    for i, it in enumerate(items):
        if not np.isfinite(scores[i, : len(it.choices)]).all():
            from cel_numpy.errors import NonFiniteError

            raise NonFiniteError(f"item {it.id}: {NON_FINITE_LOGITS}")
