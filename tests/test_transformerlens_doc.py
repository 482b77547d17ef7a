"""docs/transformerlens.md names real things: every cel-numpy activation and parameter in its
tables exists in a loaded model, with the shape the table gives (letters read from the config)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import cel_numpy as cn
from cel_numpy.models.transformer import flatten_params

ROOT = Path(__file__).resolve().parent.parent
DOC = (ROOT / "docs" / "transformerlens.md").read_text()
FIXTURES = ROOT / "tests" / "fixtures"


def table(heading: str) -> list[list[str]]:
    """The rows (cells) of the first table after `heading`."""
    section = DOC.split(heading, 1)[1]
    rows = []
    for line in section.splitlines()[1:]:
        if not line.startswith("|"):
            if rows:
                break
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if not set(cells[0]) <= set("-"):
            rows.append(cells)
    return rows[1:]  # without the header


def letters(model, T: int) -> dict[str, int]:
    c = model.config
    return {"B": 1, "T": T, "S": T, "D": c.d_model, "H": c.n_heads, "G": c.n_kv_heads,
            "E": c.d_head, "F": c.d_mlp, "V": c.vocab_size, "n_ctx": c.n_ctx}  # fmt: skip


def shape(text: str, sizes: dict[str, int]) -> tuple[int, ...]:
    """'(B, H, T, E)' -> sizes; the first shape when a cell lists several."""
    inner = re.match(r"\(([^)]*)\)", text).group(1)
    return tuple(sizes[x.strip()] for x in inner.split(",") if x.strip())


@pytest.mark.parametrize("fixture", ["tiny_gpt2", "tiny_llama"])
def test_activation_table_names_and_shapes(fixture):
    model = cn.load_model(FIXTURES / fixture)
    ids = [3, 5, 7, 9, 11]
    _, cache = model.run_with_cache([ids])
    rows = table("## Activations")
    assert len(rows) >= 15
    for row in rows:
        name = row[0].strip("`").replace("{l}", "1")
        if name == "blocks.1.mlp.up" and model.config.family == "gpt2":
            continue  # Llama only, as the table says
        assert name in cache.names(), f"docs/transformerlens.md names {name}, not in the cache"
        assert cache[name].shape == shape(row[1], letters(model, len(ids))), name


def test_parameter_table_names_and_shapes():
    """Every parameter the table names exists in the GPT-2 or the Llama fixture, shaped as said."""
    models = [cn.load_model(FIXTURES / f) for f in ("tiny_gpt2", "tiny_llama")]
    found: dict[str, int] = {}
    for row in table("## Parameters"):
        names = re.findall(r"`([^`]+)`", row[0])
        first = names[0].replace("{l}", "0")
        prefix = first.rsplit(".", 1)[0]
        keys = [first] + [f"{prefix}.{n.lstrip('.')}" for n in names[1:]]
        for key in keys:
            found[key] = 0
            for model in models:
                flat = flatten_params(model.params)
                if key not in flat:
                    continue  # family-specific: W_pos, W_gate, biases, LayerNorm .b
                found[key] += 1
                if row[1].count("(") == 1:  # one shape for the row
                    assert flat[key].shape == shape(row[1], letters(model, 0)), key
    missing = [k for k, n in found.items() if n == 0]
    assert not missing, f"docs/transformerlens.md names parameters no model has: {missing}"
    assert len(found) >= 15, found
