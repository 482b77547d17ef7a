"""GGUF loading: tiny GGUF files written here with the gguf package's writer.

The source is the tiny_llama fixture (HF safetensors, GQA 4 query / 2 kv heads, untied). We
write it the way llama.cpp's converter does -- GGUF tensor names, Q and K rows permuted so
rotary pairs are adjacent -- as F32, as Q8_0, as Q4_1, and as SmolLM2's mix (Q8_0 embedding,
Q4_1 matrices, F32 norms). The loader must give back the HF weights (exactly for F32) and the
fixture's reference logits.

Tolerances for the quantized files. Both formats quantize blocks of 32 weights:
  Q8_0: w ~ d * q, d = max|w| / 127 (stored as float16): error <= d / 2 per weight, about
        0.4% of the block's largest weight;
  Q4_1: w ~ d * q + m, d = (max - min) / 15: error <= d / 2, about 3% of the block's range.
Each weight is checked against its own block's bound (plus float16 rounding of d and m).
Logits are checked two ways. Exactly: the GGUF model equals an HF folder holding the same
dequantized weights, unpermuted by an independent index permutation (1e-10 in float64) --
this is what catches a layout mistake. Loosely, against the float reference: the relative
RMS weight error is d / sqrt(12) / sigma, with d ~ 2.5 sigma / 127 (Q8_0) and ~4.5 sigma / 15
(Q4_1) for Gaussian blocks of 32, i.e. ~0.6% and ~9%; this random 2-layer model amplifies it
~3-5x into the RMS logit error relative to the RMS logit spread: observed 0.027 (Q8_0) and
0.29 (Q4_1). We assert < 0.1 and < 0.6 (~3x / 2x headroom), and
top-1 agreement >= 80% for Q8_0. The loose check alone could not catch a wrong layout (an F32
file whose Q/K permutation is not undone scores 0.42): the exact check does.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from helpers import (
    FIXTURES,
    all_f32,
    all_q4_1,
    all_q8_0,
    gguf_name,
    gguf_of_arch,
    llama_cpp_permute,
    smollm2_mix,
    write_tiny_gguf,
)

import cel_numpy as cn
from cel_numpy.cli import UserError
from cel_numpy.models.transformer import flatten_params
from cel_numpy.models.weights import permute_rotary_rows, unpermute_rotary_rows


def block_error_bound(a: np.ndarray, qtype) -> np.ndarray:
    """Largest dequantization error each weight may have under qtype (per 32-weight block)."""
    if qtype == Q.F32:
        return np.zeros_like(a)
    blocks = a.reshape(-1, 32)
    if qtype == Q.Q8_0:
        step = np.abs(blocks).max(axis=1, keepdims=True) / 127
        slack = np.abs(blocks) * 2.0**-10  # float16 rounding of d
    else:  # Q4_1
        lo, hi = blocks.min(axis=1, keepdims=True), blocks.max(axis=1, keepdims=True)
        step = (hi - lo) / 15
        slack = (np.abs(blocks) + np.abs(lo)) * 2.0**-10  # float16 rounding of d and m
    return np.broadcast_to(step / 2 + slack + 1e-7, blocks.shape).reshape(a.shape)


def reference() -> dict:
    with np.load(FIXTURES / "tiny_llama_reference.npz") as z:
        return {k: z[k] for k in z.files}


def test_permutation_roundtrip():
    w = np.arange(3 * 8 * 5, dtype=np.float32).reshape(24, 5)
    np.testing.assert_array_equal(permute_rotary_rows(w, 3), llama_cpp_permute(w, 3))
    np.testing.assert_array_equal(unpermute_rotary_rows(llama_cpp_permute(w, 3), 3), w)


def test_f32_gguf_loads_the_exact_weights_and_logits(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, all_f32)
    ours = cn.load_model(path, dtype="float64")
    hf = cn.load_model(FIXTURES / "tiny_llama", dtype="float64")
    assert ours.config.to_dict() | {"name": ""} == hf.config.to_dict() | {"name": ""}
    a, b = flatten_params(ours.params), flatten_params(hf.params)
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)  # undoing the permutation is exact
    ref = reference()
    logits = ours.logits(ref["input_ids"], ref["attention_mask"])
    real = ref["attention_mask"].astype(bool)
    assert np.abs(logits - ref["logits"])[real].max() < 1e-10  # same weights: f64 rounding only
    ablated = ours.logits(
        ref["input_ids"],
        ref["attention_mask"],
        ablate=[(int(ref["ablate_layer"]), int(ref["ablate_head"]))],
    )
    assert np.abs(ablated - ref["logits_ablated"])[real].max() < 1e-10


def test_gguf_tokenizer_fields(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, all_f32)
    model = cn.load_model(path)
    tok = model.tokenizer
    assert (tok.bos_id, tok.eos_id, tok.add_bos) == (1, 2, False)
    assert model.decode(model.encode("Hi there")) == "Hi there"
    assert model.encode(" t") == [95]  # the merge applies
    text = model.generate("Hi", max_new_tokens=3)
    assert isinstance(text, str)


def relative_logit_error(logits: np.ndarray, ref: dict) -> float:
    """RMS of (ours - reference) over real positions, relative to the reference's RMS spread.

    Both are centred per position first (a softmax ignores a constant shift).
    """
    real = ref["attention_mask"].astype(bool)
    theirs = ref["logits"][real]
    diff = logits[real] - theirs
    diff = diff - diff.mean(-1, keepdims=True)
    spread = theirs - theirs.mean(-1, keepdims=True)
    return float(np.sqrt((diff * diff).mean() / (spread * spread).mean()))


def unpermute_by_index(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama_cpp_permute built from the row permutation itself
    (independent of the loader)."""
    perm = llama_cpp_permute(np.arange(w.shape[0])[:, None], n_head)[
        :, 0
    ]  # permuted row i = source perm[i]
    out = np.empty_like(w)
    out[perm] = w
    return out


