"""Load a model from a known name, a Hugging Face folder, a GGUF file or a .npz export.

    load_model("smollm2")                 fetched once into the cache (see fetch.py), then GGUF
    load_model("path/to/hf_folder")       config.json + model.safetensors (or a sharded index)
    load_model("model.gguf")              llama architecture; quantized tensors are dequantized
    load_model("gpt2.npz")                the export of scripts/export_gpt2_npz.py

Every format goes through ONE table per family (`weights.weight_table`) that names, for each of our
parameters, the checkpoint tensor it comes from in each format, the checkpoint shape (asserted)
and the conversion to our layout (shape asserted again). Weights are read one tensor at a time
and cast once to the model dtype (float32 by default), so peak memory stays near the size of
the float32 weights: safetensors tensors are read one by one with plain reads (BF16 widened to
float32 exactly), GGUF tensors are dequantized one by one.

Layouts: HF Llama and GGUF store torch Linear weights as (out, in) (GGUF lists its dimensions
fastest first; the reader reverses them); HF GPT-2 stores Conv1D weights as (in, out).
llama.cpp's converter permutes the rows of the Q and K projections so that rotary pairs are
adjacent (x[2i], x[2i+1]); we rotate pairs (x[i], x[i + E/2]) as HF does, so the loader
undoes that permutation (`weights.unpermute_rotary_rows`).

Bad files. Every problem with a file is a `ModelFileError` (cel_numpy.errors): one line that
starts with the file's path, says what is wrong and what to do. Files are checked cheaply before
any weight is read: the safetensors header is parsed here (length prefix, JSON, every tensor's
dtype, shape and byte range against the file's length), the GGUF header by the `gguf` reader
(guarded against lengths that run past the end), the .npz member headers by NumPy; then every
tensor the table needs must be present with the expected shape and a float dtype
(`weights.check_tensors`). Only then are weights read.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cel_numpy.errors import ModelFileError, OptionError
from cel_numpy.limits import as_path, read_json, require_regular_file
from cel_numpy.models import weight_cache as wc
from cel_numpy.models.config import ConfigError, ModelConfig
from cel_numpy.models.transformer import flatten_params, unflatten_params
from cel_numpy.models.weights import TensorHeader, build_params, check_tensors

# names load_model fetches (cel_numpy.models.fetch)
KNOWN_NAMES = ("smollm2", "qwen2.5-coder-0.5b", "gemma-3-270m")

# --------------------------------------------------------------------------- entry point


def load_model(
    source,
    *,
    dtype=np.float32,
    check_config: Callable[[ModelConfig], None] | None = None,
    check_tokenizer: Callable[[object, ModelConfig], None] | None = None,
    weight_cache: bool | None = None,
):
    """Load a Model from a known name ("smollm2"), a HF folder, a .gguf or a .npz file.

    dtype: np.float32 (default, inference) or np.float64 (parity checks, gradients).
    check_config(config), if given, runs once the configuration is known and before any weight
    is read: options that depend on the model (head specs, prompt lengths) fail there, cheaply.
    check_tokenizer(tokenizer or None, config), if given, runs once the tokenizer is loaded and
    before any weight is read: a prompt too long for the context fails there.
    weight_cache: None (default) maps the weights of a float32 GGUF model from the cache
    (`cel_numpy.models.weight_cache`: written on the first load, shared by every process, the
    arrays read-only), unless CEL_NUMPY_WEIGHT_CACHE=0; True: any format and dtype; False: never.
    """
    from cel_numpy.models.model import Model

    if dtype is None:  # np.dtype(None) is float64: say which
        raise OptionError("dtype must be float32 or float64, got None")
    try:
        dtype = np.dtype(dtype)
    except TypeError:
        raise OptionError(f"dtype must be float32 or float64, got {dtype!r}") from None
    if dtype not in (np.float32, np.float64):
        raise OptionError(f"dtype must be float32 or float64, got {dtype}")
    check = check_config or (lambda config: None)
    check_tok = check_tokenizer or (lambda tokenizer, config: None)
    path = resolve_source(source)
    if not path.is_dir():
        require_regular_file(path, "model file")  # a FIFO would block the first read forever
    entry = _cache_entry(path, dtype, weight_cache)
    hit = None if entry is None else wc.read_entry(entry, dtype, check)
    if hit is not None:
        flat, config, extra = hit
        tokenizer = _tokenizer_of(path, extra)
        check_tok(tokenizer, config)
        model = Model(unflatten_params(flat), config, tokenizer, source=str(path))
        model.weight_cache = entry
        return model
    params, config, tokenizer = _load_file(path, dtype, check, check_tok)
    if entry is not None and config.n_params() * dtype.itemsize >= _min_bytes(weight_cache):
        extra = {}
        if path.suffix == ".gguf":
            from cel_numpy.models.gguf_loader import tokenizer_fields

            extra["gguf_tokenizer"] = tokenizer_fields(path)
        mapped = wc.write_entry(entry, flatten_params(params), config, _format(path), extra)
        if mapped is not None:
            params = unflatten_params(mapped)
        else:
            entry = None
    else:
        entry = None
    model = Model(params, config, tokenizer, source=str(path))
    model.weight_cache = entry
    return model


class _ConfigRead(Exception):
    """Raised by the checks of `read_model_config` and `read_weightless_model` to stop
    `load_model` before any weight is read."""

    def __init__(self, config: ModelConfig, tokenizer=None):
        super().__init__("config read")
        self.config = config
        self.tokenizer = tokenizer


def read_model_config(source) -> ModelConfig:
    """The ModelConfig of a known name, HF folder, .gguf or .npz file, without reading any
    weight (what `load_model` knows when it calls check_config)."""

    def stop(config: ModelConfig) -> None:
        raise _ConfigRead(config)

    try:
        load_model(source, check_config=stop, weight_cache=False)
    except _ConfigRead as done:
        return done.config
    raise RuntimeError(f"{source}: load_model returned without reading a config")  # cannot


class _NoWeights(dict):
    """The params of `read_weightless_model`'s Model: any weight read is one clear error."""

    def __missing__(self, key):
        raise RuntimeError(
            f"weight {key!r}: this Model was read without its weights (read_weightless_model); "
            "use load_model for a forward"
        )


