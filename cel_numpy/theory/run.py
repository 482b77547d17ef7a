"""Train + analyse + write: what `cel-numpy theory` (and the demo) runs.

    summary = analyse(params, config, rng, n_samples)        # no I/O
    summary = run_theory(config, seed, out_dir)              # train, analyse, write DIR/...
    records = sweep_init(config, init_scales, seeds)         # concentration vs sigma0

Files in out_dir: summary.json, params.npz (K, V: reload with `load_params`), log.npz (the
training log arrays), task_losses.png, loadings.png, ablations.png.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from cel_numpy.limits import check_whole_numbers
from cel_numpy.outdir import prepare_out
from cel_numpy.theory.analysis import (
    best_ablation,
    closed_form,
    concentration,
    held_out,
    integrated_task_losses,
    joint_ablations,
    loadings,
    single_ablations,
    task_losses,
)
from cel_numpy.theory.train import TrainConfig, TrainResult, train

EVAL_SAMPLES = 50_000  # fresh held-out samples per task for the final losses and ablations
MAX_JOINT_SIZE = 3  # exhaustive joint ablations over all head subsets up to this size


def analyse(
    params: dict, config: TrainConfig, rng: np.random.Generator, n_samples: int = EVAL_SAMPLES
) -> dict:
    """Losses, closed forms, loadings, concentration and ablations on fresh held-out samples.

    Returns a JSON-ready dict (see `run_theory` for the keys). Ablation deltas are paired:
    intact and ablated models see the same `n_samples` samples per task.
    """
    data = held_out(rng, config.world, n_samples)
    loss_a, loss_b = task_losses(params, data)
    int_a, int_b = integrated_task_losses(params, data.a)
    p_a, p_b = config.p_a, 1.0 - config.p_a
    c_load, s_load = loadings(params, data.a)
    singles = single_ablations(params, data)
    joints = joint_ablations(params, data, MAX_JOINT_SIZE)
    best = best_ablation(joints)
    heads = [
        {
            "head": h,
            "c_loading": float(c_load[h]),
            "s_loading": float(s_load[h]),
            "ablate_delta_a": singles[h].delta_a,
            "ablate_delta_b": singles[h].delta_b,
        }
        for h in range(config.n_heads)
    ]
    return {
        "joint_loss": p_a * loss_a + p_b * loss_b,
        "task_losses": {"a": loss_a, "b": loss_b},
        "joint_loss_integrated": p_a * int_a + p_b * int_b,
        "task_losses_integrated": {"a": int_a, "b": int_b},
        "closed_form": closed_form(config.p_a).to_dict(),
        "concentration": concentration(c_load),
        "c_head": int(np.argmax(np.abs(c_load))),
        "heads": heads,
        "best_joint_ablation": {
            "heads": list(best.heads),
            "delta_a": best.delta_a,
            "delta_b": best.delta_b,
            "loss_a": best.loss_a,
            "loss_b": best.loss_b,
        },
        "joint_ablations": [a.to_dict() for a in joints],
        "eval_samples_per_task": n_samples,
    }


def save_params(path: str | os.PathLike, params: dict) -> None:
    np.savez(path, K=params["K"], V=params["V"])


def load_params(path: str | os.PathLike) -> dict:
    """{"K": (H, T), "V": (H, m)} as written by `run_theory` (DIR/params.npz)."""
    with np.load(path) as f:
        return {"K": f["K"].astype(np.float64), "V": f["V"].astype(np.float64)}


def run_theory(
    config: TrainConfig,
    seed: int,
    out_dir: str | os.PathLike | None,
    *,
    eval_samples: int = EVAL_SAMPLES,
    progress: bool = False,
    figures: bool = True,
) -> dict:
    """Train with `seed`, analyse on fresh samples, and (if out_dir) write summary, params, figures.

    The seed feeds one Generator, split into a training stream and an evaluation stream.
    Returns the summary dict: joint_loss, task_losses {a, b}, closed_form {joint, a, b, delta},
    concentration, heads [{head, c_loading, s_loading, ablate_delta_a, ablate_delta_b}],
    best_joint_ablation {heads, delta_a, delta_b, ...}, config, seed, and more.
    """
    # None would draw fresh entropy (a run no one could repeat); 0 samples give NaN losses
    check_whole_numbers(seed=(seed, 0), eval_samples=(eval_samples, 1))
    out = prepare_out(out_dir, "out_dir") if out_dir is not None else None
    train_rng, eval_rng = np.random.default_rng(seed).spawn(2)
    t0 = time.perf_counter()
    result = train(config, train_rng, progress=progress)
    train_seconds = time.perf_counter() - t0
    summary = analyse(result.params, config, eval_rng, eval_samples)
    summary.update(
        {
            "config": config.to_dict(),
            "seed": seed,
            "train_seconds": train_seconds,
            "steps_per_second": config.steps / train_seconds,
        }
    )
    if out is not None:
        write_outputs(out, result, summary, figures=figures)
    return summary


def write_outputs(out: Path, result: TrainResult, summary: dict, figures: bool = True) -> None:
    save_params(out / "params.npz", result.params)
    np.savez(out / "log.npz", **result.log.as_arrays())
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if figures:
        from cel_numpy import plots

        arrays = result.log.as_arrays()
        plots.plot_theory_task_losses(arrays, summary["closed_form"], out / "task_losses.png")
        plots.plot_theory_loadings(arrays, out / "loadings.png")
        plots.plot_theory_ablations(summary["heads"], out / "ablations.png")


def sweep_init(
    config: TrainConfig,
    init_scales: list[float],
    seeds: list[int],
    *,
    eval_samples: int = 20_000,
    progress: bool = False,
) -> list[dict]:
    """Train at every (init_scale, seed) and measure the concentration and losses.

    Returns one record per run: {init_scale, seed, concentration, joint_loss, task_losses,
    c_head_delta_a, c_head_delta_b}.
    """
    from dataclasses import replace

    records = []
    for scale in init_scales:
        for seed in seeds:
            # no per-step log needed
            cfg = replace(config, init_scale=float(scale), log_every=config.steps)
            s = run_theory(cfg, seed, None, eval_samples=eval_samples)
            c_head = s["heads"][s["c_head"]]
            records.append(
                {
                    "init_scale": float(scale),
                    "seed": seed,
                    "concentration": s["concentration"],
                    "joint_loss": s["joint_loss"],
                    "task_losses": s["task_losses"],
                    "c_head_delta_a": c_head["ablate_delta_a"],
                    "c_head_delta_b": c_head["ablate_delta_b"],
                }
            )
            if progress:
                print(
                    f"  init {scale:.0e} seed {seed}: concentration {s['concentration']:.3f}"
                    f" joint loss {s['joint_loss']:.4f}",
                    file=sys.stderr,
                    flush=True,
                )
    return records
