"""Load a model from a known name, a Hugging Face folder, a GGUF file or a .npz export.

    load_model("smollm2")                 fetched once into the cache (see fetch.py), then GGUF
    load_model("path/to/hf_folder")       config.json + model.safetensors (or a sharded index)
    load_model("model.gguf")              llama architecture; quantized tensors are dequantized
    load_model("gpt2.npz")                the export of scripts/export_gpt2_npz.py

Every format goes through ONE table per family (`weight_table`) that names, for each of our
parameters, the checkpoint tensor it comes from in each format, the checkpoint shape (asserted)
and the conversion to our layout (shape asserted again). Weights are read one tensor at a time
and cast once to the model dtype (float32 by default), so peak memory stays near the size of
the float32 weights: safetensors are memory-mapped, GGUF tensors are dequantized one by one.

Layouts: HF Llama and GGUF store torch Linear weights as (out, in) (GGUF lists its dimensions
fastest first; the reader reverses them); HF GPT-2 stores Conv1D weights as (in, out).
llama.cpp's converter permutes the rows of the Q and K projections so that rotary pairs are
adjacent (x[2i], x[2i+1]); we rotate pairs (x[i], x[i + E/2]) as HF does, so the loader
undoes that permutation (`unpermute_rotary_rows`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from cel_numpy.cli import UserError
from cel_numpy.models.config import ConfigError, ModelConfig
from cel_numpy.models.transformer import unflatten_params

KNOWN_NAMES = ("smollm2",)  # names load_model fetches (cel_numpy.models.fetch)

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


def weight_table(config: ModelConfig, fmt: str) -> list[WeightSpec]:
    """Every parameter of `config`'s model, with its source in format fmt ("hf", "gguf", "npz")."""
    if config.family == "gpt2":
        return _gpt2_table(config)
    return _llama_table(config, fmt)


def _linear_heads(n: int, E: int, D: int):
    """torch Linear (n*E, D) -> (n, D, E): head h owns output rows h*E:(h+1)*E."""
    return lambda w: w.reshape(n, E, D).transpose(0, 2, 1)


