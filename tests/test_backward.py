"""The whole-transformer backward: finite differences, torch autograd parity, the head-mask screen.

References: central differences in float64 against a random direction and elementwise on a
sample of every tensor; `tests/fixtures/<name>_grads.npz` written by torch autograd
(scripts/write_fixtures.py); an attention block whose readout is linear in the head mask, where
the first-order ablation estimate must equal the exact ablation.
"""

import shutil

import numpy as np
import pytest
import safetensors.numpy

import cel_numpy as cn
from cel_numpy import attention as at
from cel_numpy.models.transformer import flatten_params

FIXTURES = __import__("pathlib").Path(__file__).parent / "fixtures"
MODELS = ["tiny_gpt2", "tiny_llama", "tiny_llama_tied", "tiny_qwen2", "tiny_gemma3"]


def _batch(model, rng):
    """Two left-padded rows of random tokens with random targets; one target left unscored."""
    V = model.config.vocab_size
    seqs = [list(rng.integers(1, V, n)) for n in (6, 4)]
    targets = [list(rng.integers(0, V, n)) for n in (6, 4)]
    targets[1][0] = -1
    return seqs, targets


def _distinct_tensors(model) -> dict:
    """flatten_params without the tied unembedding (a view of W_E: the same tensor twice)."""
    flat = flatten_params(model.params)
    if np.shares_memory(flat["unembed.W_U"], flat["embed.W_E"]):
        del flat["unembed.W_U"]
    return flat


@pytest.fixture(scope="module", params=MODELS)
def model64(request):
    return cn.load_model(FIXTURES / request.param, dtype="float64")


@pytest.mark.parametrize("ablation", ["zero", "mean"])
def test_random_direction_matches_finite_differences(model64, ablation):
    rng = np.random.default_rng(1)
    c = model64.config
    seqs, targets = _batch(model64, rng)
    head_mask = rng.uniform(0.3, 1.0, (c.n_layers, c.n_heads))
    head_mask[0] = 1.0  # layer 0 runs without a mask: its gradient comes from the ones path
    mean_z = rng.normal(size=(c.n_layers, c.n_heads, c.d_head)) if ablation == "mean" else None
    kw = dict(ablation=ablation, mean_z=mean_z)
    _, grads = model64.loss_and_grads(seqs, targets, head_mask=head_mask, **kw)

    flat = _distinct_tensors(model64)
    gflat = flatten_params({k: v for k, v in grads.items() if k != "head_mask"})
    direction = {k: rng.normal(size=v.shape) for k, v in flat.items()}
    dmask = rng.normal(size=head_mask.shape)

    def loss_at(s):
        for k, v in flat.items():
            v += s * direction[k]
        try:
            return model64.loss_and_grads(seqs, targets, head_mask=head_mask + s * dmask, **kw)[0]
        finally:
            for k, v in flat.items():
                v -= s * direction[k]

    eps = 1e-5
    numeric = (loss_at(eps) - loss_at(-eps)) / (2 * eps)
    analytic = sum(float(np.sum(gflat[k] * direction[k])) for k in flat) + float(
        np.sum(grads["head_mask"] * dmask)
    )
    assert abs(numeric - analytic) <= 1e-6 * max(1.0, abs(numeric)), (
        f"directional derivative {analytic} vs FD {numeric}"
    )


def test_grads_have_the_keys_and_shapes_of_params(model64):
    seqs, targets = _batch(model64, np.random.default_rng(2))
    _, grads = model64.loss_and_grads(seqs, targets)
    flat, gflat = (
        flatten_params(model64.params),
        flatten_params({k: v for k, v in grads.items() if k != "head_mask"}),
    )
    assert flat.keys() == gflat.keys()
    assert all(gflat[k].shape == flat[k].shape for k in flat), "a gradient has the wrong shape"
    assert grads["head_mask"].shape == (model64.config.n_layers, model64.config.n_heads)


