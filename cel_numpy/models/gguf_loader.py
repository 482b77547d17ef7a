"""GGUF files (llama, qwen2 and gemma3 architectures) -> params, config, tokenizer.

The `gguf` package reads the header and memory-maps the tensor data; `gguf.quants.dequantize`
turns Q4_1, Q8_0, F16, ... blocks into float32. We dequantize one tensor at a time, in chunks
of rows written into a preallocated array of the model dtype, so no whole-tensor temporaries
pile up (peak memory stays close to the float32 weights). The tensor bytes are read with plain file
reads rather than through the reader's memory map, whose touched pages would stay resident.

GGUF lists tensor dimensions fastest first: ne = (in, out) for a torch (out, in) Linear. The
reader's `data` already has NumPy order (out, in[bytes]); we rebuild the element shape by
reversing `tensor.shape`. Tensor names and layouts are mapped by the shared table in
weights.py, which also undoes llama.cpp's Q/K row permutation (llama files only: llama.cpp
writes qwen2's Q/K rows unpermuted, in Hugging Face's rotate-half order).

Damaged files: the reader's exceptions of every kind become one `ModelFileError`. Two guards in
the reader: a metadata array whose length cannot fit in the rest of the file is refused before
the reader loops over it (past the end it reads empty views without advancing, so it could loop
for as long as the bogus length says), and a tensor whose bytes run past the end of the file is
named (a cut download). Then the metadata and every needed tensor's shape are checked against
each other (`weights.check_tensors`), before any weight is read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from cel_numpy.errors import ModelFileError
from cel_numpy.models.config import ConfigError, ModelConfig
from cel_numpy.models.weights import TensorHeader, build_params, check_tensors

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "gemma3")
GEMMA3_GLOBAL_EVERY = 6  # llama.cpp and transformers: layers 5, 11, 17, ... attend globally
CHUNK_ELEMENTS = 1 << 20  # dequantize ~1M weights (4 MB of float32) at a time
HINT = (
    "the file may be truncated or damaged: delete it and download it again "
    "(cel-numpy fetch NAME, for a known model)"
)


# Plausible header sizes, checked before the reader loops: every metadata item becomes a few
# Python objects (about 650 bytes each), so a small file of empty strings would otherwise need
# gigabytes. Gemma 3 270M, the largest header here: 786,468 items, 262,144 in its largest array.
MAX_ARRAY_ITEMS = 1 << 20  # items in one metadata array (a vocabulary of a million tokens)
MAX_METADATA_ITEMS = 1 << 21  # items in all metadata arrays together
MAX_FIELDS = 1 << 16  # metadata keys
MAX_TENSORS = 1 << 16  # tensors (the largest published models have a few thousand)


class _Refused(ValueError):
    """A header problem whose message already says what is wrong and what to do."""


# every other GGML type (F32, F16, Q4_1, IQ2_XXS, ...) holds weights
INTEGER_TYPES = (
    "I8",
    "I16",
    "I32",
    "I64",
)


def _reader_class():
    """gguf.GGUFReader, reading its header through a plain ndarray view of the file mapping.

    GGUFReader slices an np.memmap once per metadata item (~250k slices for a 49k-token
    vocabulary) and the memmap subclass's per-slice bookkeeping dominates: a plain ndarray
    view of the same mapping (no copy) opens a large-vocabulary file several times faster.
    """
    from gguf import GGUFReader, GGUFValueType

    min_item_bytes = {GGUFValueType.STRING: 8, GGUFValueType.ARRAY: 12}  # length fields

    class FastGGUFReader(GGUFReader):
        _metadata_items = 0

        @property
        def data(self):
            return self._data

        @data.setter
        def data(self, value):
            self._data = value.view(np.ndarray) if isinstance(value, np.memmap) else value

        def _build_fields(self, offs, count):
            _refuse_count(int(count), MAX_FIELDS, "metadata keys")
            return super()._build_fields(offs, count)

        def _build_tensor_info(self, offs, count):
            _refuse_count(int(count), MAX_TENSORS, "tensors")
            return super()._build_tensor_info(offs, count)

        def _build_tensors(self, start_offs, fields):
            """Refuse a tensor whose bytes run past the end of the file (a cut download), start
            off the file's alignment, or share bytes with another tensor, by name."""
            from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

            spans = []
            for field in fields:
                _, name, _, dims, raw_dtype, offset = field.parts
                try:
                    qtype = GGMLQuantizationType(int(raw_dtype[0]))
                    block, type_size = GGML_QUANT_SIZES[qtype]
                except (ValueError, KeyError):
                    raise _Refused(
                        f"tensor {bytes(name).decode(errors='replace')} has tensor type "
                        f"{int(raw_dtype[0])}, which the installed gguf package does not know: "
                        "upgrade gguf (pip install -U gguf) or convert the file to a known type"
                    ) from None
                # Python ints: no overflow
                n_bytes = math.prod(int(d) for d in dims) * type_size // block
                text = bytes(name).decode(errors="replace")
                end = int(start_offs) + int(offset[0]) + n_bytes
                if end > len(self._data):
                    raise ValueError(
                        f"tensor {text} ends at byte {end}, "
                        f"past the end of the file ({len(self._data)} bytes)"
                    )
                if int(offset[0]) % int(self.alignment):
                    raise ValueError(
                        f"tensor {text} starts at data offset {int(offset[0])}, not a multiple "
                        f"of the file's alignment ({int(self.alignment)})"
                    )
                if n_bytes:
                    spans.append((end - n_bytes, end, text))
            spans.sort()
            for (_, end_a, a), (begin_b, _, b) in zip(spans, spans[1:]):
                if begin_b < end_a:
                    raise ValueError(f"tensors {a} and {b} share bytes {begin_b} to {end_a}")
            return super()._build_tensors(start_offs, fields)

        def _get_field_parts(self, orig_offs, raw_type):
            """Refuse an array whose length cannot fit in the rest of the file (before looping
            over it)."""
            if int(raw_type) == GGUFValueType.ARRAY:
                item_type = self._get(orig_offs, np.uint32)
                length = self._get(orig_offs + 4, np.uint64)
                if len(item_type) and len(length):
                    kind = int(item_type[0])
                    scalar = self.gguf_scalar_to_np.get(kind)
                    item_bytes = (
                        np.dtype(scalar).itemsize
                        if scalar is not None
                        else min_item_bytes.get(kind, 1)
                    )
                    if int(length[0]) * item_bytes > len(self.data) - orig_offs:
                        raise ValueError(
                            f"metadata array at byte {orig_offs} claims {int(length[0])} items, "
                            "more than the file holds"
                        )
                    _refuse_count(int(length[0]), MAX_ARRAY_ITEMS, "items in one metadata array")
                    self._metadata_items += int(length[0])
                    _refuse_count(self._metadata_items, MAX_METADATA_ITEMS, "metadata items")
            return super()._get_field_parts(orig_offs, raw_type)

    return FastGGUFReader


