"""SmolLM2-135M-Instruct from its GGUF file (Q8_0 embedding, Q4_1 matrices), run in NumPy.

These tests FAIL, not skip, when the model cannot be fetched: CI must exercise the real model.
The model is loaded once per module. Facts were chosen with a top-1 logit margin >= 1 over the
runner-up, so float32 rounding cannot flip them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import cel_numpy as cn
from cel_numpy.models.transformer import transformer_forward

pytestmark = pytest.mark.download  # every test here needs the fetched model

FACTS = {
    "The capital of France is": " Paris",
    "The capital of Germany is": " Berlin",
    "The capital of Italy is": " Rome",
    "The capital of Japan is": " Tokyo",
    "The opposite of hot is": " cold",
    "The chemical symbol for gold is": " Au",
}


@pytest.fixture(scope="module")
def model():
    return cn.load_model("smollm2")  # fetches on first use; any failure fails the tests


@pytest.fixture(scope="module")
def facts(model):
    """Token ids of the fact prompts and their next-token logits, one batched forward."""
    prompts = [model.encode(p) for p in FACTS]
    return prompts, model.next_token_logits(prompts)  # (B, V)


def test_gguf_facts(model):
    c = model.config
    got = (
        c.family,
        c.n_layers,
        c.n_heads,
        c.n_kv_heads,
        c.d_model,
        c.d_head,
        c.d_mlp,
        c.vocab_size,
    )
    assert got == ("llama", 30, 9, 3, 576, 64, 1536, 49152)
    assert (c.rope_base, c.norm_eps, c.tied_embeddings) == (1e5, 1e-5, True)
    assert model.dtype == np.float32
    assert model.tokenizer.add_bos is False
    assert model.encode("The capital of France is")[0] != model.tokenizer.bos_id


def test_plain_facts_top1(model, facts):
    _, logits = facts
    got = {p: model.decode([int(i)]) for p, i in zip(FACTS, logits.argmax(-1))}
    assert got == FACTS


def test_generate_text(model):
    assert model.generate("The capital of France is", max_new_tokens=2).startswith(" Paris")


def test_batch_equals_one_by_one(model, facts):
    prompts, batched = facts
    for b in (0, 4, 5):  # different lengths, so different amounts of left padding
        alone = model.next_token_logits([prompts[b]])[0]
        # float32, logits ~15-25: different GEMM shapes round differently, ~1e-5 relative
        np.testing.assert_allclose(batched[b], alone, atol=2e-3, rtol=0, err_msg=list(FACTS)[b])
        assert batched[b].argmax() == alone.argmax()


def test_kv_cache_generation_equals_recomputation(model):
    prompts = [model.encode("The capital of France is"), model.encode("One, two, three,")]
    cached = model.generate_ids(prompts, 4)
    assert cached == model.generate_ids(prompts, 4, use_cache=False)
    assert all(len(row) == 4 for row in cached)


def test_head_mask_of_ones_is_bitwise_identical(model, facts):
    prompts, _ = facts
    ids, mask = model.pad(prompts[:3])
    c = model.config
    plain, _ = transformer_forward(model.params, c, ids, mask, keep_activations=False)
    ones, _ = transformer_forward(
        model.params,
        c,
        ids,
        mask,
        head_mask=np.ones((c.n_layers, c.n_heads)),
        keep_activations=False,
    )
    np.testing.assert_array_equal(plain, ones)


def test_ablating_a_head_changes_the_logits(model, facts):
    prompts, intact = facts[0][:3], facts[1][:3]
    zero = model.next_token_logits(prompts, ablate=[(0, 4)])
    assert np.abs(zero - intact).max() > 1e-2
    mean = model.next_token_logits(prompts, ablate=[(0, 4)], ablation="mean", reference=prompts)
    assert np.abs(mean - intact).max() > 1e-3
    assert np.abs(mean - zero).max() > 1e-3


MEASURE = textwrap.dedent(
    """
    import json, resource
    import numpy, gguf  # the baseline: an interpreter with numpy and gguf imported
    import cel_numpy.models.loaders, cel_numpy.models.gguf_loader, cel_numpy.models.model
    import cel_numpy.models.tokenizer
    from cel_numpy.models.fetch import fetch
    path = fetch("smollm2")
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    model = cel_numpy.models.loaders.load_model(path)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"base": base, "peak": peak, "weights": model.weight_bytes()}))
    """
)


def measure_load_memory() -> dict:
    """Peak resident memory of loading SmolLM2 in a fresh interpreter, minus its baseline."""
    out = subprocess.run(
        [sys.executable, "-c", MEASURE], capture_output=True, text=True, check=True
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["ratio"] = (result["peak"] - result["base"]) / result["weights"]
    return result


@pytest.mark.skipif(sys.platform != "linux", reason="ru_maxrss is in KiB on Linux only")
def test_load_peak_memory_under_1_5x_float32_weights(model):
    m = measure_load_memory()
    assert m["weights"] == model.n_params() * 4
    assert m["ratio"] < 1.5, (
        f"loading took {(m['peak'] - m['base']) / 1e6:.0f} MB above baseline for "
        f"{m['weights'] / 1e6:.0f} MB of float32 weights ({m['ratio']:.2f}x)"
    )
