"""Output directories: created and proven writable before any work starts.

One check for every command that writes a folder (`cel-numpy theory --out`, `cel-numpy localize
--out`, the demo), so the same condition always gives the same one-line `OptionError`.
"""

from __future__ import annotations

import os
from pathlib import Path

from cel_numpy.errors import OptionError


def prepare_out(out: str | os.PathLike, option: str = "--out") -> Path:
    """Create `out` (and parents) if needed and write a probe file there; else one-line error.

    `option` names the argument in the message ("--out" on the command line).
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise OptionError(
            f"{option} {out} is an existing file, not a directory: give a new or existing directory"
        )
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".write-test-{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as err:
        raise OptionError(f"cannot write to {option} {out}: {err.strerror or err}") from None
    return out
