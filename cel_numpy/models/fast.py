"""Fast exact inference for screening: fused weights, in-place elementwise ops, shared work.

The plain forward (`cel_numpy.models.transformer`) is the reference; this module computes the
same function with less work, for the thousands of forwards a head screen needs. Every saving
is exact (results agree with the plain forward to float rounding; tests compare them):

  * weights laid out once per model (`prepare`): Q, K, V fused into one (D, (H + 2G) E) matrix
    (with the biases of whichever of them has one), W_O flat (H E, D), a gated MLP's gate and
    up fused into (D, 2F); float32 throughout, elementwise chains in place.
  * a prefix tree of token sequences (a list of `Segment`s): rows are grouped into segments,
    each row of a segment continuing one row of the segment before (a panel's common prefix ->
    each prompt -> each answer continuation of that prompt). Causal attention means a
    segment's keys and values do not depend on what follows, so each segment runs once and
    later segments attend to its K/V as a past (`Past`). A chat template shared by a panel runs
    once per condition, not once per item; a prompt with two continuations (the reference
    answer, the intact model's answer) runs once.
  * exact reuse across ablation conditions (`ablated_tree`): the residual stream entering layer
    j is keyed by the heads a condition ablates *below* j; only distinct keys are computed, so
    the intact prefix (layers below the lowest ablated head) comes from one intact pass
    (`intact_tree`), joint conditions that share their lowest heads share the layers in between,
    and conditions at one layer run as one stacked batch. The last layer runs its queries, W_O
    and MLP only at the positions read out, and earlier segments only their K/V there.
  * matrix products at real rows only (`_real_rows`): segments are left-padded, and the QKV,
    W_O, MLP and unembedding products skip the padding rows (their q, k, v and MLP output are
    0: masked keys, never-read queries, finite values).
  * freed memory kept for reuse (`keep_freed_memory`, turned on by `prepare`): fresh
    activation arrays are not page-faulted in again on every layer.
  * forced-answer greedy decoding (`generate_conditions`): one forward over prompt + draft answer
    gives, at every draft position, the argmax a greedy decoder would see; greedy decoding
    produces the draft's tokens as long as each argmax equals the next draft token, so those
    tokens (and the first token after them) are known without decoding. Only rows whose argmax
    leaves every draft, or that have not stopped at the draft's end, continue with real greedy
    decoding (KV cache, `_decode_step`) from that point. Outputs are those of plain greedy
    decoding; a draft changes only the cost.

Memory is bounded by waves: conditions run in waves of at most `max_rows` token rows (rows x
tokens of every segment), a segment's K/V is stored once per condition key (not per row that
continues it), the concatenated keys a later segment attends to exist for one layer at a time,
and the decode KV cache is allocated only for rows that still decode, in one wave at a time.

Shapes: R rows, T tokens of a segment, S key positions (earlier segments' then its own), D, H,
G, E, F, V, L as in the glossary of `cel_numpy.attention`; n stacked condition keys.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import numpy as np

from cel_numpy.attention import Rotary, rotary_forward, softmax_attention_forward
from cel_numpy.limits import available_memory
from cel_numpy.models.config import ModelConfig
from cel_numpy.models.transformer import embed, prepare_inputs
from cel_numpy.ops import finite_argmax

Head = tuple[int, int]
Condition = tuple[Head, ...]

# --------------------------------------------------------------------------- prepared weights


@dataclass(frozen=True)
class LayerWeights:
    ln1_w: np.ndarray  # (D,)
    ln1_b: np.ndarray | None  # (D,) gpt2
    W_qkv: np.ndarray  # (D, (H + 2G) E) columns: all q heads, then k groups, then v groups
    b_qkv: np.ndarray | None  # ((H + 2G) E,)
    W_O: np.ndarray  # (H E, D)
    b_O: np.ndarray | None  # (D,)
    ln2_w: np.ndarray  # (D,)
    ln2_b: np.ndarray | None  # (D,)
    W_up: np.ndarray  # (D, F) gpt2 W_in; (D, 2F) gated [W_gate | W_in]
    b_up: np.ndarray | None  # (F,) or (2F,)
    W_out: np.ndarray  # (F, D)
    b_out: np.ndarray | None  # (D,)
    q_norm_w: np.ndarray | None = None  # (E,) gemma3: RMSNorm of each head's q
    k_norm_w: np.ndarray | None = None  # (E,) gemma3: RMSNorm of each head's k
    ln1_post_w: np.ndarray | None = None  # (D,) gemma3: norm of the attention output
    ln2_post_w: np.ndarray | None = None  # (D,) gemma3: norm of the MLP output


@dataclass(frozen=True)
class Prepared:
    """A model's weights laid out for `fast` inference (built once by `prepare`)."""

    config: ModelConfig
    params: dict  # the model's own params (embedding, final norm, unembedding are used as they are)
    layers: list[LayerWeights]
    dtype: np.dtype
    padding_ids: np.ndarray  # (n,) vocabulary rows that are no token: never a greedy choice


def _cat_bias(parts: Sequence[np.ndarray | None], sizes: Sequence[int], dtype) -> np.ndarray | None:
    if all(p is None for p in parts):
        return None
    return np.concatenate(
        [np.zeros(n, dtype) if p is None else p.reshape(-1) for p, n in zip(parts, sizes)]
    ).astype(dtype, copy=False)


def _fused_layer(p: dict, config: ModelConfig, dtype) -> dict[str, np.ndarray]:
    """The matrices `prepare` builds by concatenation (the rest are the model's own arrays):
    W_qkv (D, (H + 2G) E), and a gated MLP's W_up (D, 2F) = [W_gate | W_in]."""
    a, m = p["attn"], p["mlp"]
    D = config.d_model
    flat = lambda W: W.transpose(1, 0, 2).reshape(D, -1)  # (H, D, E) -> (D, H E)
    fused = {
        "W_qkv": np.ascontiguousarray(
            np.concatenate([flat(a["W_Q"]), flat(a["W_K"]), flat(a["W_V"])], axis=1), dtype
        )
    }
    if "W_gate" in m:
        W_up = np.concatenate([m["W_gate"], m["W_in"]], axis=1)  # (D, 2F)
        fused["W_up"] = np.ascontiguousarray(W_up, dtype)
    return fused


def _fused_weights(model, dtype) -> list[dict[str, np.ndarray]]:
    """Every layer's `_fused_layer`, mapped from the weight cache when the model has one (one
    copy shared by every process, `weight_cache.shared_arrays`), else built here."""
    from cel_numpy.models.weight_cache import shared_arrays

    def build() -> dict[str, np.ndarray]:
        return {
            f"{j}.{name}": W
            for j, p in enumerate(model.params["blocks"])
            for name, W in _fused_layer(p, model.config, dtype).items()
        }

    arrays = shared_arrays(model, FUSED_LAYOUT, build)
    return [
        {name: arrays[f"{j}.{name}"] for name in ("W_qkv", "W_up") if f"{j}.{name}" in arrays}
        for j in range(len(model.params["blocks"]))
    ]


FUSED_LAYOUT = "fast1"  # names the arrays `_fused_layer` builds: change it when they change