def read_weightless_model(source, check_config: Callable[[ModelConfig], None] | None = None):
    """A Model holding the configuration and tokenizer (and chat template) of a known name, HF
    folder, .gguf or .npz file and no weights (reading one is a RuntimeError): what the checks
    of prompts and their token counts need, without the time and memory of the weights
    (`cel-numpy localize --plan`). check_config as for `load_model`."""
    from cel_numpy.models.model import Model

    def stop(tokenizer, config: ModelConfig) -> None:
        raise _ConfigRead(config, tokenizer)

    path = resolve_source(source)  # once: a known name's file is checked (hashed) here
    try:
        load_model(path, check_config=check_config, check_tokenizer=stop, weight_cache=False)
    except _ConfigRead as done:
        return Model(_NoWeights(), done.config, done.tokenizer, source=str(path))
    raise RuntimeError(f"{source}: load_model returned without reading a tokenizer")  # cannot


def _cache_entry(path: Path, dtype, weight_cache: bool | None) -> Path | None:
    """The weight cache file for this load, or None when the cache is not used (load_model)."""
    if weight_cache is None:
        use = path.suffix == ".gguf" and dtype == np.float32 and wc.enabled_by_environment()
    else:
        use = bool(weight_cache)
    return wc.cache_entry(path, model_files(path), dtype) if use else None


def _min_bytes(weight_cache: bool | None) -> int:
    return wc.MIN_CACHE_BYTES if weight_cache is None else 0


def _format(path: Path) -> str:
    """The weight table's name of a file's format."""
    return "hf" if path.is_dir() else path.suffix.lstrip(".")


