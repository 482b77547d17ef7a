"""Gradient checks by central differences, in float64, against a random upstream gradient.

A random upstream gradient matters: with `sum` (ones) upstream, softmax and layer norm have
zero true gradient along many directions and a wrong backward can still pass.

    numerical_gradient(f, x)           every element of x, for a scalar function f
    directional_derivative(f, params)  one random direction through all parameters at once
    rel_error(a, b)                    ||a - b|| / (||a|| + ||b||)
    cmp(name, analytic, numeric)       one readable line (Karpathy's makemore `cmp`)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


def rel_error(a: np.ndarray, b: np.ndarray) -> float:
    """Norm-wise relative error ||a - b|| / (||a|| + ||b||); 0 when both are zero.

    Norm-wise rather than element-wise: an element-wise ratio blows up on gradient entries that
    are zero up to rounding, which says nothing about the backward pass.
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"rel_error: shapes differ, {a.shape} vs {b.shape}")
    denom = np.linalg.norm(a) + np.linalg.norm(b)
    return 0.0 if denom == 0 else float(np.linalg.norm(a - b) / denom)


def numerical_gradient(f: Callable[[], float], x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """d f / d x for every element of x by central differences; x is perturbed in
    place and restored.

    f takes no arguments and must read x (a float64 array) when called.
    """
    if x.dtype != np.float64:
        raise TypeError(f"gradient checks need float64, got {x.dtype}")
    grad = np.zeros_like(x)
    it = np.nditer(x, flags=["multi_index"])
    for _ in it:
        i = it.multi_index
        old = x[i]
        x[i] = old + eps
        f_plus = f()
        x[i] = old - eps
        f_minus = f()
        x[i] = old
        grad[i] = (f_plus - f_minus) / (2 * eps)
    return grad


def directional_derivative(
    f: Callable[[], float], params: dict, rng: np.random.Generator, eps: float = 1e-6
) -> tuple[float, dict]:
    """Derivative of f along one random unit direction u through every array in `params`.

    Returns (numeric derivative, u) so the caller compares with sum_k <grads[k], u[k]>.
    Arrays are perturbed in place and restored.
    """
    u = {k: rng.standard_normal(p.shape) for k, p in params.items()}
    norm = np.sqrt(sum(float(np.sum(d * d)) for d in u.values()))
    u = {k: d / norm for k, d in u.items()}
    originals = {k: p.copy() for k, p in params.items()}
    for k, p in params.items():
        p += eps * u[k]
    f_plus = f()
    for k, p in params.items():
        p[...] = originals[k] - eps * u[k]
    f_minus = f()
    for k, p in params.items():
        p[...] = originals[k]
    return (f_plus - f_minus) / (2 * eps), u


def directional_check(
    f: Callable[[], float], params: dict, grads: dict, rng: np.random.Generator, eps: float = 1e-6
) -> float:
    """Relative error between the analytic and numeric derivative along a random direction."""
    if set(grads) != set(params):
        raise KeyError(f"grads keys {sorted(grads)} differ from params keys {sorted(params)}")
    numeric, u = directional_derivative(f, params, rng, eps)
    analytic = sum(float(np.sum(grads[k] * u[k])) for k in params)
    return rel_error(np.array(analytic), np.array(numeric))


@dataclass(frozen=True)
class Comparison:
    name: str
    exact: bool
    rel_error: float
    max_abs_diff: float

    def __str__(self) -> str:
        return (
            f"{self.name:15s} | exact: {str(self.exact):5s} | rel_error: {self.rel_error:.2e}"
            f" | max |diff|: {self.max_abs_diff:.2e}"
        )


def cmp(name: str, analytic: np.ndarray, numeric: np.ndarray) -> Comparison:
    """Compare two gradients; print(cmp(...)) gives one line per tensor."""
    analytic = np.asarray(analytic)
    numeric = np.asarray(numeric)
    if analytic.shape != numeric.shape:
        raise ValueError(
            f"{name}: analytic shape {analytic.shape} != numeric shape {numeric.shape}"
        )
    return Comparison(
        name=name,
        exact=bool(np.array_equal(analytic, numeric)),
        rel_error=rel_error(analytic, numeric),
        max_abs_diff=float(np.max(np.abs(analytic - numeric))) if analytic.size else 0.0,
    )


def check_op(
    forward: Callable[..., tuple[np.ndarray, object]],
    backward: Callable[[np.ndarray, object], object],
    inputs: dict[str, np.ndarray],
    rng: np.random.Generator,
    unpack: Callable[[object], dict[str, np.ndarray]],
    eps: float = 1e-6,
) -> list[Comparison]:
    """Check every element of every input of an op against a random upstream gradient.

    forward(**inputs) -> (out, cache); backward(dout, cache) -> anything; unpack(that) -> a dict
    mapping input names to their analytic gradients (only those names are checked).
    The scalar under test is L = sum(out * dout) with dout ~ N(0, 1).
    """
    out, cache = forward(**inputs)
    dout = rng.standard_normal(np.shape(out))
    analytic = unpack(backward(dout, cache))

    def loss() -> float:
        return float(np.sum(forward(**inputs)[0] * dout))

    return [
        cmp(name, analytic[name], numerical_gradient(loss, inputs[name], eps)) for name in analytic
    ]
