"""Benchmark: BPE merging of one long word, heap (O(n log n)) vs GPT-2's loop (O(n^2)).

    PYTHONPATH=. .venv/bin/python bench/bench_bpe_long_words.py [--repeats 3]

Not a test: prints medians and the loop/heap ratio from one invocation, on the GPT-2
vocabulary (`cel-numpy fetch gpt2-tokenizer`). Words: random lowercase letters (many distinct
pairs: the loop's worst case) and one word repeated (few distinct pairs: the loop's best case).
Both merges give the same parts (checked here, and in tests/test_limits.py).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from cel_numpy.models.fetch import fetch
from cel_numpy.models.tokenizer import BPETokenizer, bpe_merge_heap, bpe_merge_simple


def median_seconds(merge, word: str, ranks: dict, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        merge(word, ranks)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    folder = fetch("gpt2-tokenizer")
    ranks = BPETokenizer.from_gpt2_files(folder / "encoder.json", folder / "vocab.bpe")._ranks
    rng = random.Random(0)
    words = {
        f"random letters, {n:,} chars": "".join(
            rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(n)
        )
        for n in (2_000, 10_000)
    }
    words["'antidisestablishmentarianism' repeated, 10,000 chars"] = (
        "antidisestablishmentarianism" * 358
    )[:10_000]
    print(f"{'word':<55} {'heap s':>8} {'loop s':>8} {'loop/heap':>9}")
    for name, word in words.items():
        assert bpe_merge_heap(word, ranks) == bpe_merge_simple(word, ranks)
        heap = median_seconds(bpe_merge_heap, word, ranks, args.repeats)
        loop = median_seconds(bpe_merge_simple, word, ranks, args.repeats)
        print(f"{name:<55} {heap:8.3f} {loop:8.3f} {loop / heap:9.1f}")


if __name__ == "__main__":
    main()
