"""GGUF files (llama architecture) -> params, config, tokenizer.

The `gguf` package reads the header and memory-maps the tensor data; `gguf.quants.dequantize`
turns Q4_1, Q8_0, F16, ... blocks into float32. We dequantize one tensor at a time, in chunks
of rows written into a preallocated array of the model dtype, so no whole-tensor temporaries
pile up (peak memory stays close to the float32 weights plus the mapped file).

GGUF lists tensor dimensions fastest first: ne = (in, out) for a torch (out, in) Linear. The
reader's `data` already has NumPy order (out, in[bytes]); we rebuild the element shape by
reversing `tensor.shape`. Tensor names and layouts are mapped by the shared table in
loaders.py, which also undoes llama.cpp's Q/K row permutation.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from cel_numpy.cli import UserError
from cel_numpy.models.config import ConfigError, ModelConfig
from cel_numpy.models.loaders import build_params

SUPPORTED_ARCHITECTURES = ("llama",)
CHUNK_ELEMENTS = 1 << 20  # dequantize ~1M weights (4 MB of float32) at a time


def _reader_class():
    """gguf.GGUFReader, reading its header through a plain ndarray view of the file mapping.

    GGUFReader slices an np.memmap once per metadata item (~250k slices for a 49k-token
    vocabulary) and the memmap subclass's per-slice bookkeeping dominates: a plain ndarray
    view of the same mapping (no copy) opens the SmolLM2 file ~2.5x faster.
    """
    from gguf import GGUFReader

    class FastGGUFReader(GGUFReader):
        @property
        def data(self):
            return self._data

        @data.setter
        def data(self, value):
            self._data = value.view(np.ndarray) if isinstance(value, np.memmap) else value

    return FastGGUFReader


def open_gguf(path: Path):
    """A gguf.GGUFReader, or a one-line UserError for a damaged or truncated file."""
    hint = "the file may be truncated or damaged: delete it and download it again (cel-numpy fetch smollm2)"
    try:
        reader = _reader_class()(str(path))
    except Exception as err:
        raise UserError(f"{path}: unreadable GGUF file ({type(err).__name__}: {err}); {hint}") from None
    size = os.path.getsize(path)
    for t in reader.tensors:
        if t.data_offset + t.n_bytes > size:
            raise UserError(f"{path}: tensor {t.name} extends past the end of the file; {hint}")
    return reader


def _field(reader, key: str, default=KeyError):
    from cel_numpy.models.tokenizer import gguf_field

    return gguf_field(reader, key, default)


def _float32_field(value) -> float:
    """GGUF stores these as float32: 1e-5 reads back as 9.99999975e-06; keep the short decimal."""
    return float(str(np.float32(value)))


def read_gguf_config(reader, path: Path) -> ModelConfig:
    """Config from the GGUF metadata (`{arch}.block_count`, `{arch}.attention.head_count`, ...)."""
    arch = _field(reader, "general.architecture", None)
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UserError(f"{path}: GGUF architecture {arch!r} is not supported; supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
    tensors = {t.name: t for t in reader.tensors}
    if "token_embd.weight" not in tensors:
        raise UserError(f"{path}: no token_embd.weight tensor")
    scaling = _field(reader, f"{arch}.rope.scaling.type", "none")
    if scaling not in ("none", None):
        raise UserError(f"{path}: rope scaling {scaling!r} is not supported (plain rotary only)")
    try:
        n_heads = int(_field(reader, f"{arch}.attention.head_count"))
        d_model = int(_field(reader, f"{arch}.embedding_length"))
        d_head = int(_field(reader, f"{arch}.attention.key_length", d_model // n_heads))
        rope_dims = int(_field(reader, f"{arch}.rope.dimension_count", d_head))
        if rope_dims != d_head:
            raise UserError(f"{path}: partial rotary ({rope_dims} of {d_head} dims) is not supported")
        config = ModelConfig(
            family="llama",
            n_layers=int(_field(reader, f"{arch}.block_count")),
            n_heads=n_heads,
            n_kv_heads=int(_field(reader, f"{arch}.attention.head_count_kv", n_heads)),
            d_model=d_model,
            d_head=d_head,
            d_mlp=int(_field(reader, f"{arch}.feed_forward_length")),
            vocab_size=int(tensors["token_embd.weight"].shape[1]),  # ne = (D, V)
            n_ctx=int(_field(reader, f"{arch}.context_length", 2048)),
            norm_eps=_float32_field(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon")),
            rope_base=_float32_field(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
            tied_embeddings="output.weight" not in tensors,
            attn_bias="blk.0.attn_q.bias" in tensors,
            mlp_bias="blk.0.ffn_up.bias" in tensors,
            name=str(path),
        )
    except KeyError as err:
        raise UserError(f"{path}: missing GGUF metadata ({err})") from None
    except ConfigError as err:
        raise UserError(f"{path}: {err}") from None
    return config


def dequantize_tensor(tensor, dtype) -> np.ndarray:
    """One ReaderTensor -> array of `dtype` in NumPy order (dims reversed from GGUF's ne)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))  # (out, in)
    out = np.empty(shape, dtype=dtype)
    out_rows = out.reshape(-1, shape[-1])  # (R, C) view
    src_rows = tensor.data.reshape(out_rows.shape[0], -1)  # (R, C) elements or (R, bytes)
    step = max(1, CHUNK_ELEMENTS // shape[-1])
    qtype = GGMLQuantizationType(tensor.tensor_type)
    for start in range(0, out_rows.shape[0], step):
        out_rows[start : start + step] = dequantize(src_rows[start : start + step], qtype)
    return out


def load_gguf(path: Path, dtype):
    """GGUF file -> (params, config, tokenizer or None)."""
    reader = open_gguf(path)
    config = read_gguf_config(reader, path)
    tensors = {t.name: t for t in reader.tensors}

    def read(name: str) -> np.ndarray:
        if name not in tensors:
            raise UserError(f"{path}: GGUF file has no tensor {name!r}")
        try:
            return dequantize_tensor(tensors[name], dtype)
        except NotImplementedError as err:
            raise UserError(f"{path}: tensor {name}: {err}") from None

    params = build_params(config, "gguf", read, dtype, str(path))
    tokenizer = None
    if "tokenizer.ggml.tokens" in reader.fields:
        from cel_numpy.models.tokenizer import BPETokenizer

        tokenizer = BPETokenizer.from_gguf_fields(reader)
    del reader, tensors
    return params, config, tokenizer


def gguf_storage(path: Path) -> dict[str, int]:
    """Storage type name -> number of weights, read from the header only (for `inspect`)."""
    reader = open_gguf(path)
    counts: dict[str, int] = {}
    for t in reader.tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + int(t.n_elements)
    return counts
