# %% [markdown]
# # 06 · Backward through a transformer: one block by hand, the whole model, a head screen
#
# Tutorial 01 took the attention core apart. Here we take apart the backward pass of a whole
# Llama block, check it, move to the whole model (`Model.loss_and_grads`), and use the gradient
# with respect to the head mask to predict what removing each head would do. The model is the
# tiny random Llama that ships with the package (2 layers, 4 query heads sharing 2 key/value heads,
# rotary, SwiGLU), in float64 so that finite differences are meaningful.
# A block (pre-norm, RMSNorm with weights $w$, head mask $m$, everything per position):
# $$\text{mid} = x + \sum_h m_h\, z_h W_O^{h},\quad
#   z_h = \mathrm{softmax}\Big(\tfrac{R q_h (R k_{g(h)})^\top}{\sqrt E} + \text{causal}\Big)
#   v_{g(h)},\quad
#   q_h = \mathrm{RMS}_1(x) W_Q^{h},$$
# $$\text{out} = \text{mid} + \big(\mathrm{silu}(a W_{gate}) \odot a W_{in}\big) W_{out},\qquad
#   a = \mathrm{RMS}_2(\text{mid}),$$
# with $R$ the rotary rotation and $g(h)$ the key/value group of query head $h$.

# %%
import os

import numpy as np
from scipy.stats import spearmanr

import cel_numpy as cn
from cel_numpy import attention as at
from cel_numpy.gradcheck import cmp, directional_check, numerical_gradient
from cel_numpy.models.backward import block_backward, cross_entropy_loss
from cel_numpy.models.transformer import block_forward, flatten_params, transformer_forward
from cel_numpy.ops import (
    LinearCache,
    linear_backward,
    rms_norm_backward,
    rms_norm_forward,
    silu_backward,
    silu_forward,
)

FAST = (
    os.environ.get("CEL_NUMPY_FAST") == "1"
)  # the test suite sets this: sampled elementwise checks
FIXTURES = cn.fixtures_dir()  # tiny random models shipped with the package: any working directory
rng = np.random.default_rng(0)

model = cn.load_model(FIXTURES / "tiny_llama", dtype="float64")
cfg = model.config
L, H, G, E, D = cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.d_head, cfg.d_model
print(model)


def batch(lengths):
    """Random prompts (the model is random too), left-padded, with next-token targets;
    -1 = not scored."""
    ids, mask = model.pad([list(rng.integers(1, cfg.vocab_size, n)) for n in lengths])  # (B, T)
    targets = np.full(ids.shape, -1)  # (B, T): the last column predicts nothing
    targets[:, :-1] = np.where(mask[:, 1:] == 1, ids[:, 1:], -1)  # pads are not scored
    return ids, mask, targets


ids, mask, targets = batch([8, 5])
B, T = ids.shape
_, cache = transformer_forward(
    model.params, cfg, ids, mask
)  # logits, ForwardCache; keep_activations=True by default

# %% [markdown]
# ## One block, backwards, one operation per line
#
# Block `l` has its parameters `p` and its activations `c` (a `BlockCache`: `resid_pre`,
# `ln1_out`, `attn`, `resid_mid`, `ln2_out`, `mlp`, ...). We pull a **random** upstream
# gradient $d\text{out} = \partial M/\partial \text{out}$ through it, i.e. we differentiate
# $M = \langle d\text{out}, \text{out}\rangle$. Gradients are named `d` + the forward name.
#
# **MLP.** $\text{out} = \text{mid} + \text{post}\,W_{out}$ sends `dout` both ways. Then
# $\text{post} = \text{gate} \odot \text{up}$ (a product: each factor's gradient is `dpost`
# times the other), $\text{gate} = \mathrm{silu}(\text{pre})$, and $a$ fans out to
# $W_{gate}$ and $W_{in}$, so its two gradients add.

# %%
l = L - 1
p, c = model.params["blocks"][l], cache.blocks[l]
dout = rng.standard_normal(c.resid_post.shape)  # (B, T, D)
dresid_mid = dout.copy()  # out = mid + mlp_out
dpost, g_out = linear_backward(
    dout, LinearCache(x=c.mlp.post, W=p["mlp"]["W_out"], has_bias=False)
)  # (B, T, F)
gate, silu_cache = silu_forward(c.mlp.pre)  # (B, T, F), recomputed from the cached pre-activation
dgate = dpost * c.mlp.up  # post = gate * up
dup = dpost * gate
dpre = silu_backward(dgate, silu_cache)  # silu'(x) = s (1 + x (1 - s)), s = sigmoid(x)
dln2_out, g_gate = linear_backward(
    dpre, LinearCache(x=c.ln2_out, W=p["mlp"]["W_gate"], has_bias=False)
)  # (B, T, D)
dln2_out_up, g_in = linear_backward(
    dup, LinearCache(x=c.ln2_out, W=p["mlp"]["W_in"], has_bias=False)
)
dln2_out += dln2_out_up  # ln2_out fans out to the gate and the up projection

