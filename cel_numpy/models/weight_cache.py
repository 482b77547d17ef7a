"""The weight cache: a model's float32 weights written once, memory-mapped by every process.

    entry = cache_entry(path, files, dtype)     the model's file in the cache
    hit = read_entry(entry, dtype, check)       (flat arrays, config, extra) or None (a miss)
    flat = write_entry(entry, flat, config, fmt, extra)   write, verify, map what was written
    arrays = shared_arrays(model, group, build) arrays derived from the weights (the fast
                                                engine's fused matrices), cached beside them

Why. A GGUF model is stored quantized; loading it dequantizes every tensor into float32 (about 4 s
for SmolLM2, a minute for Qwen2.5-0.5B here), and every process that loads it holds its own
float32 copy: N worker processes held N copies. The cache writes the float32 tensors once to
`<cache>/weights/` (the cache root of `cel_numpy.models.fetch`); every later load maps that file
read-only, so it takes about a second and N processes share one copy of the pages (the kernel's
page cache). The fast engine's fused matrices (`fast.prepare`) are cached the same way, in a
second file per model, so workers share those too.

Format. Each file is a safetensors file (8-byte header length, a JSON header naming every
tensor's dtype, shape and byte range, then the data; readable by the `safetensors` package), its
header padded so that the data starts on a 64-byte boundary; tensors whose size is a multiple of
64 bytes come first, so that all of those (every matrix of the supported models) are 64-byte
aligned for BLAS. The header's `__metadata__` holds: the format version, the identity key below,
the dtype, the model's config, extra fields the loader needs on a hit (a GGUF file's tokenizer
fields, so that a hit never parses the GGUF header), aliases (a tied unembedding is the
transpose of the embedding: stored once), and the sha256 of the data.

Identity. The key hashes the format version, the dtype and, for every file the loader reads
(`loaders.model_files`), its resolved path, size, modification time (ns) and inode: a file that
changes gets a new key, so a stale entry is never read (it stays on disk until the cache folder
is cleaned; `rm -r ~/.cache/cel-numpy/weights` is always safe). Hashing the file's content
instead would cost 0.4 s (SmolLM2) to 1 s (Qwen) on every load; for the known models `fetch`
does that check anyway.

Checks, and what they cost:
  * at write: the data's sha256 is computed while writing and checked again by reading the file
    back before it is renamed into place (about 2 s per GB, once per model);
  * at every load: the header is parsed and checked (every tensor of the expected dtype, its
    byte range the size of its shape, the tensors back to back, ending exactly at the end of
    the file: a cut file fails), the version, key and dtype must match, and exactly the tensors
    of the weight table must be there, each with its shape. The data's sha256 is NOT
    recomputed on load: that would read every page (1.4 s per GB per process, more than the
    whole load). `verify_entry(path)` does it on demand;
  * a damaged entry is reported in one line on stderr and rebuilt from the model file.

Writes are atomic and safe against concurrent writers: each writer writes its own temporary file
next to the entry and renames it over the entry's name (`os.replace`); two processes that build
the same entry write the same bytes, and a reader sees the old file, or the new one, never a mix.
A process that still maps a replaced file keeps reading its old pages.

The mapped arrays are read-only: code that changes a weight in place fails loudly ("assignment
destination is read-only"); copy the array first (`model.params[...][...] = W.copy()`).

When: `load_model` uses the cache for GGUF files loaded as float32 whose weights reach
`MIN_CACHE_BYTES` (the known models and any user GGUF); `load_model(..., weight_cache=False)`
or the environment variable CEL_NUMPY_WEIGHT_CACHE=0 turn it off, `weight_cache=True` forces it
for any format. When the cache cannot be written (a read-only or full disk) the model loads as
before, with a note on stderr.
"""

from __future__ import annotations

import hashlib
import json
import math
import mmap
import os
import secrets
import struct
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from cel_numpy.errors import ModelFileError
from cel_numpy.models.config import ConfigError, ModelConfig