def test_elementwise_sample_of_every_tensor(model64):
    """Central differences on 4 random elements of every tensor and of the head mask."""
    rng = np.random.default_rng(3)
    c = model64.config
    seqs, targets = _batch(model64, rng)
    head_mask = rng.uniform(0.5, 1.0, (c.n_layers, c.n_heads))
    _, grads = model64.loss_and_grads(seqs, targets, head_mask=head_mask)
    gflat = flatten_params({k: v for k, v in grads.items() if k != "head_mask"})
    cases = [(k, v, gflat[k]) for k, v in _distinct_tensors(model64).items()] + [
        ("head_mask", head_mask, grads["head_mask"])
    ]
    eps = 1e-6
    for name, tensor, grad in cases:
        for flat_index in rng.choice(tensor.size, size=min(4, tensor.size), replace=False):
            idx = np.unravel_index(flat_index, tensor.shape)
            old = tensor[idx]
            tensor[idx] = old + eps
            up = model64.loss_and_grads(seqs, targets, head_mask=head_mask)[0]
            tensor[idx] = old - eps
            down = model64.loss_and_grads(seqs, targets, head_mask=head_mask)[0]
            tensor[idx] = old
            numeric = (up - down) / (2 * eps)
            assert abs(numeric - grad[idx]) <= 1e-6 + 1e-5 * abs(numeric), (
                f"{name}{idx}: {grad[idx]} vs FD {numeric}"
            )


def _reference_grads_in_our_layout(name: str, ref, tmp_path) -> dict:
    """The fixture's checkpoint-named gradients, mapped to our layout by our own loader's table."""
    folder = tmp_path / name
    folder.mkdir()
    shutil.copy(FIXTURES / name / "config.json", folder / "config.json")
    tensors = {k.removeprefix("grad."): ref[k] for k in ref.files if k.startswith("grad.")}
    if name == "tiny_gemma3":  # the loader turns a Gemma norm weight w into 1 + w; a gradient
        # needs no shift (d/dw = d/d(1 + w)), so store g - 1 to read back g
        tensors = {
            k: v.astype(np.float64) - 1.0 if k.endswith("norm.weight") else v
            for k, v in tensors.items()
        }
    safetensors.numpy.save_file(tensors, str(folder / "model.safetensors"))
    return cn.load_model(folder, dtype="float64").params


@pytest.mark.parametrize("name", MODELS)
def test_parity_with_torch_autograd(name, tmp_path):
    ref = np.load(FIXTURES / f"{name}_grads.npz")
    model = cn.load_model(FIXTURES / name, dtype="float64")
    loss, grads = model.loss_and_grads(
        ref["input_ids"], ref["targets"], ref["attention_mask"], head_mask=ref["head_mask"]
    )
    assert abs(loss - float(ref["loss"])) < 1e-10, f"loss {loss} vs torch {float(ref['loss'])}"
    np.testing.assert_allclose(grads["head_mask"], ref["grad_head_mask"], rtol=1e-4, atol=1e-9)
    expected = flatten_params(_reference_grads_in_our_layout(name, ref, tmp_path))
    ours = flatten_params({k: v for k, v in grads.items() if k != "head_mask"})
    assert ours.keys() == expected.keys()
    for key in (
        expected
    ):  # relative to the tensor's largest entry; b_K's true gradient is 0 (softmax shift)
        scale = np.abs(expected[key]).max()
        err = np.abs(ours[key] - expected[key]).max()
        assert err <= 1e-4 * scale + 1e-12, (
            f"{name} {key}: max error {err:.2e}, largest entry {scale:.2e}"
        )


def test_first_order_estimate_is_exact_when_the_metric_is_linear_in_the_mask():
    """One attention block, metric M = <r, out>: M is linear in m, so
    -m_h dM/dm_h = M(m_h = 0) - M(m)."""
    rng = np.random.default_rng(4)
    B, T, D, H, G, E = 2, 5, 12, 4, 2, 3
    params = {
        "W_Q": rng.normal(size=(H, D, E)),
        "W_K": rng.normal(size=(G, D, E)),
        "W_V": rng.normal(size=(G, D, E)),
        "W_O": rng.normal(size=(H, E, D)),
        "b_O": rng.normal(size=D),
    }
    x = rng.normal(size=(B, T, D))
    readout = rng.normal(size=(B, T, D))  # dM/dout
    mask = at.causal_mask(T)
    head_mask = rng.uniform(0.5, 1.0, H)
    fill = rng.normal(size=(H, E))

    def metric(m):
        out, _ = at.attention_forward(params, x, mask=mask, head_mask=m, head_fill=fill)
        return float(np.sum(readout * out))

    _, cache = at.attention_forward(params, x, mask=mask, head_mask=head_mask, head_fill=fill)
    _, _, dmetric_dmask = at.attention_backward(readout, params, cache)
    estimate = -head_mask * dmetric_dmask  # (H,)
    for h in range(H):
        removed = head_mask.copy()
        removed[h] = 0.0
        exact = metric(removed) - metric(head_mask)
        assert abs(estimate[h] - exact) < 1e-10 * max(1.0, abs(exact)), (
            f"head {h}: estimate {estimate[h]} vs exact {exact}"
        )
