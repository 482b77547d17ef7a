"""Fast exact inference for screening: fused weights, in-place elementwise ops, shared prefixes.

The plain forward (`cel_numpy.models.transformer`) is the reference; this module computes the
same function with less work, for the hundreds of forwards a head screen needs:

  * weights laid out once per model (`prepare`): Q, K, V fused into one (D, (H + 2G) E) matrix,
    W_O flat (H E, D), Llama's gate and up fused into (D, 2F); the plain path re-lays W_Q/W_K/W_V
    on every call.
  * float32 (the model dtype) everywhere, elementwise chains done in place (GELU and SiLU write
    into the GEMM output; no float64 constants that would promote a float32 array).
  * the attention core is the shared `softmax_attention_forward` (and `rotary_forward`) of
    `cel_numpy.attention`; only the projections around it are laid out differently.
  * exact reuse across ablation conditions (`ablated_readout`, `generate_conditions`): the state
    of the residual stream is keyed by the heads ablated *so far*; at layer j only the distinct
    keys are computed, so the intact prefix (layers below the lowest ablated head) comes from one
    intact pass, joint conditions that share their lowest heads share the layers in between, and
    conditions ablating different heads of one layer run as one stacked batch. The last layer
    runs its queries, W_O and MLP only at the positions read out; the unembedding only at those
    positions and (optionally) only for some vocabulary columns.
  * generation with a preallocated KV cache per row; a row leaves the batch once it is done
    (eos, or a caller's stop test such as "the text has a newline"), and the loop ends when
    every row is done.

Shapes: B prompts, T tokens, R = stacked rows (conditions x prompts), D, H, G, E, F, V, L as in
docs/design.md#shapes-and-names. Results agree with the plain forward to float rounding; tests compare them.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from cel_numpy.attention import Rotary, rotary_forward, rotary_tables, softmax_attention_forward
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
    W_O_heads: np.ndarray  # (H, E, D) the same memory, one head per index
    b_O: np.ndarray | None  # (D,)
    ln2_w: np.ndarray  # (D,)
    ln2_b: np.ndarray | None  # (D,)
    W_up: np.ndarray  # (D, F) gpt2 W_in; (D, 2F) llama [W_gate | W_in]
    b_up: np.ndarray | None  # (F,) or (2F,)
    W_out: np.ndarray  # (F, D)
    b_out: np.ndarray | None  # (D,)


@dataclass(frozen=True)
class Prepared:
    """A model's weights laid out for `fast` inference (built once by `prepare`)."""

    config: ModelConfig
    params: dict  # the model's own params (embedding, final norm, unembedding are used as they are)
    layers: list[LayerWeights]
    dtype: np.dtype


def _cat_bias(parts: Sequence[np.ndarray | None], sizes: Sequence[int], dtype) -> np.ndarray | None:
    if all(p is None for p in parts):
        return None
    return np.concatenate(
        [np.zeros(n, dtype) if p is None else p.reshape(-1) for p, n in zip(parts, sizes)]
    )


def _prepare_layer(p: dict, config: ModelConfig, dtype) -> LayerWeights:
    a, m = p["attn"], p["mlp"]
    H, G, E, D = config.n_heads, config.n_kv_heads, config.d_head, config.d_model
    flat = lambda W: W.transpose(1, 0, 2).reshape(D, -1)  # (H, D, E) -> (D, H E)
    W_qkv = np.ascontiguousarray(
        np.concatenate([flat(a["W_Q"]), flat(a["W_K"]), flat(a["W_V"])], axis=1), dtype
    )
    b_qkv = _cat_bias([a.get("b_Q"), a.get("b_K"), a.get("b_V")], [H * E, G * E, G * E], dtype)
    W_O = np.ascontiguousarray(a["W_O"].reshape(H * E, D), dtype)
    if config.family == "gpt2":
        W_up, b_up = np.ascontiguousarray(m["W_in"], dtype), m.get("b_in")
    else:
        F = config.d_mlp
        W_up = np.ascontiguousarray(
            np.concatenate([m["W_gate"], m["W_in"]], axis=1), dtype
        )  # (D, 2F)
        b_up = _cat_bias([m.get("b_gate"), m.get("b_in")], [F, F], dtype)
    return LayerWeights(
        ln1_w=p["ln1"]["w"], ln1_b=p["ln1"].get("b"), W_qkv=W_qkv, b_qkv=b_qkv, W_O=W_O,
        W_O_heads=W_O.reshape(H, E, D), b_O=a.get("b_O"), ln2_w=p["ln2"]["w"], ln2_b=p["ln2"].get("b"),
        W_up=W_up, b_up=b_up, W_out=np.ascontiguousarray(m["W_out"], dtype), b_out=m.get("b_out"),
    )  # fmt: skip


