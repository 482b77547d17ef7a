"""The weight table: every parameter cel-numpy needs, where each checkpoint format keeps it.

One `WeightSpec` per parameter maps our name (TransformerLens-style, e.g. `blocks.0.attn.W_Q`)
to its name in a Hugging Face folder (`hf`), a GGUF file (`gguf`) and an `.npz` export (`npz`),
with the checkpoint's shape, our shape and the conversion between them. Both loaders
(`loaders.py` for folders and .npz, `gguf_loader.py` for GGUF) check a file's tensor headers
against this table (`check_tensors`) before reading any weight, then read through it
(`build_params`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from cel_numpy.errors import ModelFileError
from cel_numpy.models.config import ModelConfig
from cel_numpy.models.transformer import unflatten_params

# --------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class WeightSpec:
    """One of our parameters and where each format keeps it."""

    ours: str  # "blocks.3.attn.W_Q"
    hf: str | None  # Hugging Face safetensors name (None: not in this format)
    gguf: str | None  # GGUF tensor name
    npz: str | None  # name in our .npz export
    source_shape: tuple[int, ...]  # checkpoint shape (HF / GGUF after reversing its dims)
    shape: tuple[int, ...]  # our shape
    to_ours: Callable[[np.ndarray], np.ndarray]  # checkpoint layout -> ours
    npz_shape: tuple[int, ...] | None = None  # defaults to `shape` (the export uses our layout)

    def checkpoint_shape(self, fmt: str) -> tuple[int, ...]:
        """The shape the tensor has in format `fmt` ("hf", "gguf" or "npz")."""
        return (self.npz_shape or self.shape) if fmt == "npz" else self.source_shape


def _identity(a):
    return a


def unpermute_rotary_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation: (n*E, D) interleaved pairs -> half-split rows.

    The converter did w.reshape(n, 2, E/2, D).swapaxes(1, 2), i.e. row 2i+j of a head holds
    HF row j*E/2 + i. Inverse: reshape (n, E/2, 2, D) and swap back.
    """
    rows, D = w.shape
    E = rows // n_heads
    return w.reshape(n_heads, E // 2, 2, D).swapaxes(1, 2).reshape(rows, D)


def permute_rotary_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's permutation (used by tests to write GGUF files): half-split -> interleaved."""
    rows, D = w.shape
    E = rows // n_heads
    return w.reshape(n_heads, 2, E // 2, D).swapaxes(1, 2).reshape(rows, D)


# GGUF architectures stored without the Q/K row permutation
GGUF_ROTATE_HALF_ARCHS = ("qwen2", "gemma3")
# Architectures whose RMSNorm multiplies by (1 + w): Hugging Face stores w, we (and llama.cpp's
# GGUF converter, which adds the 1) store the multiplier 1 + w.
NORM_PLUS_ONE_ARCHS = ("gemma3",)


def weight_table(config: ModelConfig, fmt: str) -> list[WeightSpec]:
    """Every parameter of `config`'s model, with its source in format fmt ("hf", "gguf", "npz")."""
    if config.family == "gpt2":
        return _gpt2_table(config)
    return _llama_table(config, fmt)


def _linear_heads(n: int, E: int, D: int):
    """torch Linear (n*E, D) -> (n, D, E): head h owns output rows h*E:(h+1)*E."""
    return lambda w: w.reshape(n, E, D).transpose(0, 2, 1)


def _llama_table(c: ModelConfig, fmt: str) -> list[WeightSpec]:
    L, H, G, D, E, F, V = (
        c.n_layers,
        c.n_heads,
        c.n_kv_heads,
        c.d_model,
        c.d_head,
        c.d_mlp,
        c.vocab_size,
    )
    # llama.cpp's converter interleaves the rotary pairs of Q/K rows for llama, not for qwen2
    # (whose GGUF keeps Hugging Face's rotate-half rows).
    gguf = fmt == "gguf" and c.arch not in GGUF_ROTATE_HALF_ARCHS
    unperm_q = (lambda w: unpermute_rotary_rows(w, H)) if gguf else _identity
    unperm_k = (lambda w: unpermute_rotary_rows(w, G)) if gguf else _identity
    q_heads, kv_heads = _linear_heads(H, E, D), _linear_heads(G, E, D)
    plus_one = fmt == "hf" and c.arch in NORM_PLUS_ONE_ARCHS
    # checkpoint norm weight -> multiplier, added in float64 (1 + w in float32 would round w)
    norm = (lambda w: w.astype(np.float64) + 1.0) if plus_one else _identity
    # Gemma's four block norms: its post_attention_layernorm follows attention (our ln1_post),
    # and pre_feedforward_layernorm is what Llama calls post_attention_layernorm (our ln2).
    hf_ln2 = "pre_feedforward_layernorm" if c.sandwich_norms else "post_attention_layernorm"
    table = [
        WeightSpec(
            "embed.W_E",
            "model.embed_tokens.weight",
            "token_embd.weight",
            None,
            (V, D),
            (V, D),
            _identity,
        ),
        WeightSpec("ln_final.w", "model.norm.weight", "output_norm.weight", None, (D,), (D,), norm),
    ]
    if not c.tied_embeddings:
        table.append(
            WeightSpec(
                "unembed.W_U", "lm_head.weight", "output.weight", None, (V, D), (D, V), np.transpose
            )
        )
    for l in range(L):
        b, hf, gg = f"blocks.{l}.", f"model.layers.{l}.", f"blk.{l}."
        table += [
            WeightSpec(
                b + "ln1.w",
                hf + "input_layernorm.weight",
                gg + "attn_norm.weight",
                None,
                (D,),
                (D,),
                norm,
            ),
            WeightSpec(
                b + "attn.W_Q",
                hf + "self_attn.q_proj.weight",
                gg + "attn_q.weight",
                None,
                (H * E, D),
                (H, D, E),
                lambda w: q_heads(unperm_q(w)),
            ),
            WeightSpec(
                b + "attn.W_K",
                hf + "self_attn.k_proj.weight",
                gg + "attn_k.weight",
                None,
                (G * E, D),
                (G, D, E),
                lambda w: kv_heads(unperm_k(w)),
            ),
            WeightSpec(
                b + "attn.W_V",
                hf + "self_attn.v_proj.weight",
                gg + "attn_v.weight",
                None,
                (G * E, D),
                (G, D, E),
                kv_heads,
            ),
            WeightSpec(
                b + "attn.W_O",
                hf + "self_attn.o_proj.weight",
                gg + "attn_output.weight",
                None,
                (D, H * E),
                (H, E, D),
                lambda w: w.T.reshape(H, E, D),
            ),
            WeightSpec(
                b + "ln2.w", hf + hf_ln2 + ".weight", gg + "ffn_norm.weight", None, (D,), (D,), norm
            ),
            WeightSpec(
                b + "mlp.W_gate",
                hf + "mlp.gate_proj.weight",
                gg + "ffn_gate.weight",
                None,
                (F, D),
                (D, F),
                np.transpose,
            ),
            WeightSpec(
                b + "mlp.W_in",
                hf + "mlp.up_proj.weight",
                gg + "ffn_up.weight",
                None,
                (F, D),
                (D, F),
                np.transpose,
            ),
            WeightSpec(
                b + "mlp.W_out",
                hf + "mlp.down_proj.weight",
                gg + "ffn_down.weight",
                None,
                (D, F),
                (F, D),
                np.transpose,
            ),
        ]
        if c.sandwich_norms:
            table += [
                WeightSpec(
                    b + "ln1_post.w",
                    hf + "post_attention_layernorm.weight",
                    gg + "post_attention_norm.weight",
                    None,
                    (D,),
                    (D,),
                    norm,
                ),
                WeightSpec(
                    b + "ln2_post.w",
                    hf + "post_feedforward_layernorm.weight",
                    gg + "post_ffw_norm.weight",
                    None,
                    (D,),
                    (D,),
                    norm,
                ),
            ]
        if c.qk_norm:
            table += [
                WeightSpec(
                    b + f"attn.{n}_norm.w",
                    hf + f"self_attn.{n}_norm.weight",
                    gg + f"attn_{n}_norm.weight",
                    None,
                    (E,),
                    (E,),
                    norm,
                )
                for n in ("q", "k")
            ]
        if c.attn_bias or c.qkv_bias:
            table += [
                WeightSpec(
                    b + "attn.b_Q",
                    hf + "self_attn.q_proj.bias",
                    gg + "attn_q.bias",
                    None,
                    (H * E,),
                    (H, E),
                    lambda a: (unperm_q(a[:, None])[:, 0]).reshape(H, E),
                ),
                WeightSpec(
                    b + "attn.b_K",
                    hf + "self_attn.k_proj.bias",
                    gg + "attn_k.bias",
                    None,
                    (G * E,),
                    (G, E),
                    lambda a: (unperm_k(a[:, None])[:, 0]).reshape(G, E),
                ),
                WeightSpec(
                    b + "attn.b_V",
                    hf + "self_attn.v_proj.bias",
                    gg + "attn_v.bias",
                    None,
                    (G * E,),
                    (G, E),
                    lambda a: a.reshape(G, E),
                ),
            ]
        if c.attn_bias:
            table += [
                WeightSpec(
                    b + "attn.b_O",
                    hf + "self_attn.o_proj.bias",
                    gg + "attn_output.bias",
                    None,
                    (D,),
                    (D,),
                    _identity,
                ),
            ]
        if c.mlp_bias:
            table += [
                WeightSpec(
                    b + "mlp.b_gate",
                    hf + "mlp.gate_proj.bias",
                    gg + "ffn_gate.bias",
                    None,
                    (F,),
                    (F,),
                    _identity,
                ),
                WeightSpec(
                    b + "mlp.b_in",
                    hf + "mlp.up_proj.bias",
                    gg + "ffn_up.bias",
                    None,
                    (F,),
                    (F,),
                    _identity,
                ),
                WeightSpec(
                    b + "mlp.b_out",
                    hf + "mlp.down_proj.bias",
                    gg + "ffn_down.bias",
                    None,
                    (D,),
                    (D,),
                    _identity,
                ),
            ]
    return table


def _gpt2_table(c: ModelConfig) -> list[WeightSpec]:
    L, H, D, E, F, V, N = c.n_layers, c.n_heads, c.d_model, c.d_head, c.d_mlp, c.vocab_size, c.n_ctx

    def qkv_weight(i):  # Conv1D (D, 3D) = [q | k | v] column blocks -> (H, D, E)
        return lambda w: w[:, i * D : (i + 1) * D].reshape(D, H, E).transpose(1, 0, 2)

    def qkv_bias(i):  # (3D,) -> (H, E)
        return lambda a: a[i * D : (i + 1) * D].reshape(H, E)

    table = [
        WeightSpec("embed.W_E", "wte.weight", None, "W_E", (V, D), (V, D), _identity),
        WeightSpec("pos_embed.W_pos", "wpe.weight", None, "W_pos", (N, D), (N, D), _identity),
        WeightSpec("ln_final.w", "ln_f.weight", None, "ln_f.w", (D,), (D,), _identity),
        WeightSpec("ln_final.b", "ln_f.bias", None, "ln_f.b", (D,), (D,), _identity),
    ]
    for l in range(L):
        b, hf = f"blocks.{l}.", f"h.{l}."
        for i, n in enumerate("QKV"):
            table += [
                WeightSpec(
                    b + f"attn.W_{n}",
                    hf + "attn.c_attn.weight",
                    None,
                    b + f"attn.W_{n}",
                    (D, 3 * D),
                    (H, D, E),
                    qkv_weight(i),
                ),
                WeightSpec(
                    b + f"attn.b_{n}",
                    hf + "attn.c_attn.bias",
                    None,
                    b + f"attn.b_{n}",
                    (3 * D,),
                    (H, E),
                    qkv_bias(i),
                ),
            ]
        table += [
            WeightSpec(
                b + "attn.W_O",
                hf + "attn.c_proj.weight",
                None,
                b + "attn.W_O",
                (D, D),
                (H, E, D),
                lambda w: w.reshape(H, E, D),
            ),
            WeightSpec(
                b + "attn.b_O", hf + "attn.c_proj.bias", None, b + "attn.b_O", (D,), (D,), _identity
            ),
            WeightSpec(
                b + "mlp.W_in",
                hf + "mlp.c_fc.weight",
                None,
                b + "mlp.W_in",
                (D, F),
                (D, F),
                _identity,
            ),
            WeightSpec(
                b + "mlp.b_in", hf + "mlp.c_fc.bias", None, b + "mlp.b_in", (F,), (F,), _identity
            ),
            WeightSpec(
                b + "mlp.W_out",
                hf + "mlp.c_proj.weight",
                None,
                b + "mlp.W_out",
                (F, D),
                (F, D),
                _identity,
            ),
            WeightSpec(
                b + "mlp.b_out",
                hf + "mlp.c_proj.bias",
                None,
                b + "mlp.b_out",
                (D,),
                (D,),
                _identity,
            ),
        ]
        for ln, hf_ln in (("ln1", "ln_1"), ("ln2", "ln_2")):
            table += [
                WeightSpec(
                    b + f"{ln}.w",
                    hf + f"{hf_ln}.weight",
                    None,
                    b + f"{ln}.w",
                    (D,),
                    (D,),
                    _identity,
                ),
                WeightSpec(
                    b + f"{ln}.b", hf + f"{hf_ln}.bias", None, b + f"{ln}.b", (D,), (D,), _identity
                ),
            ]
    return table


@dataclass(frozen=True)
class TensorHeader:
    """What a checkpoint's header says about one tensor (read before any weight)."""

    shape: tuple[int, ...]  # NumPy order (GGUF: dims reversed)
    dtype: str  # storage type as the format names it: "F32", "BF16", "Q4_1", "float32", ...
    is_float: bool  # can be read as floating-point weights


def check_tensors(
    config: ModelConfig, fmt: str, headers: dict[str, TensorHeader], where: str, prefix: str = ""
) -> None:
    """Every tensor the table needs is in `headers`, with its checkpoint shape and a float dtype.

    Runs on headers only, before any weight is read; the config's layer count is first checked
    against the number of tensors, so a damaged count cannot make the table itself huge.
    """
    per_layer = 1 if fmt == "npz" else 2  # a layer has far more tensors than this in every format
    if config.n_layers * per_layer > len(headers):
        raise ModelFileError(
            f"{where}: the config says {config.n_layers} layers but the checkpoint holds only "
            f"{len(headers)} tensors: wrong config, or a damaged file (download it again)"
        )
    check_no_extra_layers(config, headers, where)
    for spec in weight_table(config, fmt):
        name = getattr(spec, fmt)
        if name is None:
            raise ModelFileError(f"{where}: format {fmt!r} has no tensor for {spec.ours}")
        header = headers.get(prefix + name)
        if header is None:
            raise ModelFileError(
                f"{where}: checkpoint has no tensor {prefix + name!r} (needed for {spec.ours}): "
                "not a complete checkpoint of this architecture"
            )
        expected = spec.checkpoint_shape(fmt)
        if header.shape != expected:
            raise ModelFileError(
                f"{where}: tensor {prefix + name} has shape {header.shape}, "
                f"the config needs {expected}: the config and the weights do not belong "
                "together (or the file is damaged)"
            )
        if not header.is_float:
            raise ModelFileError(
                f"{where}: tensor {prefix + name} is stored as {header.dtype}, "
                "not as floating point"
            )


# The layer index in a checkpoint tensor name: GGUF blk.3., HF model.layers.3. and GPT-2 h.3.,
# the .npz export's blocks.3.
LAYER_INDEX = re.compile(r"(?:^|\.)(?:blk|layers|h|blocks)\.(\d+)\.")


def check_no_extra_layers(config: ModelConfig, headers: dict[str, TensorHeader], where: str):
    """No tensor belongs to a layer past the config's count (a damaged or edited layer count
    would otherwise drop the last layers silently and give a different model)."""
    found = [(int(m.group(1)), name) for name in headers if (m := LAYER_INDEX.search(name))]
    if not found:
        return
    top, name = max(found)
    if top >= config.n_layers:
        raise ModelFileError(
            f"{where}: the config says {config.n_layers} layers but the checkpoint holds tensors "
            f"of layer {top} ({name}): the layer count is wrong or the file is damaged "
            "(download it again)"
        )


def check_finite(value: np.ndarray, name: str, where: str, source_finite: bool = True) -> None:
    """A weight must hold only finite numbers: ModelFileError naming the tensor otherwise."""
    if np.isfinite(value).all():
        return
    bad = int(value.size - np.count_nonzero(np.isfinite(value)))
    why = (
        "the file is damaged: download it again"
        if not source_finite
        else (
            f"finite in the file but too large for {value.dtype}: load it as float64 (generate "
            "and attention --dtype float64, or load_model(..., dtype='float64'); the other "
            "commands run float32 only)"
        )
    )
    raise ModelFileError(
        f"{where}: tensor {name} holds {bad} non-finite values (NaN or Inf) of {value.size}; {why}"
    )


def build_params(
    config: ModelConfig, fmt: str, read: Callable[[str], np.ndarray], dtype, where: str
) -> dict:
    """Read every parameter of the table through read(name) and return nested params.

    Call `check_tensors` on the headers first: every name exists with its checkpoint shape, so
    `read` (which returns the checkpoint array, any float dtype) cannot meet a surprise. Each
    array is converted, cast to `dtype` and made contiguous before the next one is read.
    """
    flat = {}
    for spec in weight_table(config, fmt):
        name = getattr(spec, fmt)
        with np.errstate(all="ignore"):  # damaged data is reported below, not as warnings
            source = read(name)
            assert tuple(source.shape) == spec.checkpoint_shape(fmt), (
                f"{where}: {name} read as {source.shape}"
            )
            value = source if fmt == "npz" else spec.to_ours(source)
            assert value.shape == spec.shape, (
                f"{spec.ours}: converted to {value.shape}, expected {spec.shape}"
            )
            flat[spec.ours] = np.ascontiguousarray(value, dtype=dtype)
        check_finite(flat[spec.ours], name, where, np.isfinite(source).all())
        del source, value
    if config.tied_embeddings:
        flat["unembed.W_U"] = flat["embed.W_E"].T  # (D, V) view: no copy
    return unflatten_params(flat)
