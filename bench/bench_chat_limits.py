"""Benchmark: rendering a real chat template with the limits (cel_numpy.models.chat) against the
same jinja2 sandbox without them.

    PYTHONPATH=. .venv/bin/python bench/bench_chat_limits.py [--repeats 5]

Not a test: prints medians (microseconds per render, 200 renders per repeat) and the ratio from
one invocation, on Qwen2.5-Coder's template (`cel-numpy fetch qwen2.5-coder-0.5b`) and one user
message of the arithmetic task. Both give the same text (checked here).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

RENDERS = 200
MESSAGES = [
    {
        "role": "user",
        "content": "Solve the arithmetic problem. Return only the final integer, with no words or "
        "explanation.\n\nQuestion: What is 48 plus 76?\nAnswer:",
    }
]


def median_microseconds(render, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(RENDERS):
            render()
        times.append((time.perf_counter() - start) / RENDERS * 1e6)
    return statistics.median(times)


def plain_sandbox(template: str):
    """transformers' sandbox and globals, without the limits."""
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = lambda x, **options: json.dumps(x, ensure_ascii=False, **options)
    return env.from_string(template)


def main() -> None:
    from gguf import GGUFReader

    from cel_numpy.models.chat import render_chat
    from cel_numpy.models.fetch import fetch
    from cel_numpy.models.tokenizer import gguf_field

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    template = gguf_field(GGUFReader(fetch("qwen2.5-coder-0.5b")), "tokenizer.chat_template")
    plain = plain_sandbox(template)
    variables = {"add_generation_prompt": True, "tools": None, "documents": None}
    limited_text = render_chat(template, MESSAGES, add_generation_prompt=True)
    assert limited_text == plain.render(messages=MESSAGES, **variables)
    limited = median_microseconds(
        lambda: render_chat(template, MESSAGES, add_generation_prompt=True), args.repeats
    )
    unlimited = median_microseconds(
        lambda: plain.render(messages=MESSAGES, **variables), args.repeats
    )
    print(f"{'renderer':<16} {'us/render':>10}")
    print(f"{'with limits':<16} {limited:10.0f}")
    print(f"{'plain sandbox':<16} {unlimited:10.0f}")
    print(f"ratio {limited / unlimited:.2f}")


if __name__ == "__main__":
    main()