# %% [markdown]
# **RMSNorm.** $y = x\, r\, w$ with $r = (\overline{x^2} + \epsilon)^{-1/2}$ and $\hat x = x r$:
# $$dx = r\big(\hat{dx} - \hat x\, \overline{\hat{dx}\, \hat x}\big),\qquad
#   \hat{dx} = dy \odot w,\qquad dw = \textstyle\sum_{b,t} dy \odot \hat x .$$
# The block cache does not store the norm's statistics: two reductions recompute them from the
# residual stream the norm read.

# %%
_, rms2 = rms_norm_forward(c.resid_mid, p["ln2"]["w"], cfg.norm_eps)
dresid_mid_via_ln2, g_ln2 = rms_norm_backward(dln2_out, rms2)  # (B, T, D)
dresid_mid += dresid_mid_via_ln2  # mid = x + attn_out feeds the MLP branch and the skip

# %% [markdown]
# **Attention.** Backwards through $\sum_h z'_h W_O^h$, then the head mask
# $z'_h = m_h z_h$. The forward ran without a mask ($m = 1$ skips the multiply, bitwise), but
# the derivative with respect to $m_h$ still exists:
# $\partial M/\partial m_h = \sum dz'_h \cdot z_h$. Then the softmax core (tutorial 01; with
# grouped-query attention the gradients of the query heads sharing a key/value group add up
# into that group), the rotary rotation (its transpose is the rotation by the opposite angle)
# and the three projections, whose input gradients add.

# %%
a = c.attn  # AttentionCache: x, q, k, v (after rotary), core (probs), z, z_masked
W_O = p["attn"]["W_O"]  # (H, E, D)
dattn_out = dresid_mid.reshape(B * T, D)  # attn_out = z_flat @ W_O as (H*E, D): one matrix multiply
z_flat = a.z_masked.transpose(0, 2, 1, 3).reshape(B * T, H * E)  # (B*T, H*E): heads side by side
dW_O = (z_flat.T @ dattn_out).reshape(H, E, D)  # = einsum("bhte,btd->hed", z_masked, dresid_mid)
dz_masked = (
    (dattn_out @ W_O.reshape(H * E, D).T).reshape(B, T, H, E).transpose(0, 2, 1, 3)
)  # (B, H, T, E)
ones = at.HeadMaskCache(z=a.z, head_mask=np.ones(H), fill=None)  # the forward's implicit m = 1
dz, dhead_mask = at.head_mask_backward(dz_masked, ones)  # (B, H, T, E), (H,)
dq, dk, dv = at.softmax_attention_backward(dz, a.core)  # (B, H, T, E), (B, G, T, E), (B, G, T, E)
dq, dk = at.rotary_backward(dq, a.rotary), at.rotary_backward(dk, a.rotary)
dln1_out = np.zeros_like(a.x)  # (B, T, D)
g_attn = {"W_O": dW_O}
for name, dy in (("Q", dq), ("K", dk), ("V", dv)):
    dln1_out_part, g_attn[f"W_{name}"], _ = at.project_heads_backward(
        dy, a.x, p["attn"][f"W_{name}"], False
    )
    dln1_out += dln1_out_part  # ln1_out fans out to q, k and v
_, rms1 = rms_norm_forward(c.resid_pre, p["ln1"]["w"], cfg.norm_eps)
dresid_pre_via_ln1, g_ln1 = rms_norm_backward(dln1_out, rms1)
dresid_pre = dresid_mid + dresid_pre_via_ln1  # mid = x + attn(ln1(x))
print("dhead_mask of block", l, "=", np.round(dhead_mask, 4))

# %% [markdown]
# ## The same, by the library
#
# `block_backward` is these cells, in this order, so the numbers are the same to the last bit.
# (Write the $W_O$ step as the einsum in its comment instead and they differ by ~1e-15: same
# sums, another rounding order. That is why the cell above mirrors the library's reshape.)