_PREPARED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def prepare(model) -> Prepared:
    """Prepared weights of a `Model`, built on first use and cached (weakly) per Model object."""
    prep = _PREPARED.get(model)
    if prep is None or prep.params is not model.params:
        dtype = model.params["embed"]["W_E"].dtype
        layers = [_prepare_layer(p, model.config, dtype) for p in model.params["blocks"]]
        prep = Prepared(
            config=model.config, params=model.params, layers=layers, dtype=np.dtype(dtype)
        )
        _PREPARED[model] = prep
    return prep


# --------------------------------------------------------------------------- pieces (in place where safe)


def _norm(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, config: ModelConfig) -> np.ndarray:
    """LayerNorm (gpt2) or RMSNorm (llama) over the last axis into a new array.  (..., D) -> (..., D)."""
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


def _mlp_residual_(lw: LayerWeights, x: np.ndarray, config: ModelConfig) -> np.ndarray:
    """In place on x (..., D): x <- x + mlp(norm2(x))."""
    x2 = x.reshape(-1, x.shape[-1])  # (N, D)
    xn = _norm(x2, lw.ln2_w, lw.ln2_b, config)  # (N, D)
    h = _linear(xn, lw.W_up, lw.b_up)  # (N, F) or (N, 2F)
    if config.family == "gpt2":
        post = _gelu_(h, np.empty_like(h))  # (N, F)
    else:
        F = config.d_mlp
        gate, up = h[:, :F], h[:, F:]  # (N, F) views
        post = _silu_(gate, np.empty_like(gate))
        post *= up  # (N, F) strided view; BLAS reads it with its leading dimension
    out = post @ lw.W_out  # (N, D)
    if lw.b_out is not None:
        out += lw.b_out
    x2 += out
    return x


@dataclass(frozen=True)
class Inputs:
    """Positions, mask and rotary of one batch of B prompts (query positions = all T)."""

    ids: np.ndarray  # (B, T)
    attention_mask: np.ndarray  # (B, T) 1 on real tokens
    positions: np.ndarray  # (B, T)
    mask: np.ndarray  # (B, 1, T, T) bool
    rotary: Rotary | None  # (B, 1, T, E/2)


def make_inputs(config: ModelConfig, ids: np.ndarray, attention_mask: np.ndarray, dtype) -> Inputs:
    fi = prepare_inputs(config, attention_mask, ids.shape[1], dtype)
    return Inputs(
        ids=ids,
        attention_mask=np.asarray(attention_mask),
        positions=fi.positions,
        mask=fi.mask,
        rotary=fi.rotary,
    )


def _tile(a, n: int):
    return a if n == 1 else np.concatenate([a] * n, axis=0)


def _tile_rotary(rot: Rotary | None, n: int, sel=slice(None)) -> Rotary | None:
    if rot is None:
        return None
    return Rotary(cos=_tile(rot.cos[:, :, sel], n), sin=_tile(rot.sin[:, :, sel], n))