def _refuse_count(count: int, limit: int, what: str) -> None:
    if count > limit:
        raise _Refused(
            f"the header declares {count:,} {what}, more than any model has (at most "
            f"{limit:,} are read): not a model file, or {HINT}"
        )


def open_gguf(path: Path):
    """A gguf.GGUFReader, or a one-line ModelFileError for a damaged or truncated file."""
    try:
        reader = _reader_class()(str(path))
    except _Refused as err:
        raise ModelFileError(f"{path}: {err}") from None
    # the reader raises ValueError, IndexError, KeyError, UnicodeDecodeError, ...
    except Exception as err:
        detail = str(err).splitlines()[0] if str(err) else ""
        if isinstance(err, IndexError):  # the reader indexes an empty view: a field past the end
            detail = "the header runs past the end of the file"
        raise ModelFileError(
            f"{path}: unreadable GGUF file ({type(err).__name__}: {detail}); {HINT}"
        ) from None
    return reader  # every tensor's bytes lie inside the file: checked in _build_tensors


def tensor_headers(reader) -> dict[str, TensorHeader]:
    """name -> shape (NumPy order) and storage type, from the header."""
    return {
        t.name: TensorHeader(
            tuple(int(d) for d in reversed(t.shape.tolist())),
            t.tensor_type.name,
            t.tensor_type.name not in INTEGER_TYPES,
        )
        for t in reader.tensors
    }


def _field(reader, key: str, default=KeyError):
    from cel_numpy.models.tokenizer import gguf_field

    return gguf_field(reader, key, default)