# %%
dx_lib, grads_lib, dhead_mask_lib = block_backward(dout, p, c, cfg, None)
g_mlp = {"W_in": g_in["W"], "W_gate": g_gate["W"], "W_out": g_out["W"]}
mine = {"ln1": g_ln1, "attn": g_attn, "ln2": g_ln2, "mlp": g_mlp}
mine, lib = flatten_params(mine), flatten_params(grads_lib)
assert mine.keys() == lib.keys() == flatten_params(p).keys(), (
    "grads must have exactly the keys of params"
)
for key in lib:
    print(cmp(key, mine[key], lib[key]))
print(
    cmp("dresid_pre", dresid_pre, dx_lib), cmp("dhead_mask", dhead_mask, dhead_mask_lib), sep="\n"
)
assert all(np.array_equal(mine[k], lib[k]) for k in lib), "composed by hand != block_backward"
assert np.array_equal(dresid_pre, dx_lib) and np.array_equal(dhead_mask, dhead_mask_lib)

# %% [markdown]
# ## Finite differences
#
# $M(\theta) = \langle d\text{out}, \text{block}(\theta)\rangle$ is a scalar, so central
# differences $\big(M(\theta + \epsilon e_i) - M(\theta - \epsilon e_i)\big)/2\epsilon$ check
# each gradient element. We check the block input, the head mask (passed explicitly as ones)
# and the norm weights element by element (every weight matrix too outside fast mode), and all
# tensors at once along one random direction.

# %%
x = c.resid_pre.copy()  # perturbed in place: keep the cache intact
head_mask = np.ones(H)


def M() -> float:
    out, _ = block_forward(p, x, cfg, cache.inputs, head_mask=head_mask)
    return float(np.sum(out * dout))


checked = {"x": x, "head_mask": head_mask, **flatten_params(p)}
analytic = {"x": dx_lib, "head_mask": dhead_mask_lib, **lib}
names = ["x", "head_mask", "ln1.w", "ln2.w"] if FAST else list(checked)
for name in names:
    comparison = cmp(name, analytic[name], numerical_gradient(M, checked[name]))
    print(comparison)
    assert comparison.rel_error < 1e-6, comparison
direction_error = directional_check(M, checked, analytic, rng)
print(f"random direction through all {len(checked)} tensors: rel. error {direction_error:.1e}")
assert direction_error < 1e-6

# %% [markdown]
# ## The whole model
#
# `transformer_backward` runs the unembedding and final norm backwards, then `block_backward`
# for $l = L-1, \dots, 0$, then scatters the embedding gradient onto the rows of $W_E$ that were
# read. `Model.loss_and_grads` wraps forward, mean next-token cross-entropy and backward; grads
# are keyed like `params`, plus `grads["head_mask"]` (L, H). One random direction through every
# tensor and the head mask checks them all, for both families (same batch: both vocabularies
# have 96 entries). GPT-2's $W_U$ is a view of $W_E^\top$ (tied): one tensor, perturbed once.

# %%
for name in ("tiny_llama", "tiny_gpt2"):
    m64 = cn.load_model(FIXTURES / name, dtype="float64")
    loss, grads = m64.loss_and_grads(ids, targets, mask)
    flat = flatten_params(m64.params)
    if np.shares_memory(flat["unembed.W_U"], flat["embed.W_E"]):
        del flat["unembed.W_U"]
    gflat = flatten_params({k: v for k, v in grads.items() if k != "head_mask"})
    hm = np.ones((m64.config.n_layers, m64.config.n_heads))

    def loss_fn(model=m64, hm=hm) -> float:  # defaults bind this iteration's model and mask
        logits, _ = transformer_forward(
            model.params, model.config, ids, mask, head_mask=hm, keep_activations=False
        )
        return cross_entropy_loss(logits, targets)[0]

    analytic = {**{k: gflat[k] for k in flat}, "head_mask": grads["head_mask"]}
    err = directional_check(loss_fn, {**flat, "head_mask": hm}, analytic, rng)
    print(
        f"{name:10s} loss {loss:.4f}  {len(flat)} tensors + head mask, random direction: "
        f"rel. error {err:.1e}"
    )
    assert err < 1e-6

# %% [markdown]
# ## The head-mask gradient as a screen
#
# Removing head $h$ moves its mask from $m_h$ to 0. To first order in the loss $\ell(m)$:
# $$\Delta\ell_h = \ell(m \text{ with } m_h = 0) - \ell(m)
#   \approx \frac{\partial \ell}{\partial m_h}(0 - m_h)
#   = -m_h \frac{\partial \ell}{\partial m_h}
#   \quad(= -\texttt{grads["head\_mask"]}[l, h] \text{ at } m = 1).$$
# The recipe is the same for a task score $M$ (higher is better, e.g. $M = -\ell$):
# $\Delta M_h \approx -m_h\,\partial M/\partial m_h$, which for $M = -\ell$ is $-\Delta\ell_h$.
# Keep the sign: for the loss, $\Delta\ell_h > 0$ means removing $h$ hurts and $< 0$ means it helps.
# One forward and one backward estimate every head at once; the exact effect needs one forward
# per head. We compare the two for every head of the tiny Llama (zero ablation), on a panel of
# 16 prompts: with 8 heads a rank correlation is coarse, and on two prompts it can come out
# near zero.