def _tokenizer_of(path: Path, extra: dict):
    """The tokenizer of a model whose weights come from the cache: a GGUF file's from the fields
    kept in the cache (no header parse), the others from their tokenizer files as usual."""
    if path.suffix == ".gguf":
        from cel_numpy.models.gguf_loader import gguf_tokenizer

        return gguf_tokenizer(extra["gguf_tokenizer"])
    if path.is_dir():
        return load_folder_tokenizer(path)
    return npz_tokenizer(path)


def _load_file(path: Path, dtype, check, check_tok):
    """(params, config, tokenizer) read from the model file itself."""
    if path.is_dir():
        params, config, tokenizer = load_hf_folder(path, dtype, check, check_tok)
    elif path.suffix == ".gguf":
        from cel_numpy.models.gguf_loader import load_gguf

        params, config, tokenizer = load_gguf(path, dtype, check, check_tok)
    elif path.suffix == ".npz":
        params, config, tokenizer = load_npz(path, dtype, check, check_tok)
    else:
        raise ModelFileError(
            f"{path}: don't know how to load this file: expected a Hugging Face folder, "
            "a .gguf or a .npz file"
        )
    return params, config, tokenizer


def resolve_source(source) -> Path:
    """A known name -> its fetched file; anything else must be an existing path."""
    if isinstance(source, str) and source in KNOWN_NAMES:
        from cel_numpy.models.fetch import FetchError, fetch

        try:
            return Path(fetch(source))
        except FetchError as err:
            raise FetchError(f"cannot fetch {source!r}: {err}") from None
    path = as_path(source, "the model (--model)")
    if not path.exists():
        raise OptionError(
            f"model {str(source)!r} not found: give a known name ({', '.join(KNOWN_NAMES)}), "
            "a Hugging Face folder, a .gguf or a .npz file"
        )
    return path


# --------------------------------------------------------------------------- Hugging Face folders


def read_hf_config(folder: Path) -> ModelConfig:
    cfg_path = folder / "config.json"
    if not cfg_path.exists():  # a FIFO or a device is refused by read_json, never opened
        raise ModelFileError(f"{folder}: no config.json (not a Hugging Face model folder)")
    hf = read_json(cfg_path, "model config", hint="download it again")
    try:
        return ModelConfig.from_hf_config(hf, name=str(folder))
    except ConfigError as err:
        raise ModelFileError(f"{cfg_path}: {err}") from None


# safetensors: 8-byte little-endian header length N, N bytes of JSON
# {name: {"dtype", "shape", "data_offsets": [begin, end]}} (offsets relative to the data after
# the header), then the data. Parsed here so that every problem is caught before any read.
SAFETENSORS_ITEMSIZE = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U64": 8,
    "U32": 4,
    "U16": 2,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
}
SAFETENSORS_FLOAT = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2"}  # BF16: read as bits
SAFETENSORS_MAX_HEADER = 100_000_000  # the format's own limit


@dataclass(frozen=True)
class SafetensorsEntry:
    """One tensor of a safetensors file, validated against the file's length."""

    path: Path
    header: TensorHeader
    offset: int  # absolute byte offset of the data in the file
    n_bytes: int