def _int_field(reader, key: str, default=KeyError) -> int:
    """An integer metadata value (a count or a size): a float or a bool there is refused, not
    rounded (2.7 layers is a damaged file, not 2)."""
    value = _field(reader, key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _BadField(f"{key} must be an integer, got {value!r} ({type(value).__name__})")
    return value


class _BadField(ValueError):
    """A metadata value of the wrong type (reported with the file's path)."""


def _float32_field(value) -> float:
    """GGUF stores these as float32: 1e-5 reads back as 9.99999975e-06; keep the short decimal."""
    return float(str(np.float32(value)))


def read_gguf_config(reader, path: Path) -> ModelConfig:
    """Config from the GGUF metadata (`{arch}.block_count`, `{arch}.attention.head_count`, ...)."""
    try:
        arch = _field(reader, "general.architecture", None)
    except (ValueError, IndexError, TypeError):  # a damaged string
        arch = "<unreadable>"
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelFileError(
            f"{path}: GGUF architecture {arch!r} is not supported; supported: "
            f"{', '.join(SUPPORTED_ARCHITECTURES)} (use a GGUF file or Hugging Face folder of one)"
        )
    tensors = {t.name: t for t in reader.tensors}
    if "token_embd.weight" not in tensors or len(tensors["token_embd.weight"].shape) != 2:
        raise ModelFileError(
            f"{path}: no 2-D token_embd.weight tensor; not a complete {arch} GGUF file"
        )
    try:
        scaling = _field(reader, f"{arch}.rope.scaling.type", "none")
        if scaling not in ("none", None):
            raise ModelFileError(
                f"{path}: rope scaling {scaling!r} is not supported (plain rotary only)"
            )
        n_heads = _int_field(reader, f"{arch}.attention.head_count")
        d_model = _int_field(reader, f"{arch}.embedding_length")
        d_head = _int_field(reader, f"{arch}.attention.key_length", d_model // max(1, n_heads))
        rope_dims = _int_field(reader, f"{arch}.rope.dimension_count", d_head)
        if rope_dims != d_head:
            raise ModelFileError(
                f"{path}: partial rotary ({rope_dims} of {d_head} dims) is not supported"
            )
        config = ModelConfig(
            family="llama",
            n_layers=_int_field(reader, f"{arch}.block_count"),
            n_heads=n_heads,
            n_kv_heads=_int_field(reader, f"{arch}.attention.head_count_kv", n_heads),
            d_model=d_model,
            d_head=d_head,
            d_mlp=_int_field(reader, f"{arch}.feed_forward_length"),
            vocab_size=int(tensors["token_embd.weight"].shape[1]),  # ne = (D, V)
            n_ctx=_int_field(reader, f"{arch}.context_length", 2048),
            norm_eps=_float32_field(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon")),
            rope_base=_float32_field(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
            tied_embeddings="output.weight" not in tensors,
            attn_bias="blk.0.attn_output.bias" in tensors,
            qkv_bias="blk.0.attn_q.bias" in tensors and "blk.0.attn_output.bias" not in tensors,
            mlp_bias="blk.0.ffn_up.bias" in tensors,
            name=str(path),
            arch=arch,
        )
        if arch == "gemma3":
            config = _gemma3_fields(reader, config)
    except KeyError as err:
        raise ModelFileError(
            f"{path}: missing GGUF metadata ({err.args[0] if err.args else err}); {HINT}"
        ) from None
    except (ConfigError, _BadField) as err:
        raise ModelFileError(f"{path}: {err}") from None
    # a damaged value
    except (
        ValueError,
        TypeError,
        IndexError,
        OverflowError,
        ZeroDivisionError,
    ) as err:
        raise ModelFileError(
            f"{path}: unreadable GGUF metadata ({type(err).__name__}: {err}); {HINT}"
        ) from None
    return config


def _gemma3_fields(reader, config: ModelConfig) -> ModelConfig:
    """The Gemma 3 fields of a gemma3 GGUF (see config.py).

    The file states the sliding window; the layer pattern (every 6th layer global), the local
    rotary base (10k) and the query scale (1/sqrt(head size) for this size) are not stored:
    llama.cpp hard-codes them for gemma3 and transformers takes the same defaults. The norm
    weights in the file are already the multipliers 1 + w.
    """
    from cel_numpy.models.config import gemma3_layer_types

    types = gemma3_layer_types(config.n_layers, GEMMA3_GLOBAL_EVERY)
    return replace(
        config,
        mlp_act="gelu_tanh",
        embed_scale=math.sqrt(config.d_model),
        query_scale=float(config.d_head),
        qk_norm=True,
        sandwich_norms=True,
        local_layers=tuple(i for i, t in enumerate(types) if t == "sliding_attention"),
        sliding_window=int(_field(reader, "gemma3.attention.sliding_window")),
        rope_local_base=_float32_field(_field(reader, "gemma3.rope.freq_base_swa", 10000.0)),
    )


@dataclass(frozen=True)
class TensorInfo:
    """Where a tensor's bytes are and how to decode them (kept after the reader is dropped)."""

    name: str
    qtype: int  # GGMLQuantizationType value
    shape: tuple[int, ...]  # element shape, NumPy order: (out, in)
    row_items: int  # items per row in the file: elements (F32/F16) or bytes (quantized)
    item_dtype: np.dtype  # float32, float16, ... or uint8 for quantized blocks
    offset: int  # absolute byte offset in the file

    @classmethod
    def of(cls, tensor) -> TensorInfo:
        return cls(
            name=tensor.name,
            qtype=int(tensor.tensor_type),
            shape=tuple(int(d) for d in reversed(tensor.shape.tolist())),
            row_items=int(tensor.data.shape[-1]),
            item_dtype=tensor.data.dtype,
            offset=int(tensor.data_offset),
        )


def dequantize_from_file(f, info: TensorInfo, dtype) -> np.ndarray:
    """Read one tensor from open file `f` in chunks of rows and dequantize each into `dtype`.

    Plain reads, not the reader's memory map: a touched mapping would stay resident and count
    against the process (the whole ~100 MB file for SmolLM2), page cache does not.
    """
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    qtype = GGMLQuantizationType(info.qtype)
    out = np.empty(info.shape, dtype=dtype)
    out_rows = out.reshape(-1, info.shape[-1])  # (R, C) view
    n_rows = out_rows.shape[0]
    step = max(1, CHUNK_ELEMENTS // info.shape[-1])
    row_bytes = info.row_items * info.item_dtype.itemsize
    for start in range(0, n_rows, step):
        rows = min(step, n_rows - start)
        f.seek(info.offset + start * row_bytes)
        raw = np.fromfile(f, dtype=info.item_dtype, count=rows * info.row_items)
        if raw.size != rows * info.row_items:
            raise ModelFileError(
                f"{f.name}: tensor {info.name} is cut short; the file may be truncated: "
                "download it again"
            )
        out_rows[start : start + rows] = dequantize(raw.reshape(rows, info.row_items), qtype)
    return out


def dequantize_tensor(tensor, dtype) -> np.ndarray:
    """One gguf ReaderTensor -> array of `dtype` in NumPy order (dims reversed from GGUF's ne)."""
    with open(_filename(tensor), "rb") as f:
        return dequantize_from_file(f, TensorInfo.of(tensor), dtype)


def _filename(tensor) -> str:
    base = tensor.data
    while base is not None and not hasattr(base, "filename"):
        base = base.base
    if base is None:
        raise ValueError(f"tensor {tensor.name} is not backed by a file")
    return base.filename


def load_gguf(
    path: Path, dtype, check_config=lambda config: None, check_tokenizer=lambda t, config: None
):
    """GGUF file -> (params, config, tokenizer or None).

    Header first (config, tensor shapes and offsets, tokenizer), then the reader and its ~250k
    metadata objects are dropped before any weight is allocated; weights are read tensor by tensor.
    """
    reader = open_gguf(path)
    config = read_gguf_config(reader, path)
    check_config(config)
    check_tensors(config, "gguf", tensor_headers(reader), str(path))
    tokenizer = gguf_tokenizer(reader)
    check_tokenizer(tokenizer, config)
    infos = {t.name: TensorInfo.of(t) for t in reader.tensors}
    del reader

    from gguf import GGMLQuantizationType

    with open(path, "rb") as f:

        def read(name: str) -> np.ndarray:
            try:
                return dequantize_from_file(f, infos[name], dtype)
            # a type the gguf package cannot dequantize
            except (
                NotImplementedError,
                ValueError,
            ) as err:
                raise ModelFileError(
                    f"{path}: tensor {name} ({GGMLQuantizationType(infos[name].qtype).name}): {err}"
                ) from None

        params = build_params(config, "gguf", read, dtype, str(path))
    return params, config, tokenizer


def gguf_tokenizer(fields):
    """The tokenizer of a GGUF file's `tokenizer.*` fields, or None when it has none: byte-level
    BPE (tokenizer model 'gpt2') or SentencePiece-style BPE with byte fallback (model 'llama',
    Gemma: `sentencepiece.py`). `fields`: a GGUFReader, or the dict `tokenizer_fields` returns
    (the weight cache keeps it)."""
    names = fields if isinstance(fields, dict) else fields.fields
    if "tokenizer.ggml.tokens" not in names:
        return None
    from cel_numpy.models.tokenizer import BPETokenizer, gguf_field

    try:
        model = gguf_field(fields, "tokenizer.ggml.model", default="gpt2")
    except (ValueError, IndexError, TypeError, UnicodeDecodeError):
        model = None  # a damaged field: the constructor names the file and the problem
    if model == "llama":
        from cel_numpy.models.sentencepiece import SentencePieceTokenizer

        return SentencePieceTokenizer.from_gguf_fields(fields)
    return BPETokenizer.from_gguf_fields(fields)


def tokenizer_fields(path: Path) -> dict:
    """Every `tokenizer.*` field of a GGUF file, as plain values (JSON-safe)."""
    reader = open_gguf(path)
    return {k: _field(reader, k) for k in reader.fields if k.startswith("tokenizer.")}


def gguf_storage(path: Path) -> dict[str, int]:
    """Storage type name -> number of weights, read from the header only (for `inspect`)."""
    reader = open_gguf(path)
    counts: dict[str, int] = {}
    for t in reader.tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + int(t.n_elements)
    return counts
