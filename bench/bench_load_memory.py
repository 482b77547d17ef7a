"""Peak resident memory of loading a model, against its float32 weight bytes (not a test).

    .venv/bin/python bench/bench_load_memory.py                   # qwen2.5-coder-0.5b
    .venv/bin/python bench/bench_load_memory.py smollm2

Each model loads in a fresh interpreter. The baseline is that interpreter's peak after importing
numpy, gguf and cel_numpy's loaders (and fetching the file); the load's cost is the peak after
`load_model` minus that baseline. The loaders read one tensor at a time and dequantize it in
chunks of rows into the float32 array it ends in, so the goal is a ratio below 1.5.
"""

from __future__ import annotations

import json
import subprocess
import sys

MEASURE = """
import json, resource, time
import numpy, gguf
import cel_numpy.models.loaders, cel_numpy.models.gguf_loader, cel_numpy.models.model
import cel_numpy.models.tokenizer
from cel_numpy.models.fetch import fetch
path = fetch({name!r})
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
t0 = time.perf_counter()
model = cel_numpy.models.loaders.load_model(path)
seconds = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({{
    "base": base, "peak": peak, "weights": model.weight_bytes(), "seconds": seconds
}}))
"""


def main() -> None:
    for name in sys.argv[1:] or ["qwen2.5-coder-0.5b"]:
        out = subprocess.run(
            [sys.executable, "-c", MEASURE.format(name=name)],
            capture_output=True,
            text=True,
            check=True,
        )
        m = json.loads(out.stdout.strip().splitlines()[-1])
        ratio = (m["peak"] - m["base"]) / m["weights"]
        print(
            f"{name}: float32 weights {m['weights'] / 1e9:.3f} GB; "
            f"peak RSS {m['peak'] / 1e9:.3f} GB "
            f"(baseline {m['base'] / 1e9:.3f} GB); load cost {ratio:.2f}x the weights, "
            f"peak/weights {m['peak'] / m['weights']:.2f}x; {m['seconds']:.2f} s"
        )


if __name__ == "__main__":
    main()
