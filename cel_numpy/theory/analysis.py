"""Closed forms, loadings, concentration and head ablations of the theory model.

Closed forms (derived in docs/design.md#closed-forms). Write u = w_s . z_s and r = w_c . z_c,
independent N(0, 1). Task A wants u + r, task B wants u - r, and the task is hidden, so the
joint optimum is the conditional mean  y* = u + delta r  with delta = p_A - p_B.
For any predictor a_s u + a_c r:

    loss_A(a_s, a_c) = 1/2 [(1 - a_s)^2 + (1 - a_c)^2]
    loss_B(a_s, a_c) = 1/2 [(1 - a_s)^2 + (1 + a_c)^2]

so at the optimum loss_A = 2 p_B^2, loss_B = 2 p_A^2 and the joint loss is 2 p_A p_B.
Removing the c-feature (a_c = 0) gives 1/2 on both tasks: task A improves iff p_B > 1/2.

Loadings. Head h reads feature f with the coefficient beta_h^f = E[a_{h,f}] (V_h . w_f), the
expected attention on the f token times the readout along w_f; the model predicts about
(sum_h beta^s_h) u + (sum_h beta^c_h) r. Concentration C = max_h |beta^c_h| / sum_h |beta^c_h|
(1 = the c-feature lives in one head, 1/H = spread evenly).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from cel_numpy.theory.data import (
    C_TYPE,
    S_TYPE,
    TASK_A,
    TASK_B,
    Batch,
    WorldConfig,
    feature_directions,
    sample_batch,
)
from cel_numpy.theory.model import loss_of, mse_forward, readout, theory_forward

# --------------------------------------------------------------------------- closed forms


@dataclass(frozen=True)
class ClosedForm:
    joint: float  # 2 p_A p_B
    a: float  # 2 p_B^2
    b: float  # 2 p_A^2
    delta: float  # p_A - p_B: the optimal coefficient on w_c . z_c

    def to_dict(self) -> dict:
        return {"joint": self.joint, "a": self.a, "b": self.b, "delta": self.delta}


def closed_form(p_a: float) -> ClosedForm:
    """Losses of the joint optimum y* = w_s.z_s + (p_A - p_B) w_c.z_c, for any p_A in [0, 1]."""
    if not 0.0 <= p_a <= 1.0:
        raise ValueError(f"p_a must lie in [0, 1], got {p_a}")
    p_b = 1.0 - p_a
    return ClosedForm(joint=2 * p_a * p_b, a=2 * p_b * p_b, b=2 * p_a * p_a, delta=p_a - p_b)


def linear_predictor_losses(coef_s: float, coef_c: float) -> tuple[float, float]:
    """(task-A loss, task-B loss) of the predictor coef_s w_s.z_s + coef_c w_c.z_c."""
    shared = (1.0 - coef_s) ** 2
    return 0.5 * (shared + (1.0 - coef_c) ** 2), 0.5 * (shared + (1.0 + coef_c) ** 2)


# --------------------------------------------------------------------------- loadings


def _positions(batch: Batch, type_id: int) -> np.ndarray:
    """Position of the (unique) token of `type_id` in each sequence: (B,)."""
    return np.argmax(batch.types == type_id, axis=1)


def expected_attention(params: dict, batch: Batch) -> tuple[np.ndarray, np.ndarray]:
    """(E[a_{h,c}], E[a_{h,s}]), each (H,), averaged over the sequences of `batch`."""
    _, cache = theory_forward(params, batch)
    probs = cache.attention.probs[:, :, 0, :]  # (B, H, 1, N) -> (B, H, N)
    rows = np.arange(batch.size)
    a_c = probs[rows, :, _positions(batch, C_TYPE)]  # (B, H)
    a_s = probs[rows, :, _positions(batch, S_TYPE)]  # (B, H)
    return a_c.mean(axis=0), a_s.mean(axis=0)


def loadings(params: dict, batch: Batch) -> tuple[np.ndarray, np.ndarray]:
    """(c-loadings, s-loadings), each (H,): beta_h = E[a_{h,f}] (V_h . w_f),
    E over `batch` types."""
    w_s, w_c = feature_directions(params["V"].shape[1])
    mean_a_c, mean_a_s = expected_attention(params, batch)
    return mean_a_c * (params["V"] @ w_c), mean_a_s * (params["V"] @ w_s)  # (H,), (H,)


def concentration(c_loading: np.ndarray) -> float:
    """C = max_h |beta_h| / sum_h |beta_h|, in [1/H, 1]."""
    mag = np.abs(np.asarray(c_loading, dtype=np.float64))
    if mag.size == 0:
        raise ValueError("concentration is undefined: no head's c-loading was given")
    total = mag.sum()
    if total == 0:
        raise ValueError("concentration is undefined: every c-loading is zero")
    return float(mag.max() / total)


def integrated_task_losses(
    params: dict, batch: Batch, head_mask: np.ndarray | None = None
) -> tuple[float, float]:
    """(task-A loss, task-B loss) with the contents z integrated out exactly; types from `batch`.

    For fixed types, y_hat = sum_i u_i . z_i with u_i = sum_h m_h a[h, i] V_h (m,), so with
    z_i ~ N(0, I):  loss_A|types = 1/2 [sum_i |u_i|^2 - 2 u_s . w_s - 2 u_c . w_c + 2]  and
    loss_B|types the same with + 2 u_c . w_c. Only the types are sampled, which removes most
    of the Monte-Carlo noise of `task_losses` (useful to compare with the closed forms).
    """
    H = params["K"].shape[0]
    mask = np.ones(H) if head_mask is None else head_mask
    w_s, w_c = feature_directions(params["V"].shape[1])
    _, cache = theory_forward(params, batch)
    probs = cache.attention.probs[:, :, 0, :] * mask[None, :, None]  # (B, H, N)
    u = np.einsum("bhn,hm->bnm", probs, params["V"])  # (B, H, N),(H, m) -> (B, N, m)
    rows = np.arange(batch.size)
    u_s_ws = u[rows, _positions(batch, S_TYPE)] @ w_s  # (B,)
    u_c_wc = u[rows, _positions(batch, C_TYPE)] @ w_c  # (B,)
    sumsq = np.sum(u * u, axis=(1, 2))  # (B,)
    loss_a = 0.5 * np.mean(sumsq - 2 * u_s_ws - 2 * u_c_wc + 2)
    loss_b = 0.5 * np.mean(sumsq - 2 * u_s_ws + 2 * u_c_wc + 2)
    return float(loss_a), float(loss_b)


# --------------------------------------------------------------------------- ablations


@dataclass(frozen=True)
class HeldOut:
    """Fresh samples for evaluation, one batch per task (never used in training)."""

    a: Batch
    b: Batch

    @property
    def size(self) -> int:
        return self.a.size


def held_out(rng: np.random.Generator, world: WorldConfig, n_samples: int) -> HeldOut:
    return HeldOut(
        a=sample_batch(rng, world, n_samples, task=TASK_A),
        b=sample_batch(rng, world, n_samples, task=TASK_B),
    )


@dataclass(frozen=True)
class Ablation:
    heads: tuple  # ablated (zeroed) heads, ascending; () = intact model
    loss_a: float
    loss_b: float
    delta_a: float  # loss_a - intact loss_a (negative = ablation helps task A)
    delta_b: float

    def to_dict(self) -> dict:
        return {
            "heads": list(self.heads),
            "loss_a": self.loss_a,
            "loss_b": self.loss_b,
            "delta_a": self.delta_a,
            "delta_b": self.delta_b,
        }


def task_losses(
    params: dict, data: HeldOut, head_mask: np.ndarray | None = None
) -> tuple[float, float]:
    """(task-A loss, task-B loss) on the held-out samples, with an optional head mask (H,)."""
    return loss_of(params, data.a, head_mask), loss_of(params, data.b, head_mask)


def ablate(params: dict, data: HeldOut, head_sets) -> list[Ablation]:
    """Zero-ablate each head set (an iterable of tuples of head ids) and compare with intact.

    The same held-out samples serve every set, so the deltas are paired differences.
    The attention runs once per task: an ablation only changes the head mask, so each set
    reuses the intact per-head outputs and re-runs `readout` (head_mask_forward + sum).
    """
    H = params["K"].shape[0]
    _, cache_a = theory_forward(params, data.a)
    _, cache_b = theory_forward(params, data.b)
    z_a, z_b = cache_a.head_mask.z, cache_b.head_mask.z  # (B, H, 1, 1) intact per-head outputs

    def losses(mask: np.ndarray) -> tuple[float, float]:
        return mse_forward(readout(z_a, mask)[0], data.a.y)[0], mse_forward(
            readout(z_b, mask)[0], data.b.y
        )[0]

    intact_a, intact_b = losses(np.ones(H))
    out = []
    for heads in head_sets:
        heads = tuple(sorted(int(h) for h in heads))
        if any(not 0 <= h < H for h in heads) or len(set(heads)) != len(heads):
            raise ValueError(f"head set {heads} is not a set of distinct heads in 0..{H - 1}")
        mask = np.ones(H)
        mask[list(heads)] = 0.0
        loss_a, loss_b = losses(mask)
        out.append(Ablation(heads, loss_a, loss_b, loss_a - intact_a, loss_b - intact_b))
    return out


def head_subsets(n_heads: int, max_size: int) -> list[tuple]:
    """Every non-empty subset of heads of size <= max_size, smaller sets first."""
    return [
        s
        for k in range(1, min(max_size, n_heads) + 1)
        for s in itertools.combinations(range(n_heads), k)
    ]


def single_ablations(params: dict, data: HeldOut) -> list[Ablation]:
    """Ablate each head alone: H results in head order."""
    return ablate(params, data, [(h,) for h in range(params["K"].shape[0])])


def joint_ablations(params: dict, data: HeldOut, max_size: int = 3) -> list[Ablation]:
    """Exhaustively ablate every head subset of size 1..max_size (H=8, size 3: 8 + 28 + 56 = 92)."""
    return ablate(params, data, head_subsets(params["K"].shape[0], max_size))


def best_ablation(ablations: list[Ablation]) -> Ablation:
    """The ablation that most lowers either task's loss: min over sets of min(delta_a, delta_b);
    ties go to fewer heads, then to the lower head ids."""
    return min(ablations, key=lambda a: (min(a.delta_a, a.delta_b), len(a.heads), a.heads))
