"""Data of the two-task theory world (docs/design.md#data; this project's own construction).

A sequence has N tokens. Token i has a type t_i in {0..T-1} and a content z_i ~ N(0, I_m).
Type 0 is the shared feature s, type 1 the conflicting feature c, types 2..T-1 are noise.
Every sequence holds exactly one s and one c token, at random distinct positions; the other
N - 2 tokens draw their types uniformly from {2..T-1}.

The feature directions are the first two standard basis vectors of R^m:

    w_s = e_0,   w_c = e_1     (so w_s . z = z[0] and w_c . z = z[1])

Tasks (the task is NOT visible in the input):
    task A (probability p_A):     y = w_s . z_s + w_c . z_c
    task B (probability 1 - p_A): y = w_s . z_s - w_c . z_c
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

S_TYPE = 0  # type id of the shared feature token s
C_TYPE = 1  # type id of the conflicting feature token c
TASK_A = 0
TASK_B = 1


@dataclass(frozen=True)
class WorldConfig:
    """Sizes of the theory world: N tokens per sequence, T types, m content dimensions."""

    n_tokens: int = 8  # N
    n_types: int = 8  # T
    d_content: int = 8  # m
    p_a: float = 0.3  # probability that a sample belongs to task A

    def __post_init__(self):
        if self.n_tokens < 2:
            raise ValueError(f"n_tokens must be >= 2 (one s and one c token), got {self.n_tokens}")
        if self.n_types < 3:
            raise ValueError(
                f"n_types must be >= 3 (s, c and at least one noise type), got {self.n_types}"
            )
        if self.d_content < 2:
            raise ValueError(
                f"d_content must be >= 2 (w_s and w_c are e_0 and e_1), got {self.d_content}"
            )
        if not 0.0 <= self.p_a <= 1.0:
            raise ValueError(f"p_a must lie in [0, 1], got {self.p_a}")


def feature_directions(d_content: int) -> tuple[np.ndarray, np.ndarray]:
    """(w_s, w_c) = (e_0, e_1) in R^m, each (m,)."""
    eye = np.eye(d_content)
    return eye[0], eye[1]


@dataclass(frozen=True)
class Batch:
    types: np.ndarray  # (B, N) int, exactly one 0 (s) and one 1 (c) per row
    z: np.ndarray  # (B, N, m) float64 contents
    task: np.ndarray  # (B,) int, TASK_A or TASK_B
    y: np.ndarray  # (B,) float64 targets

    @property
    def size(self) -> int:
        return self.types.shape[0]


def sample_batch(
    rng: np.random.Generator, world: WorldConfig, batch_size: int, task: int | None = None
) -> Batch:
    """Draw `batch_size` fresh sequences; task=None mixes A and B with p_A, else all from `task`."""
    B, N, T, m = batch_size, world.n_tokens, world.n_types, world.d_content
    types = rng.integers(2, T, size=(B, N))  # (B, N) noise types
    pos = np.argsort(rng.random((B, N)), axis=1)[:, :2]  # (B, 2) two distinct random positions
    rows = np.arange(B)
    types[rows, pos[:, 0]] = S_TYPE
    types[rows, pos[:, 1]] = C_TYPE
    z = rng.standard_normal((B, N, m))  # (B, N, m)
    if task is None:
        task_ids = np.where(rng.random(B) < world.p_a, TASK_A, TASK_B)  # (B,)
    else:
        if task not in (TASK_A, TASK_B):
            raise ValueError(f"task must be TASK_A (0), TASK_B (1) or None, got {task}")
        task_ids = np.full(B, task)
    z_s = z[rows, pos[:, 0], 0]  # (B,) w_s . z_s
    z_c = z[rows, pos[:, 1], 1]  # (B,) w_c . z_c
    sign = np.where(task_ids == TASK_A, 1.0, -1.0)  # (B,)
    y = z_s + sign * z_c  # (B,)
    return Batch(types=types, z=z, task=task_ids, y=y)


def feature_values(batch: Batch) -> tuple[np.ndarray, np.ndarray]:
    """(w_s . z_s, w_c . z_c), each (B,): the two numbers the targets are built from."""
    rows = np.arange(batch.size)
    s_pos = np.argmax(batch.types == S_TYPE, axis=1)  # (B,)
    c_pos = np.argmax(batch.types == C_TYPE, axis=1)  # (B,)
    return batch.z[rows, s_pos, 0], batch.z[rows, c_pos, 1]