FORMAT_VERSION = "1"
ALIGN = 64  # bytes: the data section, and every tensor whose size is a multiple of it
MIN_CACHE_BYTES = 16 << 20  # smaller models load fast anyway and share little
DTYPE_NAMES = {np.dtype(np.float32): "F32", np.dtype(np.float64): "F64"}
CHUNK = 1 << 24  # bytes hashed per read when verifying


def weights_dir() -> Path:
    from cel_numpy.models.fetch import cache_dir

    return cache_dir() / "weights"


def enabled_by_environment() -> bool:
    return os.environ.get("CEL_NUMPY_WEIGHT_CACHE", "1") != "0"


def identity_key(files: list[Path], dtype) -> str:
    """Hex sha256 of the format version, dtype and every file's path, size, mtime and inode."""
    described = []
    for f in files:
        st = Path(f).stat()
        described.append([str(Path(f).resolve()), st.st_size, st.st_mtime_ns, st.st_ino])
    text = json.dumps([FORMAT_VERSION, np.dtype(dtype).name, described])
    return hashlib.sha256(text.encode()).hexdigest()


def cache_entry(path: Path, files: list[Path], dtype) -> Path:
    """Where the weights of the model at `path` (read from `files`, `loaders.model_files`),
    loaded as `dtype`, live in the cache."""
    key = identity_key(files, dtype)
    stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in Path(path).resolve().name)
    return weights_dir() / f"{stem[:80]}-{key[:24]}.safetensors"


def _group_path(entry: Path, group: str) -> Path:
    return entry.with_name(entry.name.replace(".safetensors", f".{group}.safetensors"))


