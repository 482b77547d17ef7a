"""Plain gradient descent on the theory model, a fresh batch every step, with a training log.

At each logging step the log records, on fresh samples that training never sees:
the loss on task A and on task B (and their p_A mixture), and every head's s- and c-loading,
so the c-feature can be watched moving into one head as it happens.
"""

from __future__ import annotations

import math
import sys
from dataclasses import asdict, dataclass, field

import numpy as np

from cel_numpy.errors import DivergenceError
from cel_numpy.limits import check_whole_numbers
from cel_numpy.theory.data import TASK_A, TASK_B, WorldConfig, sample_batch
from cel_numpy.theory.model import init_params, loss_and_grads, loss_of

# Gradient descent has diverged once a batch loss exceeds this multiple of the first one (on
# this regression the loss only falls at a stable learning rate; 1e3 leaves room for noise).
DIVERGED = 1e3


@dataclass(frozen=True)
class TrainConfig:
    """Everything that defines one training run (the world, the model size, the optimiser).

    Defaults: N = T = m = 8, H = 4, p_A = 0.3, sigma0 = 1e-3, B = 256, lr 0.5, 3000 steps
    (docs/design.md#training: why, and what they measure).
    """

    n_heads: int = 4  # H
    p_a: float = 0.3
    init_scale: float = 1e-3  # sigma0
    steps: int = 3000
    lr: float = 0.5
    batch_size: int = 256  # B
    n_tokens: int = 8  # N
    n_types: int = 8  # T
    d_content: int = 8  # m
    log_every: int = 50  # steps between log records (the last step is always logged)
    log_samples: int = 2048  # fresh samples per task at each log record

    def __post_init__(self):
        names = ("n_heads", "steps", "batch_size", "log_every", "log_samples")
        check_whole_numbers(**{name: (getattr(self, name), 1) for name in names})
        if not 0 < self.init_scale < math.inf:
            raise ValueError(f"init_scale must be a finite number > 0, got {self.init_scale}")
        if not 0 < self.lr < math.inf:
            raise ValueError(f"lr must be a finite number > 0, got {self.lr}")
        _ = self.world  # validates the world sizes and p_a

    @property
    def world(self) -> WorldConfig:
        return WorldConfig(
            n_tokens=self.n_tokens, n_types=self.n_types, d_content=self.d_content, p_a=self.p_a
        )

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class TrainLog:
    """One row per logging step; arrays are built by `as_arrays` (L = number of records)."""

    step: list = field(default_factory=list)  # L ints
    loss_a: list = field(default_factory=list)  # L floats, task-A loss on fresh samples
    loss_b: list = field(default_factory=list)  # L floats, task-B loss on fresh samples
    loss_joint: list = field(default_factory=list)  # L floats, p_A loss_a + p_B loss_b
    c_loading: list = field(default_factory=list)  # L arrays (H,)
    s_loading: list = field(default_factory=list)  # L arrays (H,)

    def as_arrays(self) -> dict:
        """{"step": (L,), "loss_a": (L,), "loss_b": (L,), "loss_joint": (L,),
        "c_loading": (L, H), "s_loading": (L, H)}."""
        return {name: np.asarray(getattr(self, name)) for name in self.__dataclass_fields__}


@dataclass(frozen=True)
class TrainResult:
    params: dict  # {"K": (H, T), "V": (H, m)}
    log: TrainLog
    config: TrainConfig


def train(config: TrainConfig, rng: np.random.Generator, progress: bool = False) -> TrainResult:
    """Initialise K, V ~ N(0, sigma0^2) and run `config.steps` steps of plain gradient descent.

    Every step draws a fresh batch of `config.batch_size` samples from the task mixture.
    `rng` feeds three independent streams (init, training batches, log samples), so the log
    never changes the training trajectory. progress=True prints a line every ~10% to stderr.
    """
    from cel_numpy.theory.analysis import loadings  # analysis imports the model, not train

    world = config.world
    init_rng, batch_rng, log_rng = rng.spawn(3)
    params = init_params(
        init_rng, config.n_heads, config.n_types, config.d_content, config.init_scale
    )
    log = TrainLog()
    tenth = max(1, config.steps // 10)

    def record(step: int) -> None:
        batch_a = sample_batch(log_rng, world, config.log_samples, task=TASK_A)
        batch_b = sample_batch(log_rng, world, config.log_samples, task=TASK_B)
        loss_a, loss_b = loss_of(params, batch_a), loss_of(params, batch_b)
        c_load, s_load = loadings(params, batch_a)
        log.step.append(step)
        log.loss_a.append(loss_a)
        log.loss_b.append(loss_b)
        log.loss_joint.append(config.p_a * loss_a + (1 - config.p_a) * loss_b)
        log.c_loading.append(c_load)
        log.s_loading.append(s_load)

    record(0)
    first_loss = None
    for step in range(1, config.steps + 1):
        batch = sample_batch(batch_rng, world, config.batch_size)
        loss, grads = loss_and_grads(params, batch)
        first_loss = loss if first_loss is None else first_loss
        if step == 1 and not np.isfinite(loss):  # before any update: the initial weights
            raise DivergenceError(
                f"the loss of the initial weights is {loss:.3g}, not a number: lower the init "
                f"scale (now {config.init_scale:g}: --init, or --sweep-scales in a sweep; the "
                "theory wants a small one)"
            )
        if not np.isfinite(loss) or loss > DIVERGED * max(first_loss, 1e-3):
            raise DivergenceError(
                f"training diverged at step {step} (batch loss {loss:.3g}, first "
                f"{first_loss:.3g}): lower the learning rate (--lr, now {config.lr:g})"
            )
        for name in params:
            params[name] -= config.lr * grads[name]
        if step % config.log_every == 0 or step == config.steps:
            record(step)
        if progress and (step % tenth == 0 or step == config.steps):
            print(
                f"  step {step:6d}/{config.steps}  batch loss {loss:.4f}",
                file=sys.stderr,
                flush=True,
            )
    return TrainResult(params=params, log=log, config=config)