def _attention_z(
    lw: LayerWeights,
    x: np.ndarray,
    config: ModelConfig,
    mask,
    rotary: Rotary | None,
    query: slice = slice(None),
    past: tuple[np.ndarray, np.ndarray] | None = None,
):
    """norm1, fused QKV, rotary, shared softmax attention.  x (R, T, D) -> z (R, H, Tq, E), k, v (R, G, S, E).

    `query` selects the query positions (the last layer needs only the read-out ones); keys and
    values cover all T (plus `past`). mask (R, 1, Tq, S) already matches the selection.
    """
    R, T, D = x.shape
    H, G, E = config.n_heads, config.n_kv_heads, config.d_head
    xn = _norm(x.reshape(R * T, D), lw.ln1_w, lw.ln1_b, config)  # (R T, D)
    y = _linear(xn, lw.W_qkv, lw.b_qkv).reshape(R, T, H + 2 * G, E)  # (R, T, H + 2G, E)
    q = y[:, query, :H].transpose(0, 2, 1, 3)  # (R, H, Tq, E)
    k = y[:, :, H : H + G].transpose(0, 2, 1, 3)  # (R, G, T, E)
    v = y[:, :, H + G :].transpose(0, 2, 1, 3)  # (R, G, T, E)
    if rotary is not None:
        q = rotary_forward(q, Rotary(cos=rotary.cos[:, :, query], sin=rotary.sin[:, :, query]))
        k = rotary_forward(k, rotary)
    else:
        k, v = np.ascontiguousarray(k), v
    if past is not None:
        k = np.concatenate([past[0], k], axis=2)  # (R, G, S, E)
        v = np.concatenate([past[1], v], axis=2)
    z, _ = softmax_attention_forward(
        q, k, v, scale=1.0 / float(np.sqrt(E)), mask=mask
    )  # (R, H, Tq, E)
    return z, k, v


def _ablate_(z: np.ndarray, keep: np.ndarray | None, fill: np.ndarray | None) -> np.ndarray:
    """In place: z_h <- keep_h z_h + (1 - keep_h) fill_h per row.  z (R, H, T, E), keep (R, H), fill (H, E)."""
    if keep is None:
        return z
    m = keep[:, :, None, None]  # (R, H, 1, 1)
    z *= m
    if fill is not None:
        z += (1.0 - m) * fill[None, :, None, :]
    return z


def _attn_out_residual(lw: LayerWeights, x: np.ndarray, z: np.ndarray) -> np.ndarray:
    """x (R, T, D) + z (R, H, T, E) W_O + b_O -> new (R, T, D)."""
    R, H, T, E = z.shape
    out = z.transpose(0, 2, 1, 3).reshape(R * T, H * E) @ lw.W_O  # (R T, D)
    if lw.b_O is not None:
        out += lw.b_O
    out = out.reshape(R, T, -1)
    out += x
    return out


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


# --------------------------------------------------------------------------- intact forward


def forward(
    prep: Prepared,
    ids: np.ndarray,
    attention_mask: np.ndarray | None = None,
    *,
    positions: slice = slice(None),
    columns: np.ndarray | None = None,
) -> np.ndarray:
    """Intact logits, the fast way.  ids (B, T) -> logits (B, T', V) at `positions` (all by default)."""
    ids = np.asarray(ids)
    attention_mask = (
        np.ones(ids.shape, np.int64) if attention_mask is None else np.asarray(attention_mask)
    )
    config = prep.config
    inp = make_inputs(config, ids, attention_mask, prep.dtype)
    x = embed(prep.params, config, ids, inp.positions).astype(prep.dtype, copy=False)  # (B, T, D)
    L = config.n_layers
    for j, lw in enumerate(prep.layers):
        last = j == L - 1
        q = positions if last else slice(None)
        z, _, _ = _attention_z(lw, x, config, inp.mask[:, :, q], inp.rotary, q)
        x = _mlp_residual_(lw, _attn_out_residual(lw, x[:, q], z), config)
    return _unembed(prep, x, columns)


# --------------------------------------------------------------------------- many conditions, shared prefixes


@dataclass
class IntactState:
    """One intact pass kept layer by layer: what every ablated condition starts from."""

    inputs: Inputs
    resid_pre: list[np.ndarray]  # L x (B, T, D)
    z: list[np.ndarray]  # L x (B, H, T, E) per-head outputs (what ablation replaces)
    kv: list[tuple[np.ndarray, np.ndarray]]  # L x (k, v) each (B, G, T, E)
    resid_final: np.ndarray  # (B, T', D) at the read-out positions
    readout: slice


