"""Benchmark: intact forward and a full singleton head screen, cel-numpy vs transformers + torch.

    PYTHONPATH=. .venv-ref/bin/python bench/bench_forward.py       # with torch (the reference venv)
    PYTHONPATH=. .venv/bin/python bench/bench_forward.py           # ours only
    ... --models gpt2 --batch 64 --tokens 16 --repeats 5 --sweep-heads 12

Not a test: prints one table of medians and ratios from one invocation. Models:
  gpt2     GPT-2-small shape (GPT2Config defaults: 12 layers x 12 heads, d_model 768, vocab 50257)
           with random weights; built in transformers and saved with save_pretrained, then loaded
           by `cel_numpy.load_model`, so both sides run the same weights (without torch: random
           NumPy weights of the same shape).
  smollm2  SmolLM2-135M-Instruct from its GGUF (`cel_numpy.load_model("smollm2")`); the torch side
           is a LlamaForCausalLM given our (dequantized, float32) weights.
Rows:
  forward      tokens/s of one intact forward of B x T tokens, logits at every position: ours
               (fast: `cel_numpy.models.fast.forward`, what the screen runs; plain: the reference
               `transformer_forward`, what `Model.logits` runs) and torch, timed in turns.
  screen       every head zeroed alone; the score is the argmax of the next-token logits at the
               last position of every prompt, compared with a target (the intact argmax). Ours
               (shared prefixes, `cel_numpy.models.fast.ablated_readout`) vs our naive full
               recomputation (one `transformer_forward` per head) vs a transformers sweep that
               zeroes the head with a forward pre-hook on the output projection (plain: full
               logits; and with logits_to_keep=1, a stronger baseline). A naive or torch sweep
               costs the same full forward for every head, so by default it is timed on
               --sweep-heads heads spread over the layers and scaled to all heads (--sweep-heads 0:
               all heads); the per-head verdicts of all sweeps are checked equal on those heads.
  GFLOP/s      matmul FLOPs of our forward / its time, against the best float32 GEMM rate measured
               in this run (NumPy matmul on transformer-shaped and square matrices).
  memory       peak resident set of the process (ru_maxrss; includes torch when loaded) and the
               peak NumPy working memory of our screen above the weights (tracemalloc).
Threads: --threads N (default 2) pins both sides inside the process (NumPy's BLAS through
threadpoolctl, torch.set_num_threads), whatever the environment says; the table prints what was in
force.
Install the reference side with: pip install torch==2.13.0 transformers threadpoolctl
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
import tracemalloc

import numpy as np

import cel_numpy as cn
from cel_numpy.models.fast import ablated_readout, forward, prepare
from cel_numpy.models.transformer import transformer_forward

try:
    import torch
    import transformers
except ImportError:  # ours only
    torch = transformers = None


def pin_threads(n: int) -> str:
    """Pin this process to `n` threads: NumPy's BLAS (through threadpoolctl, at run time, so the
    environment cannot disagree) and torch. Returns what is in force, for the table."""
    if torch is not None:
        torch.set_num_threads(n)
    try:
        from threadpoolctl import threadpool_info, threadpool_limits
    except ImportError:
        return f"BLAS threads NOT pinned (pip install threadpoolctl); torch {n}"
    threadpool_limits(limits=n)  # stays in force for the process
    blas = ", ".join(f"{d['internal_api']} {d['num_threads']}" for d in threadpool_info())
    return f"{blas} threads; torch {torch.get_num_threads() if torch is not None else '-'}"


VECTOR_FLAGS = ("avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
                "avx512_bf16", "amx_tile")  # fmt: skip


def cpu_summary() -> str:
    """The CPU model and its vector extensions (from /proc/cpuinfo; what BLAS kernels use)."""
    name, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    name = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
                    break
    except OSError:
        pass
    found = [f for f in VECTOR_FLAGS if f in flags]
    return f"{name}; vector extensions: {' '.join(found) or 'unknown'}"


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def interleaved_medians(paths: dict, repeats: int) -> dict[str, float]:
    """Median seconds of each path, timed in turns (a, b, c, a, b, c, ...) after one untimed
    call each: on a shared machine a change of load then hits every path alike."""
    for fn in paths.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(repeats):
        for name, fn in paths.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def gemm_peak(repeats: int) -> tuple[float, str]:
    """Best float32 matmul rate (GFLOP/s) over a few shapes, median of `repeats` each."""
    rng = np.random.default_rng(0)
    best, where = 0.0, ""
    for M, K, N in [(1024, 768, 3072), (1024, 3072, 768), (2048, 2048, 2048)]:
        A = rng.standard_normal((M, K), dtype=np.float32)
        Bm = rng.standard_normal((K, N), dtype=np.float32)
        A @ Bm
        rate = 2 * M * K * N / median_time(lambda: A @ Bm, repeats) / 1e9  # noqa: B023 - called within this iteration
        if rate > best:
            best, where = rate, f"{M}x{K}x{N}"
    return best, where


def forward_flops(c, B: int, T: int) -> float:
    """Matmul FLOPs of one forward (logits at every position), as our code executes them."""
    H, G, E, D, F, V = c.n_heads, c.n_kv_heads, c.d_head, c.d_model, c.d_mlp, c.vocab_size
    n_mlp = 2 if c.family == "gpt2" else 3
    per_token_layer = (
        D * (H + 2 * G) * E + H * E * D + n_mlp * D * F + 2 * H * T * E
    )  # + scores and pattern @ v
    return 2.0 * B * T * (c.n_layers * per_token_layer + D * V)


# --------------------------------------------------------------------------- models


def build_gpt2(tmp: str):
    if transformers is None:
        from cel_numpy.models.config import ModelConfig
        from cel_numpy.models.model import Model

        c = ModelConfig(
            family="gpt2",
            n_layers=12,
            n_heads=12,
            n_kv_heads=12,
            d_model=768,
            d_head=64,
            d_mlp=3072,
            vocab_size=50257,
            n_ctx=1024,
            norm_eps=1e-5,
            attn_bias=True,
            mlp_bias=True,
            name="gpt2-random",
        )
        rng = np.random.default_rng(0)
        r = lambda *s: (0.02 * rng.standard_normal(s)).astype(np.float32)
        z = lambda *s: np.zeros(s, np.float32)
        one = lambda *s: np.ones(s, np.float32)
        W_E = r(50257, 768)
        blocks = [
            {
                "ln1": {"w": one(768), "b": z(768)},
                "ln2": {"w": one(768), "b": z(768)},
                "attn": {
                    "W_Q": r(12, 768, 64),
                    "W_K": r(12, 768, 64),
                    "W_V": r(12, 768, 64),
                    "W_O": r(12, 64, 768),
                    "b_Q": z(12, 64),
                    "b_K": z(12, 64),
                    "b_V": z(12, 64),
                    "b_O": z(768),
                },
                "mlp": {
                    "W_in": r(768, 3072),
                    "b_in": z(3072),
                    "W_out": r(3072, 768),
                    "b_out": z(768),
                },
            }
            for _ in range(12)
        ]
        params = {
            "embed": {"W_E": W_E},
            "pos_embed": {"W_pos": r(1024, 768)},
            "blocks": blocks,
            "ln_final": {"w": one(768), "b": z(768)},
            "unembed": {"W_U": W_E.T},
        }
        return Model(params, c, source="gpt2-random"), None
    torch.manual_seed(0)
    ref = transformers.GPT2LMHeadModel(transformers.GPT2Config()).eval()
    ref.save_pretrained(tmp)
    return cn.load_model(tmp), ref


def torch_llama_from(model):
    """A transformers LlamaForCausalLM (Qwen2ForCausalLM for a qwen2 model, with its Q/K/V biases)
    holding our weights (HF layout: q_proj (H E, D) ...)."""
    c, p = model.config, model.params
    # family is "llama" for qwen2 (one forward); getattr: ba605e3 (the README before/after run)
    # has no arch
    qwen = getattr(c, "arch", "") == "qwen2"
    Config = transformers.Qwen2Config if qwen else transformers.LlamaConfig
    cfg = Config(
        vocab_size=c.vocab_size,
        hidden_size=c.d_model,
        intermediate_size=c.d_mlp,
        num_hidden_layers=c.n_layers,
        num_attention_heads=c.n_heads,
        num_key_value_heads=c.n_kv_heads,
        head_dim=c.d_head,
        rms_norm_eps=c.norm_eps,
        max_position_embeddings=c.n_ctx,
        tie_word_embeddings=c.tied_embeddings,
        rope_theta=c.rope_base,
        rope_parameters={"rope_type": "default", "rope_theta": c.rope_base},
    )
    ref = (transformers.Qwen2ForCausalLM if qwen else transformers.LlamaForCausalLM)(cfg).eval()
    # a copy: weights mapped from the weight cache are read-only, which torch warns about
    t = lambda a: torch.from_numpy(np.array(a, dtype=np.float32))
    heads = lambda W: W.transpose(0, 2, 1).reshape(-1, W.shape[1])  # (n, D, E) -> (n E, D)
    sd = {
        "model.embed_tokens.weight": t(p["embed"]["W_E"]),
        "model.norm.weight": t(p["ln_final"]["w"]),
    }
    for l, b in enumerate(p["blocks"]):
        h = f"model.layers.{l}."
        sd[h + "input_layernorm.weight"] = t(b["ln1"]["w"])
        sd[h + "post_attention_layernorm.weight"] = t(b["ln2"]["w"])
        sd[h + "self_attn.q_proj.weight"] = t(heads(b["attn"]["W_Q"]))
        sd[h + "self_attn.k_proj.weight"] = t(heads(b["attn"]["W_K"]))
        sd[h + "self_attn.v_proj.weight"] = t(heads(b["attn"]["W_V"]))
        sd[h + "self_attn.o_proj.weight"] = t(b["attn"]["W_O"].reshape(-1, c.d_model).T)
        for x in "QKV" if qwen else "":
            sd[h + f"self_attn.{x.lower()}_proj.bias"] = t(b["attn"][f"b_{x}"].reshape(-1))
        sd[h + "mlp.gate_proj.weight"] = t(b["mlp"]["W_gate"].T)
        sd[h + "mlp.up_proj.weight"] = t(b["mlp"]["W_in"].T)
        sd[h + "mlp.down_proj.weight"] = t(b["mlp"]["W_out"].T)
    if not c.tied_embeddings:
        sd["lm_head.weight"] = t(p["unembed"]["W_U"].T)
    missing, unexpected = ref.load_state_dict(sd, strict=False)
    missing = [k for k in missing if k != "lm_head.weight"]
    assert not missing and not unexpected, (missing, unexpected)
    return ref


def out_proj(ref, layer: int):
    if hasattr(ref, "transformer"):
        return ref.transformer.h[layer].attn.c_proj
    return ref.model.layers[layer].self_attn.o_proj


# --------------------------------------------------------------------------- one model


def bench_model(name: str, args, rows: list) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        if name == "gpt2":
            model, ref = build_gpt2(tmp)
        else:
            model = cn.load_model("smollm2")
            ref = torch_llama_from(model) if torch is not None else None
    c = model.config
    B, T = args.batch, args.tokens
    rng = np.random.default_rng(1)
    ids = rng.integers(0, c.vocab_size, size=(B, T))
    mask = np.ones((B, T), np.int64)
    prep = prepare(model)
    L, H = c.n_layers, c.n_heads
    heads = [(l, h) for l in range(L) for h in range(H)]
    label = f"{name} ({L}x{H}, D {c.d_model}, V {c.vocab_size}), {B}x{T} tokens"
    print(f"\n== {label}", flush=True)
    t_start = time.perf_counter()

    # ---- exactness before timing
    ours = forward(prep, ids, mask)  # (B, T, V)
    plain, _ = transformer_forward(model.params, c, ids, mask, keep_activations=False)
    print(f"fast vs plain forward: max |dlogits| = {np.abs(ours - plain).max():.2e}")
    if ref is not None:
        with torch.inference_mode():
            theirs = ref(torch.from_numpy(ids)).logits.numpy()
        print(f"ours vs transformers:  max |dlogits| = {np.abs(ours - theirs).max():.2e}")

    # ---- forward
    peak, peak_shape = gemm_peak(args.repeats)
    paths = {
        "fast": lambda: forward(prep, ids, mask),
        "plain": lambda: transformer_forward(model.params, c, ids, mask, keep_activations=False),
    }
    if ref is not None:
        tid = torch.from_numpy(ids)
        paths["torch"] = lambda: ref(tid).logits
    with torch.inference_mode() if ref is not None else contextlib.nullcontext():
        medians = interleaved_medians(paths, args.repeats)
    t_fast, t_plain, t_torch = medians["fast"], medians["plain"], medians.get("torch")
    peak2, _ = gemm_peak(args.repeats)  # again after: the machine is shared, keep the better
    peak = max(peak, peak2)
    flops = forward_flops(c, B, T)
    rows.append(
        (name, "forward tokens/s: ours (fast)", f"{B * T / t_fast:,.0f}", f"{t_fast:.3f} s")
    )
    rows.append(
        (
            name,
            "forward tokens/s: ours (plain reference)",
            f"{B * T / t_plain:,.0f}",
            f"{t_plain:.3f} s",
        )
    )
    if t_torch:
        rows.append(
            (
                name,
                "forward tokens/s: transformers + torch",
                f"{B * T / t_torch:,.0f}",
                f"{t_torch:.3f} s",
            )
        )
        rows.append((name, "forward speed ours / torch", f"{t_torch / t_fast:.2f}x", "target >= 1"))
    rows.append(
        (name, "forward GFLOP/s ours", f"{flops / t_fast / 1e9:.1f}", f"{flops / 1e9:.1f} GFLOP")
    )
    rows.append((name, f"GEMM peak GFLOP/s ({peak_shape})", f"{peak:.1f}", "float32 NumPy matmul"))
    rows.append(
        (name, "forward / GEMM peak", f"{flops / t_fast / 1e9 / peak:.0%}", "target >= 60%")
    )

    print(f"forward timed ({time.perf_counter() - t_start:.0f} s so far)", flush=True)
    if args.forward_only:
        return

    # ---- screen
    target = ours[:, -1].argmax(-1)  # (B,)
    conds = [(hd,) for hd in heads]
    tracemalloc.start()
    t0 = time.perf_counter()
    best = lambda lg: lg[:, -1].argmax(-1)
    verdict = ablated_readout(prep, ids, mask, conds, readout=slice(-1, None), reduce=best)
    t_screen = time.perf_counter() - t0
    _, screen_mem = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    # (tracemalloc only hooks allocations: a screen is a few hundred large arrays, so no
    # measurable cost)
    print(f"fast screen {t_screen:.1f} s", flush=True)
    fast_ok = {hd: (v == target) for hd, v in zip(heads, verdict)}

    k = len(heads) if args.sweep_heads <= 0 else min(args.sweep_heads, len(heads))
    sample = [heads[i] for i in np.linspace(0, len(heads) - 1, k).round().astype(int)]
    scale = len(heads) / len(sample)

    def naive(hd):
        hm = np.ones((L, H), model.dtype)
        hm[hd] = 0
        lg, _ = transformer_forward(
            model.params,
            c,
            ids,
            mask,
            head_mask=hm,
            keep_activations=False,
            logit_positions=slice(-1, None),
        )
        return lg[:, -1].argmax(-1) == target

    t0 = time.perf_counter()
    naive_ok = {hd: naive(hd) for hd in sample}
    t_naive = (time.perf_counter() - t0) * scale
    agree = all(np.array_equal(naive_ok[hd], fast_ok[hd]) for hd in sample)
    rows.append(
        (name, f"screen {len(heads)} heads: ours (shared prefixes)", f"{t_screen:.2f} s", "")
    )
    rows.append(
        (
            name,
            "screen: ours naive (full recomputation)",
            f"{t_naive:.2f} s",
            f"{t_naive / t_screen:.2f}x slower"
            + ("" if k == len(heads) else f"; timed on {k} heads, scaled"),
        )
    )
    if ref is not None:
        tid = torch.from_numpy(ids)

        def torch_sweep(keep: int | None):
            verdicts = {}
            for l, h in sample:
                E = c.d_head

                def pre_hook(module, inputs, h=h):
                    x = inputs[0].clone()
                    x[..., h * E : (h + 1) * E] = 0  # noqa: B023 - called within this iteration
                    return (x,)

                handle = out_proj(ref, l).register_forward_pre_hook(pre_hook)
                try:
                    with torch.inference_mode():
                        kw = {} if keep is None else {"logits_to_keep": keep}
                        lg = ref(tid, **kw).logits[:, -1].numpy()
                finally:
                    handle.remove()
                verdicts[(l, h)] = lg.argmax(-1) == target
            return verdicts

        for keep, what in (
            (None, "torch hook sweep (full logits)"),
            (1, "torch hook sweep (logits_to_keep=1)"),
        ):
            t0 = time.perf_counter()
            torch_ok = torch_sweep(keep)
            t_t = (time.perf_counter() - t0) * scale
            agree = agree and all(np.array_equal(torch_ok[hd], fast_ok[hd]) for hd in sample)
            rows.append(
                (
                    name,
                    f"screen: {what}",
                    f"{t_t:.2f} s",
                    f"ours {t_t / t_screen:.2f}x faster (target >= 3)",
                )
            )
    rows.append(
        (name, "screen verdicts identical across sweeps", str(agree), f"on {len(sample)} heads")
    )
    rows.append(
        (name, "screen working memory (tracemalloc peak)", f"{screen_mem / 2**20:.0f} MiB", "")
    )
    rows.append(
        (
            name,
            "peak RSS so far (ru_maxrss)",
            f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB",
            "process, incl. torch" if torch is not None else "process",
        )
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--models", default="gpt2,smollm2")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--sweep-heads",
        type=int,
        default=12,
        help="heads timed in the naive/torch sweeps (0 = all)",
    )
    ap.add_argument("--threads", type=int, default=2, help="threads of each side (default 2)")
    ap.add_argument("--forward-only", action="store_true", help="the forward rows, no screen")
    args = ap.parse_args(argv)
    threads = pin_threads(args.threads)
    print(f"threads: {threads}", flush=True)
    if torch is None:
        print(
            "torch/transformers not importable: timing ours only. For the comparison run this "
            "with the reference venv, or: pip install torch==2.13.0 transformers",
            file=sys.stderr,
        )
    else:
        torch.set_grad_enabled(False)
    rows: list = []
    for name in args.models.split(","):
        n0 = len(rows)
        bench_model(name.strip(), args, rows)
        for r in rows[n0:]:
            print(" | ".join(r), flush=True)
    load = os.getloadavg()
    print(
        f"\nmachine: {cpu_summary()}, {os.cpu_count()} cores, "
        f"numpy {np.__version__}"
        + (
            f", torch {torch.__version__}, transformers {transformers.__version__}"
            if torch is not None
            else ""
        )
        + f"; threads: {threads}; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    w = max(len(r[1]) for r in rows)
    print(f"\n| model | {'measure':<{w}} | value | note |\n|---|---|---|---|")
    for m, what, val, note in rows:
        print(f"| {m} | {what:<{w}} | {val} | {note} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
