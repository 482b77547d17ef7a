"""Gemma 3 on the tiny fixture and in isolation: what is particular to it.

tests/fixtures/tiny_gemma3 is a random Gemma3ForCausalLM (3 layers: sliding, global, sliding;
a window of 3 keys, shorter than the 7-token rows; query scale 6, head size 8) written by
scripts/write_fixtures.py --only gemma3; its logits, ablations and gradients are checked against
transformers / torch autograd with the other families in test_models.py, test_backward.py and
test_fast_engine.py. The real file is tests/test_gemma3_real.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
from safetensors.numpy import load_file

import cel_numpy as cn
from cel_numpy.attention import padded_causal_mask
from cel_numpy.errors import TokenizerError
from cel_numpy.models.config import ConfigError, ModelConfig
from cel_numpy.models.gguf_loader import gguf_tokenizer
from cel_numpy.models.model import Model
from cel_numpy.models.transformer import sliding_window_mask

FIXTURES = Path(__file__).parent / "fixtures"


def test_tiny_gemma3_config_and_parameters():
    model = cn.load_model(FIXTURES / "tiny_gemma3", dtype="float64")
    c = model.config
    assert (c.arch, c.local_layers, c.sliding_window, c.rope_base, c.rope_local_base) == (
        "gemma3", (0, 2), 3, 1e6, 1e4
    )  # fmt: skip
    assert c.query_scale == 6.0 and c.embed_scale == np.sqrt(32)
    assert c.attn_scale == pytest.approx(6**-0.5, rel=1e-15)
    assert model.n_params() == c.n_params()
    hf = load_file(FIXTURES / "tiny_gemma3" / "model.safetensors")
    assert model.n_params() == sum(a.size for a in hf.values())
    # Hugging Face stores w, the gain is 1 + w: every norm weight was loaded with its 1 added
    ours = model.params["blocks"][1]
    np.testing.assert_allclose(
        ours["ln1_post"]["w"], hf["model.layers.1.post_attention_layernorm.weight"] + 1.0
    )
    np.testing.assert_allclose(
        ours["ln2"]["w"], hf["model.layers.1.pre_feedforward_layernorm.weight"] + 1.0
    )
    np.testing.assert_allclose(
        ours["attn"]["q_norm"]["w"], hf["model.layers.1.self_attn.q_norm.weight"] + 1.0
    )


def test_sliding_window_keeps_the_last_window_keys_counted_in_real_tokens():
    # one row: 2 real past tokens, 2 padding slots (a segment boundary), then 4 real tokens
    valid = np.array([[1, 1, 0, 0, 1, 1, 1, 1]], bool)  # (B, S)
    T = 4
    mask = sliding_window_mask(padded_causal_mask(valid, T), valid, window=3)[0, 0]  # (T, S)
    # real positions of the keys: 0 1 - - 2 3 4 5; query t has position t + 2
    expected = np.array(
        [
            [1, 1, 0, 0, 1, 0, 0, 0],  # position 2 sees 0, 1, 2
            [0, 1, 0, 0, 1, 1, 0, 0],  # position 3 sees 1, 2, 3
            [0, 0, 0, 0, 1, 1, 1, 0],
            [0, 0, 0, 0, 0, 1, 1, 1],
        ],
        bool,
    )
    np.testing.assert_array_equal(mask, expected)


def test_a_window_longer_than_the_prompt_changes_nothing():
    model = cn.load_model(FIXTURES / "tiny_gemma3", dtype="float64")
    ids = [[5, 17, 33, 2, 9, 41, 60]]
    wide = Model(
        model.params,
        ModelConfig.from_dict({**model.config.to_dict(), "sliding_window": 7}),
    )
    unlimited = Model(
        model.params, ModelConfig.from_dict({**model.config.to_dict(), "sliding_window": 64})
    )
    np.testing.assert_allclose(wide.logits(ids), unlimited.logits(ids), atol=1e-12)
    narrow = model.logits(ids)  # window 3 < 7 tokens: later queries lose keys
    assert np.abs(narrow[0, 3:] - wide.logits(ids)[0, 3:]).max() > 1e-3
    np.testing.assert_allclose(narrow[0, :3], wide.logits(ids)[0, :3], atol=1e-12)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"final_logit_softcapping": 30.0}, "final_logit_softcapping=30.0 is not supported"),
        ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping=50.0 is not supported"),
        ({"hidden_activation": "gelu"}, "gemma3 activation 'gelu' not supported"),
        ({"layer_types": ["sliding_attention"]}, "layer_types must name 3 sliding/full layers"),
    ],
)
def test_unsupported_gemma3_configs_are_refused(change, message):
    hf = json.loads((FIXTURES / "tiny_gemma3" / "config.json").read_text())
    with pytest.raises(ConfigError, match=message):
        ModelConfig.from_hf_config({**hf, **change})


def test_gemma_fields_belong_to_the_llama_family():
    gpt2 = cn.load_model(FIXTURES / "tiny_gpt2").config.to_dict()
    with pytest.raises(ConfigError, match="Gemma 3 fields apply to the llama family only"):
        ModelConfig.from_dict({**gpt2, "qk_norm": True})
    llama = cn.load_model(FIXTURES / "tiny_llama").config.to_dict()
    with pytest.raises(ConfigError, match="local_layers need a positive integer sliding_window"):
        ModelConfig.from_dict({**llama, "local_layers": [0]})


def _tokenizer_gguf(path: Path, add_space_prefix: bool | None, tokens: list[str]) -> Path:
    writer = gguf.GGUFWriter(str(path), "gemma3")
    writer.add_tokenizer_model("llama")
    if add_space_prefix is not None:
        writer.add_add_space_prefix(add_space_prefix)
    writer.add_token_list(tokens)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("prefix", [True, None])
def test_sentencepiece_gguf_with_a_space_prefix_is_refused(tmp_path, prefix):
    path = _tokenizer_gguf(tmp_path / "t.gguf", prefix, ["a", "b"])
    with pytest.raises(TokenizerError, match="add_space_prefix is true \\(or absent\\)") as info:
        gguf_tokenizer(gguf.GGUFReader(path))
    assert str(info.value).startswith(str(path)) and "\n" not in str(info.value)


def test_sentencepiece_vocabulary_needs_every_byte_token(tmp_path):
    tokens = ["<unk>", "a"] + [f"<0x{b:02X}>" for b in range(255)]  # 0xFF missing
    path = _tokenizer_gguf(tmp_path / "t.gguf", False, tokens)
    with pytest.raises(TokenizerError, match="lacks the byte token <0xFF>"):
        gguf_tokenizer(gguf.GGUFReader(path))


def test_sentencepiece_merges_by_vocabulary_rank_with_byte_fallback(tmp_path):
    # "ab" ranks above "bc": "abc" -> ab + c; "é" is no token: its two UTF-8 bytes
    tokens = ["<unk>", "a", "b", "c", "\u2581", "ab", "bc", "\u2581a", "  "]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    tok = gguf_tokenizer(gguf.GGUFReader(_tokenizer_gguf(tmp_path / "t.gguf", False, tokens)))
    spell = lambda text: [tok.id_to_token(i) for i in tok.encode(text)]
    assert spell("abc") == ["ab", "c"]
    assert spell("bcab a") == ["bc", "ab", "\u2581a"]
    assert spell("a  b") == ["a", "\u2581\u2581", "b"], "a space run is one token"
    assert spell("aé") == ["a", "<0xC3>", "<0xA9>"]
    assert tok.decode(tok.encode("bcab aé  b")) == "bcab aé  b"