def intact_pass(
    prep: Prepared, ids: np.ndarray, attention_mask: np.ndarray, readout: slice
) -> IntactState:
    config = prep.config
    inp = make_inputs(config, ids, attention_mask, prep.dtype)
    x = embed(prep.params, config, ids, inp.positions).astype(prep.dtype, copy=False)  # (B, T, D)
    resid_pre, zs, kvs = [], [], []
    L = config.n_layers
    for j, lw in enumerate(prep.layers):
        resid_pre.append(x)
        z, k, v = _attention_z(
            lw, x, config, inp.mask, inp.rotary
        )  # all queries: ablations need all z
        zs.append(z)
        kvs.append((k, v))
        q = readout if j == L - 1 else slice(None)
        x = _mlp_residual_(
            lw, _attn_out_residual(lw, x[:, q], np.ascontiguousarray(z[:, :, q])), config
        )
    return IntactState(
        inputs=inp, resid_pre=resid_pre, z=zs, kv=kvs, resid_final=x, readout=readout
    )


def _keep_rows(keys: Sequence[Condition], layer: int, H: int, dtype) -> np.ndarray | None:
    """(n_keys, H) 0/1: which heads of `layer` each key ablates; None if none does."""
    keep = np.ones((len(keys), H), dtype)
    for i, key in enumerate(keys):
        for l, h in key:
            if l == layer:
                keep[i, h] = 0.0
    return None if keep.all() else keep


def _rows(keep: np.ndarray | None, B: int) -> np.ndarray | None:
    return None if keep is None else np.repeat(keep, B, axis=0)  # (n B, H)


