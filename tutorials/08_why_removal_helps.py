# %% [markdown]
# # 08 · Why removing a head helps: from a conflicting feature to a copy head
#
# Tutorial 02 trained the theory world: two tasks that share a feature $s$ and disagree about a
# feature $c$ (task A wants $+w_c\cdot z_c$, task B $-w_c\cdot z_c$). The trained model settles
# on the compromise $\delta\,w_c\cdot z_c$, and the compromise lives in *one head*, the c-head:
# it attends to the $c$ token and reads $V_h\cdot z_c$. Removing that head helps task A and hurts
# task B.
#
# Tutorial 05 found heads of SmolLM2-135M whose removal helps few-shot antonyms
# ("hot -> cold\nwet ->" $\to$ " dry"). Here we ask what those heads *do*, with the tools of
# `cel_numpy.explain`:
#
# * **where the head looks** from the answer position, split by the prompt's token roles (the
#   query word, the shots' answers, separators, the first token);
# * **its OV copying score**: the head's value-output circuit followed by the unembedding,
#   $W_E W_V W_O W_U$, is a token-to-token map; when its eigenvalues are mostly positive, the
#   head raises the logit of whatever token it attends to: it *copies*;
# * **its direct logit attribution** (DLA): what its output adds straight to the logits of the
#   reference answer and of the intact model's (wrong) answer, through the final norm with its
#   scale frozen at the intact run;
# * **activation patching**: remove the whole set, put back only this head's intact output
#   $z$, and see how much of the removal's effect it undoes.
#
# The theory's prediction, transplanted: the helpful removals should take out a *copying*
# feature, which a copying task (induction, IOI) needs. The last section tests that prediction
# on a small panel; docs/mechanism.md has the full measurement.

# %%
import os

import numpy as np

import cel_numpy as cn
from cel_numpy.explain import (
    direct_logit_attribution,
    explain,
    forward_patched,
    ov_copying_scores,
)
from cel_numpy.localize import LMEvaluator
from cel_numpy.plots import attention_pattern
from cel_numpy.tasks import TASKS, make_panels
from cel_numpy.theory import TrainConfig, held_out, loadings, single_ablations, train
from cel_numpy.theory.analysis import expected_attention

FAST = os.environ.get("CEL_NUMPY_FAST") == "1"  # the test suite sets this: smaller panels
STEPS = 800 if FAST else 3000
N_ITEMS = 30 if FAST else 100  # antonyms items explained (held-out panel of seed 2026)
N_COPY = 12 if FAST else 100  # induction items for the conflict check

# %% [markdown]
# ## 1. The theory: the conflicting feature sits in one head, and that head copies $c$
#
# The c-head's attention puts its weight on the $c$ token, and its readout $V_h$ points along
# $w_c$: it moves the $c$ token's content into the prediction, a (signed) copy.

# %%
config = TrainConfig(steps=STEPS, log_every=STEPS)
result = train(config, np.random.default_rng(0))
data = held_out(np.random.default_rng(1), config.world, 5_000 if FAST else 50_000)
c_load, _ = loadings(result.params, data.a)
a_c, a_s = expected_attention(result.params, data.a)
c_head = int(np.argmax(np.abs(c_load)))
w_c = np.eye(config.world.d_content)[1]
V = result.params["V"]
for h in range(len(c_load)):
    tag = "  <- c-head" if h == c_head else ""
    print(
        f"head {h}: E[a to c] {a_c[h]:.2f}  E[a to s] {a_s[h]:.2f}  "
        f"V.w_c {V[h] @ w_c:+.2f}  c-loading {c_load[h]:+.3f}{tag}"
    )
theory_abl = single_ablations(result.params, data)[c_head]
print(f"removing the c-head: task A {theory_abl.delta_a:+.3f}, task B {theory_abl.delta_b:+.3f}")

# %% [markdown]
# ## 2. SmolLM2: which heads copy?
#
# `ov_copying_scores` gives every head's eigenvalue score in one pass: the (V, V) circuit
# $W_E\,\mathrm{diag}(w_{ln1})\,W_V W_O\,\mathrm{diag}(w_{ln\,final})\,W_U$ has the nonzero
# eigenvalues of a small $(E, E)$ matrix, so the 49,152-token map is never built.

# %%
model = cn.load_model("smollm2")
copying = ov_copying_scores(model)  # (L, H)
order = np.argsort(-copying.ravel())
L, H = copying.shape
print(
    "strongest copiers:", ", ".join(f"L{i // H}H{i % H} {copying.flat[i]:+.2f}" for i in order[:8])
)
for name in ("L2H1", "L13H2", "L8H1", "L10H8", "L14H3"):
    l, h = cn.heads.parse_heads(name)[0]
    rank = int(np.where(order == l * H + h)[0][0]) + 1
    print(f"{name}: copying {copying[l, h]:+.2f}, rank {rank} of {L * H}")

# %% [markdown]
# ## 3. Explaining the antonyms pair L2H1 + L13H2
#
# The pair was found by an early search and replicated on 300 fresh items (+28 of 300,
# docs/results.md). We explain it on a held-out panel of seed 2026.