def read_safetensors_header(path: Path) -> dict[str, SafetensorsEntry]:
    """Parse and check a safetensors header (no tensor data is read): name -> entry."""
    path = Path(path)
    hint = "the file is damaged or truncated: download it again"
    size = require_regular_file(path, "safetensors file")
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise ModelFileError(f"{path}: {size} bytes, too short for a safetensors file; {hint}")
        (n,) = struct.unpack("<Q", prefix)
        if n > size - 8 or n > SAFETENSORS_MAX_HEADER:  # the number itself is not shown: it is
            raise ModelFileError(  # whatever 8 bytes the file starts with (an HTML page, ...)
                f"{path}: the header length field points past the end of the file ({size} "
                f"bytes): not a safetensors file, or {hint}"
            )
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise ModelFileError(f"{path}: the safetensors header is not valid JSON; {hint}") from None
    if not isinstance(header, dict):
        raise ModelFileError(f"{path}: the safetensors header is not a JSON object; {hint}")
    data_start, data_size = 8 + n, size - 8 - n
    entries = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
            ok = (
                isinstance(dtype, str)
                and isinstance(shape, list)
                and len(shape) <= 8
                and all(
                    isinstance(d, int) and not isinstance(d, bool) and d >= 0
                    for d in shape + [begin, end]
                )
                and begin <= end
            )
        except (TypeError, KeyError, ValueError):
            ok = False
        if not ok:
            raise ModelFileError(f"{path}: malformed header entry for tensor {name!r}; {hint}")
        if dtype not in SAFETENSORS_ITEMSIZE:
            raise ModelFileError(f"{path}: tensor {name} has unknown dtype {dtype!r}; {hint}")
        needed = math.prod(shape) * SAFETENSORS_ITEMSIZE[dtype]
        if end - begin != needed:
            raise ModelFileError(
                f"{path}: tensor {name} ({dtype} {tuple(shape)}) needs {needed} bytes but its "
                f"offsets span {end - begin}; {hint}"
            )
        if end > data_size:
            raise ModelFileError(
                f"{path}: tensor {name} ends at byte {data_start + end}, past the end of the file "
                f"({size} bytes); {hint}"
            )
        entries[name] = SafetensorsEntry(
            path,
            TensorHeader(tuple(shape), dtype, dtype in SAFETENSORS_FLOAT),
            data_start + begin,
            needed,
        )
    spans = sorted((e.offset, e.offset + e.n_bytes, name) for name, e in entries.items())
    for (_, end_a, a), (begin_b, end_b, b) in zip(spans, spans[1:]):
        if begin_b < end_a and begin_b < end_b:  # empty tensors overlap nothing
            raise ModelFileError(
                f"{path}: tensors {a} and {b} share bytes {begin_b} to {min(end_a, end_b)}; {hint}"
            )
    return entries


