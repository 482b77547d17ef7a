"""Training steps per second of the default theory config: NumPy, and torch autograd if importable.

Both frameworks train the same model from the same init on the same pre-drawn batches (float64,
CPU), so the timing compares one forward + backward + SGD update and nothing else; batch
sampling is timed separately. Reported: the median over repeats, the final parameter difference
between the two (a correctness check), and the ratio NumPy / torch (goal: >= 1).

    PYTHONPATH=. python bench/bench_theory.py [--steps 300] [--repeats 5]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import numpy as np

from cel_numpy.theory.data import sample_batch
from cel_numpy.theory.model import init_params, loss_and_grads
from cel_numpy.theory.train import TrainConfig


def numpy_steps(params: dict, batches: list, lr: float) -> dict:
    params = {k: p.copy() for k, p in params.items()}
    for batch in batches:
        _, grads = loss_and_grads(params, batch)
        for name in params:
            params[name] -= lr * grads[name]
    return params


def torch_setup(batches: list, n_types: int):
    import torch

    return [
        (
            torch.nn.functional.one_hot(torch.from_numpy(b.types), n_types).to(
                torch.float64
            ),  # (B, N, T)
            torch.from_numpy(b.z),  # (B, N, m)
            torch.from_numpy(b.y),  # (B,)
        )
        for b in batches
    ]


def torch_steps(params: dict, tbatches: list, lr: float) -> dict:
    """The same model in torch: y_hat = sum_h sum_i softmax_i(K_h[t_i]) V_h.z_i,
    autograd backward."""
    import torch

    K = torch.tensor(params["K"], requires_grad=True)  # (H, T)
    V = torch.tensor(params["V"], requires_grad=True)  # (H, m)
    for onehot, z, y in tbatches:
        scores = onehot @ K.T  # (B, N, T) @ (T, H) -> (B, N, H)
        a = torch.softmax(scores, dim=1)  # over tokens N
        values = z @ V.T  # (B, N, m) @ (m, H) -> (B, N, H)
        y_hat = (a * values).sum(dim=(1, 2))  # (B,)
        loss = 0.5 * ((y_hat - y) ** 2).mean()
        K.grad = V.grad = None
        loss.backward()
        with torch.no_grad():
            K -= lr * K.grad
            V -= lr * V.grad
    return {"K": K.detach().numpy(), "V": V.detach().numpy()}


def timed(fn, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=300, help="training steps per repeat")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()

    cfg = TrainConfig()
    rng = np.random.default_rng(0)
    params = init_params(rng, cfg.n_heads, cfg.n_types, cfg.d_content, cfg.init_scale)
    t_sample, batches = timed(
        lambda: [sample_batch(rng, cfg.world, cfg.batch_size) for _ in range(args.steps)], 1
    )
    print(
        f"theory default config: H={cfg.n_heads} B={cfg.batch_size} N={cfg.n_tokens} "
        f"T={cfg.n_types} m={cfg.d_content}, float64, {args.steps} steps x {args.repeats} "
        f"repeats (median), python {platform.python_version()}"
    )
    print(f"batch sampling (NumPy, not in the step times): {args.steps / t_sample:9.0f} batches/s")

    t_np, p_np = timed(lambda: numpy_steps(params, batches, cfg.lr), args.repeats)
    np_rate = args.steps / t_np
    print(
        f"numpy  forward+backward+update:              {np_rate:9.0f} steps/s   "
        f"(numpy {np.__version__})"
    )
    per_step = (t_np + t_sample) / args.steps
    print(
        f"numpy  full default training ({cfg.steps} steps, incl. sampling, no log): "
        f"~{cfg.steps * per_step:.1f} s"
    )

    try:
        import torch
    except ImportError:
        print(
            "torch not importable: no comparison (run with an interpreter that has torch, "
            "e.g. .venv-ref)"
        )
        return
    tbatches = torch_setup(batches, cfg.n_types)
    default_threads = torch.get_num_threads()
    rates = {}
    for threads in sorted(
        {default_threads, 1}, reverse=True
    ):  # tiny tensors: 1 thread is often faster
        torch.set_num_threads(threads)
        t_t, p_t = timed(lambda: torch_steps(params, tbatches, cfg.lr), args.repeats)
        rates[threads] = args.steps / t_t
        diff = max(float(np.max(np.abs(p_np[k] - p_t[k]))) for k in params)
        print(
            f"torch  forward+backward(autograd)+update:    {rates[threads]:9.0f} steps/s   "
            f"(torch {torch.__version__}, {threads} thread{'s' if threads > 1 else ''}; "
            f"max |params numpy - torch| after {args.steps} steps {diff:.1e})"
        )
    torch.set_num_threads(default_threads)
    best = max(rates, key=rates.get)
    print(
        f"ratio numpy / torch steps per second: {np_rate / rates[best]:.2f} against torch's "
        f"faster setting ({best} thread{'s' if best > 1 else ''}); "
        f"{np_rate / rates[default_threads]:.2f} against its default  (goal >= 1)"
    )


if __name__ == "__main__":
    main()