# %%
task = TASKS["antonyms"]
_, items = make_panels(task, 100, N_ITEMS, 2026)
report = explain(model, task, "L2H1+L13H2", items, spec="smollm2", progress=None)
print(report.counts)
for head in report.per_head:
    top = sorted(head.shares.items(), key=lambda kv: -kv[1])[:3]
    print(
        f"{head.head}: OV copying {head.ov_copying:+.2f}, attended lift "
        f"{head.attended_lift:+.2f}; looks at "
        + ", ".join(f"{k} {v:.2f}" for k, v in top)
        + f"; DLA(ref - intact answer) on rescued {head.dla['rescued']['difference']:+.3f}; "
        f"restoring it alone undoes {head.restore.get('undone', float('nan')):.0%} "
        f"(the intact answer returns on {head.restore.get('intact_token_returns', 0):.0%})"
    )
rescued = [r for r in report.items if r.status == "rescued"]
echo = [r for r in rescued if r.intact.strip() == r.prompt.rsplit("\n", 1)[1].split(" ->")[0]]
print(f"{len(rescued)} rescued; the intact model echoed the query on {len(echo)} of them:")
for r in rescued[:5]:
    print(f"  {r.prompt.rsplit(chr(10), 1)[1]!r}: intact {r.intact!r}, removed {r.removed!r}")

# %% [markdown]
# What the numbers say (measured on the 30-item panel of the fast run; docs/mechanism.md has
# 100 items): L13H2 is a copier by its OV circuit, yet its *direct* effect on the answer is
# small; it acts through later layers, since putting back only its output brings most of the
# intact (wrong) answers back. Its attention goes to the first token and the newline before the
# query, not to a word it could copy (its attended lift is negative). L2H1, early, attends to
# the query word itself. Most rescued items are echoes ("plural -> plural"): the removal takes
# away what makes the model repeat the query.
#
# ## 4. Attention on a rescued item, intact and with the pair removed
#
# Removing a head acts on its output, so its own pattern stays; the heads *above* it see a
# different residual stream. L13H2's pattern with L2H1 removed shows whether L2H1 steers where
# L13H2 looks (compare the two rows printed below); layer 20, every head, shows how far up the
# change reaches.

# %%
example = rescued[0]
picture = attention_pattern(
    model, example.prompt, 13, 2, ablate="L2H1+L13H2", path="attention_rescued_L13H2.png"
)
print(f"{example.prompt!r}: tokens {picture.tokens}")
intact_row = picture.patterns["intact"][0, -1]
removed_row = picture.patterns["L2H1+L13H2"][0, -1]
print("L13H2 from the answer position, intact :", np.round(intact_row, 2))
print("L13H2 from the answer position, removed:", np.round(removed_row, 2))
late = attention_pattern(
    model, example.prompt, 20, None, ablate="L2H1+L13H2", path="attention_rescued_L20.png"
)

# %% [markdown]
# ## 5. The other half of the theory: does removing the pair cost copying?
#
# The theory says the removed feature is one the *other* task needs. Induction is the purest
# copying task: "river lamp horse cloud stone apple\nriver lamp horse" $\to$ " cloud".

# %%
induction = TASKS["induction"]
_, copy_items = make_panels(induction, 100, N_COPY, 0)
ev = LMEvaluator(model, induction)
intact_res, removed_res = ev.evaluate_many(copy_items, [(), cn.heads.parse_heads("L2H1+L13H2")])
n_int = sum(r.correct for r in intact_res)
n_rem = sum(r.correct for r in removed_res)
print(f"induction, {len(copy_items)} items: intact {n_int}, without L2H1+L13H2 {n_rem}")

# %% [markdown]
# On this small panel, compare the two counts; docs/mechanism.md tests every lookup primary set
# on 200 induction and 200 IOI items with the held-out statistics, and correlates every head's
# copying score with what removing it does to each task.
#
# ## Checks

# %%
assert theory_abl.delta_a < -0.2 and theory_abl.delta_b > 0.2, "the theory's c-head conflict"
assert a_c[c_head] == a_c.max() > 2 * np.sort(a_c)[-2], "the c-head is the one that reads c"
assert np.all(np.abs(copying) <= 1 + 1e-9)
assert copying[13, 2] > 0.5, "L13H2 is a copier by its OV circuit (measured +0.88)"
assert sum(report.counts.values()) == len(items) and rescued, "the panel has rescued items"
for head in report.per_head:
    assert abs(sum(head.shares.values()) - 1) < 1e-4, "attention shares add up to 1"
# DLA adds up to the logit difference (float32: a loose tolerance) ...
ids = model.encode(example.prompt)
logits, cache = model.run_with_cache([ids])
names, contrib = direct_logit_attribution(
    model, cache, 0, len(ids) - 1, [example.reference_token, example.competitor_token]
)
diff = logits[0, -1, example.reference_token] - logits[0, -1, example.competitor_token]
assert abs((contrib[:, 0] - contrib[:, 1]).sum() - diff) < 1e-2 * max(1.0, abs(diff))
# ... and patching both heads back is the intact model
patches = {(l, h): cache[f"blocks.{l}.attn.z"][:, h] for l, h in [(2, 1), (13, 2)]}
ids_b, mask_b = model.pad([ids])
back = forward_patched(model, ids_b, mask_b, "L2H1+L13H2", patches)
assert np.allclose(back, model.next_token_logits(ids_b, mask_b), atol=1e-3)
assert np.allclose(intact_row.sum(), 1.0, atol=1e-5) and late.figure is not None
assert 0 <= n_rem <= len(copy_items) and 0 <= n_int <= len(copy_items)
print("tutorial 08: all checks passed")
