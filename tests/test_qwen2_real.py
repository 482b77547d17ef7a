"""Qwen2.5-Coder-0.5B-Instruct, the real file: facts, tokenizer parity, golden logits.

These tests FAIL, not skip, when the model cannot be fetched: CI must exercise the real model.
The model is loaded once per session (`qwen2` in conftest.py).

References, written by scripts/write_fixtures.py --only qwen2-real with /work's reference venv:
  tests/fixtures/qwen2_tokenizer_reference.json  ids from HF `tokenizers` built from the GGUF's
      vocabulary and merges with Qwen2's NFC normalizer and Split pre-tokenizer (the fixture
      script also checks them against transformers' own GGUF tokenizer)
  tests/fixtures/qwen2_golden.npz  transformers reading the same GGUF (AutoModelForCausalLM with
      gguf_file=..., dequantized by the same `gguf` package, float32): for three chat-formatted
      prompts, the ids and the last-position logits (the 64 largest, 256 fixed random entries and
      the log-sum-exp over the whole vocabulary)
"""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cel_numpy.models.fetch import KNOWN
from cel_numpy.models.gguf_loader import gguf_storage

pytestmark = pytest.mark.download  # every test here needs the fetched model

FIXTURES = Path(__file__).parent / "fixtures"
QWEN_SHA256 = KNOWN["qwen2.5-coder-0.5b"].sha256


def test_gguf_facts(qwen2):
    c = qwen2.config
    assert (c.family, c.arch, c.n_layers, c.n_heads, c.n_kv_heads, c.d_head, c.d_model) == (
        "llama", "qwen2", 24, 14, 2, 64, 896
    )  # fmt: skip
    assert (c.vocab_size, c.d_mlp, c.rope_base, c.qkv_bias, c.attn_bias) == (
        151936, 4864, 1e6, True, False
    )  # fmt: skip
    assert not c.tied_embeddings, "this file stores its own output.weight"
    assert qwen2.n_params() == c.n_params()
    storage = gguf_storage(Path(qwen2.source))
    assert {"Q4_K", "Q5_0", "Q6_K", "Q8_0"} <= set(storage), storage


def test_capital_of_france(qwen2):
    ids = qwen2.encode("The capital of France is")
    logits = qwen2.next_token_logits([ids])[0].astype(np.float64)
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    top = int(np.argmax(probs))
    assert qwen2.decode([top]) == " Paris" and probs[top] > 0.8, (qwen2.decode([top]), probs[top])


# --------------------------------------------------------------------------- tokenizer


def test_tokenizer_matches_hf_tokenizers(qwen2):
    fixture = json.loads((FIXTURES / "qwen2_tokenizer_reference.json").read_text("utf-8"))
    assert fixture["gguf_sha256"] == QWEN_SHA256
    tok = qwen2.tokenizer
    assert len(fixture["cases"]) > 100
    for case in fixture["cases"]:
        assert tok.encode(case["text"]) == case["ids"], f"ids differ for {case['text']!r}"
        assert tok.decode(case["ids"]) == case["decoded"], f"decode differs for {case['text']!r}"


def test_digits_split_one_by_one_and_special_tokens(qwen2):
    tok = qwen2.tokenizer
    ids = tok.encode("12345 + 678")
    assert [tok.decode([i]) for i in ids] == ["1", "2", "3", "4", "5", " +", " ", "6", "7", "8"]
    assert tok.encode("<|im_start|>user<|im_end|>") == [151644, 872, 151645]
    assert (tok.eos_id, tok.pad_id, tok.add_bos) == (151645, 151643, False)
    assert tok.stop_ids == frozenset({151645, 151643})  # <|im_end|>, <|endoftext|>


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=60))
def test_round_trip_is_the_nfc_text(qwen2, text):
    # Qwen2 normalizes to NFC before splitting: decode(encode(s)) == NFC(s); special-token text
    # such as "<|im_end|>" in s is one token and decodes to itself.
    tok = qwen2.tokenizer
    assert tok.decode(tok.encode(text)) == unicodedata.normalize("NFC", text)


def test_padding_rows_are_never_generated(qwen2):
    pad = qwen2.padding_ids
    assert pad.tolist() == list(range(151665, 151936)), "271 '[PAD...]' rows after the tokens"
    prompt = [qwen2.encode("Hello")]
    saved = qwen2.params["unembed"]["W_U"]  # (D, V), read-only when mapped from the weight cache
    W_U = saved.copy()
    best = int(np.argmax(qwen2.next_token_logits(prompt)[0]))
    qwen2.params["unembed"]["W_U"] = W_U
    try:  # give a padding row twice the winning token's logit: it must still not be produced
        W_U[:, pad[0]] = 2 * W_U[:, best]
        logits = qwen2.next_token_logits(prompt)[0]
        assert int(np.argmax(logits)) == pad[0], "the test did not make the padding row win"
        new = qwen2.generate_ids(prompt, 3, stop_at_eos=False)[0]
        assert not set(new) & set(pad.tolist()), new
    finally:
        qwen2.params["unembed"]["W_U"] = saved


# --------------------------------------------------------------------------- golden logits


def test_golden_ids_and_logits_equal_transformers(qwen2):
    with np.load(FIXTURES / "qwen2_golden.npz") as z:
        golden = {k: z[k] for k in z.files}
    assert str(golden["gguf_sha256"]) == QWEN_SHA256
    sample = golden["sample_ids"]
    n = sum(1 for k in golden if k.startswith("ids_"))
    assert n >= 3
    for i in range(n):
        text = str(golden[f"text_{i}"])
        ids = qwen2.encode_chat_text(text)
        assert ids == golden[f"ids_{i}"].tolist(), f"prompt {i}: token ids differ"
        logits = qwen2.next_token_logits([ids])[0].astype(np.float64)  # (V,)
        top = golden[f"top_ids_{i}"]
        assert int(np.argmax(logits)) == int(top[0]), f"prompt {i}: top-1 differs"
        for name, where in (("top", top), ("sample", sample)):
            err = np.abs(logits[where] - golden[f"{name}_logits_{i}"]).max()
            assert err < 2e-2, f"prompt {i}: {name} logits differ by {err:.2e}"
        lse = np.log(np.exp(logits - logits.max()).sum()) + logits.max()
        assert abs(lse - float(golden[f"logsumexp_{i}"])) < 2e-2, f"prompt {i}: normalizer"


def test_golden_prompts_render_from_the_model_template(qwen2):
    """transformers rendered the golden texts; our chat() renders the same messages alike."""
    with np.load(FIXTURES / "qwen2_golden.npz") as z:
        pairs = [(json.loads(str(z[k])), str(z[k.replace("messages", "text")])) for k in z.files
                 if k.startswith("messages_")]  # fmt: skip
    assert len(pairs) >= 3
    for messages, text in pairs:
        assert qwen2.chat(messages, add_generation_prompt=True) == text
