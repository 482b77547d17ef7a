"""Matplotlib figures. matplotlib is imported inside each function (Agg backend), never at import.

Theory world:
    plot_theory_task_losses(log, closed_form, path)   task losses over training + closed-form levels
    plot_theory_loadings(log, path)                   per-head c- and s-loadings over training
    plot_theory_ablations(heads, path)                per-head ablation effect on both tasks
    plot_concentration_vs_init(records, path)         concentration index against sigma0
"""

from __future__ import annotations

import os

import numpy as np


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: str | os.PathLike) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    _pyplot().close(fig)


def plot_theory_task_losses(log: dict, closed_form: dict, path: str | os.PathLike) -> None:
    """log: {"step": (L,), "loss_a": (L,), "loss_b": (L,), "loss_joint": (L,)}; closed_form {joint, a, b}."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for key, name, color in (
        ("loss_a", "task A", "C0"),
        ("loss_b", "task B", "C1"),
        ("loss_joint", "joint", "C2"),
    ):
        ax.plot(log["step"], log[key], color=color, label=name)
    for key, name, color in (("a", "A", "C0"), ("b", "B", "C1"), ("joint", "joint", "C2")):
        ax.axhline(
            closed_form[key], color=color, linestyle="--", linewidth=1, label=f"closed form {name}"
        )
    ax.axhline(0.5, color="grey", linestyle=":", linewidth=1, label="no c-feature (0.5)")
    ax.set_xlabel("step")
    ax.set_ylabel("loss on fresh samples")
    ax.set_yscale("log")
    ax.set_title("Theory model: task losses during training")
    ax.legend(fontsize=7, ncol=2)
    _save(fig, path)


def plot_theory_loadings(log: dict, path: str | os.PathLike) -> None:
    """log: {"step": (L,), "c_loading": (L, H), "s_loading": (L, H)}."""
    plt = _pyplot()
    fig, (ax_c, ax_s) = plt.subplots(1, 2, figsize=(9.0, 3.6), sharex=True)
    H = log["c_loading"].shape[1]
    for h in range(H):
        ax_c.plot(log["step"], log["c_loading"][:, h], label=f"head {h}")
        ax_s.plot(log["step"], log["s_loading"][:, h], label=f"head {h}")
    ax_c.set_title(r"c-loading $E[a_{h,c}]\,V_h\cdot w_c$")
    ax_s.set_title(r"s-loading $E[a_{h,s}]\,V_h\cdot w_s$")
    for ax in (ax_c, ax_s):
        ax.axhline(0.0, color="grey", linewidth=0.5)
        ax.set_xlabel("step")
    ax_c.legend(fontsize=7)
    _save(fig, path)


def plot_theory_ablations(heads: list[dict], path: str | os.PathLike) -> None:
    """heads: [{"head", "ablate_delta_a", "ablate_delta_b"}, ...] (ablated minus intact loss)."""
    plt = _pyplot()
    idx = np.array([h["head"] for h in heads])
    d_a = np.array([h["ablate_delta_a"] for h in heads])
    d_b = np.array([h["ablate_delta_b"] for h in heads])
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    ax.bar(idx - 0.2, d_a, width=0.4, label="task A")
    ax.bar(idx + 0.2, d_b, width=0.4, label="task B")
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_xticks(idx)
    ax.set_xlabel("ablated head")
    ax.set_ylabel("loss change (ablated - intact)")
    ax.set_title("Single-head ablations (below 0 = the task improves)")
    ax.legend()
    _save(fig, path)


def plot_concentration_vs_init(records: list[dict], path: str | os.PathLike) -> None:
    """records: [{"init_scale", "seed", "concentration"}, ...] from `sweep_init`."""
    plt = _pyplot()
    scales = np.array([r["init_scale"] for r in records])
    conc = np.array([r["concentration"] for r in records])
    fig, ax = plt.subplots(figsize=(6.0, 3.8))
    ax.scatter(scales, conc, alpha=0.6, label="one seed")
    uniq = np.unique(scales)
    ax.plot(
        uniq,
        [conc[scales == s].mean() for s in uniq],
        color="C1",
        marker="o",
        label="mean over seeds",
    )
    ax.set_xscale("log")
    ax.set_ylim(0, 1.05)
    ax.set_xlabel(r"init scale $\sigma_0$")
    ax.set_ylabel(r"concentration $\max|\beta_h| / \sum|\beta_h|$")
    ax.set_title("Concentration of the c-feature vs init scale")
    ax.legend()
    _save(fig, path)
