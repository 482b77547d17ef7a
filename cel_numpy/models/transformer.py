"""One config-driven transformer forward for GPT-2 and Llama, as plain functions.

    ids (B, T) --embed--> x (B, T, D) --block_0..block_{L-1}--> x
               --final norm, W_U--> logits (B, T, V)

    block (pre-norm):  x = x + attn(norm1(x));  x = x + mlp(norm2(x))
      gpt2:  LayerNorm, learned positions added to the embedding,
             MLP = GELU-tanh(x W_in + b_in) W_out + b_out
      llama: RMSNorm, rotary on q and k, grouped-query attention,
             MLP = (silu(x W_gate) * (x W_in)) W_out
      gemma3 (llama family): x_0 scaled by sqrt(D); q and k RMS-normed per head; sandwich norms
             x = x + ln1_post(attn(ln1(x)));  x = x + ln2_post(mlp(ln2(x)));
             MLP = (gelu_tanh(x W_gate) * (x W_in)) W_out; local layers attend through a sliding
             window with their own rotary base (ForwardInputs.for_layer)

The attention is `cel_numpy.attention.attention_forward`, the same function the theory model
trains with; the norms and activations come from `cel_numpy.ops`.

Parameters are a nested dict with TransformerLens names (flatten with `flatten_params`):

    embed.W_E (V, D)   pos_embed.W_pos (n_ctx, D) gpt2 only
    blocks[l].ln1.w (D,) [.b]   blocks[l].attn.{W_Q (H,D,E), W_K (G,D,E), W_V (G,D,E),
                                                W_O (H,E,D), b_*}
    blocks[l].ln2.w (D,) [.b]   blocks[l].mlp.{W_in (D,F), W_gate (D,F) llama, W_out (F,D),
                                               b_in, b_out}
    gemma3 also: blocks[l].attn.q_norm.w (E,), .attn.k_norm.w (E,), .ln1_post.w (D,),
                 .ln2_post.w (D,)
    ln_final.w (D,) [.b]        unembed.W_U (D, V) (a transposed view of W_E when tied) [b_U (V,)]

Pieces for a performance pass: `prepare_inputs` builds positions, masks and rotary tables once;
`blocks_forward` runs any range of layers from a given residual stream; `unembed` takes any
subset of positions (the caller slices the residual) and optionally of vocabulary columns.

Padding: prompts are LEFT-padded, attention_mask (B, S) is 1 on real tokens, and the position of
a token is the number of real tokens before it, clip(cumsum(mask) - 1, 0). Outputs at padding
positions are garbage and must be ignored.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cel_numpy.attention import (
    AttentionCache,
    Rotary,
    attention_forward,
    padded_causal_mask,
    rotary_tables,
)
from cel_numpy.errors import PromptError
from cel_numpy.models.config import ModelConfig
from cel_numpy.ops import gelu_forward, layer_norm_forward, rms_norm_forward, silu_forward

GATE_ACTIVATIONS = {"silu": silu_forward, "gelu_tanh": gelu_forward}  # config.mlp_act -> op

# --------------------------------------------------------------------------- parameters


def flatten_params(params: dict, prefix: str = "") -> dict[str, np.ndarray]:
    """Nested params -> {"blocks.0.attn.W_Q": array, ...} (TransformerLens state-dict names)."""
    flat = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten_params(value, name + "."))
        elif isinstance(value, list):
            for i, item in enumerate(value):
                flat.update(flatten_params(item, f"{name}.{i}."))
        else:
            flat[name] = value
    return flat


def unflatten_params(flat: dict[str, np.ndarray]) -> dict:
    """Inverse of `flatten_params`: "blocks.{l}.x.y" go to params["blocks"][l]["x"]["y"]."""
    params: dict = {}
    blocks: dict[int, dict] = {}
    for name, value in flat.items():
        parts = name.split(".")
        if parts[0] == "blocks":
            node = blocks.setdefault(int(parts[1]), {})
            parts = parts[2:]
        else:
            node = params
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    if blocks:
        if sorted(blocks) != list(range(len(blocks))):
            raise ValueError(f"block indices must be 0..L-1, got {sorted(blocks)}")
        params["blocks"] = [blocks[i] for i in range(len(blocks))]
    return params


def params_dtype(params: dict) -> np.dtype:
    return params["embed"]["W_E"].dtype


# --------------------------------------------------------------------------- inputs


@dataclass(frozen=True)
class ForwardInputs:
    """What every layer needs besides the residual stream, built once per forward."""

    positions: np.ndarray  # (B, T) int: position of each query token (pads get 0)
    mask: np.ndarray  # (B, 1, T, S) bool: True = may attend (causal, no padding keys)
    rotary: Rotary | None  # cos/sin (B, 1, T, E/2) in the model dtype; None for gpt2
    n_past: int  # S - T key positions come from the KV cache
    local_mask: np.ndarray | None = None  # (B, 1, T, S) mask within the sliding window (gemma3)
    local_rotary: Rotary | None = None  # rotary tables of the local base (gemma3)

    def for_layer(self, config: ModelConfig, layer: int) -> tuple[np.ndarray, Rotary | None]:
        """(mask, rotary) of `layer`: the sliding-window ones for a local layer."""
        if config.is_local(layer):
            return self.local_mask, self.local_rotary
        return self.mask, self.rotary


def sliding_window_mask(mask: np.ndarray, key_valid: np.ndarray, window: int) -> np.ndarray:
    """mask (B, 1, T, S) -> the same mask keeping only keys less than `window` positions back.

    Positions count real tokens (as for rotary), so padding between a row's segments does not
    narrow the window: key s is kept iff pos(t) - pos(s) < window.
    """
    S, T = key_valid.shape[1], mask.shape[2]
    key_pos = np.cumsum(key_valid, axis=1) - 1  # (B, S) position of each real key
    query_pos = key_pos[:, S - T :]  # (B, T)
    near = (query_pos[:, :, None] - key_pos[:, None, :]) < window  # (B, T, S)
    return mask & near[:, None]  # (B, 1, T, S); a query's own position stays (0 < window)


def prepare_inputs(config: ModelConfig, attention_mask: np.ndarray, T: int, dtype) -> ForwardInputs:
    """attention_mask (B, S) over past + current tokens -> positions, mask, rotary for the
    last T (and for local layers, gemma3, the sliding-window mask and local rotary)."""
    valid = np.asarray(attention_mask).astype(bool)  # (B, S)
    B, S = valid.shape
    if S < T:
        raise ValueError(f"attention_mask covers {S} positions, fewer than the {T} tokens")
    positions = np.clip(np.cumsum(valid, axis=1) - 1, 0, None)[:, S - T :]  # (B, T)
    if positions.size and positions.max() >= config.n_ctx:
        raise PromptError(
            f"{positions.max() + 1} tokens exceed the model's context of {config.n_ctx} tokens: "
            "shorten the prompt (or lower max_new_tokens)"
        )
    mask = padded_causal_mask(valid, T)  # (B, 1, T, S)
    rotary = local_mask = local_rotary = None
    if config.family == "llama":
        rotary = rotary_tables(positions, config.d_head, config.rope_base, dtype=dtype)
    if config.local_layers:
        local_mask = sliding_window_mask(mask, valid, config.sliding_window)  # (B, 1, T, S)
        local_rotary = rotary_tables(positions, config.d_head, config.rope_local_base, dtype=dtype)
    return ForwardInputs(
        positions=positions,
        mask=mask,
        rotary=rotary,
        n_past=S - T,
        local_mask=local_mask,
        local_rotary=local_rotary,
    )


# --------------------------------------------------------------------------- pieces


def embed(params: dict, config: ModelConfig, ids: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """ids (B, T) int -> x (B, T, D): token embedding (+ learned position embedding for gpt2),
    times config.embed_scale (sqrt(D) for gemma3)."""
    if ids.size and (ids.min() < 0 or ids.max() >= config.vocab_size):
        raise ValueError(
            f"token ids must be in [0, {config.vocab_size}), got range [{ids.min()}, {ids.max()}]"
        )
    x = params["embed"]["W_E"][ids]  # (B, T, D)
    if config.embed_scale != 1.0:
        x *= config.embed_scale  # a Python float: float32 stays float32, as HF rounds it
    if config.family == "gpt2":
        x = x + params["pos_embed"]["W_pos"][positions]  # (B, T, D)
    return x


def norm_forward(p: dict, x: np.ndarray, config: ModelConfig):
    """LayerNorm (gpt2) or RMSNorm (llama) over the last axis.  x (..., D) -> (..., D)."""
    if config.family == "gpt2":
        return layer_norm_forward(x, p["w"], p["b"], config.norm_eps)
    return rms_norm_forward(x, p["w"], config.norm_eps)


def _matmul(x: np.ndarray, W: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """x (B, T, D_in) @ W (D_in, D_out) as one GEMM over B*T rows -> (B, T, D_out)."""
    out = x.reshape(-1, x.shape[-1]) @ W  # (B*T, D_out)
    if b is not None:
        out += b
    return out.reshape(*x.shape[:-1], W.shape[-1])


@dataclass(frozen=True)
class MLPActivations:
    pre: np.ndarray  # (B, T, F) input of the nonlinearity: x W_in + b_in (gpt2), x W_gate (gated)
    up: np.ndarray | None  # (B, T, F) x W_in (llama only, multiplies the gate)
    post: np.ndarray  # (B, T, F) what W_out reads


def mlp_forward(p: dict, x: np.ndarray, config: ModelConfig):
    """x (B, T, D) -> out (B, T, D), MLPActivations."""
    if config.family == "gpt2":
        pre = _matmul(x, p["W_in"], p.get("b_in"))  # (B, T, F)
        post, _ = gelu_forward(pre)
        up = None
    else:
        pre = _matmul(x, p["W_gate"], p.get("b_gate"))  # (B, T, F)
        up = _matmul(x, p["W_in"], p.get("b_in"))  # (B, T, F)
        gate, _ = GATE_ACTIVATIONS[config.mlp_act](pre)
        post = gate * up  # (B, T, F)
    out = _matmul(post, p["W_out"], p.get("b_out"))  # (B, T, D)
    return out, MLPActivations(pre=pre, up=up, post=post)


@dataclass(frozen=True)
class BlockCache:
    """Activations of one block; `ForwardCache` gives them names like "blocks.3.attn.z"."""

    resid_pre: np.ndarray  # (B, T, D)
    ln1_out: np.ndarray  # (B, T, D) what attention reads
    attn: AttentionCache  # q (B,H,T,E), k/v (B,G,S,E), probs (B,H,T,S), z (B,H,T,E), z_masked
    attn_out: np.ndarray  # (B, T, D) what is added to the residual stream
    resid_mid: np.ndarray  # (B, T, D)
    ln2_out: np.ndarray  # (B, T, D) what the MLP reads
    mlp: MLPActivations
    mlp_out: np.ndarray  # (B, T, D) what is added to the residual stream
    resid_post: np.ndarray  # (B, T, D)
    attn_out_raw: np.ndarray | None = None  # (B, T, D) z W_O before ln1_post (sandwich norms)
    mlp_out_raw: np.ndarray | None = None  # (B, T, D) post W_out before ln2_post (sandwich norms)


def block_forward(
    p: dict,
    x: np.ndarray,
    config: ModelConfig,
    inputs: ForwardInputs,
    *,
    head_mask: np.ndarray | None = None,
    head_fill: np.ndarray | None = None,
    past_kv: tuple[np.ndarray, np.ndarray] | None = None,
    layer: int = 0,
):
    """One pre-norm block.  x (B, T, D) -> (B, T, D), BlockCache.

    head_mask (H,) multiplies each head's z before W_O; head_fill (H, E) replaces a removed
    head (mean ablation). past_kv = (k, v), each (B, G, S_past, E). `layer` picks the mask and
    rotary tables (local or global, gemma3).
    """
    mask, rotary = inputs.for_layer(config, layer)
    ln1_out, _ = norm_forward(p["ln1"], x, config)  # (B, T, D)
    # (B, T, D)
    attn_out, attn = attention_forward(
        p["attn"],
        ln1_out,
        mask=mask,
        rotary=rotary,
        head_mask=head_mask,
        head_fill=head_fill,
        past_kv=past_kv,
        scale=config.attn_scale,
        norm_eps=config.norm_eps,
    )
    attn_out_raw = mlp_out_raw = None
    if config.sandwich_norms:
        attn_out_raw = attn_out
        attn_out, _ = norm_forward(p["ln1_post"], attn_out_raw, config)  # (B, T, D)
    resid_mid = x + attn_out  # (B, T, D)
    ln2_out, _ = norm_forward(p["ln2"], resid_mid, config)  # (B, T, D)
    mlp_out, mlp = mlp_forward(p["mlp"], ln2_out, config)  # (B, T, D)
    if config.sandwich_norms:
        mlp_out_raw = mlp_out
        mlp_out, _ = norm_forward(p["ln2_post"], mlp_out_raw, config)  # (B, T, D)
    resid_post = resid_mid + mlp_out  # (B, T, D)
    cache = BlockCache(
        resid_pre=x,
        ln1_out=ln1_out,
        attn=attn,
        attn_out=attn_out,
        resid_mid=resid_mid,
        ln2_out=ln2_out,
        mlp=mlp,
        mlp_out=mlp_out,
        resid_post=resid_post,
        attn_out_raw=attn_out_raw,
        mlp_out_raw=mlp_out_raw,
    )
    return resid_post, cache


def blocks_forward(
    params: dict,
    config: ModelConfig,
    x: np.ndarray,
    inputs: ForwardInputs,
    layers: range,
    *,
    head_mask: np.ndarray | None = None,
    head_fill: np.ndarray | None = None,
    past: list | None = None,
    keep_activations: bool = True,
):
    """Run `layers` (a range, e.g. range(l, L)) from residual x (B, T, D).

    head_mask (L, H) and head_fill (L, H, E) are indexed by absolute layer; past is a list of
    (k, v) per absolute layer. Returns x (B, T, D), {layer: BlockCache} (empty unless
    keep_activations), {layer: (k, v)} the KV cache including this call's positions.
    """
    caches: dict[int, BlockCache] = {}
    kv: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    dtype = x.dtype
    for layer in layers:
        hm = fill = None
        if head_mask is not None and not np.all(head_mask[layer] == 1):
            hm = head_mask[layer].astype(dtype, copy=False)  # (H,)
            # (H, E)
            fill = None if head_fill is None else head_fill[layer].astype(dtype, copy=False)
        x, cache = block_forward(
            params["blocks"][layer],
            x,
            config,
            inputs,
            head_mask=hm,
            head_fill=fill,
            past_kv=None if past is None else past[layer],
            layer=layer,
        )
        kv[layer] = (cache.attn.k, cache.attn.v)
        if keep_activations:
            caches[layer] = cache
    return x, caches, kv


def unembed(params: dict, config: ModelConfig, x: np.ndarray, columns: np.ndarray | None = None):
    """Final norm, then logits.  x (..., D) -> logits (..., V) or (..., len(columns)), normed x.

    Pass only the positions you need (x[:, -1:] for next-token logits) and, when a metric
    reads a few tokens, only those vocabulary `columns`.
    """
    xn, _ = norm_forward(params["ln_final"], x, config)  # (..., D)
    W_U = params["unembed"]["W_U"]  # (D, V)
    b_U = params["unembed"].get("b_U")  # (V,) or None
    if columns is not None:
        W_U = W_U[:, columns]  # (D, C)
        b_U = None if b_U is None else b_U[columns]
    logits = _matmul(xn, W_U, b_U)  # (..., V)
    return logits, xn


# --------------------------------------------------------------------------- named activations


_BLOCK_NAMES = {
    "resid_pre": lambda c: c.resid_pre,  # (B, T, D)
    "ln1.out": lambda c: c.ln1_out,  # (B, T, D)
    "attn.q": lambda c: c.attn.q,  # (B, H, T, E) after rotary
    "attn.k": lambda c: c.attn.k,  # (B, G, S, E) after rotary, past included
    "attn.v": lambda c: c.attn.v,  # (B, G, S, E)
    "attn.pattern": lambda c: c.attn.probs,  # (B, H, T, S)
    "attn.z": lambda c: c.attn.z,  # (B, H, T, E) per-head output before ablation
    "attn.z_ablated": lambda c: c.attn.z_masked,  # (B, H, T, E) what W_O reads
    "attn.out_raw": lambda c: c.attn_out_raw,  # (B, T, D) before ln1_post (gemma3 only)
    "attn.out": lambda c: c.attn_out,  # (B, T, D)
    "resid_mid": lambda c: c.resid_mid,  # (B, T, D)
    "ln2.out": lambda c: c.ln2_out,  # (B, T, D)
    "mlp.pre": lambda c: c.mlp.pre,  # (B, T, F)
    "mlp.up": lambda c: c.mlp.up,  # (B, T, F) llama only
    "mlp.post": lambda c: c.mlp.post,  # (B, T, F)
    "mlp.out_raw": lambda c: c.mlp_out_raw,  # (B, T, D) before ln2_post (gemma3 only)
    "mlp.out": lambda c: c.mlp_out,  # (B, T, D)
    "resid_post": lambda c: c.resid_post,  # (B, T, D)
}


@dataclass(frozen=True)
class ForwardCache:
    """Everything one forward computed, by name: cache["blocks.3.attn.pattern"].

    Names: "embed" (B,T,D), "positions" (B,T), "attention_mask" (B,S), "ln_final.out" (B,T,D),
    "logits", and "blocks.{l}.{name}" for name in BLOCK_ACTIVATIONS. `blocks` and `kv` are the
    dataclasses behind them, for a debugger.
    """

    embed: np.ndarray | None  # (B, T, D) residual stream entering block 0
    inputs: ForwardInputs
    attention_mask: np.ndarray  # (B, S)
    blocks: list[BlockCache]  # one per layer; empty when keep_activations=False
    kv: list[
        tuple[np.ndarray, np.ndarray]
    ]  # per layer (k, v), each (B, G, S, E): next call's `past`
    ln_final_out: np.ndarray | None  # (B, T', D) the normed positions that were unembedded
    logits: np.ndarray  # (B, T', V)

    def __getitem__(self, name: str) -> np.ndarray:
        top = {
            "embed": self.embed,
            "positions": self.inputs.positions,
            "attention_mask": self.attention_mask,
            "ln_final.out": self.ln_final_out,
            "logits": self.logits,
        }
        if name in top:
            return top[name]
        parts = name.split(".", 2)
        if (
            len(parts) == 3
            and parts[0] == "blocks"
            and parts[1].isdigit()
            and parts[2] in _BLOCK_NAMES
        ):
            layer = int(parts[1])
            if not self.blocks:
                raise KeyError(f"{name}: activations were not kept (keep_activations=False)")
            if layer >= len(self.blocks):
                raise KeyError(f"{name}: the model has {len(self.blocks)} layers (0-based)")
            return _BLOCK_NAMES[parts[2]](self.blocks[layer])
        raise KeyError(f"unknown activation {name!r}; see ForwardCache.names()")

    def names(self) -> list[str]:
        """The activations this forward has (e.g. "mlp.up" only for gated MLPs, "attn.out_raw"
        only with sandwich norms)."""
        out = ["embed", "positions", "attention_mask"]
        here = [
            n for n in _BLOCK_NAMES if self.blocks and _BLOCK_NAMES[n](self.blocks[0]) is not None
        ]
        out += [f"blocks.{l}.{n}" for l in range(len(self.blocks)) for n in here]
        return out + ["ln_final.out", "logits"]

    def stack(self, name: str) -> np.ndarray:
        """One block activation over all layers: stack("attn.z") -> (L, B, H, T, E)."""
        return np.stack([self[f"blocks.{l}.{name}"] for l in range(len(self.blocks))])


BLOCK_ACTIVATIONS = tuple(_BLOCK_NAMES)


# --------------------------------------------------------------------------- whole model


def transformer_forward(
    params: dict,
    config: ModelConfig,
    ids: np.ndarray,
    attention_mask: np.ndarray | None = None,
    *,
    head_mask: np.ndarray | None = None,
    head_fill: np.ndarray | None = None,
    past: list | None = None,
    keep_activations: bool = True,
    logit_positions: slice | np.ndarray | None = None,
    logit_columns: np.ndarray | None = None,
):
    """ids (B, T) int -> logits (B, T, V), ForwardCache.

    attention_mask (B, S) covers the S = S_past + T positions (ones when None and no past).
    head_mask (L, H): 1 keeps a head, 0 removes it (z_h -> head_fill[l, h], zero when None);
    head_fill (L, H, E), or (L, B, H, E) for a fill per batch row (resample ablation).
    past: the previous call's `cache.kv`. logit_positions selects query positions to unembed
    (slice(-1, None) for next-token logits); logit_columns selects vocabulary entries.
    """
    ids = np.asarray(ids)
    if ids.ndim != 2:
        raise ValueError(f"ids must be (B, T), got shape {ids.shape}")
    B, T = ids.shape
    n_past = 0 if past is None else past[0][0].shape[2]
    if attention_mask is None:
        attention_mask = np.ones((B, n_past + T), dtype=np.int64)
    attention_mask = np.asarray(attention_mask)
    if attention_mask.shape != (B, n_past + T):
        raise ValueError(
            f"attention_mask must be (B, S_past + T) = {(B, n_past + T)}, "
            f"got {attention_mask.shape}"
        )
    L, H = config.n_layers, config.n_heads
    if head_mask is not None and np.shape(head_mask) != (L, H):
        raise ValueError(f"head_mask must be (L, H) = {(L, H)}, got {np.shape(head_mask)}")
    if head_fill is not None and np.shape(head_fill) not in (
        (L, H, config.d_head),
        (L, B, H, config.d_head),
    ):
        raise ValueError(
            f"head_fill must be (L, H, E) = {(L, H, config.d_head)} or per row (L, B, H, E), "
            f"got {np.shape(head_fill)}"
        )
    dtype = params_dtype(params)
    inputs = prepare_inputs(config, attention_mask, T, dtype)
    x0 = embed(params, config, ids, inputs.positions)  # (B, T, D)
    x, caches, kv = blocks_forward(
        params,
        config,
        x0,
        inputs,
        range(L),
        head_mask=head_mask,
        head_fill=head_fill,
        past=past,
        keep_activations=keep_activations,
    )
    if logit_positions is not None:
        x = x[:, logit_positions]  # (B, T', D)
    logits, xn = unembed(params, config, x, logit_columns)  # (B, T', V)
    cache = ForwardCache(
        embed=x0 if keep_activations else None,
        inputs=inputs,
        attention_mask=attention_mask,
        blocks=[caches[l] for l in range(L)] if keep_activations else [],
        kv=[kv[l] for l in range(L)],
        ln_final_out=xn if keep_activations else None,
        logits=logits,
    )
    return logits, cache