def read_safetensors_tensor(f, entry: SafetensorsEntry) -> np.ndarray:
    """One tensor's data from open file `f` (checked entry), as a fresh array; BF16 -> float32."""
    dtype = SAFETENSORS_FLOAT[entry.header.dtype]
    f.seek(entry.offset)
    flat = np.fromfile(f, dtype=dtype, count=entry.n_bytes // np.dtype(dtype).itemsize)
    if flat.nbytes != entry.n_bytes:
        raise ModelFileError(
            f"{f.name}: file shrank while reading (was it being overwritten?); download it again"
        )
    if entry.header.dtype == "BF16":  # the top 16 bits of a float32
        flat = (flat.astype(np.uint32) << 16).view(np.float32)
    return flat.reshape(entry.header.shape)


def safetensors_entries(folder: Path) -> dict[str, SafetensorsEntry]:
    """Tensor name -> checked entry, from model.safetensors or a sharded index."""
    single = folder / "model.safetensors"
    index = folder / "model.safetensors.index.json"
    if single.exists():  # a FIFO or a device is refused by read_safetensors_header
        return read_safetensors_header(single)
    if not index.exists():
        raise ModelFileError(f"{folder}: no model.safetensors or model.safetensors.index.json")
    weight_map = read_json(index, "safetensors index")
    if not (
        isinstance(weight_map, dict)
        and isinstance(weight_map.get("weight_map"), dict)
        and all(isinstance(v, str) for v in weight_map["weight_map"].values())
    ):
        raise ModelFileError(
            f"{index}: not a safetensors index (JSON with a weight_map of file names)"
        )
    weight_map = weight_map["weight_map"]
    shards = sorted(set(weight_map.values()))
    entries: dict[str, SafetensorsEntry] = {}
    for shard in shards:
        check_shard_name(index, shard)
        path = folder / shard
        if not path.is_file():
            raise ModelFileError(
                f"{index}: lists shard {shard}, which is missing from {folder}; download it"
            )
        found = read_safetensors_header(path)
        for name, where in weight_map.items():
            if where == shard:
                if name not in found:
                    raise ModelFileError(
                        f"{path}: has no tensor {name!r}, which {index.name} places there"
                    )
                entries[name] = found[name]
    return entries


def check_shard_name(index: Path, shard: str) -> None:
    """A shard named by an index must be a file name inside the model folder: no absolute path,
    no `..`, no subfolder, no control characters (the index comes with the download)."""
    parts = Path(shard).parts
    if (
        not shard
        or Path(shard).is_absolute()
        or len(parts) != 1
        or parts[0] in (".", "..")
        or any(ord(c) < 32 or 0x7F <= ord(c) < 0xA0 for c in shard)
    ):
        raise ModelFileError(
            f"{index}: lists shard {shard!r}, which is not a file name in the model folder "
            "(shards must sit next to the index): the index is damaged or hostile"
        )


def load_hf_folder(
    folder: Path,
    dtype,
    check_config: Callable[[ModelConfig], None] = lambda config: None,
    check_tokenizer=lambda tokenizer, config: None,
):
    """HF folder -> (params, config, tokenizer or None). Headers are checked before any read."""
    config = read_hf_config(folder)
    check_config(config)
    entries = safetensors_entries(folder)
    prefix = (
        "transformer."
        if config.family == "gpt2" and any(k.startswith("transformer.") for k in entries)
        else ""
    )
    where = str(folder)
    check_tensors(config, "hf", {k: e.header for k, e in entries.items()}, where, prefix)
    tokenizer = load_folder_tokenizer(folder)  # a broken tokenizer fails before the weights
    check_tokenizer(tokenizer, config)
    handles: dict[Path, object] = {}

    def read(name: str) -> np.ndarray:
        entry = entries[prefix + name]
        if entry.path not in handles:
            handles[entry.path] = open(entry.path, "rb")
        return read_safetensors_tensor(handles[entry.path], entry)

    try:
        params = build_params(config, "hf", read, dtype, where)
    finally:
        for handle in handles.values():
            handle.close()
    return params, config, tokenizer


def load_folder_tokenizer(folder: Path):
    """tokenizer.json, else vocab.json + merges.txt, else None."""
    from cel_numpy.models.tokenizer import BPETokenizer

    if (folder / "tokenizer.json").is_file():
        return BPETokenizer.from_hf_tokenizer_json(folder / "tokenizer.json")
    if (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file():
        return BPETokenizer.from_vocab_merges(folder / "vocab.json", folder / "merges.txt")
    return None


def model_files(path: Path) -> list[Path]:
    """The files `load_model(path)` reads, in a fixed order: what a model's identity is.

    HF folder: config.json, model.safetensors (or the index and its shards), and the tokenizer
    files it picks (tokenizer.json with tokenizer_config.json when present, or vocab.json +
    merges.txt). A .gguf file alone; a .npz with its STEM.vocab.json + STEM.merges.txt when
    both exist. Other files in a folder (a README, a run directory) are not part of it.
    """
    path = Path(path)
    if not path.is_dir():
        files = [path]
        if path.suffix == ".npz":
            side = [
                path.with_name(f"{path.stem}.vocab.json"),
                path.with_name(f"{path.stem}.merges.txt"),
            ]
            files += side if all(f.is_file() for f in side) else []
        return files
    files = [path / "config.json"]
    single, index = path / "model.safetensors", path / "model.safetensors.index.json"
    if single.is_file():
        files.append(single)
    else:
        files.append(index)
        files += sorted({e.path for e in safetensors_entries(path).values()})
    if (path / "tokenizer.json").is_file():
        files.append(path / "tokenizer.json")
        if (path / "tokenizer_config.json").is_file():
            files.append(path / "tokenizer_config.json")
    elif (path / "vocab.json").is_file() and (path / "merges.txt").is_file():
        files += [path / "vocab.json", path / "merges.txt"]
    return files


# --------------------------------------------------------------------------- .npz export


NPZ_HINT = "not a cel-numpy .npz export, or damaged: export it again (scripts/export_gpt2_npz.py)"


def _npz_headers(archive, path: Path) -> dict[str, TensorHeader]:
    """Shape and dtype of every array in an open .npz, from the .npy headers only (no data read)."""
    headers = {}
    for name in archive.files:
        try:
            with archive.zip.open(name + ".npy") as member:
                version = np.lib.format.read_magic(member)
                if version not in ((1, 0), (2, 0)):
                    raise ValueError(f"unsupported .npy format version {version}")
                read_header = (
                    np.lib.format.read_array_header_1_0
                    if version == (1, 0)
                    else np.lib.format.read_array_header_2_0
                )
                shape, _, dtype = read_header(member)
        # NumPy's header parser raises ValueError, SyntaxError, TokenError, ...
        except Exception as err:
            raise ModelFileError(
                f"{path}: array {name!r} has an unreadable header ({err}); {NPZ_HINT}"
            ) from None
        if dtype.hasobject and name != "config_json":  # needs pickle: never loaded
            raise ModelFileError(
                f"{path}: array {name!r} holds Python objects (dtype {dtype}), which cel-numpy "
                f"does not load (pickle could run code); {NPZ_HINT}"
            )
        headers[name] = TensorHeader(tuple(int(d) for d in shape), str(dtype), dtype.kind == "f")
    return headers


def load_npz(
    path: Path,
    dtype,
    check_config: Callable[[ModelConfig], None] = lambda config: None,
    check_tokenizer=lambda tokenizer, config: None,
):
    """The export of scripts/export_gpt2_npz.py -> (params, config, tokenizer or None).

    A tokenizer is picked up from OUT_STEM.vocab.json + OUT_STEM.merges.txt next to the file.
    """
    with open(path, "rb") as f:
        if f.read(4) != b"PK\x03\x04":  # every .npz is a zip archive
            raise ModelFileError(f"{path}: not an .npz file (no zip signature); {NPZ_HINT}")
    try:
        archive = np.load(path, allow_pickle=False)
    except Exception as err:  # zipfile, NumPy and OS errors of every kind: the file is not an .npz
        raise ModelFileError(
            f"{path}: unreadable .npz file ({type(err).__name__}: {err}); {NPZ_HINT}"
        ) from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise ModelFileError(f"{path}: holds a single array, not an .npz archive; {NPZ_HINT}")
    with archive:
        if "config_json" not in archive.files:
            raise ModelFileError(f"{path}: no config_json entry; {NPZ_HINT}")
        headers = _npz_headers(archive, path)
        try:
            cfg = json.loads(str(archive["config_json"]))
            if not isinstance(cfg, dict):
                raise TypeError("not a JSON object")
            config = ModelConfig.from_dict({**cfg, "name": str(path)})
        except Exception as err:  # a damaged member fails in zipfile, NumPy or JSON
            raise ModelFileError(
                f"{path}: bad config_json ({type(err).__name__}: {err}); {NPZ_HINT}"
            ) from None
        if config.family != "gpt2":
            raise ModelFileError(
                f"{path}: the .npz export holds gpt2 models, config says {config.family!r}"
            )
        check_config(config)
        del headers["config_json"]
        check_tensors(config, "npz", headers, str(path))
        tokenizer = npz_tokenizer(path)
        check_tokenizer(tokenizer, config)

        def read(name: str) -> np.ndarray:
            try:
                return archive[name]
            except Exception as err:  # CRC mismatch, truncated member, ...
                raise ModelFileError(
                    f"{path}: cannot read array {name} ({type(err).__name__}: {err}); {NPZ_HINT}"
                ) from None

        params = build_params(config, "npz", read, dtype, str(path))
    return params, config, tokenizer


def npz_tokenizer(path: Path):
    """The tokenizer of STEM.vocab.json + STEM.merges.txt beside a .npz export, or None."""
    vocab, merges = (
        path.with_name(f"{path.stem}.vocab.json"),
        path.with_name(f"{path.stem}.merges.txt"),
    )
    if not (vocab.is_file() and merges.is_file()):
        return None
    from cel_numpy.models.tokenizer import BPETokenizer

    return BPETokenizer.from_vocab_merges(vocab, merges)
