# %% [markdown]
# # 01 · Attention by hand: forward, backward, gradient check, head mask
#
# cel-numpy has **one** attention implementation, `cel_numpy.attention`. The theory model
# trains with it and the real language models run with it. This tutorial opens it up:
# we recompute every line of the forward and the backward pass by hand, check the
# gradients by central differences, and remove a head with the head mask.
#
# Shapes (the glossary used everywhere): B batch, H query heads, T query positions,
# S key positions, E head size.
#
# $$\mathrm{scores}_{bhts} = \text{scale}\; q_{bht} \cdot k_{bs}, \qquad
#   p_{bht\cdot} = \mathrm{softmax}(\mathrm{scores}_{bht\cdot}), \qquad
#   z_{bht} = \sum_s p_{bhts}\, v_{bs}.$$
#
# Run as a script (`python tutorials/01_attention_by_hand.py`) or open it as a notebook.

# %%

import numpy as np

from cel_numpy import attention as at
from cel_numpy.gradcheck import check_op, cmp, numerical_gradient

rng = np.random.default_rng(0)

B, H, T, S, E = 2, 3, 4, 4, 5
q = rng.standard_normal((B, H, T, E))
k = rng.standard_normal((B, H, S, E))
v = rng.standard_normal((B, H, S, E))
scale = 1 / np.sqrt(E)
mask = at.causal_mask(T)  # (T, S): query t sees keys s <= t
print(mask.astype(int))

# %% [markdown]
# ## Forward, one line at a time
#
# A causal mask sets the forbidden scores to $-\infty$, so their probability is exactly 0.
# Subtracting the row maximum before `exp` keeps the softmax from overflowing.

# %%
scores = np.einsum("bhte,bhse->bhts", q, k) * scale  # (B,H,T,E),(B,H,S,E) -> (B,H,T,S)
scores = np.where(mask, scores, -np.inf)  # (B, H, T, S)
e = np.exp(scores - scores.max(axis=-1, keepdims=True))  # (B, H, T, S); exp(-inf) = 0
probs = e / e.sum(axis=-1, keepdims=True)  # (B, H, T, S)
z = probs @ v  # (B,H,T,S) @ (B,H,S,E) -> (B,H,T,E)

z_lib, cache = at.softmax_attention_forward(q, k, v, scale=scale, mask=mask)
print("forward  max |by hand - library| =", np.abs(z - z_lib).max())
print("probability rows sum to", probs.sum(-1).min(), "...", probs.sum(-1).max())
assert np.allclose(z, z_lib, atol=1e-14)
assert np.all(probs[..., ~mask] == 0)

# %% [markdown]
# ## Backward, in reverse order
#
# We pick a *random* upstream gradient $dz = \partial L/\partial z$. (A gradient of ones,
# i.e. $L = \sum z$, would hide bugs: the softmax backward of a constant is zero.)
# Then we walk the forward lines backwards; a gradient is named `d` + the forward name.
#
# The softmax step is the only subtle one: with $p = \mathrm{softmax}(x)$,
# $$dx_s = p_s \Big(dp_s - \sum_{s'} p_{s'}\, dp_{s'}\Big).$$

# %%
dz = rng.standard_normal(z.shape)  # (B, H, T, E)
dprobs = dz @ v.swapaxes(-1, -2)  # z = probs @ v:  (B,H,T,E) @ (B,H,E,S) -> (B,H,T,S)
dv = probs.swapaxes(-1, -2) @ dz  # (B,H,S,T) @ (B,H,T,E) -> (B,H,S,E)
dscores = probs * (
    dprobs - np.sum(dprobs * probs, axis=-1, keepdims=True)
)  # softmax; 0 where masked
dscores = dscores * scale  # (B, H, T, S)
dq = dscores @ k  # (B,H,T,S) @ (B,H,S,E) -> (B,H,T,E)
dk = dscores.swapaxes(-1, -2) @ q  # (B,H,S,T) @ (B,H,T,E) -> (B,H,S,E)

dq_lib, dk_lib, dv_lib = at.softmax_attention_backward(dz, cache)
for name, mine, lib in (("dq", dq, dq_lib), ("dk", dk, dk_lib), ("dv", dv, dv_lib)):
    print(cmp(name, mine, lib))
    assert np.allclose(mine, lib, atol=1e-13)

# %% [markdown]
# ## Gradient check by central differences
#
# For the scalar $L = \sum z \odot dz$ (so that $\partial L/\partial z = dz$), every element of
# $q$, $k$, $v$ is nudged by $\pm\epsilon$ in float64:
# $\partial L/\partial x_i \approx (L(x + \epsilon e_i) - L(x - \epsilon e_i)) / 2\epsilon$.


# %%
def L():
    return float(np.sum(at.softmax_attention_forward(q, k, v, scale=scale, mask=mask)[0] * dz))


for name, x, analytic in (("q", q, dq), ("k", k, dk), ("v", v, dv)):
    c = cmp(name, analytic, numerical_gradient(L, x))
    print(c)
    assert c.rel_error < 1e-6, c

# `check_op` packages the same recipe: random upstream, every element, one line per input.
comparisons = check_op(
    lambda q, k, v: at.softmax_attention_forward(q, k, v, scale=scale, mask=mask),
    at.softmax_attention_backward,
    {"q": q, "k": k, "v": v},
    rng,
    lambda grads: dict(zip("qkv", grads)),
)
assert all(c.rel_error < 1e-6 for c in comparisons)

# %% [markdown]
# ## Shared keys, one value per head
#
# `k` may have fewer heads than `q` (grouped-query attention). The theory model of tutorial 02
# uses the extreme case: keys shared by every head (`Gk = 1`), a value per head (`Gv = H`).

# %%
k_shared = rng.standard_normal((B, 1, S, E))
z_shared, _ = at.softmax_attention_forward(q, k_shared, v, scale=scale, mask=mask)
z_repeat, _ = at.softmax_attention_forward(
    q, np.repeat(k_shared, H, axis=1), v, scale=scale, mask=mask
)
assert np.allclose(z_shared, z_repeat, atol=1e-14)

# %% [markdown]
# ## The head mask: removing a head
#
# An ablation is an argument, not a hook: `head_mask_forward(z, m)` returns $m_h z_h$
# (zero ablation) or $m_h z_h + (1-m_h)\bar z_h$ with a `fill` (mean ablation).
# Its backward also returns $\partial L/\partial m_h = \sum dz'_h \cdot z_h$, the attribution
# score used to screen heads quickly.

# %%
m = np.array([1.0, 0.0, 1.0])  # remove head 1
z_masked, hm_cache = at.head_mask_forward(z, m)
assert np.all(z_masked[:, 1] == 0) and np.array_equal(z_masked[:, 0], z[:, 0])
assert np.array_equal(at.head_mask_forward(z, np.ones(H))[0], z), (
    "a mask of ones changes nothing, bitwise"
)

fill = z.mean(axis=(0, 2))  # (H, E) mean output of each head
z_mean_abl, _ = at.head_mask_forward(z, m, fill)
assert np.allclose(z_mean_abl[:, 1], fill[1])

dz_masked = rng.standard_normal(z.shape)
dz_back, dm = at.head_mask_backward(dz_masked, hm_cache)
print("d L / d m_h =", dm)
assert np.allclose(dm, np.einsum("bhte,bhte->h", dz_masked, z))
assert np.all(dz_back[:, 1] == 0)
print("tutorial 01: all checks passed")
