# %% [markdown]
# # 03 · GPT-2 in NumPy: one forward pass, by name, and one head removed
#
# A GPT-2 forward is a short list of matrix multiplies. Here we load a model, follow one
# forward pass through its **named activations** -- recomputing each from the weights with
# plain NumPy -- and then remove one attention head and watch the next-token distribution move.
#
# Which model: the tiny random GPT-2 that ships with the package (2 layers, 4 heads, vocabulary 96),
# unless the environment variable `CEL_NUMPY_GPT2` names a real one: a Hugging Face GPT-2
# folder (config.json + model.safetensors + vocab.json/merges.txt) or a `.npz` export
# (`scripts/export_gpt2_npz.py`). Everything below works for both.
#
# Per block (pre-norm), with LN a LayerNorm and $h$ running over heads:
# $$x \leftarrow x + \sum_h z_h W_O^{h} + b_O,\qquad
#   z_h = \mathrm{softmax}\!\Big(\tfrac{q_h k_h^\top}{\sqrt{E}} + \text{causal}\Big) v_h,\qquad
#   q_h = \mathrm{LN}_1(x) W_Q^{h} + b_Q^{h}$$
# $$x \leftarrow x + \mathrm{GELU}(\mathrm{LN}_2(x) W_{in} + b_{in}) W_{out} + b_{out},\qquad
#   \text{logits} = \mathrm{LN}_f(x)\, W_E^\top .$$

# %%
import os

import numpy as np

import cel_numpy as cn
from cel_numpy.heads import head_name
from cel_numpy.ops import GELU_C, log_softmax

FAST = (
    os.environ.get("CEL_NUMPY_FAST") == "1"
)  # the test suite sets this; the tiny model is fast anyway
source = os.environ.get("CEL_NUMPY_GPT2") or cn.fixtures_dir() / "tiny_gpt2"  # in the package

model = cn.load_model(source, dtype="float64")  # float64: hand recomputation agrees to ~1e-12
cfg = model.config
print(model)
L, H, D, E = cfg.n_layers, cfg.n_heads, cfg.d_model, cfg.d_head
assert cfg.family == "gpt2"

# %% [markdown]
# ## Tokens
#
# With a tokenizer we encode a sentence; the tiny random model has none (its 96 "tokens" mean
# nothing), so we make up ids. A batch is a list of id lists; `model.pad` left-pads it, so the
# last column is every prompt's next-token position.

# %%
if model.tokenizer is not None:
    prompts = [
        model.encode("When Mary and John went to the store, John gave a drink to"),
        model.encode("The cat"),
    ]
else:
    prompts = [[10, 52, 33, 7, 81, 3, 19, 44], [5, 60, 12]]
ids, mask = model.pad(prompts)
print("ids\n", ids, "\nattention_mask\n", mask)

logits, cache = model.run_with_cache(ids, mask)  # logits (B, T, V) and every activation by name
print(len(cache.names()), "named activations, e.g.", cache.names()[:6])

# %% [markdown]
# ## Follow the forward pass
#
# Each cell recomputes one activation from the weights and compares with the cache.
# Positions count real tokens only, so a left-padded prompt starts at position 0.

# %%
p = model.params
positions = cache["positions"]  # (B, T)
x = p["embed"]["W_E"][ids] + p["pos_embed"]["W_pos"][positions]  # (B, T, D)
assert np.allclose(x, cache["embed"], atol=1e-12)


def layer_norm(x, w, b, eps=cfg.norm_eps):
    xc = x - x.mean(-1, keepdims=True)
    return xc / np.sqrt((xc * xc).mean(-1, keepdims=True) + eps) * w + b


blk = p["blocks"][0]
ln1 = layer_norm(x, blk["ln1"]["w"], blk["ln1"]["b"])  # (B, T, D)
assert np.allclose(ln1, cache["blocks.0.ln1.out"], atol=1e-12)

q = (
    np.einsum("btd,hde->bhte", ln1, blk["attn"]["W_Q"]) + blk["attn"]["b_Q"][:, None]
)  # (B, H, T, E)
k = (
    np.einsum("btd,hde->bhte", ln1, blk["attn"]["W_K"]) + blk["attn"]["b_K"][:, None]
)  # (B, H, S, E)
v = (
    np.einsum("btd,hde->bhte", ln1, blk["attn"]["W_V"]) + blk["attn"]["b_V"][:, None]
)  # (B, H, S, E)
scores = np.einsum("bhte,bhse->bhts", q, k) / np.sqrt(E)  # (B, H, T, S)
T = ids.shape[1]
allowed = (
    np.tril(np.ones((T, T), bool))[None, None] & mask.astype(bool)[:, None, None, :]
)  # no future, no pads
allowed |= np.eye(T, dtype=bool)  # a padding query keeps itself (its output is ignored)
scores = np.where(allowed, scores, -np.inf)
pattern = np.exp(scores - scores.max(-1, keepdims=True))
pattern /= pattern.sum(-1, keepdims=True)  # (B, H, T, S)
assert np.allclose(pattern, cache["blocks.0.attn.pattern"], atol=1e-12)

z = pattern @ v  # (B, H, T, E): each head's output, what ablation acts on
assert np.allclose(z, cache["blocks.0.attn.z"], atol=1e-12)
attn_out = np.einsum("bhte,hed->btd", z, blk["attn"]["W_O"]) + blk["attn"]["b_O"]  # (B, T, D)
assert np.allclose(attn_out, cache["blocks.0.attn.out"], atol=1e-12)
resid_mid = x + attn_out
assert np.allclose(resid_mid, cache["blocks.0.resid_mid"], atol=1e-12)