def _llama_table(c: ModelConfig, fmt: str) -> list[WeightSpec]:
    L, H, G, D, E, F, V = c.n_layers, c.n_heads, c.n_kv_heads, c.d_model, c.d_head, c.d_mlp, c.vocab_size
    gguf = fmt == "gguf"
    unperm_q = (lambda w: unpermute_rotary_rows(w, H)) if gguf else _identity
    unperm_k = (lambda w: unpermute_rotary_rows(w, G)) if gguf else _identity
    q_heads, kv_heads = _linear_heads(H, E, D), _linear_heads(G, E, D)
    table = [
        WeightSpec("embed.W_E", "model.embed_tokens.weight", "token_embd.weight", None, (V, D), (V, D), _identity),
        WeightSpec("ln_final.w", "model.norm.weight", "output_norm.weight", None, (D,), (D,), _identity),
    ]
    if not c.tied_embeddings:
        table.append(WeightSpec("unembed.W_U", "lm_head.weight", "output.weight", None, (V, D), (D, V), np.transpose))
    for l in range(L):
        b, hf, gg = f"blocks.{l}.", f"model.layers.{l}.", f"blk.{l}."
        table += [
            WeightSpec(b + "ln1.w", hf + "input_layernorm.weight", gg + "attn_norm.weight", None, (D,), (D,), _identity),
            WeightSpec(b + "attn.W_Q", hf + "self_attn.q_proj.weight", gg + "attn_q.weight", None,
                       (H * E, D), (H, D, E), lambda w: q_heads(unperm_q(w))),
            WeightSpec(b + "attn.W_K", hf + "self_attn.k_proj.weight", gg + "attn_k.weight", None,
                       (G * E, D), (G, D, E), lambda w: kv_heads(unperm_k(w))),
            WeightSpec(b + "attn.W_V", hf + "self_attn.v_proj.weight", gg + "attn_v.weight", None,
                       (G * E, D), (G, D, E), kv_heads),
            WeightSpec(b + "attn.W_O", hf + "self_attn.o_proj.weight", gg + "attn_output.weight", None,
                       (D, H * E), (H, E, D), lambda w: w.T.reshape(H, E, D)),
            WeightSpec(b + "ln2.w", hf + "post_attention_layernorm.weight", gg + "ffn_norm.weight", None,
                       (D,), (D,), _identity),
            WeightSpec(b + "mlp.W_gate", hf + "mlp.gate_proj.weight", gg + "ffn_gate.weight", None,
                       (F, D), (D, F), np.transpose),
            WeightSpec(b + "mlp.W_in", hf + "mlp.up_proj.weight", gg + "ffn_up.weight", None, (F, D), (D, F), np.transpose),
            WeightSpec(b + "mlp.W_out", hf + "mlp.down_proj.weight", gg + "ffn_down.weight", None,
                       (D, F), (F, D), np.transpose),
        ]
        if c.attn_bias:
            table += [
                WeightSpec(b + "attn.b_Q", hf + "self_attn.q_proj.bias", gg + "attn_q.bias", None, (H * E,), (H, E),
                           lambda a: (unperm_q(a[:, None])[:, 0]).reshape(H, E)),
                WeightSpec(b + "attn.b_K", hf + "self_attn.k_proj.bias", gg + "attn_k.bias", None, (G * E,), (G, E),
                           lambda a: (unperm_k(a[:, None])[:, 0]).reshape(G, E)),
                WeightSpec(b + "attn.b_V", hf + "self_attn.v_proj.bias", gg + "attn_v.bias", None, (G * E,), (G, E),
                           lambda a: a.reshape(G, E)),
                WeightSpec(b + "attn.b_O", hf + "self_attn.o_proj.bias", gg + "attn_output.bias", None, (D,), (D,),
                           _identity),
            ]
        if c.mlp_bias:
            table += [
                WeightSpec(b + "mlp.b_gate", hf + "mlp.gate_proj.bias", gg + "ffn_gate.bias", None, (F,), (F,), _identity),
                WeightSpec(b + "mlp.b_in", hf + "mlp.up_proj.bias", gg + "ffn_up.bias", None, (F,), (F,), _identity),
                WeightSpec(b + "mlp.b_out", hf + "mlp.down_proj.bias", gg + "ffn_down.bias", None, (D,), (D,), _identity),
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
                WeightSpec(b + f"attn.W_{n}", hf + "attn.c_attn.weight", None, b + f"attn.W_{n}",
                           (D, 3 * D), (H, D, E), qkv_weight(i)),
                WeightSpec(b + f"attn.b_{n}", hf + "attn.c_attn.bias", None, b + f"attn.b_{n}",
                           (3 * D,), (H, E), qkv_bias(i)),
            ]
        table += [
            WeightSpec(b + "attn.W_O", hf + "attn.c_proj.weight", None, b + "attn.W_O", (D, D), (H, E, D),
                       lambda w: w.reshape(H, E, D)),
            WeightSpec(b + "attn.b_O", hf + "attn.c_proj.bias", None, b + "attn.b_O", (D,), (D,), _identity),
            WeightSpec(b + "mlp.W_in", hf + "mlp.c_fc.weight", None, b + "mlp.W_in", (D, F), (D, F), _identity),
            WeightSpec(b + "mlp.b_in", hf + "mlp.c_fc.bias", None, b + "mlp.b_in", (F,), (F,), _identity),
            WeightSpec(b + "mlp.W_out", hf + "mlp.c_proj.weight", None, b + "mlp.W_out", (F, D), (F, D), _identity),
            WeightSpec(b + "mlp.b_out", hf + "mlp.c_proj.bias", None, b + "mlp.b_out", (D,), (D,), _identity),
        ]
        for ln, hf_ln in (("ln1", "ln_1"), ("ln2", "ln_2")):
            table += [
                WeightSpec(b + f"{ln}.w", hf + f"{hf_ln}.weight", None, b + f"{ln}.w", (D,), (D,), _identity),
                WeightSpec(b + f"{ln}.b", hf + f"{hf_ln}.bias", None, b + f"{ln}.b", (D,), (D,), _identity),
            ]
    return table


