"""The two-task theory world (docs/design.md#theory-world): data, model, training, analysis.

The specific data and model are this project's construction from the paper's abstract:
a one-layer, H-head softmax attention model with a fixed query, trained by plain gradient
descent from small random init on a hidden mixture of two tasks that agree on a shared
feature s and disagree on a conflicting feature c. Training reaches the joint optimum
(loss 2 p_A p_B), yet the c-feature concentrates in one head; ablating that head improves
the minority task A and harms task B.

Defaults (`TrainConfig`): N = T = m = 8, H = 4, p_A = 0.3, sigma0 = 1e-3, B = 256, lr 0.5,
3000 steps; docs/design.md#training says why, the README's Results section what they measure.
"""

from cel_numpy.theory.analysis import (
    Ablation,
    ClosedForm,
    best_ablation,
    closed_form,
    concentration,
    held_out,
    integrated_task_losses,
    joint_ablations,
    linear_predictor_losses,
    loadings,
    single_ablations,
    task_losses,
)
from cel_numpy.theory.data import Batch, WorldConfig, feature_directions, sample_batch
from cel_numpy.theory.model import init_params, loss_and_grads, theory_backward, theory_forward
from cel_numpy.theory.run import analyse, load_params, run_theory, sweep_init
from cel_numpy.theory.train import TrainConfig, TrainLog, TrainResult, train

__all__ = [
    "Ablation",
    "Batch",
    "ClosedForm",
    "TrainConfig",
    "TrainLog",
    "TrainResult",
    "WorldConfig",
    "analyse",
    "best_ablation",
    "closed_form",
    "concentration",
    "feature_directions",
    "held_out",
    "init_params",
    "integrated_task_losses",
    "joint_ablations",
    "linear_predictor_losses",
    "load_params",
    "loadings",
    "loss_and_grads",
    "run_theory",
    "sample_batch",
    "single_ablations",
    "sweep_init",
    "task_losses",
    "theory_backward",
    "theory_forward",
    "train",
]
