"""Benchmark: the matrix products of one intact forward alone, against the whole forward's time.

    PYTHONPATH=. python bench/bench_gemm_floor.py --threads 1      # then --threads 2

Not a test. For the two workloads of bench_forward.py (GPT-2-small shape and SmolLM2, 64 x 16
tokens, logits at every position) this times, with NumPy's BLAS at --threads, exactly the dense
products a forward must do -- per layer the fused Q/K/V projection, the output projection, the
MLP's input (fused gate and up for SmolLM2) and output projections, then the unembedding -- on
random float32 matrices of those shapes (medians of --repeats). The sum is what any NumPy forward
costs before a single elementwise pass, attention score or softmax: if it exceeds a reference's
whole forward, no NumPy forward on this BLAS can match that reference. When torch is importable
(the reference venv), the same products are timed with torch.matmul at the same thread count, in
the same invocation, so the two BLAS libraries are compared shape by shape.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from bench_forward import cpu_summary, median_time, pin_threads, torch

# (name, layers, d_model, qkv columns, mlp input columns, d_mlp, vocab)
SHAPES = {
    "gpt2": (12, 768, 3 * 768, 3072, 3072, 50257),
    "smollm2": (30, 576, 576 + 2 * 192, 2 * 1536, 1536, 49152),
}


def time_product(rows: int, inner: int, cols: int, repeats: int, rng, on_torch=False) -> float:
    """Median seconds of one (rows, inner) @ (inner, cols) float32 product (NumPy, or torch)."""
    a = rng.standard_normal((rows, inner), dtype=np.float32)
    b = rng.standard_normal((inner, cols), dtype=np.float32)
    if on_torch:
        a, b = torch.from_numpy(a), torch.from_numpy(b)
    a @ b  # warm
    return median_time(lambda: a @ b, repeats)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rows", type=int, default=64 * 16, help="tokens of the forward (64 x 16)")
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    print(f"machine: {cpu_summary()}")
    print(f"threads: {pin_threads(args.threads)}; torch {torch.__version__ if torch else '-'}")
    print("| model | product | shape | NumPy s (median) | torch s (median) | count |")
    print("|---|---|---|---|---|---|")
    for name, (layers, d, qkv, mlp_in, d_mlp, vocab) in SHAPES.items():
        n = args.rows
        parts = [
            ("qkv", (n, d, qkv), layers),
            ("out proj", (n, d, d), layers),
            ("mlp in", (n, d, mlp_in), layers),
            ("mlp out", (n, d_mlp, d), layers),
            ("unembed", (n, d, vocab), 1),
        ]
        total, total_torch = 0.0, 0.0
        for label, shape, count in parts:
            t = time_product(*shape, args.repeats, rng)
            tt = time_product(*shape, args.repeats, rng, True) if torch else float("nan")
            total, total_torch = total + t * count, total_torch + tt * count
            where = f"{shape[0]}x{shape[1]} @ {shape[1]}x{shape[2]}"
            print(f"| {name} | {label} | {where} | {t:.4f} | {tt:.4f} | x{count} |")
        print(
            f"| {name} | **all products of one forward** | | **{total:.3f}** | "
            f"**{total_torch:.3f}** | NumPy / torch {total / total_torch:.2f}x the time |"
        )


if __name__ == "__main__":
    main()
