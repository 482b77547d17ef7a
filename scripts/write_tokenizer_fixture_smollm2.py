"""Write tests/fixtures/smollm2_tokenizer_reference.json with Hugging Face `tokenizers`.

The reference tokenizer is built from the vocabulary and merges stored in the SmolLM2 GGUF
(the file `cel_numpy.models.fetch.fetch("smollm2")` returns), configured like HF's SmolLM2
tokenizer.json: pre_tokenizer Sequence[Digits(individual_digits=True),
ByteLevel(add_prefix_space=False, use_regex=True)], ByteLevel decoder, and the GGUF's
CONTROL tokens (token_type 3) as special added tokens. It encodes a fixed, varied corpus plus
seeded random strings and stores the ids and HF's decoding of them.

Needs `tokenizers` and `gguf`, which are not project dependencies; use a throwaway venv:

    python3 -m venv /tmp/tokref && /tmp/tokref/bin/pip install tokenizers gguf numpy
    PYTHONPATH=. /tmp/tokref/bin/python scripts/write_tokenizer_fixture_smollm2.py
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import gguf
import tokenizers
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from cel_numpy.models.fetch import KNOWN, fetch  # stdlib-only module: locates the cached GGUF

OUT = (
    Path(__file__).resolve().parent.parent
    / "tests"
    / "fixtures"
    / "smollm2_tokenizer_reference.json"
)
SEED = 20240601
N_RANDOM = 60

CORPUS = [
    "",
    "The capital of France is",
    "Hello world",
    " Hello world",
    "Café déjà vu, naïve façade, Ærøskøbing, Straße, İstanbul, ÉCOLE",
    "I ❤️ NumPy 🐍🔥 👩‍👩‍👧‍👦 🇫🇷 👍🏽",
    "日本語のテキスト、中文文本，한국어 텍스트。",
    "مرحبا بالعالم — שלום עולם — नमस्ते दुनिया — สวัสดีชาวโลก",
    "12345",
    "48 plus 76",
    "48 plus 76 equals 124.",
    "3.14159 and -2,500,000.75 or 1e-5; 0x1F; 2024-06-01",
    "Ⅻ ½ ² ٣٤٥ ١٢ ３４５ ⑦",
    "a  b   c\t\td\n\n\ne \r\n f    ",
    "   leading and trailing   ",
    "\n\n\n",
    "    ",
    "line one\nline two\r\nline three\rline four",
    'def f(x):\n    return x ** 2  # square\n\nfor i in range(10):\n    print(f"{i}: {f(i)}")\n',
    'int main(void) { return printf("%d\\n", 42) != 0; }',
    '{"key": [1, 2, 3], "nested": {"a": null, "b": true}}',
    "https://example.com/path?query=1&x=y#frag and user@example.org",
    "# Title\n\n- item *one*\n- item **two**\n\n```python\nx = 1\n```",
    "I'm, you're, they've, she'll, he'd, it's, don't; I'M YOU'RE THEY'VE",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|><|endoftext|>text<|im_end|>",
    "<|im_start <|im_start|x <im_start> <|im_start|><|im_end|>",
    "<repo_name>cel-numpy<file_sep>tokenizer.py<filename>a.py<gh_stars>100",
    "e\u0301 a\u0300\u0301\u0302 \u0301\u0301x \u0301",
    "Z̤͔ͧ̑̓ä͖̭̈̇lͮ̒ͫǧ̗͚̚o̙̔ͮ̇͐̇",
    "\x00\x01\x04\x1b[31mred\x1b[0m\x7f",
    "!\x04! a\x04b \x13\x14\x16\x1d",
    "a\u00a0b\u2003c\u3000d\u2028e\u0085f\x1cg\x1dh\x1fi\x0bj\x0ck",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "ThisIsCamelCase and snake_case_name and kebab-case-name",
    "!!!??? ... --- *** ''' \"\"\" ``` ~~~ ;;; ::",
    "x\U00050000y \U0010ffff \U0001f600",
]

# Characters the random strings are drawn from: ASCII, Latin-1, combining marks, CJK, emoji,
# whitespace of all kinds, digits of several scripts, controls and special-token fragments.
POOL = (
    [chr(c) for c in range(0x20, 0x7F)] * 3
    + [chr(c) for c in range(0xA0, 0x180)]
    + [chr(c) for c in range(0x300, 0x370)]
    + [chr(c) for c in range(0x4E00, 0x4E80)]
    + [chr(c) for c in range(0x1F600, 0x1F650)]
    + ["\n", "\r\n", "\r", "\t", "\x00", "\x0b", "\x0c", "\x85", "\u2028", "\u3000", "\u200b"] * 4
    + [chr(c) for c in range(0x0660, 0x066A)]
    + ["\x04", "\x1d", "\U00050000", "\U0010fffd", "\ufeff"]
    + ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|", "|>", "'s", "'ll", " "] * 2
)


def gguf_value(reader: gguf.GGUFReader, key: str):
    """A metadata value through gguf's own accessor (independent of cel_numpy's reader)."""
    return reader.fields[key].contents()


def build_reference(gguf_path: Path) -> Tokenizer:
    """HF tokenizer from the GGUF's vocab + merges, configured like SmolLM2's tokenizer.json."""
    reader = gguf.GGUFReader(gguf_path)
    tokens = gguf_value(reader, "tokenizer.ggml.tokens")
    types = gguf_value(reader, "tokenizer.ggml.token_type")
    merges = [tuple(m.split(" ")) for m in gguf_value(reader, "tokenizer.ggml.merges")]
    tokenizer = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    control = [
        AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, types) if k == 3
    ]
    tokenizer.add_special_tokens(control)
    return tokenizer


def random_strings(rng: random.Random) -> list[str]:
    """Seeded random strings of 1..80 pool items."""
    return ["".join(rng.choice(POOL) for _ in range(rng.randint(1, 80))) for _ in range(N_RANDOM)]


def main() -> None:
    gguf_path = fetch("smollm2")
    tokenizer = build_reference(gguf_path)
    cases = []
    for text in CORPUS + random_strings(random.Random(SEED)):
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        decoded = tokenizer.decode(ids, skip_special_tokens=False)
        cases.append({"text": text, "ids": ids, "decoded": decoded})
    fixture = {
        "description": "SmolLM2-135M-Instruct GGUF tokenizer encoded by HF tokenizers; "
        "written by scripts/write_tokenizer_fixture_smollm2.py",
        "gguf_sha256": KNOWN["smollm2"].members[0].sha256,
        "tokenizers_version": tokenizers.__version__,
        "cases": cases,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(fixture, ensure_ascii=True, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {len(cases)} cases to {OUT}")


if __name__ == "__main__":
    main()