def _prepare_layer(p: dict, config: ModelConfig, dtype, fused: dict) -> LayerWeights:
    a, m = p["attn"], p["mlp"]
    H, G, E, D = config.n_heads, config.n_kv_heads, config.d_head, config.d_model
    b_qkv = _cat_bias([a.get("b_Q"), a.get("b_K"), a.get("b_V")], [H * E, G * E, G * E], dtype)
    W_O = np.ascontiguousarray(a["W_O"].reshape(H * E, D), dtype)
    if "W_gate" in m:
        F = config.d_mlp
        W_up = fused["W_up"]
        b_up = _cat_bias([m.get("b_gate"), m.get("b_in")], [F, F], dtype)  # (2F,)
    else:
        W_up, b_up = np.ascontiguousarray(m["W_in"], dtype), m.get("b_in")
    gemma = {
        "q_norm_w": a.get("q_norm", {}).get("w"),
        "k_norm_w": a.get("k_norm", {}).get("w"),
        "ln1_post_w": p.get("ln1_post", {}).get("w"),
        "ln2_post_w": p.get("ln2_post", {}).get("w"),
    }
    return LayerWeights(
        ln1_w=p["ln1"]["w"],
        ln1_b=p["ln1"].get("b"),
        W_qkv=fused["W_qkv"],
        b_qkv=b_qkv,
        W_O=W_O,
        b_O=a.get("b_O"),
        ln2_w=p["ln2"]["w"],
        ln2_b=p["ln2"].get("b"),
        W_up=W_up,
        b_up=b_up,
        W_out=np.ascontiguousarray(m["W_out"], dtype),
        b_out=m.get("b_out"),
        **gemma,
    )


_PREPARED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

_MALLOC_KEEP_BYTES = 1 << 30  # arrays up to this size are recycled by malloc, not unmapped
_MALLOC_KEPT: bool | None = None  # None: not tried yet


def keep_freed_memory() -> bool:
    """Let glibc's malloc keep freed memory for reuse instead of returning it to the system.

    A forward allocates and frees arrays of several MiB per layer. By default glibc maps each
    one afresh and unmaps it when freed, so every new activation array is paid again in page
    faults when it is first written, about 1.4 ms per MiB on this project's VMs, which made a
    capitals screen measurably slower (`bench/bench_screen.py`, variant `keep_memory`). With
    the mmap threshold raised (and trimming off) freed blocks are reused: the process keeps its peak
    heap instead of shrinking between forwards. Process-wide; called by `prepare`, so any
    use of the fast engine turns it on. A no-op returning False where there is no glibc, or
    when the environment sets CEL_NUMPY_SYSTEM_MALLOC=1 (the system's default behaviour).
    """
    global _MALLOC_KEPT
    if _MALLOC_KEPT is None:
        _MALLOC_KEPT = False
        if os.environ.get("CEL_NUMPY_SYSTEM_MALLOC") == "1":
            return False
        try:
            import ctypes

            libc = ctypes.CDLL("libc.so.6")
            M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
            _MALLOC_KEPT = bool(
                libc.mallopt(M_MMAP_THRESHOLD, _MALLOC_KEEP_BYTES)
                and libc.mallopt(M_TRIM_THRESHOLD, 2 * _MALLOC_KEEP_BYTES)
            )
        except (OSError, AttributeError):  # not glibc (macOS, Windows, musl without mallopt)
            pass
    return _MALLOC_KEPT


def prepare(model) -> Prepared:
    """Prepared weights of a `Model`, built on first use and cached (weakly) per Model object.
    Also turns on `keep_freed_memory` for the process."""
    keep_freed_memory()
    prep = _PREPARED.get(model)
    if prep is None or prep.params is not model.params:
        dtype = model.params["embed"]["W_E"].dtype
        fused = _fused_weights(model, dtype)
        layers = [
            _prepare_layer(p, model.config, dtype, f) for p, f in zip(model.params["blocks"], fused)
        ]
        padding = np.asarray(getattr(model, "padding_ids", ()), np.int64)  # (n,)
        prep = Prepared(
            config=model.config,
            params=model.params,
            layers=layers,
            dtype=np.dtype(dtype),
            padding_ids=padding,
        )
        _PREPARED[model] = prep
    return prep


# --------------------------------------------------------------------- pieces (in place where safe)


def _norm(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, config: ModelConfig) -> np.ndarray:
    """LayerNorm (gpt2) or RMSNorm (others) over the last axis into a new array.
    (..., D) -> (..., D)."""
    eps = config.norm_eps  # a Python float: keeps float32 float32
    if config.family == "gpt2":
        y = x - x.mean(axis=-1, keepdims=True)  # (..., D)
        var = np.einsum("...d,...d->...", y, y)[..., None] / y.shape[-1]  # (..., 1)
    else:
        y = x.copy()
        var = np.einsum("...d,...d->...", x, x)[..., None] / x.shape[-1]  # (..., 1) mean square
    var += eps
    np.sqrt(var, out=var)
    y /= var
    y *= w
    if b is not None:
        y += b
    return y


def _gelu_(h: np.ndarray, tmp: np.ndarray) -> np.ndarray:
    """In place: h <- 0.5 h (1 + tanh(u)) = h / (1 + exp(-2u)), u = c (h + 0.044715 h^3).

    The same function as `ops.gelu_forward` (0.5 (1 + tanh u) = sigmoid(2u)), one exp instead
    of a tanh (the slowest op in the chain), every step into `tmp` or `h`. exp may overflow to
    inf for very negative h; h / inf = -0 is the right limit.
    """
    np.multiply(h, h, out=tmp)
    tmp *= h
    tmp *= 0.044715
    tmp += h
    tmp *= -2.0 * float(np.sqrt(2.0 / np.pi))
    with np.errstate(over="ignore"):
        np.exp(tmp, out=tmp)
    tmp += 1.0
    np.divide(h, tmp, out=h)
    return h


def _silu_(g: np.ndarray, tmp: np.ndarray) -> np.ndarray:
    """In place: g <- g sigmoid(g) = g / (1 + exp(-g))."""
    np.negative(g, out=tmp)
    with np.errstate(over="ignore"):
        np.exp(tmp, out=tmp)
    tmp += 1.0
    np.divide(g, tmp, out=g)
    return g


