"""Gradient checks (every element, float64, random upstream) and invariants of ops and attention."""

import numpy as np
import pytest

from cel_numpy import attention as at
from cel_numpy import ops
from cel_numpy.gradcheck import check_op, cmp, directional_check, numerical_gradient, rel_error

TOL = 1e-6


def assert_all_close(comparisons, atol=1e-8):
    """Relative error below TOL, or both gradients zero up to finite-difference noise.

    The second case is real: without rotary, b_K has gradient exactly zero (adding q.b_K to
    every score of a row leaves the softmax unchanged), and a ratio of two noises means nothing.
    """
    for c in comparisons:
        assert c.rel_error < TOL or c.max_abs_diff < atol, f"gradient check failed: {c}"


@pytest.fixture
def rng():
    return np.random.default_rng(0)


# --------------------------------------------------------------------------- ops


def test_linear_grad(rng):
    inputs = {
        "x": rng.standard_normal((2, 3, 4)),
        "W": rng.standard_normal((4, 5)),
        "b": rng.standard_normal(5),
    }
    res = check_op(
        ops.linear_forward,
        ops.linear_backward,
        inputs,
        rng,
        lambda r: {"x": r[0], "W": r[1]["W"], "b": r[1]["b"]},
    )
    assert_all_close(res)


def test_layer_norm_grad(rng):
    inputs = {
        "x": 3 * rng.standard_normal((2, 3, 6)),
        "w": rng.standard_normal(6),
        "b": rng.standard_normal(6),
    }
    fwd = lambda x, w, b: ops.layer_norm_forward(x, w, b, eps=1e-5)
    res = check_op(
        fwd,
        ops.layer_norm_backward,
        inputs,
        rng,
        lambda r: {"x": r[0], "w": r[1]["w"], "b": r[1]["b"]},
    )
    assert_all_close(res)


def test_rms_norm_grad(rng):
    inputs = {"x": 3 * rng.standard_normal((2, 3, 6)), "w": rng.standard_normal(6)}
    fwd = lambda x, w: ops.rms_norm_forward(x, w, eps=1e-5)
    res = check_op(fwd, ops.rms_norm_backward, inputs, rng, lambda r: {"x": r[0], "w": r[1]["w"]})
    assert_all_close(res)


@pytest.mark.parametrize("name", ["gelu", "silu"])
def test_activation_grad(rng, name):
    fwd, bwd = getattr(ops, f"{name}_forward"), getattr(ops, f"{name}_backward")
    res = check_op(fwd, bwd, {"x": 3 * rng.standard_normal((4, 5))}, rng, lambda dx: {"x": dx})
    assert_all_close(res)


def test_gelu_matches_reference_values():
    # GPT-2's gelu_new at a few points, computed by hand from the formula with math.tanh.
    import math

    xs = np.array([-3.0, -1.0, -0.1, 0.0, 0.5, 2.0])
    want = [0.5 * x * (1 + math.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))) for x in xs]
    np.testing.assert_allclose(ops.gelu_forward(xs)[0], want, rtol=1e-15, atol=1e-15)


def test_silu_stable_at_extremes():
    x = np.array([-1000.0, -50.0, 0.0, 50.0, 1000.0])
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        y, _ = ops.silu_forward(x)
    np.testing.assert_allclose(
        y, [0.0, -50.0 / (1 + np.exp(50.0)), 0.0, 50.0, 1000.0], rtol=1e-12, atol=1e-300
    )


def test_softmax_grad_and_rows(rng):
    x = rng.standard_normal((3, 4, 5))
    res = check_op(ops.softmax_forward, ops.softmax_backward, {"x": x}, rng, lambda dx: {"x": dx})
    assert_all_close(res)
    p, _ = ops.softmax_forward(1000 * x)
    assert np.all(np.isfinite(p)), "softmax overflowed: max not subtracted?"
    np.testing.assert_allclose(p.sum(-1), 1.0, rtol=0, atol=1e-12)