@pytest.mark.parametrize(
    "scheme, max_rel_err",
    [(all_q8_0, 0.1), (all_q4_1, 0.6), (smollm2_mix, 0.6)],
    ids=["q8_0", "q4_1", "smollm2_mix"],
)
def test_quantized_gguf_within_quantization_tolerance(tmp_path, scheme, max_rel_err):
    import shutil

    from safetensors.numpy import save_file

    path = tmp_path / "tiny.gguf"
    written = write_tiny_gguf(path, scheme)
    ours = cn.load_model(path, dtype="float64")
    reader = gguf.GGUFReader(str(path))

    # 1. weights: every dequantized weight within its own block's bound (GGUF layout)
    dequantized = {}
    for t in reader.tensors:
        deq = gguf.quants.dequantize(t.data, t.tensor_type).reshape(written[t.name].shape)
        err = np.abs(deq - written[t.name])
        bound = block_error_bound(written[t.name], t.tensor_type)
        assert np.all(err <= bound), (
            f"{t.name} ({t.tensor_type.name}): error {err.max():.2e} above its bound"
        )
        dequantized[t.name] = deq

    # 2. exact: the GGUF model equals an HF folder holding the same dequantized weights, unpermuted
    #    independently of the loader. This is the check that catches a layout mistake.
    folder = tmp_path / "dequantized_hf"
    folder.mkdir()
    shutil.copy(FIXTURES / "tiny_llama" / "config.json", folder)
    hf_tensors = {}
    for hf_name in _hf_names():
        w = dequantized[gguf_name(hf_name)]
        if hf_name.endswith("q_proj.weight"):
            w = unpermute_by_index(w, 4)
        elif hf_name.endswith("k_proj.weight"):
            w = unpermute_by_index(w, 2)
        hf_tensors[hf_name] = np.ascontiguousarray(w)
    save_file(hf_tensors, folder / "model.safetensors")
    same_weights = cn.load_model(folder, dtype="float64")
    ref = reference()
    logits = ours.logits(ref["input_ids"], ref["attention_mask"])
    np.testing.assert_allclose(
        logits, same_weights.logits(ref["input_ids"], ref["attention_mask"]), atol=1e-10
    )

    # 3. loose: against the float reference, the error is what the quantization noise makes it
    rel = relative_logit_error(logits, ref)
    assert rel < max_rel_err, f"{scheme.__name__}: relative logit error {rel:.3f}"
    if scheme is all_q8_0:
        real = ref["attention_mask"].astype(bool)
        agree = (logits.argmax(-1) == ref["logits"].argmax(-1))[real].mean()
        assert agree >= 0.8, f"Q8_0 top-1 agrees at only {agree:.0%} of positions"


