"""Qwen2 on the tiny fixture: config, GGUF layout (no Q/K permutation, Q/K/V biases), bad files.

tests/fixtures/tiny_qwen2 is a random Qwen2ForCausalLM written by scripts/write_fixtures.py
(--only qwen2); its logits, ablations and gradients are checked against transformers / torch
autograd with the other families in test_models.py, test_backward.py and test_fast_engine.py. Here:
what is particular to Qwen2.
"""

from __future__ import annotations

import struct
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.quants import quantize
from safetensors.numpy import load_file

import cel_numpy as cn
from cel_numpy.errors import ModelFileError
from cel_numpy.models.transformer import flatten_params

FIXTURES = Path(__file__).parent / "fixtures"

GGUF_NAMES = {  # Hugging Face name (inside a layer) -> llama.cpp's name
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
TOP_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def write_qwen2_gguf(path: Path, qtype=Q.F32) -> None:
    """tiny_qwen2 as llama.cpp writes a qwen2 GGUF: HF rows as they are (no Q/K permutation)."""
    hf = load_file(FIXTURES / "tiny_qwen2" / "model.safetensors")
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_block_count(2)
    w.add_context_length(64)
    w.add_embedding_length(32)
    w.add_feed_forward_length(48)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1e6)
    for name, array in hf.items():
        if name in TOP_NAMES:
            target = TOP_NAMES[name]
        else:
            _, _, layer, rest = name.split(".", 3)
            target = f"blk.{layer}.{GGUF_NAMES[rest]}"
        kind = qtype if array.ndim == 2 and array.shape[-1] % 32 == 0 else Q.F32  # whole blocks
        w.add_tensor(target, quantize(array, kind), raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_tiny_qwen2_config_and_parameters():
    model = cn.load_model(FIXTURES / "tiny_qwen2", dtype="float64")
    c = model.config
    assert (c.family, c.arch, c.qkv_bias, c.attn_bias, c.tied_embeddings) == (
        "llama", "qwen2", True, False, False
    )  # fmt: skip
    assert (c.n_heads, c.n_kv_heads, c.rope_base) == (4, 2, 1e6)
    attn = model.params["blocks"][0]["attn"]
    assert (
        attn["b_Q"].shape == (4, 8) and attn["b_K"].shape == (2, 8) and attn["b_V"].shape == (2, 8)
    )
    assert "b_O" not in attn, "Qwen2 has no output-projection bias"
    assert model.n_params() == c.n_params()
    hf = load_file(FIXTURES / "tiny_qwen2" / "model.safetensors")
    assert model.n_params() == sum(a.size for a in hf.values())


def test_qwen2_gguf_keeps_rotate_half_rows_and_loads_the_exact_weights(tmp_path):
    path = tmp_path / "tiny_qwen2.gguf"
    write_qwen2_gguf(path)
    ours = cn.load_model(path, dtype="float64")
    hf = cn.load_model(FIXTURES / "tiny_qwen2", dtype="float64")
    assert ours.config.to_dict() | {"name": ""} == hf.config.to_dict() | {"name": ""}
    a, b = flatten_params(ours.params), flatten_params(hf.params)
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    with np.load(FIXTURES / "tiny_qwen2_reference.npz") as ref:
        real = ref["attention_mask"].astype(bool)
        logits = ours.logits(ref["input_ids"], ref["attention_mask"])
        assert np.abs(logits - ref["logits"])[real].max() < 1e-10


def test_quantized_qwen2_gguf_is_dequantized_by_the_gguf_package(tmp_path):
    path = tmp_path / "tiny_qwen2_q8.gguf"
    write_qwen2_gguf(path, Q.Q8_0)
    ours = cn.load_model(path, dtype="float64")
    with np.load(FIXTURES / "tiny_qwen2_reference.npz") as ref:
        real = ref["attention_mask"].astype(bool)
        logits = ours.logits(ref["input_ids"], ref["attention_mask"])[real]
        theirs = ref["logits"][real]
    # Q8_0 keeps ~0.4% of each block's largest weight: the logits move by a few percent.
    rel = np.sqrt(np.mean((logits - theirs) ** 2)) / np.std(theirs)
    assert 0 < rel < 0.1, f"relative RMS logit error {rel:.3f}"


def _patch_tensor_type(path: Path, tensor: str, new_type: int) -> None:
    """Overwrite the GGML type field of one tensor's header entry in place."""
    data = bytearray(path.read_bytes())
    name = tensor.encode()
    at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
    (n_dims,) = struct.unpack_from("<I", data, at)
    struct.pack_into("<I", data, at + 4 + 8 * n_dims, new_type)
    path.write_bytes(bytes(data))


def test_unknown_tensor_type_is_one_line_naming_the_file_and_tensor(tmp_path):
    path = tmp_path / "odd.gguf"
    write_qwen2_gguf(path)
    _patch_tensor_type(path, "blk.1.ffn_up.weight", 250)
    with pytest.raises(ModelFileError) as info:
        cn.load_model(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: tensor blk.1.ffn_up.weight has tensor type 250"), message
    assert "upgrade gguf" in message, message


def test_unknown_architecture_is_one_line(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_qwen2_gguf(path)
    data = path.read_bytes().replace(b"qwen2", b"qwen9")  # key prefixes and the value alike
    path.write_bytes(data)
    with pytest.raises(ModelFileError) as info:
        cn.load_model(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: GGUF architecture 'qwen9' is not supported"), message
    assert "supported: llama, qwen2" in message, message


def _ascii_tokenizer(n_extra: int = 0):
    """A byte-level tokenizer of the 94 printable ASCII characters (+ n_extra unused tokens)."""
    from cel_numpy.models.tokenizer import BPETokenizer

    vocab = {chr(c): i for i, c in enumerate(range(0x21, 0x7F))}
    vocab |= {f"[PAD{i}]": 94 + i for i in range(n_extra)}
    return BPETokenizer(vocab, [], unused_ids=range(94, 94 + n_extra))


def test_padding_rows_are_masked_in_both_decoders():
    """96 embedding rows, 94 tokens: rows 94 and 95 are padding and must never be generated."""
    from cel_numpy.models.fast import Stop, generate_conditions, prepare
    from cel_numpy.models.model import Model

    base = cn.load_model(FIXTURES / "tiny_qwen2")
    params = copy_params(base.params)
    model = Model(params, base.config, _ascii_tokenizer(), source="tiny")
    assert model.padding_ids.tolist() == [94, 95]
    prompts = [[5, 6, 7], [8, 9]]
    W_U = params["unembed"]["W_U"]  # (D, V)
    W_U[:, 95] = 50 * np.abs(W_U).max() * np.sign(W_U).sum(axis=1)  # a huge logit everywhere
    logits = model.logits(prompts)
    assert (logits[:, -1].argmax(-1) == 95).all(), "the padding row should win unmasked"
    naive = model.generate_ids(prompts, 4, stop_at_eos=False)
    fast = generate_conditions(prepare(model), prompts, [()], None, Stop((), 4))[0][0]
    for rows in (naive, fast):
        for row in rows:
            assert len(row) == 4 and not {94, 95} & set(row), rows
    assert naive == fast
    masked = model.mask_padding(np.zeros((2, 96)))
    assert (masked[:, 94:] == np.finfo(np.float64).min).all() and (masked[:, :94] == 0).all()


def test_unused_gguf_slots_are_padding_too():
    from cel_numpy.models.model import Model

    base = cn.load_model(FIXTURES / "tiny_qwen2")
    model = Model(base.params, base.config, _ascii_tokenizer(n_extra=2), source="tiny")
    assert model.padding_ids.tolist() == [94, 95]  # "[PAD94]", "[PAD95]": type UNUSED


def test_more_tokens_than_embedding_rows_is_a_load_error():
    from cel_numpy.models.model import Model

    base = cn.load_model(FIXTURES / "tiny_qwen2")
    with pytest.raises(ModelFileError) as info:
        Model(base.params, base.config, _ascii_tokenizer(n_extra=3), source="tiny_dir")
    message = str(info.value)
    assert message.startswith("tiny_dir: the tokenizer has 97 tokens but the embedding only 96")
    assert "\n" not in message


def copy_params(params):
    """A deep copy of nested params (dicts of arrays)."""
    if isinstance(params, dict):
        return {k: copy_params(v) for k, v in params.items()}
    if isinstance(params, list):
        return [copy_params(v) for v in params]
    return np.array(params, copy=True)