def test_softmax_masked_entries_are_exactly_zero():
    x = np.array([[1.0, -np.inf, 2.0], [-np.inf, 0.5, -np.inf]])
    p, _ = ops.softmax_forward(x)
    assert p[0, 1] == 0.0 and p[1, 0] == 0.0 and p[1, 2] == 0.0 and p[1, 1] == 1.0


def test_log_softmax_matches_log_of_softmax(rng):
    x = rng.standard_normal((4, 7))
    np.testing.assert_allclose(ops.log_softmax(x), np.log(ops.softmax_forward(x)[0]), atol=1e-13)


def test_cross_entropy_grad_and_value(rng):
    logits = rng.standard_normal((5, 7))
    targets = rng.integers(0, 7, size=5)
    loss, cache = ops.cross_entropy_forward(logits, targets)
    p = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    assert abs(loss - (-np.mean(np.log(p[np.arange(5), targets])))) < 1e-13
    dloss = 1.7  # a random-ish upstream scalar
    analytic = ops.cross_entropy_backward(dloss, cache)
    numeric = numerical_gradient(
        lambda: dloss * ops.cross_entropy_forward(logits, targets)[0], logits
    )
    assert rel_error(analytic, numeric) < TOL


# --------------------------------------------------------------------------- attention pieces


def test_softmax_attention_grad_gqa_and_mask(rng):
    B, H, G, T, E = 2, 4, 2, 3, 5
    mask = at.padded_causal_mask(np.array([[True] * 3, [False, True, True]]), T)  # (B, 1, T, T)
    inputs = {
        "q": rng.standard_normal((B, H, T, E)),
        "k": rng.standard_normal((B, G, T, E)),
        "v": rng.standard_normal((B, G, T, E + 1)),
    }
    fwd = lambda q, k, v: at.softmax_attention_forward(q, k, v, scale=0.7, mask=mask)
    res = check_op(fwd, at.softmax_attention_backward, inputs, rng, lambda r: dict(zip("qkv", r)))
    assert_all_close(res)


def test_softmax_attention_separate_key_and_value_groups(rng):
    # The theory model shares keys across heads (Gk = 1) but has one value per head (Gv = H).
    B, H, T, S = 3, 4, 1, 6
    inputs = {
        "q": rng.standard_normal((B, H, T, 5)),
        "k": rng.standard_normal((B, 1, S, 5)),
        "v": rng.standard_normal((B, H, S, 1)),
    }
    fwd = lambda q, k, v: at.softmax_attention_forward(q, k, v, scale=1.0)
    assert_all_close(
        check_op(fwd, at.softmax_attention_backward, inputs, rng, lambda r: dict(zip("qkv", r)))
    )


