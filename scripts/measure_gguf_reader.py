"""What gguf_loader's reader override saves: open / load time and peak RSS, with and without.

    python scripts/measure_gguf_reader.py FILE.gguf {fast,plain} {open,load}

`fast` is cel-numpy's reader (`gguf_loader._reader_class()`), `plain` swaps in gguf.GGUFReader
itself. Run each mode in a fresh process (peak RSS is per process), alternating, several times:
docs/design.md#reading-gguf-files has the numbers.
"""

from __future__ import annotations

import resource
import sys
import time
from pathlib import Path


def main(path: Path, mode: str, what: str) -> str:
    from cel_numpy.models import gguf_loader

    if mode == "plain":
        from gguf import GGUFReader

        gguf_loader._reader_class = lambda: GGUFReader
    t0 = time.perf_counter()
    if what == "open":
        gguf_loader.open_gguf(path)
    else:
        from cel_numpy.models.loaders import load_model

        load_model(str(path))
    seconds = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    return f"{path.name} {mode} {what}: {seconds:.2f} s, peak RSS {rss:.0f} MiB"


if __name__ == "__main__":
    if (
        len(sys.argv) != 4
        or sys.argv[2] not in ("fast", "plain")
        or sys.argv[3] not in ("open", "load")
    ):
        sys.exit(__doc__.split("\n\n")[1])
    print(main(Path(sys.argv[1]), sys.argv[2], sys.argv[3]))