def _hf_names() -> list[str]:
    from safetensors import safe_open

    with safe_open(str(FIXTURES / "tiny_llama" / "model.safetensors"), framework="numpy") as f:
        return list(f.keys())


def test_chunked_dequantization_equals_whole_tensor(tmp_path, monkeypatch):
    from cel_numpy.models import gguf_loader

    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, smollm2_mix)
    reader = gguf.GGUFReader(str(path))
    monkeypatch.setattr(gguf_loader, "CHUNK_ELEMENTS", 64)  # several chunks per tensor
    for t in reader.tensors:
        whole = gguf.quants.dequantize(t.data, t.tensor_type).reshape(
            gguf_loader.dequantize_tensor(t, np.float32).shape
        )
        np.testing.assert_array_equal(
            gguf_loader.dequantize_tensor(t, np.float32), whole, err_msg=t.name
        )


def test_unknown_gguf_architecture(tmp_path):
    path = gguf_of_arch(tmp_path, "falcon")
    with pytest.raises(
        UserError, match=r"GGUF architecture 'falcon' is not supported; supported: llama, qwen2"
    ):
        cn.load_model(path)


def test_truncated_gguf_is_one_line(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, smollm2_mix)
    data = path.read_bytes()
    for cut in (len(data) - 100, 200):  # inside the tensor data; inside the header
        path.write_bytes(data[:cut])
        with pytest.raises(
            UserError, match=r"tiny.gguf.*(truncated|damaged).*cel-numpy fetch"
        ) as err:
            cn.load_model(path)
        assert "\n" not in str(err.value)


# --------------------------------------------------------------------------- the reader override


def test_reader_override_fits_the_installed_gguf(tmp_path):
    """gguf_loader's reader subclass overrides private parts of gguf.GGUFReader: the `data`
    attribute (a plain ndarray view instead of np.memmap: opening SmolLM2's file is ~2.5x
    faster) and `_build_tensors` / `_get_field_parts` (the guards against truncated files and
    bogus array lengths). pyproject.toml bounds gguf below its next minor release; this test
    fails when the installed gguf no longer has the shape the override relies on."""
    import inspect
    import tomllib

    from gguf import GGUFReader

    from cel_numpy.models.gguf_loader import _reader_class

    def params(name: str) -> list[str]:
        return list(inspect.signature(getattr(GGUFReader, name)).parameters)

    assert params("_build_tensors") == ["self", "start_offs", "fields"]
    assert params("_get_field_parts") == ["self", "orig_offs", "raw_type"]
    assert params("_get")[:3] == ["self", "offset", "dtype"]
    assert isinstance(GGUFReader.gguf_scalar_to_np, dict)

    calls: dict[str, int] = {"_build_tensors": 0, "_get_field_parts": 0}

    class Counting(_reader_class()):
        def _build_tensors(self, start_offs, fields):
            calls["_build_tensors"] += 1
            assert all(len(f.parts) == 6 for f in fields)  # _, name, _, dims, dtype, offset
            return super()._build_tensors(start_offs, fields)

        def _get_field_parts(self, orig_offs, raw_type):
            calls["_get_field_parts"] += 1
            return super()._get_field_parts(orig_offs, raw_type)

    path = tmp_path / "tiny.gguf"
    written = write_tiny_gguf(path, smollm2_mix)
    reader = Counting(str(path))
    assert type(reader.data) is np.ndarray  # the reader assigned self.data = np.memmap(...)
    assert calls["_build_tensors"] == 1 and calls["_get_field_parts"] > 10, calls
    assert {t.name for t in reader.tensors} == set(written)

    pyproject = tomllib.loads((FIXTURES.parent.parent / "pyproject.toml").read_text())
    (spec,) = [d for d in pyproject["project"]["dependencies"] if d.startswith("gguf")]
    assert "<" in spec, f"gguf needs an upper bound while the override exists: {spec}"