def test_gqa_equals_repeated_kv(rng):
    B, H, G, T, E = 2, 6, 3, 4, 3
    q, k, v = (
        rng.standard_normal((B, H, T, E)),
        rng.standard_normal((B, G, T, E)),
        rng.standard_normal((B, G, T, E)),
    )
    z, _ = at.softmax_attention_forward(q, k, v, scale=0.5, mask=at.causal_mask(T))
    k_rep, v_rep = (
        np.repeat(k, H // G, axis=1),
        np.repeat(v, H // G, axis=1),
    )  # head h reads group h // (H/G)
    z_rep, _ = at.softmax_attention_forward(q, k_rep, v_rep, scale=0.5, mask=at.causal_mask(T))
    np.testing.assert_allclose(z, z_rep, atol=1e-14)


def test_masked_probs_rows_sum_to_one_and_respect_mask(rng):
    key_valid = np.array([[False, False, True, True, True], [True] * 5])
    mask = at.padded_causal_mask(key_valid, 5)
    q, k, v = (rng.standard_normal((2, 2, 5, 3)) for _ in range(3))
    _, cache = at.softmax_attention_forward(q, k, v, scale=1.0, mask=mask)
    np.testing.assert_allclose(cache.probs.sum(-1), 1.0, atol=1e-12)
    assert np.all(cache.probs[np.broadcast_to(~mask, cache.probs.shape)] == 0.0), (
        "probability on a masked key"
    )
    assert np.all(cache.probs[0, :, 2:, :2] == 0.0), "a real token attended to left padding"


def test_head_mask_grad(rng):
    inputs = {
        "z": rng.standard_normal((2, 3, 4, 5)),
        "head_mask": rng.random(3),
        "fill": rng.standard_normal((3, 5)),
    }
    res = check_op(
        at.head_mask_forward,
        at.head_mask_backward,
        inputs,
        rng,
        lambda r: {"z": r[0], "head_mask": r[1]},
    )
    assert_all_close(res)


def test_rotary_is_orthogonal_and_grad(rng):
    rot = at.rotary_tables(rng.integers(0, 50, size=(2, 4)), d_head=6, base=10000.0)
    x = rng.standard_normal((2, 3, 4, 6))
    y = at.rotary_forward(x, rot)
    np.testing.assert_allclose(np.linalg.norm(y, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-13)
    res = check_op(
        lambda x: (at.rotary_forward(x, rot), None),
        lambda d, _: at.rotary_backward(d, rot),
        {"x": x},
        rng,
        lambda dx: {"x": dx},
    )
    assert_all_close(res)


def test_rotary_relative_position_property(rng):
    # <R(m) q, R(n) k> depends on m - n only.
    q, k = rng.standard_normal((1, 1, 1, 8)), rng.standard_normal((1, 1, 1, 8))

    def dot(m, n):
        rq = at.rotary_forward(q, at.rotary_tables(np.array([[m]]), 8, 100.0))
        rk = at.rotary_forward(k, at.rotary_tables(np.array([[n]]), 8, 100.0))
        return float(np.sum(rq * rk))

    assert abs(dot(5, 2) - dot(13, 10)) < 1e-12
    assert abs(dot(5, 2) - dot(5, 3)) > 1e-6


# --------------------------------------------------------------------------- full attention block


def make_params(rng, D=6, H=4, G=2, E=3, bias=True):
    p = {
        "W_Q": rng.standard_normal((H, D, E)) * 0.5,
        "W_K": rng.standard_normal((G, D, E)) * 0.5,
        "W_V": rng.standard_normal((G, D, E)) * 0.5,
        "W_O": rng.standard_normal((H, E, D)) * 0.5,
    }
    if bias:
        p |= {
            "b_Q": rng.standard_normal((H, E)),
            "b_K": rng.standard_normal((G, E)),
            "b_V": rng.standard_normal((G, E)),
            "b_O": rng.standard_normal(D),
        }
    return p


@pytest.mark.parametrize("bias,rotary,G", [(True, False, 4), (False, True, 2), (True, True, 1)])
def test_attention_block_grad_every_element(rng, bias, rotary, G):
    B, T, D, H, E = 2, 3, 6, 4, 4
    params = make_params(rng, D=D, H=H, G=G, E=E, bias=bias)
    x = rng.standard_normal((B, T, D))
    head_mask = rng.random(H)
    fill = rng.standard_normal((H, E))
    mask = at.padded_causal_mask(np.array([[True] * T, [False] + [True] * (T - 1)]), T)
    rot = at.rotary_tables(np.array([[0, 1, 2], [0, 0, 1]]), E, 10000.0) if rotary else None
    out, cache = at.attention_forward(
        params, x, mask=mask, rotary=rot, head_mask=head_mask, head_fill=fill
    )
    dout = rng.standard_normal(out.shape)
    dx, grads, dhead_mask = at.attention_backward(dout, params, cache)
    assert set(grads) == set(params)
    assert all(grads[k].shape == params[k].shape for k in params), (
        "grads must mirror params' shapes"
    )

    def loss():
        return float(
            np.sum(
                at.attention_forward(
                    params, x, mask=mask, rotary=rot, head_mask=head_mask, head_fill=fill
                )[0]
                * dout
            )
        )

    comparisons = [
        cmp("x", dx, numerical_gradient(loss, x)),
        cmp("head_mask", dhead_mask, numerical_gradient(loss, head_mask)),
    ]
    comparisons += [cmp(k, grads[k], numerical_gradient(loss, params[k])) for k in params]
    assert_all_close(comparisons)


def test_attention_block_directional(rng):
    params = make_params(rng, D=8, H=4, G=2, E=4)
    x = rng.standard_normal((3, 5, 8))
    mask = at.causal_mask(5)
    out, cache = at.attention_forward(params, x, mask=mask)
    dout = rng.standard_normal(out.shape)
    _, grads, _ = at.attention_backward(dout, params, cache)
    f = lambda: float(np.sum(at.attention_forward(params, x, mask=mask)[0] * dout))
    assert directional_check(f, params, grads, rng) < TOL


def test_head_mask_of_ones_is_bitwise_identical(rng):
    params = make_params(rng)
    x = rng.standard_normal((2, 4, 6))
    plain, _ = at.attention_forward(params, x, mask=at.causal_mask(4))
    ones, _ = at.attention_forward(params, x, mask=at.causal_mask(4), head_mask=np.ones(4))
    assert np.array_equal(plain, ones), "head_mask of ones must not change a single bit"


def test_zero_head_mask_equals_removing_that_head(rng):
    params = make_params(rng, bias=False)
    x = rng.standard_normal((2, 4, 6))
    m = np.array([1.0, 0.0, 1.0, 1.0])
    masked, _ = at.attention_forward(params, x, mask=at.causal_mask(4), head_mask=m)
    no_head = dict(params, W_O=params["W_O"] * m[:, None, None])
    direct, _ = at.attention_forward(params | no_head, x, mask=at.causal_mask(4))
    np.testing.assert_allclose(masked, direct, atol=1e-14)
    plain, _ = at.attention_forward(params, x, mask=at.causal_mask(4))
    assert np.max(np.abs(plain - masked)) > 1e-3, "ablating a head changed nothing"


def test_kv_cache_step_equals_full_recompute(rng):
    params = make_params(rng)
    x = rng.standard_normal((2, 5, 6))
    full, _ = at.attention_forward(params, x, mask=at.causal_mask(5))
    _, c1 = at.attention_forward(params, x[:, :3], mask=at.causal_mask(3))
    step, c2 = at.attention_forward(
        params, x[:, 3:], mask=at.causal_mask(2, 5), past_kv=(c1.k, c1.v)
    )
    np.testing.assert_allclose(step, full[:, 3:], atol=1e-13)
    assert c2.k.shape[2] == 5


def test_batched_equals_one_by_one(rng):
    params = make_params(rng)
    x = rng.standard_normal((3, 4, 6))
    batched, _ = at.attention_forward(params, x, mask=at.causal_mask(4))
    for b in range(3):
        single, _ = at.attention_forward(params, x[b : b + 1], mask=at.causal_mask(4))
        np.testing.assert_allclose(batched[b], single[0], atol=1e-13)


def test_bad_group_count_is_a_clear_error(rng):
    with pytest.raises(ValueError, match="must divide"):
        at.softmax_attention_forward(
            rng.standard_normal((1, 4, 2, 3)),
            rng.standard_normal((1, 3, 2, 3)),
            rng.standard_normal((1, 3, 2, 3)),
            scale=1.0,
        )


def test_float32_stays_float32(rng):
    # NumPy 2 promotes float32 arrays times an np.float64 scalar: constants must be Python floats.
    x = rng.standard_normal((2, 3, 6)).astype(np.float32)
    assert ops.gelu_forward(x)[0].dtype == np.float32
    assert ops.silu_forward(x)[0].dtype == np.float32
    assert (
        ops.layer_norm_forward(x, np.ones(6, np.float32), np.zeros(6, np.float32), 1e-5)[0].dtype
        == np.float32
    )
    assert ops.rms_norm_forward(x, np.ones(6, np.float32), 1e-5)[0].dtype == np.float32
    params = {k: v.astype(np.float32) for k, v in make_params(rng).items()}
    rot = at.rotary_tables(np.zeros((2, 3), int), 3, 1e4, dtype=np.float32)
    out, cache = at.attention_forward(
        params, x, mask=at.causal_mask(3), head_mask=np.ones(4, np.float32)
    )
    assert (
        out.dtype == np.float32 and cache.probs.dtype == np.float32 and cache.z.dtype == np.float32
    )
    assert rot.cos.dtype == np.float32