ln2 = layer_norm(resid_mid, blk["ln2"]["w"], blk["ln2"]["b"])
pre = ln2 @ blk["mlp"]["W_in"] + blk["mlp"]["b_in"]  # (B, T, F)
post = 0.5 * pre * (1 + np.tanh(GELU_C * (pre + 0.044715 * pre * pre * pre)))  # GELU, tanh form
resid_post = resid_mid + post @ blk["mlp"]["W_out"] + blk["mlp"]["b_out"]
assert np.allclose(resid_post, cache["blocks.0.resid_post"], atol=1e-12)
print(
    "block 0 recomputed by hand: embed, ln1, pattern, z, attn.out, resid_mid, mlp, resid_post "
    "all match"
)

# %% [markdown]
# The remaining blocks repeat this. The last residual stream goes through the final LayerNorm
# and the tied unembedding $W_U = W_E^\top$ (a transposed *view*: no second copy in memory).

# %%
last = cache[f"blocks.{L - 1}.resid_post"]
by_hand = (
    layer_norm(last, p["ln_final"]["w"], p["ln_final"]["b"]) @ p["embed"]["W_E"].T
)  # (B, T, V)
assert np.allclose(by_hand, logits, atol=1e-10)
assert np.shares_memory(p["unembed"]["W_U"], p["embed"]["W_E"])


# %% [markdown]
# ## A picture of attention
#
# `cel_numpy.plots.attention_pattern(model, text, layer, head)` draws the pattern we just
# recomputed: row $t$ is the query at token $t$, column $s$ the key it reads, each row sums to 1
# and nothing sits above the diagonal. Heads are named `L0H1` (layer 0, head 1; counted from 0).
# The random model's patterns mean nothing; tutorial 04 draws SmolLM2's. In a notebook the figure
# shows below the cell; as a script it is written to the working directory.

# %%
from cel_numpy.plots import attention_pattern  # noqa: E402

text = prompts[0]  # a string works too when the model has a tokenizer
picture = attention_pattern(model, text, 0, 1, path="attention_L0H1.png")
print("wrote attention_L0H1.png; axes labelled", picture.tokens)
assert np.allclose(picture.patterns["intact"][0], pattern[0, 1], atol=1e-12)  # our softmax above

# %% [markdown]
# ## Remove one head
#
# Zero ablation replaces $z_h$ by 0 before $W_O$. `ablate=` takes heads as `"L0H1"`,
# `"L0H1+L1H3"` or `(layer, head)` pairs, all counted from 0.
# We measure how far each head moves the next-token distribution of prompt 0 (KL divergence
# from the intact one) and keep the head that moves it most.


# %%
def next_token_logprobs(**ablation):
    return log_softmax(model.next_token_logits(ids, mask, **ablation))  # (B, V)


def show_top(logp, label, k=5):
    top = np.argsort(-logp)[:k]
    names = [repr(model.decode([i])) if model.tokenizer else f"#{i}" for i in top]
    print(f"{label:>22}: " + ", ".join(f"{n} {np.exp(logp[i]):.3f}" for n, i in zip(names, top)))


intact = next_token_logprobs()
heads = [(l, h) for l in range(L) for h in range(H)]
if FAST and len(heads) > 24:
    heads = heads[:: len(heads) // 24]  # a sample of heads is enough to show the effect
kl = {}
for head in heads:
    ablated = next_token_logprobs(ablate=[head])
    kl[head] = float(np.sum(np.exp(intact[0]) * (intact[0] - ablated[0])))
best = max(kl, key=kl.get)
print(f"{head_name(best)} moves prompt 0's next-token distribution most: KL = {kl[best]:.4f}")

show_top(intact[0], "intact")
show_top(next_token_logprobs(ablate=[best])[0], f"zero-ablate {head_name(best)}")

# %% [markdown]
# **Mean ablation** replaces $z_h$ by its average over all real positions of a reference batch
# (here the prompts themselves) instead of 0: the head still adds its "typical" output, only
# the information specific to this input is removed. It usually moves the distribution less.

# %%
mean_ablated = next_token_logprobs(ablate=[best], ablation="mean", reference=prompts)
show_top(mean_ablated[0], f"mean-ablate {head_name(best)}")
kl_mean = float(np.sum(np.exp(intact[0]) * (intact[0] - mean_ablated[0])))
print(f"KL zero: {kl[best]:.4f}   KL mean: {kl_mean:.4f}")

# %% [markdown]
# Ablating a head in layer $l$ cannot change anything below it: the residual stream entering
# layer $l$ is identical. (The localization routine uses this to reuse the intact prefix.)

# %%
_, ablated_cache = model.run_with_cache(ids, mask, ablate=[best])
layer = best[0]
assert np.array_equal(
    ablated_cache[f"blocks.{layer}.resid_pre"], cache[f"blocks.{layer}.resid_pre"]
)
assert not np.allclose(
    ablated_cache[f"blocks.{layer}.resid_post"], cache[f"blocks.{layer}.resid_post"]
)

# %% [markdown]
# ## Checks

# %%
assert np.allclose(np.exp(intact).sum(-1), 1.0)
assert kl[best] > 0
assert np.array_equal(
    model.logits(ids, mask, ablate=[]), logits
)  # nothing ablated = intact, bitwise
print("all checks passed")