def _linear(x2: np.ndarray, W: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    """x2 (N, D_in) @ W (D_in, D_out) + b -> (N, D_out), bias added in place."""
    y = x2 @ W
    if b is not None:
        y += b
    return y


def _real_rows(valid: np.ndarray, n: int = 1) -> np.ndarray | None:
    """valid (R, T) tiled for n stacked conditions -> (n R T,) bool, the rows of a flattened
    (n R, T, D) array that hold real tokens; None when every row does (nothing to skip)."""
    if valid.all():
        return None
    return np.tile(valid, (n, 1)).ravel()


def _linear_rows(x2: np.ndarray, W: np.ndarray, b: np.ndarray | None, real) -> np.ndarray:
    """`_linear` at the real rows only (real (N,) bool or None: all); padding rows get 0."""
    if real is None:
        return _linear(x2, W, b)
    y = np.zeros((x2.shape[0], W.shape[1]), x2.dtype)
    y[real] = _linear(x2[real], W, b)
    return y


def _mlp_residual_(
    lw: LayerWeights, x: np.ndarray, config: ModelConfig, real: np.ndarray | None = None
) -> np.ndarray:
    """In place on x (..., D): x <- x + mlp(norm2(x)) at the real rows of x (N = the leading
    axes flattened; real (N,) bool or None: all); padding rows keep their x (never read)."""
    x2 = x.reshape(-1, x.shape[-1])  # (N, D)
    xn = _norm(x2 if real is None else x2[real], lw.ln2_w, lw.ln2_b, config)  # (N', D)
    h = _linear(xn, lw.W_up, lw.b_up)  # (N, F) or (N, 2F)
    if h.shape[1] == lw.W_out.shape[0]:  # gpt2: GELU
        post = _gelu_(h, np.empty_like(h))  # (N, F)
    else:  # gated: act(gate) * up, act silu (llama) or GELU-tanh (gemma3)
        F = lw.W_out.shape[0]
        gate, up = h[:, :F], h[:, F:]  # (N, F) views
        act = _gelu_ if config.mlp_act == "gelu_tanh" else _silu_
        post = act(gate, np.empty_like(gate))
        post *= up  # (N, F) strided view; BLAS reads it with its leading dimension
    out = post @ lw.W_out  # (N', D)
    if lw.b_out is not None:
        out += lw.b_out
    if lw.ln2_post_w is not None:  # sandwich norm (gemma3)
        out = _norm(out, lw.ln2_post_w, None, config)
    if real is None:
        x2 += out
    else:
        x2[real] += out
    return x


class Past:
    """Keys and values that come before a call's own positions: an earlier segment's K/V."""

    def __init__(self, k: np.ndarray, v: np.ndarray):
        self.k, self.v = k, v  # (R, G, S_past, E) each

    def extend(self, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(k, v) of this call (R, G, T, E) -> all keys and values (R, G, S_past + T, E)."""
        return np.concatenate([self.k, k], axis=2), np.concatenate([self.v, v], axis=2)


def _attention_step(
    lw: LayerWeights,
    x: np.ndarray,
    config: ModelConfig,
    mask: np.ndarray,
    rotary: Rotary | None,
    query: slice = slice(None),
    past=None,
    real: np.ndarray | None = None,
):
    """norm1, fused QKV, rotary, the shared softmax attention.

    x (R, T, D) -> z (R, H, Tq, E) and this call's own k, v (R, G, T, E). `query` selects the
    query positions (the last layer needs only the read-out ones); mask (R, 1, Tq, S) matches
    it. `past.extend(k, v)` gives the keys and values the queries see (an earlier segment's
    before them, `Past`; or a decode cache, `DecodeCache.layer`); None: only this call's own.
    real (R T,) bool: the rows holding real tokens (`_real_rows`); padding rows' q, k, v are 0
    (masked keys, queries never read), None: all rows are real.
    """
    R, T, D = x.shape
    H, G, E = config.n_heads, config.n_kv_heads, config.d_head
    xn = _norm(x.reshape(R * T, D), lw.ln1_w, lw.ln1_b, config)  # (R T, D)
    qkv = _linear_rows(xn, lw.W_qkv, lw.b_qkv, real).reshape(R, T, H + 2 * G, E)
    q = qkv[:, query, :H].transpose(0, 2, 1, 3)  # (R, H, Tq, E)
    k = qkv[:, :, H : H + G].transpose(0, 2, 1, 3)  # (R, G, T, E)
    v = qkv[:, :, H + G :].transpose(0, 2, 1, 3)  # (R, G, T, E)
    if lw.q_norm_w is not None:  # gemma3: RMSNorm of each head's q and k, before rotary
        q = _norm(q, lw.q_norm_w, None, config)  # (R, H, Tq, E)
        k = _norm(k, lw.k_norm_w, None, config)  # (R, G, T, E)
    if rotary is not None:
        q = rotary_forward(q, Rotary(cos=rotary.cos[:, :, query], sin=rotary.sin[:, :, query]))
        k = rotary_forward(k, rotary)
    keys, values = (k, v) if past is None else past.extend(k, v)  # (R, G, S, E)
    if q.shape[2] == 0:  # only this call's K/V are wanted (an earlier segment, last layer)
        return np.empty((R, H, 0, E), x.dtype), k, v
    z = _attention_in_blocks(q, keys, values, config.attn_scale, mask)
    return z, k, v  # z (R, H, Tq, E)


# Bytes of attention scores one call may hold at once (per block of query rows: the scores, the
# masked copy and the probabilities, each (R, H, rows, S)). Without a bound, one long prompt
# (an MBPP problem whose tests are 4,300 tokens long) took 4.3 GB at one row and 14 GB at four.
ATTENTION_BLOCK_BYTES = 256 << 20


def _attention_in_blocks(q, keys, values, scale: float, mask, max_bytes: int | None = None):
    """The shared softmax attention over blocks of query rows, so that the (R, H, rows, S)
    scores stay under `max_bytes` (default ATTENTION_BLOCK_BYTES). Each query row's softmax
    reads only its own scores, so the blocks compute the rows the unblocked call computes (up to
    the matrix products' rounding). q (R, H, Tq, E), keys/values (R, G, S, E), mask
    (R, 1, Tq, S) or broadcastable -> z (R, H, Tq, E)."""
    R, H, Tq, _ = q.shape
    S = keys.shape[2]
    budget = ATTENTION_BLOCK_BYTES if max_bytes is None else max_bytes
    rows = max(1, budget // max(1, 3 * R * H * S * q.itemsize))
    if rows >= Tq:
        return softmax_attention_forward(q, keys, values, scale=scale, mask=mask)[0]
    per_row_mask = mask is not None and mask.shape[2] == Tq
    z = np.empty((R, H, Tq, values.shape[-1]), q.dtype)
    for a in range(0, Tq, rows):
        m = mask[:, :, a : a + rows] if per_row_mask else mask
        z[:, :, a : a + rows], _ = softmax_attention_forward(
            q[:, :, a : a + rows], keys, values, scale=scale, mask=m
        )
    return z


def _ablate_(z: np.ndarray, keep: np.ndarray | None, fill: np.ndarray | None) -> np.ndarray:
    """In place: z_h <- keep_h z_h + (1 - keep_h) fill_h per row.
    z (R, H, T, E), keep (R, H), fill (H, E) or one per row (R, H, E)."""
    if keep is None:
        return z
    m = keep[:, :, None, None]  # (R, H, 1, 1)
    z *= m
    if fill is not None:
        z += (1.0 - m) * np.expand_dims(fill, -2)  # (H, 1, E) or (R, H, 1, E)
    return z


def _segment_fill(fill: np.ndarray | None, j: int, segments, s: int, n: int):
    """Layer j's fill for the n R_s stacked rows of segment s: (H, E) as it is, or, for a fill
    per root row (L, R_0, H, E), each row's root (segment 0 row) taken, tiled n times."""
    if fill is None or fill.ndim == 3:
        return None if fill is None else fill[j]
    root = segments[s].lineage[0] if s else np.arange(segments[0].ids.shape[0])  # (R_s,)
    return _tile(fill[j][root], n)  # (n R_s, H, E)


def check_row_fill(fill: np.ndarray | None, n_roots: int, share_prefix: bool) -> None:
    """A fill per row (L, B, H, E) needs one vector per prompt and no shared-prefix segment (its
    one row would serve every prompt)."""
    if fill is not None and fill.ndim == 4:
        if fill.shape[1] != n_roots:
            raise ValueError(f"a fill per row needs {n_roots} rows, got {fill.shape[1]}")
        if share_prefix:
            raise ValueError("a fill per row (resample ablation) needs share_prefix=False")


def _attn_out_residual(
    lw: LayerWeights,
    x: np.ndarray,
    z: np.ndarray,
    config: ModelConfig,
    real: np.ndarray | None = None,
) -> np.ndarray:
    """x (R, T, D) + z (R, H, T, E) W_O + b_O (normed by ln1_post for gemma3) -> new (R, T, D);
    at padding rows (not `real`) the attention output is 0."""
    R, H, T, E = z.shape
    out = _linear_rows(z.transpose(0, 2, 1, 3).reshape(R * T, H * E), lw.W_O, lw.b_O, real)
    if lw.ln1_post_w is not None:  # sandwich norm (gemma3); a zero padding row stays 0
        out = _norm(out, lw.ln1_post_w, None, config)
    out = out.reshape(R, T, -1)
    out += x
    return out


def _block_rest(
    lw: LayerWeights,
    x: np.ndarray,
    z: np.ndarray,
    keep: np.ndarray | None,
    fill: np.ndarray | None,
    config: ModelConfig,
    real: np.ndarray | None = None,
) -> np.ndarray:
    """After attention: ablate z, W_O, residual, MLP, the matrix products at the `real` rows
    (R Tq,) only (None: all). x (R, Tq, D), z (R, H, Tq, E) -> (R, Tq, D)."""
    _ablate_(z, keep, fill)
    return _mlp_residual_(lw, _attn_out_residual(lw, x, z, config, real), config, real)


def _unembed(prep: Prepared, x: np.ndarray, columns: np.ndarray | None) -> np.ndarray:
    """Final norm and logits.  x (..., D) -> (..., V) or (..., C)."""
    p = prep.params
    xn = _norm(x, p["ln_final"]["w"], p["ln_final"].get("b"), prep.config)
    W_U, b_U = p["unembed"]["W_U"], p["unembed"].get("b_U")
    if columns is not None:
        W_U = W_U[:, columns]  # (D, C)
        b_U = None if b_U is None else b_U[columns]
    out = xn.reshape(-1, xn.shape[-1]) @ W_U
    if b_U is not None:
        out += b_U
    return out.reshape(*x.shape[:-1], -1)


def _greedy(prep: Prepared, logits: np.ndarray) -> np.ndarray:
    """argmax over the vocabulary (..., V) -> (...), never a padding row of the embedding.

    The logits must be finite (`ops.finite_argmax`: NonFiniteError otherwise)."""
    best = finite_argmax(logits)
    if not prep.padding_ids.size:
        return best
    logits = logits.copy()
    logits[..., prep.padding_ids] = -np.inf
    return logits.argmax(-1)


def _embed(prep: Prepared, ids: np.ndarray, positions: np.ndarray) -> np.ndarray:
    return embed(prep.params, prep.config, ids, positions).astype(prep.dtype, copy=False)


# --------------------------------------------------------------------------- intact forward


def forward(
    prep: Prepared,
    ids: np.ndarray,
    attention_mask: np.ndarray | None = None,
    *,
    positions: slice = slice(None),
    columns: np.ndarray | None = None,
) -> np.ndarray:
    """Intact logits, the fast way.
    ids (B, T) -> logits (B, T', V) at `positions` (all by default)."""
    ids = np.asarray(ids)
    if attention_mask is None:
        attention_mask = np.ones(ids.shape, np.int64)
    config = prep.config
    inp = prepare_inputs(config, np.asarray(attention_mask), ids.shape[1], prep.dtype)
    x = _embed(prep, ids, inp.positions)  # (B, T, D)
    L = config.n_layers
    for j, lw in enumerate(prep.layers):
        query = positions if j == L - 1 else slice(None)
        mask, rotary = inp.for_layer(config, j)
        z, _, _ = _attention_step(lw, x, config, mask[:, :, query], rotary, query)
        x = _block_rest(lw, x[:, query], z, None, None, config)
    return _unembed(prep, x, columns)


# --------------------------------------------------------------------------- prefix trees


@dataclass(frozen=True)
class Segment:
    """One level of a prefix tree: rows of tokens, each continuing one row of the level above.

    Inputs of a tree-shaped forward, built by `tree`: positions count the real tokens of a row's
    lineage (earlier segments', then its own), and the mask lets a query see the real keys of
    its lineage and the causal ones of its own row.
    """

    ids: np.ndarray  # (R, T) left-padded
    valid: np.ndarray  # (R, T) bool: real tokens
    lineage: tuple[np.ndarray, ...]  # per earlier segment k: (R,) int, the ancestor row there
    positions: np.ndarray  # (R, T)
    mask: np.ndarray  # (R, 1, T, S) S = widths of the earlier segments + T
    rotary: Rotary | None  # (R, 1, T, E/2)
    local_mask: np.ndarray | None = None  # (R, 1, T, S) within the sliding window (gemma3)
    local_rotary: Rotary | None = None  # (R, 1, T, E/2) of the local rotary base (gemma3)

    def for_layer(self, config: ModelConfig, layer: int) -> tuple[np.ndarray, Rotary | None]:
        """(mask, rotary) of `layer`: the sliding-window ones for a local layer."""
        if config.is_local(layer):
            return self.local_mask, self.local_rotary
        return self.mask, self.rotary


def left_pad(rows: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Token-id lists -> ids (R, T) left-padded with id 0 (masked, never read),
    valid (R, T) bool."""
    T = max(1, max(len(r) for r in rows))
    ids = np.zeros((len(rows), T), np.int64)
    valid = np.zeros((len(rows), T), bool)
    for b, r in enumerate(rows):
        if len(r):
            ids[b, T - len(r) :] = r
            valid[b, T - len(r) :] = True
    return ids, valid


def tree(
    prep: Prepared, levels: Sequence[tuple[np.ndarray, np.ndarray, Sequence[int] | None]]
) -> list[Segment]:
    """Segments from levels [(ids (R, T), valid (R, T), parent row of each in the level above)].

    The first level's parents are None. A row may have no real token (it continues its parent
    unchanged; its padding queries' outputs are ignored).
    """
    config = prep.config
    segments: list[Segment] = []
    for ids, valid, parent in levels:
        valid = np.asarray(valid, bool)
        if segments:
            parent = np.asarray(parent, np.int64)
            lineage = tuple(a[parent] for a in segments[-1].lineage) + (parent,)
        else:
            lineage = ()
        past = [segments[k].valid[lineage[k]] for k in range(len(segments))]  # (R, T_k) each
        key_valid = np.concatenate(past + [valid], axis=1)  # (R, S)
        inp = prepare_inputs(config, key_valid, ids.shape[1], prep.dtype)
        segments.append(
            Segment(
                ids=np.asarray(ids),
                valid=valid,
                lineage=lineage,
                positions=inp.positions,
                mask=inp.mask,
                rotary=inp.rotary,
                local_mask=inp.local_mask,
                local_rotary=inp.local_rotary,
            )
        )
    return segments


def common_prefix(seqs: Sequence[Sequence[int]], keep: Sequence[int]) -> int:
    """Length of the longest common token prefix of `seqs` that leaves row b at least
    keep[b] tokens."""
    n = min(len(s) - k for s, k in zip(seqs, keep))
    first = seqs[0]
    for s in seqs[1:]:
        i = 0
        while i < n and s[i] == first[i]:
            i += 1
        n = i
    return max(n, 0)


def _tile(a, n: int):
    return a if n == 1 else np.concatenate([a] * n, axis=0)


def _tile_rotary(rot: Rotary | None, n: int, query=slice(None)) -> Rotary | None:
    if rot is None:
        return None
    return Rotary(cos=_tile(rot.cos[:, :, query], n), sin=_tile(rot.sin[:, :, query], n))


def _past(segments: list[Segment], s: int, kv: list[tuple[np.ndarray, np.ndarray]], n: int):
    """The K/V segment s attends to before its own: earlier segments' along each row's lineage.

    kv[k] = (k, v) of segment k for n stacked condition keys, (n R_k, G, T_k, E) each.
    Returns a `Past` (n R_s, G, S_past, E) or None for the first segment.
    """
    if s == 0:
        return None
    ks, vs = [], []
    for k in range(s):
        R_k = segments[k].ids.shape[0]
        rows = (np.arange(n)[:, None] * R_k + segments[s].lineage[k][None, :]).ravel()  # (n R_s,)
        ks.append(kv[k][0][rows])
        vs.append(kv[k][1][rows])
    return Past(np.concatenate(ks, axis=2), np.concatenate(vs, axis=2))


def _tree_attention(prep, j, segments, xs, n, readout):
    """Attention of layer j for every segment of n stacked condition keys.

    xs[s] (n R_s, T_s, D). At the last layer only the last segment's `readout` queries run
    (earlier segments give their K/V only). Returns z per segment (n R_s, H, Tq_s, E) and
    (k, v) per segment (n R_s, G, T_s, E).
    """
    config, lw = prep.config, prep.layers[j]
    last_layer = j == config.n_layers - 1
    zs, kv = [], []
    for s, (seg, x) in enumerate(zip(segments, xs)):
        query = slice(None)
        if last_layer:
            query = readout if s == len(segments) - 1 else slice(0, 0)
        mask, rotary = seg.for_layer(config, j)
        z, k, v = _attention_step(
            lw,
            x,
            config,
            _tile(mask[:, :, query], n),
            _tile_rotary(rotary, n),
            query,
            _past(segments, s, kv, n),
            _real_rows(seg.valid, n),
        )
        zs.append(z)
        kv.append((k, v))
    return zs, kv


def _layer_segments(segments, j, L, readout):
    """Which segments leave layer j with a residual stream, and at which positions."""
    if j < L - 1:
        return [(s, slice(None)) for s in range(len(segments))]
    return [(len(segments) - 1, readout)]


@dataclass
class IntactTree:
    """One intact pass over a tree, kept layer by layer: what every ablated condition
    starts from."""

    segments: list[Segment]
    resid_pre: list[list[np.ndarray]]  # [layer][segment] (R_s, T_s, D)
    z: list[list[np.ndarray]]  # [layer][segment] (R_s, H, Tq_s, E) what ablation replaces
    kv: list[list[tuple[np.ndarray, np.ndarray]]]  # [layer][segment] (k, v) (R_s, G, T_s, E)
    resid_final: np.ndarray  # (R_last, T', D) at the read-out positions of the last segment
    readout: slice

    @property
    def nbytes(self) -> int:
        """Bytes of the per-layer activations kept (residual streams, z, K/V)."""
        size = sum(a.nbytes for layer in self.resid_pre + self.z for a in layer)
        return size + sum(k.nbytes + v.nbytes for layer in self.kv for k, v in layer)


def _own_memory(a: np.ndarray) -> np.ndarray:
    """`a`, or a copy of it when it is a view of a larger array: K and V are slices of the
    fused QKV projection, and keeping the slices kept all of it (1.5x the counted bytes of a
    kept intact pass on SmolLM2, measured by `IntactTree.nbytes` against the bases' bytes)."""
    base = a
    while isinstance(base.base, np.ndarray):
        base = base.base
    return a if base.nbytes <= a.nbytes else a.copy()


def intact_tree(prep: Prepared, segments: list[Segment], readout: slice) -> IntactTree:
    L = prep.config.n_layers
    xs = [_embed(prep, seg.ids, seg.positions) for seg in segments]  # (R_s, T_s, D) each
    resid_pre, zs, kvs = [], [], []
    for j, lw in enumerate(prep.layers):
        resid_pre.append(xs)
        z, kv = _tree_attention(prep, j, segments, xs, 1, readout)
        zs.append([_own_memory(a) for a in z])
        kvs.append([(_own_memory(k), _own_memory(v)) for k, v in kv])
        xs = [
            _block_rest(
                lw, xs[s][:, q], z[s], None, None, prep.config, _real_rows(segments[s].valid[:, q])
            )
            for s, q in _layer_segments(segments, j, L, readout)
        ]
    return IntactTree(segments, resid_pre, zs, kvs, resid_final=xs[0], readout=readout)


# Token rows of one wave of stacked conditions (`generate_conditions`, `score_continuations`),
# rows of one unembedding GEMM of both, and the bytes of generation's decode cache (the K/V of
# the rows that decode on, in groups of rows within it): with the batch's intact pass, what
# bounds an evaluator's activations (`cel_numpy.localize.workers.activation_bytes` prices them).
WAVE_ROWS = 8192
UNEMBED_ROWS = 512
DECODE_CACHE_BYTES = 512 << 20


# What an IntactCache keeps by default (the evaluator's default; `localize` sizes a larger
# budget from free memory, `cel_numpy.localize.workers.intact_cache_budget`).
INTACT_CACHE_BYTES = 1 << 30


# Memory the machine must still have available for an intact pass to be kept (IntactCache): a
# last guard for runs that share the machine. Within one run the budgets leave room for the
# workers' activations (`workers.intact_cache_budget` counts `workers.activation_bytes`, 2.1-3.4
# GB per worker on the known models for a choice task, 3.1-4.3 GB for a generate task, besides
# the kept passes).
INTACT_CACHE_FLOOR = 2 * 2**30


class IntactCache:
    """Intact passes kept across calls, keyed by the tree's tokens; at most `max_bytes` of them.

    A screen asks for a panel's conditions a few at a time, and each call walks the same batches
    in the same order; without this every call would redo their intact passes. When the panel's
    passes do not all fit, plain least-recently-used eviction keeps none of them (each batch
    evicts the one the next call needs first), so eviction is scan-resistant instead: a caller
    marks each call (`begin_call`); passes not used in the current call go first (least recently
    used first), and once only the current call's passes are kept, a new one is not stored. A
    panel too large for the budget then keeps its first batches, and each call reuses them; a
    new panel (a later stage) replaces the old one as it is walked.

    The budget is sized once, from the memory free when a run starts; another process started
    later (a second run, a test beside a search) sizes its own from the same free memory. So a
    new pass is also kept only while the machine still has `floor` bytes available
    (MemAvailable, read after the pass is computed); below it the pass serves its batch and is
    dropped, as when the budget is full. Kept passes stay: the cache stops growing, it does not
    shrink.
    """

    def __init__(self, max_bytes: int = INTACT_CACHE_BYTES, floor: int = INTACT_CACHE_FLOOR):
        self.max_bytes = int(max_bytes)
        self.floor = int(floor)
        self.call = 0
        # key -> (intact pass, its bytes, the call that last used it); least recently used first
        self._trees: dict[bytes, tuple[IntactTree, int, int]] = {}

    @property
    def nbytes(self) -> int:
        """Bytes of activations kept now."""
        return sum(entry[1] for entry in self._trees.values())

    def begin_call(self) -> None:
        """A new call starts: what it has not used yet may be evicted for what it needs."""
        self.call += 1

    @staticmethod
    def key(segments: list[Segment], readout: slice) -> bytes:
        parts = [repr(readout).encode()]
        for seg in segments:
            parts += [seg.ids.tobytes(), seg.valid.tobytes(), str(seg.ids.shape).encode()]
            parts += [a.tobytes() for a in seg.lineage]
        return b"|".join(parts)

    def get(self, prep: Prepared, segments: list[Segment], readout: slice) -> IntactTree:
        key = self.key(segments, readout)
        if key in self._trees:
            intact, size, _ = self._trees.pop(key)
            self._trees[key] = (intact, size, self.call)  # most recently used last
            return intact
        intact = intact_tree(prep, segments, readout)
        size = intact.nbytes
        stale = [k for k, entry in self._trees.items() if entry[2] != self.call]
        while stale and self.nbytes + size > self.max_bytes:
            del self._trees[stale.pop(0)]
        if self.nbytes + size <= self.max_bytes and self._memory_left():
            self._trees[key] = (intact, size, self.call)
        return intact

    def _memory_left(self) -> bool:
        available = available_memory()
        return available is None or available >= self.floor


def _intact(prep, segments, readout, cache: IntactCache | None) -> IntactTree:
    return (
        intact_tree(prep, segments, readout)
        if cache is None
        else cache.get(prep, segments, readout)
    )


def _keep_rows(keys: Sequence[Condition], layer: int, H: int, dtype) -> np.ndarray | None:
    """(n_keys, H) 0/1: which heads of `layer` each key ablates; None if none does."""
    keep = np.ones((len(keys), H), dtype)
    for i, key in enumerate(keys):
        for l, h in key:
            if l == layer:
                keep[i, h] = 0.0
    return None if keep.all() else keep


def _below(cond: Condition, j: int) -> Condition:
    """The heads of `cond` in layers below j: what the residual stream entering layer j
    depends on."""
    return tuple(hd for hd in cond if hd[0] < j)


def ablated_tree(
    prep: Prepared,
    intact: IntactTree,
    conds: Sequence[Condition],
    fill: np.ndarray | None,
    *,
    keep_kv: bool = False,
):
    """Final residual at the read-out positions for every condition, sharing every common prefix.

    Returns (final {cond: (R_last, T', D)}, kv {cond: [layer][segment] (k, v)} if keep_kv). The
    state entering layer j is keyed by the condition's heads below j; the intact key () is
    never recomputed. fill (L, H, E) for mean ablation, (L, R_0, H, E) for a fill per root row
    (resample ablation; the tree has no shared-prefix segment then), None for zero ablation.
    """
    config = prep.config
    L, H = config.n_layers, config.n_heads
    segments = intact.segments
    conds = [tuple(sorted(c)) for c in conds]
    states: dict[Condition, list[np.ndarray]] = {}  # key (heads < j) -> per segment, entering j
    kv: dict[Condition, list] = {c: [] for c in conds} if keep_kv else {}
    for j, lw in enumerate(prep.layers):
        parents = sorted({_below(c, j) for c in conds})  # keys entering layer j
        children = sorted({_below(c, j + 1) for c in conds} - {()})  # keys leaving j, non-intact
        # attention of every non-intact parent, stacked; the intact parent's is the intact pass's
        z_of = {(): intact.z[j]}
        kv_of = {(): intact.kv[j]}
        computed = [p for p in parents if p]
        if computed:
            n = len(computed)
            xs = [np.concatenate([states[p][s] for p in computed]) for s in range(len(segments))]
            zs, kvs = _tree_attention(prep, j, segments, xs, n, intact.readout)
            for i, p in enumerate(computed):
                rows = [slice(i * len(z) // n, (i + 1) * len(z) // n) for z in zs]
                z_of[p] = [z[r] for z, r in zip(zs, rows)]
                kv_of[p] = [(k[r], v[r]) for (k, v), r in zip(kvs, rows)]
        if keep_kv:  # kept in memory of their own: a slice of the fused QKV would keep all of it
            kept = {p: [(_own_memory(k), _own_memory(v)) for k, v in kv_of[p]] for p in computed}
            kept[()] = kv_of[()]
            for c in conds:
                kv[c].append(kept[_below(c, j)])
        new_states: dict[Condition, list[np.ndarray]] = {c: [] for c in children}
        if children:
            n = len(children)
            par = [_below(c, j) for c in children]
            keep = _keep_rows(children, j, H, prep.dtype)  # (n, H)
            for s, q in _layer_segments(segments, j, L, intact.readout):
                R = segments[s].ids.shape[0]
                z_in = np.concatenate([z_of[p][s] for p in par])  # (n R, H, Tq, E) a copy
                # (n R, Tq, D)
                x_in = np.concatenate(
                    [states[p][s][:, q] if p else intact.resid_pre[j][s][:, q] for p in par]
                )
                rows_keep = None if keep is None else np.repeat(keep, R, axis=0)  # (n R, H)
                x_out = _block_rest(
                    lw,
                    x_in,
                    z_in,
                    rows_keep,
                    _segment_fill(fill, j, segments, s, n),
                    config,
                    _real_rows(segments[s].valid[:, q], n),
                )
                for i, c in enumerate(children):
                    new_states[c].append(x_out[i * R : (i + 1) * R])
        states = new_states
    final = {c: (states[c][-1] if c else intact.resid_final) for c in conds}
    return final, kv


def _waves(conds: Sequence[Condition], per_wave: int) -> list[list[Condition]]:
    """Distinct conditions, sorted (shared lowest heads are neighbours), in waves."""
    order = sorted(set(conds))
    return [order[i : i + per_wave] for i in range(0, len(order), per_wave)]


def _tokens(segments: list[Segment]) -> int:
    return sum(seg.ids.size for seg in segments)


def ablated_readout(
    prep: Prepared,
    ids: np.ndarray,
    attention_mask: np.ndarray,
    conds: Sequence[Condition],
    fill: np.ndarray | None = None,
    *,
    readout: slice = slice(-1, None),
    columns: np.ndarray | None = None,
    max_rows: int = 4096,
    reduce: Callable[[np.ndarray], object] | None = None,
    share_prefix: bool = True,
    cache: IntactCache | None = None,
) -> list:
    """Logits (B, T', V or C) at the `readout` positions for each condition (in the given order).

    ids (B, T) left-padded. With share_prefix the batch's longest common token prefix (that
    leaves every row its read-out positions) runs once per condition as its own segment.
    Conditions run in sorted waves of at most `max_rows` token rows; `reduce` (e.g. an argmax)
    is applied to each condition's logits as its wave finishes, so full-vocabulary logits of
    hundreds of conditions are never held at once. `cache` keeps the intact pass across calls.
    """
    ids, valid = np.asarray(ids), np.asarray(attention_mask).astype(bool)
    B, T = ids.shape
    read = range(T)[readout]
    n_read = len(read)
    if n_read == 0 or read.step != 1 or read[-1] != T - 1:
        raise ValueError(f"readout must be the last positions (slice(-n, None)), got {readout}")
    rows = [list(ids[b][valid[b]]) for b in range(B)]
    share_prefix = share_prefix and (fill is None or fill.ndim == 3)
    check_row_fill(fill, B, share_prefix)
    P = common_prefix(rows, [n_read] * B) if share_prefix and B > 1 else 0
    if P:  # rows are left-padded: each keeps its last n_read real tokens in the suffix
        segments = tree(
            prep, [(*left_pad([rows[0][:P]]), None), (*left_pad([r[P:] for r in rows]), [0] * B)]
        )
    else:
        segments = tree(prep, [(ids, valid, None)])
    last = segments[-1].ids.shape[1]
    read = slice(last - n_read, None)
    intact = _intact(prep, segments, read, cache)
    per_wave = max(1, max_rows // max(1, _tokens(segments)))
    logits: dict[Condition, object] = {}
    for wave in _waves([tuple(sorted(c)) for c in conds], per_wave):
        final, _ = ablated_tree(prep, intact, wave, fill)
        stacked = _unembed(prep, np.concatenate([final[c] for c in wave]), columns)  # (n B, T', C)
        for i, c in enumerate(wave):
            lg = stacked[i * B : (i + 1) * B]
            logits[c] = lg if reduce is None else reduce(lg)
    return [logits[tuple(sorted(c))] for c in conds]


# --------------------------------------------------------------------------- greedy generation


@dataclass(frozen=True)
class Stop:
    """When a greedy row ends: a stop token (excluded), `is_done(ids so far)`, or the cap."""

    ids: Collection[int]
    max_new_tokens: int
    is_done: Callable[[list[int]], bool] | None = None

    def ended_by_last(self, new: list[int]) -> bool:
        """True when the tokens kept so far end the row by their last one: the cap or
        `is_done` (a stop token is never kept)."""
        return len(new) >= self.max_new_tokens or (self.is_done is not None and self.is_done(new))


def _accept(new: list[int], token: int, stop: Stop) -> bool:
    """Append a generated token to a row; True when the row is finished."""
    if token in stop.ids:
        return True
    new.append(token)
    return stop.ended_by_last(new)


@dataclass(frozen=True)
class Resume:
    """A row that must decode on: where its known greedy tokens end."""

    cond: int  # index into the wave
    prompt: int  # index of the prompt
    row: int  # the continuation row (last segment) whose first `matched` draft tokens it keeps
    matched: int  # draft tokens that are greedy tokens (their K/V are valid)
    token: int  # the next greedy token (fed first)


class DecodeCache:
    """KV cache of rows that decode on: every segment's K/V along the row's lineage, then slots
    for new tokens. `layer(j)` is what `_attention_step` extends for layer j."""

    def __init__(self, k: list[np.ndarray], v: list[np.ndarray], valid: np.ndarray, first: int):
        self.k, self.v = k, v  # L x (r, G, S_max, E)
        self.valid = valid  # (r, S_max) bool
        self.slot = first  # the slot the next token's K/V go to

    def layer(self, j: int) -> _CacheLayer:
        return _CacheLayer(self, j)

    def keep(self, live: np.ndarray) -> None:
        """Drop finished rows from every buffer, one layer at a time (the old and the new
        buffers of one layer alive at once, not of all)."""
        for j in range(len(self.k)):
            self.k[j] = self.k[j][live]
            self.v[j] = self.v[j][live]
        self.valid = self.valid[live]


@dataclass(frozen=True)
class _CacheLayer:
    cache: DecodeCache
    j: int

    def extend(self, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Write this step's k, v (r, G, 1, E) to the slot; all keys so far (r, G, slot + 1, E)."""
        c, s = self.cache, self.cache.slot
        c.k[self.j][:, :, s : s + 1] = k
        c.v[self.j][:, :, s : s + 1] = v
        return c.k[self.j][:, :, : s + 1], c.v[self.j][:, :, : s + 1]


def _decode_step(
    prep: Prepared,
    cache: DecodeCache,
    tokens: np.ndarray,
    keep: np.ndarray,
    fill: np.ndarray | None,
) -> np.ndarray:
    """Feed one token per row at the cache's slot; the next greedy token of each row.

    tokens (r,), keep (r, L, H) 0 at ablated heads, fill (L, H, E) or per row (L, r, H, E)
    -> (r,) argmax of the next-token logits.
    """
    config, s = prep.config, cache.slot
    cache.valid[:, s] = True
    # positions, mask (r,1,1,S)
    inp = prepare_inputs(config, cache.valid[:, : s + 1], 1, prep.dtype)
    x = _embed(prep, tokens[:, None], inp.positions)  # (r, 1, D)
    for j, lw in enumerate(prep.layers):
        mask, rotary = inp.for_layer(config, j)
        z, _, _ = _attention_step(lw, x, config, mask, rotary, past=cache.layer(j))
        keep_j = None if keep[:, j].all() else keep[:, j]
        x = _block_rest(lw, x, z, keep_j, None if fill is None else fill[j], config)  # (r, 1, D)
    cache.slot += 1
    return _greedy(prep, _unembed(prep, x[:, -1], None))  # (r,)


def _decode_cache(prep, segments, kv, resumes, draft_len, max_new) -> DecodeCache:
    """The KV cache of the rows in `resumes` (one wave): lineage K/V, draft K/V up to `matched`."""
    config = prep.config
    G, E = config.n_kv_heads, config.d_head
    widths = [seg.ids.shape[1] for seg in segments]
    S0 = _lineage_width(segments)
    r = len(resumes)
    k = [np.zeros((r, G, S0 + max_new, E), prep.dtype) for _ in range(config.n_layers)]
    v = [np.zeros((r, G, S0 + max_new, E), prep.dtype) for _ in range(config.n_layers)]
    valid = np.zeros((r, S0 + max_new), bool)
    last = len(segments) - 1
    for i, rs in enumerate(resumes):
        rows = [segments[last].lineage[s][rs.row] for s in range(last)] + [rs.row]
        start = 0
        for s, (width, row) in enumerate(zip(widths, rows)):
            valid[i, start : start + width] = segments[s].valid[row]
            for j in range(config.n_layers):
                ks, vs = kv[rs.cond][j][s]
                k[j][i, :, start : start + width] = ks[row]
                v[j][i, :, start : start + width] = vs[row]
            start += width
        valid[i, S0 - draft_len[rs.row] + rs.matched : S0] = False  # draft tokens past the match
    return DecodeCache(k, v, valid, S0)


def generate_conditions(
    prep: Prepared,
    prompts: Sequence[Sequence[int]],
    conds: Sequence[Condition],
    fill: np.ndarray | None,
    stop: Stop,
    *,
    drafts: Sequence[Sequence[Sequence[int]]] | None = None,
    score: Callable[[int, np.ndarray], object] | None = None,
    share_prefix: bool = True,
    verify: bool = True,
    max_rows: int = WAVE_ROWS,
    unembed_rows: int = UNEMBED_ROWS,
    decode_bytes: int = DECODE_CACHE_BYTES,
    cache: IntactCache | None = None,
) -> tuple[list[list[list[int]]], list]:
    """Greedy continuations of every prompt under every condition, and a score of the drafts.

    Returns (out, scores): out[k][b] = new ids of prompt b under conds[k] (stop token excluded),
    the same tokens as `Model.generate_ids` cut by `stop`; scores[k][c] = score(c, logits of
    draft row c under conds[k]) (scores[k] is None without `score`).

    drafts[b]: guesses of prompt b's continuation (e.g. the reference answer, the intact model's
    answer); they change only the cost. The tree is: the prompts' common prefix (share_prefix),
    each prompt but its last token, and per draft [last prompt token] + draft. `score` gets a
    draft row c (the drafts in order: prompt 0's, then prompt 1's, ...) and its logits
    (A_c + 1, V): at row c's last prompt token and its A_c draft tokens, the last predicting the
    token after its draft. The unembedding runs only at those positions, never at a shorter
    draft's padding.
    verify=False takes only the first greedy token from the forward and decodes the rest (the
    plain prompt pass + KV-cache decoding, for measuring what the drafts save). `cache` keeps
    the intact pass across calls on the same prompts and drafts. The draft rows are unembedded
    as `score_continuations` does it, in GEMMs of at most `unembed_rows` rows across rows and
    conditions (a longer draft alone), each row scored and reduced to its argmax as soon as its
    logits exist: against the (D, V) unembedding a GEMM of a few dozen rows runs well below the
    rate of one of a few hundred (`bench/bench_screen.py` prints the rates), and the logits
    alive at once stay within 2 x max(`unembed_rows`, longest draft + 1) x V. The rows that
    leave their drafts decode in groups whose KV caches fit `decode_bytes` (one row at least).
    """
    B = len(prompts)
    drafts = [list(d) if d else [[]] for d in (drafts or [[[]]] * B)]
    parent = [b for b in range(B) for _ in drafts[b]]
    cont = [[prompts[b][-1], *d] for b in range(B) for d in drafts[b]]  # (C rows)
    draft_len = [len(c) - 1 for c in cont]
    share_prefix = share_prefix and (fill is None or fill.ndim == 3)
    check_row_fill(fill, B, share_prefix)
    segments = continuation_tree(
        prep, prompts, [d for b in range(B) for d in drafts[b]], parent, share_prefix
    )
    n_read = segments[-1].ids.shape[1]
    intact = _intact(prep, segments, slice(None), cache)
    conds = [tuple(sorted(c)) for c in conds]
    per_wave = max(1, max_rows // max(1, _tokens(segments)))
    results: dict[Condition, list[list[int]]] = {}
    real = segments[-1].valid  # (C, n) each draft row's real positions: its last A + 1
    scored: dict[Condition, list] = {c: [None] * len(real) for c in conds}
    for wave in _waves(conds, per_wave):
        final, kv = ablated_tree(prep, intact, wave, fill, keep_kv=True)
        resumes = []
        greedy = {c: np.zeros(real.shape, np.int64) for c in wave}  # (C, n) right-aligned
        for c, k, logits in _unembed_continuations(prep, wave, final, real, unembed_rows):
            scored[c][k] = None if score is None else score(k, logits)
            greedy[c][k, real[k]] = _greedy(prep, logits)  # padding positions never read
        for i, c in enumerate(wave):
            results[c], g = [], greedy[c]
            for b in range(B):
                new, resume = _verify(b, i, parent, cont, draft_len, g, n_read, stop, verify)
                results[c].append(new)
                if resume is not None:
                    resumes.append(resume)
        kv_wave = [kv[c] for c in wave]
        for group in _decode_groups(prep, segments, resumes, stop.max_new_tokens, decode_bytes):
            _decode(prep, segments, kv_wave, wave, group, results, draft_len, fill, stop)
    return [results[c] for c in conds], [scored[c] if score is not None else None for c in conds]


def continuation_tree(
    prep: Prepared,
    contexts: Sequence[Sequence[int]],
    continuations: Sequence[Sequence[int]],
    parent: Sequence[int],
    share_prefix: bool = True,
) -> list[Segment]:
    """The prefix tree of contexts and their continuations (continuation c follows context
    parent[c]): [the contexts' common prefix] -> each context without its last token -> per
    continuation, [its context's last token] + its tokens. The last segment's real positions
    are exactly the ones whose logits score a continuation (the last token of a continuation
    predicts what follows it)."""
    B = len(contexts)
    cont = [[contexts[b][-1], *d] for b, d in zip(parent, continuations)]  # (C rows)
    heads = [list(p[:-1]) for p in contexts]
    P = common_prefix(heads, [0] * B) if share_prefix and B > 1 else 0
    levels = [(*left_pad([h[P:] for h in heads]), None), (*left_pad(cont), list(parent))]
    if P:
        levels = [(*left_pad([heads[0][:P]]), None), (*levels[0][:2], [0] * B), levels[1]]
    return tree(prep, levels)


def score_continuations(
    prep: Prepared,
    contexts: Sequence[Sequence[int]],
    continuations: Sequence[Sequence[int]],
    parent: Sequence[int],
    conds: Sequence[Condition],
    fill: np.ndarray | None,
    score: Callable[[int, np.ndarray], object],
    *,
    share_prefix: bool = True,
    max_rows: int = WAVE_ROWS,
    unembed_rows: int = UNEMBED_ROWS,
    cache: IntactCache | None = None,
) -> list[list]:
    """Teacher-forced continuations of shared contexts under every condition: out[i][k] =
    score(k, logits of continuation k under conds[i]).

    contexts[b] (non-empty) are token ids; continuation c (non-empty) follows context
    parent[c]. Each context runs once per condition, however many continuations follow it
    (`continuation_tree`: a HellaSwag context and its four endings), and the unembedding runs
    only at the continuation rows' positions. `score` gets k and continuation k's logits
    (A_k + 1, V), right-aligned like `localize.scoring`: rows 0..A_k - 1 predict the
    continuation's tokens (row 0 is at the context's last token), row A_k what follows it.

    The unembedding runs in GEMMs of at most `unembed_rows` rows (a longer continuation alone),
    across continuations and conditions, and each continuation is scored as soon as its logits
    exist: the (rows, V) logits alive at once stay within 2 x `unembed_rows` x V (the group
    being scored and, while it is computed, the next) whatever the batch (a batch of 16
    HellaSwag items is about 1,600 rows; at Gemma 3's 262,144-token vocabulary one condition's
    logits at once were 1.7 GB).
    """
    segments = continuation_tree(prep, contexts, continuations, parent, share_prefix)
    intact = _intact(prep, segments, slice(None), cache)
    conds = [tuple(sorted(c)) for c in conds]
    per_wave = max(1, max_rows // max(1, _tokens(segments)))
    real = segments[-1].valid  # (C, n)
    scored: dict[Condition, list] = {c: [None] * len(real) for c in conds}
    for wave in _waves(conds, per_wave):
        final, _ = ablated_tree(prep, intact, wave, fill)
        for cond, k, logits in _unembed_continuations(prep, wave, final, real, unembed_rows):
            scored[cond][k] = score(k, logits)
    return [scored[c] for c in conds]


def row_groups(sizes: Sequence[int], max_rows: int) -> list[range]:
    """Consecutive runs of `sizes` whose sum stays within `max_rows`; a size larger than that
    alone."""
    groups, start, total = [], 0, 0
    for i, n in enumerate(sizes):
        if i > start and total + n > max_rows:
            groups.append(range(start, i))
            start, total = i, 0
        total += n
    if len(sizes) > start:
        groups.append(range(start, len(sizes)))
    return groups


def _unembed_continuations(prep, wave, final, real, unembed_rows: int):
    """(condition, continuation k, logits (A_k + 1, V)) for every condition of the wave and
    every continuation row k of the last segment (`real` (C, n) marks its real positions), from
    unembedding GEMMs of at most `unembed_rows` rows each (`row_groups`)."""
    pairs = [(c, k) for c in wave for k in range(len(real))]
    sizes = [int(real[k].sum()) for _, k in pairs]
    for group in row_groups(sizes, unembed_rows):
        rows = [final[pairs[i][0]][pairs[i][1]][real[pairs[i][1]]] for i in group]  # (A_k + 1, D)
        logits = _unembed(prep, np.concatenate(rows), None)  # (sum of the group's rows, V)
        ends = np.cumsum([sizes[i] for i in group])[:-1]
        for i, lg in zip(group, np.split(logits, ends)):
            yield (*pairs[i], lg)


def _verify(b, cond, parent, cont, draft_len, greedy, n_read, stop, verify=True):
    """Greedy tokens of prompt b known from the draft forward; a `Resume` if it must decode on.

    greedy (C, n): argmax at every draft position (right-aligned). The draft whose tokens match
    the argmax longest is followed: its matched tokens, then the argmax after them, are exactly
    what greedy decoding produces.
    """
    best, matched = None, -1
    for c in (c for c in range(len(parent)) if parent[c] == b):
        A = draft_len[c]
        g = greedy[c, n_read - 1 - A :]  # (A + 1,) g[i] predicts draft token i (g[A]: after it)
        m = 0
        while verify and m < A and g[m] == cont[c][1 + m]:
            m += 1
        if m > matched:
            best, matched = c, m
    A = draft_len[best]
    g = greedy[best, n_read - 1 - A :]
    new: list[int] = []
    for m in range(matched + 1):
        if _accept(new, int(g[m]), stop):
            return new, None
    return new, Resume(cond=cond, prompt=b, row=best, matched=matched, token=int(g[matched]))


def _lineage_width(segments: list[Segment]) -> int:
    """Positions of a row's whole lineage: every segment's width, end to end."""
    return sum(seg.ids.shape[1] for seg in segments)


def decode_row_bytes(config, slots: int, itemsize: int = 4) -> int:
    """Bytes of one decoding row's cache: K and V at every layer for `slots` positions."""
    return config.n_layers * 2 * config.n_kv_heads * config.d_head * slots * itemsize


def _decode_groups(prep, segments, resumes, max_new: int, budget: int) -> list[list[Resume]]:
    """`resumes` in consecutive groups whose decode caches fit `budget` bytes (a row larger
    than that alone). A row's cache spans its whole lineage plus `max_new` slots: on a
    long-answer task (MBPP, hundreds of slots a row) one cache for every row that leaves its
    draft would grow with the wave, not with the budget. Rows decode independently, so the
    groups give the same tokens."""
    slots = _lineage_width(segments) + max_new  # as `_decode_cache` allocates
    row = decode_row_bytes(prep.config, slots, np.dtype(prep.dtype).itemsize)
    size = max(1, budget // row)
    return [resumes[i : i + size] for i in range(0, len(resumes), size)]


def _decode(prep, segments, kv, wave, resumes, results, draft_len, fill, stop):
    """Real greedy decoding of the rows in `resumes`, from their known tokens, until they stop."""
    if not resumes:
        return
    L, H = prep.config.n_layers, prep.config.n_heads
    cache = _decode_cache(prep, segments, kv, resumes, draft_len, stop.max_new_tokens)
    keep = np.ones((len(resumes), L, H), prep.dtype)  # (r, L, H)
    for i, rs in enumerate(resumes):
        for l, h in wave[rs.cond]:
            keep[i, l, h] = 0.0
    tokens = np.array([rs.token for rs in resumes])  # (r,) fed next (already accepted)
    if fill is not None and fill.ndim == 4:  # a fill per prompt: each decoding row's own
        fill = fill[:, [rs.prompt for rs in resumes]]  # (L, r, H, E)
    rows = list(resumes)
    while rows:
        nxt = _decode_step(prep, cache, tokens, keep, fill)  # (r,)
        live = np.array(
            [
                not _accept(results[wave[rs.cond]][rs.prompt], int(t), stop)
                for rs, t in zip(rows, nxt)
            ]
        )
        if not live.all():
            cache.keep(live)
            keep, tokens = keep[live], nxt[live]
            fill = fill if fill is None or fill.ndim == 3 else fill[:, live]
            rows = [rs for rs, ok in zip(rows, live) if ok]
        else:
            tokens = nxt