def _note(message: str) -> None:
    print(f"cel-numpy: {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- writing


def _transpose_aliases(flat: dict[str, np.ndarray]) -> dict[str, str]:
    """name -> earlier name, for arrays that are exactly the transpose of an earlier one
    (a tied unembedding): stored once, rebuilt as a view on load."""
    aliases, seen = {}, []
    for name, a in flat.items():
        for other, b in seen:
            same_data = a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
            if same_data and a.shape == b.shape[::-1] and a.strides == b.strides[::-1]:
                aliases[name] = other
                break
        else:
            seen.append((name, a))
    return aliases


def _header_bytes(arrays: dict[str, np.ndarray], metadata: dict[str, str]) -> tuple[bytes, list]:
    """The padded JSON header and the tensor order (64-byte multiples first)."""
    order = sorted(arrays, key=lambda n: arrays[n].nbytes % ALIGN != 0)  # stable
    header: dict = {"__metadata__": metadata}
    offset = 0
    for name in order:
        a = arrays[name]
        header[name] = {
            "dtype": DTYPE_NAMES[a.dtype],
            "shape": list(a.shape),
            "data_offsets": [offset, offset + a.nbytes],
        }
        offset += a.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * ((-(8 + len(raw))) % ALIGN)  # safetensors allows trailing spaces
    return raw, order


def _data_sha256(f, start: int) -> str:
    """sha256 of an open file's bytes from `start` to its end, read back in chunks."""
    digest = hashlib.sha256()
    f.seek(start)
    for chunk in iter(lambda: f.read(CHUNK), b""):
        digest.update(chunk)
    return digest.hexdigest()


def write_file(path: Path, arrays: dict[str, np.ndarray], metadata: dict[str, str]) -> None:
    """Write `arrays` as one safetensors file at `path`, atomically (temporary file + rename).

    The data's sha256 goes into the metadata (a fixed-width placeholder patched in place once the
    data is written), then is checked by reading the file back before the rename.
    """
    placeholder = "0" * 64
    raw, order = _header_bytes(arrays, {**metadata, "data_sha256": placeholder})
    at = raw.index(placeholder.encode())
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        with open(tmp, "xb+") as f:
            f.write(struct.pack("<Q", len(raw)))
            f.write(raw)
            digest = hashlib.sha256()
            for name in order:
                data = memoryview(np.ascontiguousarray(arrays[name])).cast("B")
                digest.update(data)
                f.write(data)
            f.seek(8 + at)
            f.write(digest.hexdigest().encode())
            f.flush()
            os.fsync(f.fileno())
            if _data_sha256(f, 8 + len(raw)) != digest.hexdigest():
                raise OSError(f"{tmp}: the data read back differs from the data written")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


# --------------------------------------------------------------------------- reading


def _header(path: Path) -> tuple[int, dict]:
    """(data start, header JSON) of a cache file; ModelFileError when it cannot be one."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        prefix = f.read(8)
        n = struct.unpack("<Q", prefix)[0] if len(prefix) == 8 else size
        if n > size - 8:
            raise ModelFileError(f"{path}: too short for its header (cut short?)")
        try:
            header = json.loads(f.read(n).decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise ModelFileError(f"{path}: the header is not JSON") from None
    if not isinstance(header, dict):
        raise ModelFileError(f"{path}: the header is not a JSON object")
    return 8 + n, header


def _metadata(header: dict, path: Path) -> dict:
    meta = header.get("__metadata__")
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise ModelFileError(f"{path}: no cel-numpy metadata in the header")
    return meta


def _layout(header: dict, dtype, data_bytes: int, path: Path) -> dict[str, tuple]:
    """name -> (shape, offset in the data): every tensor of `dtype`, back to back from 0 in the
    order `write_file` writes them, ending exactly at the end of the file."""
    name, itemsize = DTYPE_NAMES[np.dtype(dtype)], np.dtype(dtype).itemsize
    layout, end = {}, 0
    spans = sorted(
        (info.get("data_offsets", [-1])[0], tensor, info)
        for tensor, info in header.items()
        if tensor != "__metadata__" and isinstance(info, dict)
    )
    if len(spans) != len(header) - ("__metadata__" in header):
        raise ModelFileError(f"{path}: a header entry is not an object")
    for begin, tensor, info in spans:
        shape = info.get("shape")
        ok = (
            info.get("dtype") == name
            and isinstance(shape, list)
            and all(isinstance(d, int) and d >= 0 for d in shape)
            and info.get("data_offsets") == [end, end + math.prod(shape) * itemsize]
        )
        if not ok:
            raise ModelFileError(f"{path}: tensor {tensor} is not where or what it should be")
        layout[tensor] = (tuple(shape), begin)
        end += math.prod(shape) * itemsize
    if end != data_bytes:
        raise ModelFileError(f"{path}: {data_bytes} bytes of data, the header says {end}")
    return layout


def map_file(path: Path, key: str, dtype) -> tuple[dict[str, np.ndarray], dict]:
    """Read-only arrays mapped from a cache file, and its metadata; ModelFileError when the
    file is not a complete cache file of this key and dtype (module docstring: checks)."""
    start, header = _header(path)
    meta = _metadata(header, path)
    if meta.get("format") != f"cel-numpy-weights-{FORMAT_VERSION}" or meta.get("key") != key:
        raise ModelFileError(f"{path}: written for another model or format version")
    layout = _layout(header, dtype, path.stat().st_size - start, path)
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    arrays = {
        n: np.frombuffer(mapped, dtype=dtype, count=math.prod(shape), offset=start + at).reshape(
            shape
        )
        for n, (shape, at) in layout.items()
    }
    return arrays, meta


def verify_entry(path: Path) -> bool:
    """True when a cache file's data still has the sha256 recorded when it was written (reads
    every byte: not done on load)."""
    start, header = _header(path)
    with open(path, "rb") as f:
        return _data_sha256(f, start) == _metadata(header, path).get("data_sha256")


# --------------------------------------------------------------------------- the model's weights


def _check_table(config: ModelConfig, fmt: str, flat: dict[str, np.ndarray], where: Path) -> None:
    """Exactly the parameters of the weight table, each with its shape."""
    from cel_numpy.models.weights import weight_table

    want = {spec.ours: spec.shape for spec in weight_table(config, fmt)}
    if config.tied_embeddings:
        want["unembed.W_U"] = (config.d_model, config.vocab_size)
    got = {n: tuple(a.shape) for n, a in flat.items()}
    if got != want:
        missing = sorted(set(want) - set(got))[:3]
        raise ModelFileError(
            f"{where}: its tensors do not match the model's weight table "
            f"(missing or mis-shaped: {missing or sorted(set(got) - set(want))[:3]})"
        )


def read_entry(
    entry: Path, dtype, check_config: Callable[[ModelConfig], None]
) -> tuple[dict, ModelConfig, dict] | None:
    """(flat params, config, extra) mapped from the cache, or None on a miss.

    A damaged or foreign entry is a miss with a note (it is rebuilt); `check_config` runs on the
    cached config before any array is used, as on a normal load (its errors propagate).
    """
    if not entry.is_file():
        return None
    key = entry.name.rsplit("-", 1)[-1].split(".")[0]
    try:
        arrays, meta = map_file(entry, key, dtype)
        config = ModelConfig.from_dict(json.loads(meta["config"]))
        aliases = json.loads(meta["aliases"])
        extra = json.loads(meta["extra"])
        flat = {**arrays, **{n: arrays[other].T for n, other in aliases.items()}}
        _check_table(config, meta["source_format"], flat, entry)
    except (ModelFileError, ConfigError, KeyError, TypeError, ValueError, OSError) as err:
        _note(f"weight cache {entry} is unusable ({str(err).splitlines()[0]}); rebuilding it")
        return None
    check_config(config)
    return flat, config, extra


def write_entry(
    entry: Path, flat: dict[str, np.ndarray], config: ModelConfig, fmt: str, extra: dict
) -> dict[str, np.ndarray] | None:
    """Write a model's flat params to the cache and return them mapped from the file (None, with
    a note, when the cache cannot be written: the caller keeps its in-memory arrays)."""
    if ModelConfig.from_dict(json.loads(json.dumps(config.to_dict()))) != config:
        return None  # a config that does not survive JSON: no entry rather than a wrong one
    aliases = _transpose_aliases(flat)
    arrays = {n: a for n, a in flat.items() if n not in aliases}
    dtype = next(iter(arrays.values())).dtype
    key = entry.name.rsplit("-", 1)[-1].split(".")[0]
    metadata = {
        "format": f"cel-numpy-weights-{FORMAT_VERSION}",
        "key": key,
        "dtype": dtype.name,
        "config": json.dumps(config.to_dict()),
        "source_format": fmt,
        "aliases": json.dumps(aliases),
        "extra": json.dumps(extra),
    }
    try:
        if entry.parent.is_symlink():
            raise OSError(f"{entry.parent} is a symbolic link; cel-numpy writes only real folders")
        write_file(entry, arrays, metadata)
        mapped, _ = map_file(entry, key, dtype)
    except (OSError, ModelFileError) as err:
        _note(f"could not write the weight cache ({err}); loading without it")
        return None
    return {**mapped, **{n: mapped[other].T for n, other in aliases.items()}}


# --------------------------------------------------------------------------- derived arrays


def shared_arrays(
    model, group: str, build: Callable[[], dict[str, np.ndarray]]
) -> dict[str, np.ndarray]:
    """Arrays computed from a model's weights (`build()`), kept in the cache beside the model's
    own file when it has one, so that every process maps one copy; else `build()` itself.

    `group` names the layout (change it when `build` changes what it computes).
    """
    entry = getattr(model, "weight_cache", None)
    if entry is None:
        return build()
    path = _group_path(Path(entry), group)
    key = Path(entry).name.rsplit("-", 1)[-1].split(".")[0] + "." + group
    dtype = model.dtype
    if path.is_file():
        try:
            return map_file(path, key, dtype)[0]
        except (ModelFileError, OSError) as err:
            _note(f"weight cache {path} is unusable ({str(err).splitlines()[0]}); rebuilding it")
    arrays = build()
    metadata = {"format": f"cel-numpy-weights-{FORMAT_VERSION}", "key": key, "dtype": dtype.name}
    try:
        write_file(path, arrays, metadata)
        return map_file(path, key, dtype)[0]
    except (OSError, ModelFileError) as err:
        _note(f"could not write the weight cache ({err}); using in-memory arrays")
        return arrays
