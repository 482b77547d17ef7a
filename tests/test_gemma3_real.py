"""Gemma 3 270M, the real file: facts, tokenizer parity, golden logits against transformers.

These tests FAIL, not skip, when the model cannot be fetched. The model is loaded once per
session (`gemma3` in conftest.py).

References, written by scripts/write_fixtures.py --only gemma3-real with the reference venv:
  tests/fixtures/gemma3_tokenizer_reference.json  ids of transformers' tokenizer read from the
      same GGUF (whitespace runs, digits, emoji, byte fallback, several scripts, control and
      user-defined tokens, random strings), and its decoding of them
  tests/fixtures/gemma3_golden.npz  transformers' Gemma3ForCausalLM reading the same GGUF
      (dequantized by the same `gguf` package, float32): for four prompts (one of 1,459 tokens,
      longer than the 512-key sliding window), the ids, the 64 largest and 256 fixed random
      last-position logits, the log-sum-exp over the vocabulary and 8 greedy tokens.
      Measured: logits within 2.5e-5 on the short prompts and 1.3e-4 on the long one (float32
      summation order over 1,459 positions); the test allows 1e-3.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from cel_numpy.models.fetch import KNOWN
from cel_numpy.models.gguf_loader import gguf_storage

FIXTURES = Path(__file__).parent / "fixtures"
GEMMA_SHA256 = KNOWN["gemma-3-270m"].sha256


def test_gguf_facts(gemma3):
    c = gemma3.config
    assert (c.family, c.arch, c.n_layers, c.n_heads, c.n_kv_heads, c.d_head, c.d_model) == (
        "llama", "gemma3", 18, 4, 1, 256, 640
    )  # fmt: skip
    assert (c.vocab_size, c.d_mlp, c.rope_base, c.rope_local_base, c.sliding_window) == (
        262144, 2048, 1e6, 1e4, 512
    )  # fmt: skip
    assert c.local_layers == tuple(l for l in range(18) if l not in (5, 11, 17))
    assert (c.mlp_act, c.qk_norm, c.sandwich_norms, c.tied_embeddings) == (
        "gelu_tanh", True, True, True
    )  # fmt: skip
    assert c.embed_scale == np.sqrt(640) and c.attn_scale == 1 / 16
    assert gemma3.n_params() == c.n_params()
    assert c.n_layers * c.n_heads == 72, "72 heads: an exact screen of every head is cheap"
    storage = gguf_storage(Path(gemma3.source))
    assert {"Q4_K", "Q5_0", "Q6_K", "Q8_0"} <= set(storage), storage


def test_norm_weights_are_the_multipliers_the_file_holds(gemma3):
    """llama.cpp's converter stored 1 + w; read as is, the final norm's gains are mostly > 1."""
    w = gemma3.params["ln_final"]["w"]
    assert np.median(w) > 1.0 and w.min() >= 0.0, (np.median(w), w.min())


# --------------------------------------------------------------------------- tokenizer


def test_tokenizer_matches_transformers(gemma3):
    fixture = json.loads((FIXTURES / "gemma3_tokenizer_reference.json").read_text("utf-8"))
    assert fixture["gguf_sha256"] == GEMMA_SHA256
    tok = gemma3.tokenizer
    assert len(fixture["cases"]) > 150
    for case in fixture["cases"]:
        ids = tok.encode(case["text"], add_bos=False)
        assert ids == case["ids"], f"ids differ for {case['text']!r}"
        assert tok.decode(case["ids"]) == case["decoded"], f"decode differs for {case['text']!r}"


def test_tokenizer_details(gemma3):
    tok = gemma3.tokenizer
    assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.add_bos) == (2, 1, 0, True)
    assert tok.encode("The capital of Japan is")[:2] == [2, 818], "<bos> then 'The'"
    assert [tok.decode([i]) for i in tok.encode("12345", add_bos=False)] == list("12345")
    assert tok.encode("<start_of_turn>user\n", add_bos=False) == [105, 2364, 107]
    assert tok.stop_ids == frozenset({1, 106}), "<eos> and <end_of_turn>"
    # a character outside the vocabulary falls back to its UTF-8 bytes
    ids = tok.encode("\U000f0000", add_bos=False)
    assert [tok.id_to_token(i) for i in ids] == ["<0xF3>", "<0xB0>", "<0x80>", "<0x80>"]


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=60))
def test_round_trip(gemma3, text):
    tok = gemma3.tokenizer
    assert tok.decode(tok.encode(text, add_bos=False)) == text


# --------------------------------------------------------------------------- golden logits


def test_golden_ids_logits_and_greedy_tokens_equal_transformers(gemma3):
    with np.load(FIXTURES / "gemma3_golden.npz") as z:
        golden = {k: z[k] for k in z.files}
    assert str(golden["gguf_sha256"]) == GEMMA_SHA256
    sample = golden["sample_ids"]
    n = sum(1 for k in golden if k.startswith("ids_"))
    assert n >= 4
    assert max(len(golden[f"ids_{i}"]) for i in range(n)) > gemma3.config.sliding_window
    for i in range(n):
        ids = gemma3.encode(str(golden[f"text_{i}"]))
        assert ids == golden[f"ids_{i}"].tolist(), f"prompt {i}: token ids differ"
        logits = gemma3.next_token_logits([ids])[0].astype(np.float64)  # (V,)
        top = golden[f"top_ids_{i}"]
        assert int(np.argmax(logits)) == int(top[0]), f"prompt {i}: top-1 differs"
        for name, where in (("top", top), ("sample", sample)):
            err = np.abs(logits[where] - golden[f"{name}_logits_{i}"]).max()
            assert err < 1e-3, f"prompt {i}: {name} logits differ by {err:.2e}"
        lse = np.log(np.exp(logits - logits.max()).sum()) + logits.max()
        assert abs(lse - float(golden[f"logsumexp_{i}"])) < 1e-3, f"prompt {i}: normalizer"
        greedy = golden[f"greedy_{i}"].tolist()
        ours = gemma3.generate_ids([ids], len(greedy), stop_at_eos=False)[0]
        assert ours == greedy, f"prompt {i}: greedy tokens {ours} vs transformers {greedy}"


def test_capital_of_japan(gemma3):
    assert gemma3.generate("The capital of Japan is", max_new_tokens=2).startswith(" Tokyo")