def build_params(config: ModelConfig, fmt: str, read: Callable[[str], np.ndarray], dtype, where: str) -> dict:
    """Read every parameter of the table through read(name) and return nested params.

    `read` returns the checkpoint array (any float dtype, possibly memory-mapped). Each array is
    converted, cast to `dtype` and made contiguous before the next one is read.
    """
    flat = {}
    for spec in weight_table(config, fmt):
        name = getattr(spec, fmt)
        if name is None:
            raise UserError(f"{where}: format {fmt!r} has no tensor for {spec.ours}")
        source = read(name)
        expected_source = spec.source_shape if fmt != "npz" else (spec.npz_shape or spec.shape)
        if tuple(source.shape) != expected_source:
            raise UserError(f"{where}: tensor {name} has shape {tuple(source.shape)}, expected {expected_source}")
        value = source if fmt == "npz" else spec.to_ours(source)
        assert value.shape == spec.shape, f"{spec.ours}: converted to {value.shape}, expected {spec.shape}"
        flat[spec.ours] = np.ascontiguousarray(value, dtype=dtype)
        del source, value
    if config.tied_embeddings:
        flat["unembed.W_U"] = flat["embed.W_E"].T  # (D, V) view: no copy
    return unflatten_params(flat)


# --------------------------------------------------------------------------- entry point


def load_model(source, *, dtype=np.float32):
    """Load a Model from a known name ("smollm2"), a HF folder, a .gguf or a .npz file.

    dtype: np.float32 (default, inference) or np.float64 (parity checks, gradients).
    """
    from cel_numpy.models.model import Model

    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise UserError(f"dtype must be float32 or float64, got {dtype}")
    path = resolve_source(source)
    if path.is_dir():
        params, config, tokenizer = load_hf_folder(path, dtype)
    elif path.suffix == ".gguf":
        from cel_numpy.models.gguf_loader import load_gguf

        params, config, tokenizer = load_gguf(path, dtype)
    elif path.suffix == ".npz":
        params, config, tokenizer = load_npz(path, dtype)
    else:
        raise UserError(f"don't know how to load {path}: expected a folder, a .gguf or a .npz file")
    return Model(params, config, tokenizer, source=str(path))


def resolve_source(source) -> Path:
    """A known name -> its fetched file; anything else must be an existing path."""
    if isinstance(source, str) and source in KNOWN_NAMES:
        from cel_numpy.models.fetch import FetchError, fetch

        try:
            return Path(fetch(source))
        except FetchError as err:
            raise UserError(f"cannot fetch {source!r}: {err}") from None
    path = Path(source).expanduser()
    if not path.exists():
        raise UserError(
            f"model {str(source)!r} not found: give a known name ({', '.join(KNOWN_NAMES)}), "
            "a Hugging Face folder, a .gguf or a .npz file"
        )
    return path


# --------------------------------------------------------------------------- Hugging Face folders


def read_hf_config(folder: Path) -> ModelConfig:
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise UserError(f"{folder}: no config.json (not a Hugging Face model folder)")
    try:
        hf = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as err:
        raise UserError(f"{cfg_path}: invalid JSON ({err})") from None
    try:
        return ModelConfig.from_hf_config(hf, name=str(folder))
    except ConfigError as err:
        raise UserError(f"{cfg_path}: {err}") from None
    except KeyError as err:
        raise UserError(f"{cfg_path}: missing key {err}") from None