# %%
ids16, mask16, targets16 = batch(rng.integers(5, 12, 16))
m = np.ones((L, H))  # every head kept
loss, grads = model.loss_and_grads(ids16, targets16, mask16, head_mask=m)
estimate = (
    -m * grads["head_mask"]
)  # (L, H): first-order change of the loss when each head is removed
exact = np.zeros((L, H))
for layer in range(L):
    for h in range(H):
        ablated = model.logits(
            ids16, mask16, ablate=[(layer, h)]
        )  # (B, T, V), one forward per head
        exact[layer, h] = cross_entropy_loss(ablated, targets16)[0] - loss
verdict = np.where(
    np.stack([estimate, exact]) > 0, "hurts", "helps"
)  # (2, L, H): what removal does
print(" head   estimated dloss   exact dloss   removal (estimate / exact)")
for layer in range(L):
    for h in range(H):
        est, ex = estimate[layer, h], exact[layer, h]
        print(
            f"L{layer}H{h}  {est:+15.5f}  {ex:+12.5f}     "
            f"{verdict[0, layer, h]} / {verdict[1, layer, h]}"
        )
rho = spearmanr(estimate.ravel(), exact.ravel()).statistic
signs = int(np.sum(np.sign(estimate) == np.sign(exact)))
print(f"Spearman rank correlation {rho:.3f}; same sign for {signs} of {L * H} heads")
assert rho > 0

# %% [markdown]
# ## When is first order exact?
#
# Along one head's mask the loss is a smooth function $\ell(m_h)$, and
# $\ell(0) = \ell(m_h) - m_h \ell'(m_h) + \tfrac12 m_h^2 \ell''(m_h) - \dots$. The estimate keeps
# the first two terms, so it is exact for every head and every starting mask when the metric is
# **linear (affine) in the mask**. In a transformer it is not: $m_h$ enters the residual stream
# linearly, but later norms, attention softmaxes, MLPs and the log-softmax of the loss all bend
# it. The screen is therefore a pre-filter; exact ablation decides.
#
# One attention block read out linearly, $M = \langle r, \text{out}\rangle$, is linear in $m$:
# $\text{out} = \sum_h (m_h z_h + (1 - m_h)\,\text{fill}_h) W_O^h + b_O$ and $z_h$ does not depend
# on $m$ (the mask acts after the block's own softmax). There the estimate equals the exact
# effect, for zero or mean ablation, from any $m$.

# %%
Bt, Tt, Dt = 2, 5, 12
toy = {
    "W_Q": rng.normal(size=(H, Dt, E)),
    "W_K": rng.normal(size=(G, Dt, E)),
    "W_V": rng.normal(size=(G, Dt, E)),
}
toy |= {"W_O": rng.normal(size=(H, E, Dt)), "b_O": rng.normal(size=Dt)}  # one attention block, GQA
x_toy, r = rng.normal(size=(Bt, Tt, Dt)), rng.normal(size=(Bt, Tt, Dt))  # input, readout dM/dout
m_toy, fill = rng.uniform(0.5, 1.0, H), rng.normal(size=(H, E))


def M_toy(m) -> float:
    out, _ = at.attention_forward(toy, x_toy, mask=at.causal_mask(Tt), head_mask=m, head_fill=fill)
    return float(np.sum(r * out))


_, toy_cache = at.attention_forward(
    toy, x_toy, mask=at.causal_mask(Tt), head_mask=m_toy, head_fill=fill
)
_, _, dM_dm = at.attention_backward(r, toy, toy_cache)
toy_estimate = -m_toy * dM_dm  # (H,)
toy_exact = np.array(
    [M_toy(np.where(np.arange(H) == h, 0.0, m_toy)) - M_toy(m_toy) for h in range(H)]
)
print(
    "linear toy: estimate",
    np.round(toy_estimate, 6),
    "\n            exact   ",
    np.round(toy_exact, 6),
)
assert np.allclose(toy_estimate, toy_exact, rtol=1e-10, atol=1e-12)
print("tutorial 06: all checks passed")