def ablated_states(
    prep: Prepared,
    intact: IntactState,
    conds: Sequence[Condition],
    fill: np.ndarray | None,
    *,
    keep_kv: bool = False,
):
    """Final residual at the read-out positions for every condition, sharing every common prefix.

    Returns (final {cond: (B, T', D)}, kv {cond: [L x (k, v)]} if keep_kv). The state entering
    layer j is keyed by the condition's heads below j; the intact key () is never recomputed.
    fill (L, H, E) for mean ablation, None for zero ablation.
    """
    config = prep.config
    L, H = config.n_layers, config.n_heads
    B, T = intact.inputs.ids.shape
    inp = intact.inputs
    conds = [tuple(sorted(c)) for c in conds]
    below = lambda c, j: tuple(hd for hd in c if hd[0] < j)
    states: dict[
        Condition, np.ndarray
    ] = {}  # key (heads < j) -> (B, T, D) entering layer j, non-intact keys
    kv: dict[Condition, list] = {c: [] for c in conds} if keep_kv else {}
    for j, lw in enumerate(prep.layers):
        last = j == L - 1
        q = intact.readout if last else slice(None)
        parents = sorted({below(c, j) for c in conds})  # keys entering layer j
        children = sorted(
            {below(c, j + 1) for c in conds} - {()}
        )  # keys leaving layer j (non-intact)
        # attention of every non-intact parent, stacked; the intact parent's z is the intact pass's
        computed = [p for p in parents if p]
        z_of: dict[Condition, np.ndarray] = {(): intact.z[j][:, :, q]}
        if computed:
            n = len(computed)
            x_in = np.concatenate([states[p] for p in computed])  # (n B, T, D)
            z, k, v = _attention_z(
                lw, x_in, config, _tile(inp.mask[:, :, q], n), _tile_rotary(inp.rotary, n), q
            )
            for i, p in enumerate(computed):
                z_of[p] = z[i * B : (i + 1) * B]
                if keep_kv:
                    for c in conds:
                        if below(c, j) == p:
                            kv[c].append((k[i * B : (i + 1) * B], v[i * B : (i + 1) * B]))
        if keep_kv:
            for c in conds:
                if below(c, j) == ():
                    kv[c].append(intact.kv[j])
        new_states: dict[Condition, np.ndarray] = {}
        if children:
            n = len(children)
            par = [below(c, j) for c in children]
            z_in = np.concatenate(
                [z_of[p] for p in par]
            )  # (n B, H, Tq, E) a copy: ablated in place
            x_in = np.concatenate(
                [states[p][:, q] if p else intact.resid_pre[j][:, q] for p in par]
            )  # (n B, Tq, D)
            keep = _rows(_keep_rows(children, j, H, prep.dtype), B)
            _ablate_(z_in, keep, None if fill is None else fill[j])
            x_out = _mlp_residual_(lw, _attn_out_residual(lw, x_in, z_in), config)  # (n B, Tq, D)
            for i, c in enumerate(children):
                new_states[c] = x_out[i * B : (i + 1) * B]
        states = new_states
    final = {c: (states[c] if c else intact.resid_final) for c in conds}
    return final, kv


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
    reduce: Callable[[np.ndarray], np.ndarray] | None = None,
) -> list[np.ndarray]:
    """Logits (B, T', V or C) at the `readout` positions for each condition (in the given order).

    Conditions are processed in sorted order (shared prefixes are neighbours), in waves of at
    most `max_rows` token rows (B T per condition) to bound memory. `reduce` (e.g. an argmax)
    is applied to each condition's logits as its wave finishes, so full-vocabulary logits of
    hundreds of conditions are never held at once.
    """
    ids = np.asarray(ids)
    intact = intact_pass(prep, ids, attention_mask, readout)
    conds = [tuple(sorted(c)) for c in conds]
    per_wave = max(1, max_rows // max(1, ids.size))
    order = sorted(set(conds))
    logits: dict[Condition, np.ndarray] = {}
    for start in range(0, len(order), per_wave):
        wave = order[start : start + per_wave]
        final, _ = ablated_states(prep, intact, wave, fill)
        stacked = _unembed(prep, np.concatenate([final[c] for c in wave]), columns)  # (n B, T', C)
        B = ids.shape[0]
        for i, c in enumerate(wave):
            lg = stacked[i * B : (i + 1) * B]
            logits[c] = lg if reduce is None else reduce(lg)
    return [logits[c] for c in conds]


# --------------------------------------------------------------------------- generation


def generate_conditions(
    prep: Prepared,
    prompts: Sequence[Sequence[int]],
    pad_id: int,
    conds: Sequence[Condition],
    fill: np.ndarray | None,
    max_new_tokens: int,
    *,
    eos: int | None = None,
    is_done: Callable[[list[int]], bool] | None = None,
    max_rows: int = 2048,
) -> list[list[list[int]]]:
    """Greedy continuations of every prompt under every condition: out[k][b] = new ids (eos excluded).

    The same tokens as `Model.generate_ids(prompts, ablate=cond)` for each cond. The prompt pass
    reuses the intact prefix (`ablated_states` with keep_kv); then all (condition, prompt) rows
    of a wave decode together with a preallocated KV cache; a row stops at eos or when
    `is_done(its ids so far)` (the caller's "newline reached"), and leaves the batch.
    """
    config = prep.config
    L, H, G, E = config.n_layers, config.n_heads, config.n_kv_heads, config.d_head
    B = len(prompts)
    T = max(len(p) for p in prompts)
    ids = np.full((B, T), pad_id, np.int64)
    amask = np.zeros((B, T), np.int64)
    for b, p in enumerate(prompts):
        ids[b, T - len(p) :] = p
        amask[b, T - len(p) :] = 1
    conds = [tuple(sorted(c)) for c in conds]
    intact = intact_pass(prep, ids, amask, slice(-1, None))
    order = sorted(set(conds))
    per_wave = max(1, max_rows // max(1, B * (T + max_new_tokens)))
    results: dict[Condition, list[list[int]]] = {}
    n_real = amask.sum(axis=1)  # (B,)
    for start in range(0, len(order), per_wave):
        wave = order[start : start + per_wave]
        n = len(wave)
        final, kv = ablated_states(prep, intact, wave, fill, keep_kv=max_new_tokens > 1)
        first = finite_argmax(
            _unembed(prep, np.concatenate([final[c] for c in wave]), None)[:, -1]
        )  # (n B,)
        R = n * B
        new: list[list[int]] = [[] for _ in range(R)]
        active = np.ones(R, bool)
        _accept(new, active, np.arange(R), first, eos, is_done, max_new_tokens)
        if active.any():
            S = T + max_new_tokens
            kbuf = [np.zeros((R, G, S, E), prep.dtype) for _ in range(L)]
            vbuf = [np.zeros((R, G, S, E), prep.dtype) for _ in range(L)]
            for j in range(L):
                for i, c in enumerate(wave):
                    kbuf[j][i * B : (i + 1) * B, :, :T] = kv[c][j][0]
                    vbuf[j][i * B : (i + 1) * B, :, :T] = kv[c][j][1]
            valid = np.zeros((R, S), bool)
            valid[:, :T] = np.tile(amask.astype(bool), (n, 1))
            keep_all = np.ones((R, L, H), prep.dtype)
            for i, c in enumerate(wave):
                for l, h in c:
                    keep_all[i * B : (i + 1) * B, l, h] = 0.0
            rows = np.arange(R)  # which original rows the buffers hold
            pos = np.tile(n_real, n)  # (R,) position of the next token
            token = first
            for step in range(1, max_new_tokens):
                live = active[rows]
                if live.sum() < 0.75 * len(rows):  # compact: drop finished rows from every buffer
                    kbuf = [kb[live] for kb in kbuf]
                    vbuf = [vb[live] for vb in vbuf]
                    valid, pos, token, rows = valid[live], pos[live], token[live], rows[live]
                s = T + step - 1  # slot of the token being fed
                valid[:, s] = True
                x = embed(prep.params, config, token[:, None], pos[:, None]).astype(
                    prep.dtype, copy=False
                )  # (r, 1, D)
                mask = valid[:, None, None, : s + 1]  # (r, 1, 1, s+1)
                rot = None
                if config.family == "llama":
                    rot = rotary_tables(pos[:, None], E, config.rope_base, dtype=prep.dtype)
                keep = keep_all[rows]  # (r, L, H)
                for j, lw in enumerate(prep.layers):
                    x2 = x.reshape(-1, x.shape[-1])
                    xn = _norm(x2, lw.ln1_w, lw.ln1_b, config)
                    y = _linear(xn, lw.W_qkv, lw.b_qkv).reshape(len(rows), 1, H + 2 * G, E)
                    q = y[:, :, :H].transpose(0, 2, 1, 3)  # (r, H, 1, E)
                    kn = y[:, :, H : H + G].transpose(0, 2, 1, 3)  # (r, G, 1, E)
                    vn = y[:, :, H + G :].transpose(0, 2, 1, 3)
                    if rot is not None:
                        q = rotary_forward(q, rot)
                        kn = rotary_forward(kn, rot)
                    kbuf[j][:, :, s : s + 1] = kn
                    vbuf[j][:, :, s : s + 1] = vn
                    z, _ = softmax_attention_forward(
                        q,
                        kbuf[j][:, :, : s + 1],
                        vbuf[j][:, :, : s + 1],
                        scale=1.0 / float(np.sqrt(E)),
                        mask=mask,
                    )  # (r, H, 1, E)
                    kj = keep[:, j]
                    _ablate_(z, None if kj.all() else kj, None if fill is None else fill[j])
                    x = _mlp_residual_(lw, _attn_out_residual(lw, x, z), config)
                token = finite_argmax(_unembed(prep, x[:, -1], None))  # (r,)
                pos = pos + 1
                _accept(new, active, rows, token, eos, is_done, max_new_tokens)
                if not active.any():
                    break
        for i, c in enumerate(wave):
            results[c] = new[i * B : (i + 1) * B]
    return [results[c] for c in conds]


def _accept(new, active, rows, tokens, eos, is_done, max_new_tokens) -> None:
    """Append each active row's token; mark rows done at eos, at `is_done`, or at the length cap."""
    for r, t in zip(rows, tokens):
        if not active[r]:
            continue
        t = int(t)
        if eos is not None and t == eos:
            active[r] = False
            continue
        new[r].append(t)
        if len(new[r]) >= max_new_tokens or (is_done is not None and is_done(new[r])):
            active[r] = False