def safetensors_files(folder: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it (single file or sharded index)."""
    single = folder / "model.safetensors"
    index = folder / "model.safetensors.index.json"
    if single.is_file():
        return dict.fromkeys(_safetensors_keys(single), single)
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {name: folder / shard for name, shard in weight_map.items()}
    raise UserError(f"{folder}: no model.safetensors or model.safetensors.index.json")


def _open_safetensors(path: Path):
    from safetensors import safe_open

    try:
        return safe_open(str(path), framework="numpy")
    except Exception as err:  # the Rust reader raises its own SafetensorError
        raise UserError(f"{path}: unreadable safetensors file ({err}); it may be truncated: download it again") from None


def _safetensors_keys(path: Path) -> list[str]:
    with _open_safetensors(path) as f:
        return list(f.keys())


def load_hf_folder(folder: Path, dtype):
    """HF folder -> (params, config, tokenizer or None)."""
    config = read_hf_config(folder)
    files = safetensors_files(folder)
    prefix = "transformer." if config.family == "gpt2" and any(k.startswith("transformer.") for k in files) else ""
    handles: dict[Path, object] = {}

    def read(name: str) -> np.ndarray:
        key = prefix + name
        if key not in files:
            raise UserError(f"{folder}: checkpoint has no tensor {key!r}")
        path = files[key]
        if path not in handles:
            handles[path] = _open_safetensors(path).__enter__()
        try:
            return handles[path].get_tensor(key)
        except Exception as err:
            raise UserError(f"{path}: cannot read {key} ({err}); the file may be truncated: download it again") from None

    try:
        params = build_params(config, "hf", read, dtype, str(folder))
    finally:
        for handle in handles.values():
            handle.__exit__(None, None, None)
    return params, config, load_folder_tokenizer(folder)


def load_folder_tokenizer(folder: Path):
    """tokenizer.json, else vocab.json + merges.txt, else None."""
    from cel_numpy.models.tokenizer import BPETokenizer

    if (folder / "tokenizer.json").is_file():
        return BPETokenizer.from_hf_tokenizer_json(folder / "tokenizer.json")
    if (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file():
        return BPETokenizer.from_vocab_merges(folder / "vocab.json", folder / "merges.txt")
    return None


# --------------------------------------------------------------------------- .npz export


def load_npz(path: Path, dtype):
    """The export of scripts/export_gpt2_npz.py -> (params, config, tokenizer or None).

    A tokenizer is picked up from OUT_STEM.vocab.json + OUT_STEM.merges.txt next to the file.
    """
    try:
        archive = np.load(path, allow_pickle=False)
    except Exception as err:
        raise UserError(f"{path}: unreadable .npz file ({err})") from None
    with archive:
        if "config_json" not in archive.files:
            raise UserError(f"{path}: no config_json entry (not a cel-numpy export)")
        cfg = json.loads(str(archive["config_json"]))
        try:
            config = ModelConfig.from_dict({**cfg, "name": str(path)})
        except (ConfigError, TypeError) as err:
            raise UserError(f"{path}: bad config_json ({err})") from None
        if config.family != "gpt2":
            raise UserError(f"{path}: the .npz export holds gpt2 models, config says {config.family!r}")

        def read(name: str) -> np.ndarray:
            if name not in archive.files:
                raise UserError(f"{path}: no array {name!r}")
            try:
                return archive[name]
            except Exception as err:
                raise UserError(f"{path}: cannot read {name} ({err}); the file may be truncated") from None

        params = build_params(config, "npz", read, dtype, str(path))
    tokenizer = None
    vocab, merges = path.with_name(f"{path.stem}.vocab.json"), path.with_name(f"{path.stem}.merges.txt")
    if vocab.is_file() and merges.is_file():
        from cel_numpy.models.tokenizer import BPETokenizer

        tokenizer = BPETokenizer.from_vocab_merges(vocab, merges)
    return params, config, tokenizer
