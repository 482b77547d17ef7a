"""Limits on what a file or an option controls: sizes, file kinds, memory, terminal output.

Everything cel-numpy reads from a file that someone else wrote (a model download, a run
directory) goes through these few helpers, so one rule holds everywhere:

    read_json(path, what, error=...)   a regular file (never a FIFO or a device: reading one can
                                       hang or never end), at most `max_bytes`, valid UTF-8 JSON,
                                       nested no deeper than the parser's recursion limit; any
                                       failure is one line of `error` naming the file
    require_regular_file(path, ...)    the same file-kind check for binary files (GGUF, weights)
    safe_for_terminal(text)            C0/C1 control characters (ESC, BEL, NUL, CSI, ...) shown
                                       as \\x1b etc., so text from a file cannot drive the terminal
    physical_memory(), check_memory()  refuse an option whose working set would exceed half of
                                       this machine's memory (a one-line error, not a MemoryError)
    available_memory()                 what new allocations can use now without swapping (read
                                       before each optional cache entry, not once at start)
    check_whole_numbers(name=(v, min)) a count or seed that is an integer (not a bool, float,
                                       string or None) and at least `min`: a 2.5 would be
                                       truncated, a None seed draw fresh entropy

Nothing here imports the rest of the package except cel_numpy.errors.
"""

from __future__ import annotations

import json
import numbers
import os
import stat
from pathlib import Path

from cel_numpy.errors import ModelFileError, OptionError

MAX_JSON_BYTES = 64 << 20  # a JSON file we write or a model's config: far below this
MAX_TOKENIZER_JSON_BYTES = 256 << 20  # tokenizer.json of a 262k vocabulary is about 33 MB

# C0 controls (except tab and newline), DEL and the C1 controls: what a terminal may interpret.
_CONTROLS = {c: f"\\x{c:02x}" for c in (*range(0x00, 0x09), *range(0x0B, 0x20), 0x7F)}
_CONTROLS.update({c: f"\\x{c:02x}" for c in range(0x80, 0xA0)})


def safe_for_terminal(text: str) -> str:
    """`text` with every C0/C1 control character except tab and newline written as `\\xNN`.

    An escape sequence in a tensor name, a shard name or a chat template's error message (ESC
    `]52;` sets the clipboard, ESC `[2J` clears the screen, BEL rings) is printed as text.
    """
    return str(text).translate(_CONTROLS)


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def require_regular_file(path, what: str, error: type[Exception] = ModelFileError) -> int:
    """Size in bytes of `path`, which must be a regular file (a symlink to one is fine).

    A FIFO would block the first read forever and a device (/dev/zero) never ends: both are
    refused before anything opens them.
    """
    try:
        info = os.stat(path)
    except OSError as err:
        raise error(f"{path}: {err.strerror or err}") from None
    if not stat.S_ISREG(info.st_mode):
        raise error(f"{path}: {_kind(info.st_mode)}, not a regular file: give the {what} itself")
    return info.st_size


def read_bytes_limited(
    path, what: str, *, max_bytes: int, error: type[Exception] = ModelFileError, hint: str = ""
) -> bytes:
    """The bytes of regular file `path`, at most `max_bytes` of them (one-line `error` else)."""
    size = require_regular_file(path, what, error)
    tail = f"; {hint}" if hint else ""
    if size > max_bytes:
        raise error(f"{path}: {size:,} bytes, more than a {what} can be ({max_bytes:,}){tail}")
    try:
        # O_NONBLOCK: if the file was swapped for a FIFO since the check, open does not block
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as err:
        raise error(f"{path}: {err.strerror or err}") from None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            raise error(f"{path}: not a regular file: give the {what} itself")
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:  # it grew after the check
        raise error(f"{path}: more than {max_bytes:,} bytes, more than a {what} can be{tail}")
    return data


def read_json(
    path,
    what: str,
    *,
    error: type[Exception] = ModelFileError,
    hint: str = "",
    max_bytes: int = MAX_JSON_BYTES,
):
    """Parse the JSON file `path` (a `what`, e.g. "model config") with the limits above.

    Every failure is one `error` line starting with the path: not a regular file, too large,
    not UTF-8, invalid JSON (the parser's message), or nested too deeply to parse.
    """
    raw = read_bytes_limited(path, what, max_bytes=max_bytes, error=error, hint=hint)
    tail = f"; {hint}" if hint else ""
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise error(f"{path}: not UTF-8 text ({err.reason} at byte {err.start}){tail}") from None
    except json.JSONDecodeError as err:
        raise error(f"{path}: invalid JSON ({err}){tail}") from None
    except RecursionError:
        raise error(f"{path}: JSON nested too deeply to be a {what}{tail}") from None


def physical_memory() -> int | None:
    """Bytes of RAM on this machine (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def available_memory() -> int | None:
    """Bytes the kernel says new allocations can use without swapping (MemAvailable), or None
    where /proc/meminfo does not exist."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_memory(need: int, what: str, fix: str, context: str = "") -> None:
    """OptionError when `need` bytes exceed half of this machine's memory.

    what: the option and value that need it ("--batch-size 100000"); context: what else it
    depends on (" with --heads 4"); fix: what to do instead.
    """
    memory = physical_memory()
    if memory is None or need <= memory // 2:
        return
    raise OptionError(
        f"{what} needs about {need / 2**30:.3g} GiB{context}, more than half of this machine's "
        f"{memory / 2**30:.3g} GiB: {fix}"
    )


def as_path(spec, what: str) -> Path:
    """A path option that must not be empty (an empty string would mean the current folder)."""
    if not isinstance(spec, (str, os.PathLike)) or not str(spec).strip():
        raise OptionError(f"{what} is empty: give a file or folder")
    return Path(spec).expanduser()


def check_whole_numbers(**values: tuple) -> None:
    """OptionError naming the first argument that is not an integer at least its bound, given
    as name=(value, least); numpy integers count as integers, bools do not."""
    for name, (value, least) in values.items():
        whole = isinstance(value, numbers.Integral) and not isinstance(value, bool)
        if not whole or value < least:
            raise OptionError(f"{name} must be an integer >= {least}, got {value!r}")
