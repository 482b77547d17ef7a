# %% [markdown]
# # 05 · Localizing heads: the two-stage routine by hand, then through the CLI
#
# Question (docs/design.md#protocol): for a model and a task, is there a *small set of heads whose
# removal improves the task*? The routine answers it with two stages and then checks the answer
# on data it never looked at:
#
# 1. **screen**: ablate every head alone; on each discovery example compare with the intact
#    model: *rescued* (became correct), *damaged* (became wrong),
#    $\text{gain}=\text{rescued}-\text{damaged}$. Rank by
#    $(-\text{gain}, \text{damaged}, -\text{correct}, \text{head})$; the top 10 are nominees.
# 2. **joint search**: every pair and triple of nominees ($45+120$, plus the 10 singletons = 175
#    candidates), same ranking with fewer heads first on ties. The top 10 are frozen as finalists.
#
# Then the finalists are confirmed (fresh intact comparator), evaluated on a disjoint held-out
# panel with an exact McNemar test and a 95% interval for the gain, and evaluated on every other
# task ("does the gain cost elsewhere?").
#
# We use the theory model (tutorial 02), where the answer is known: after training, one head
# carries the conflicting feature $c$, and removing it should help task A and hurt task B.
# An example counts as correct iff $|\hat y - y| < \tau = 1$ (see `TheoryTask` for why 1).

# %%
import json
import os
import shutil
from pathlib import Path

import numpy as np

import cel_numpy as cn
from cel_numpy.localize import (
    LMEvaluator,
    Scored,
    TheoryEvaluator,
    TheoryTask,
    build_panels,
    condition_name,
    joint_enumeration,
    paired_summary,
    rank_joint,
    rank_singletons,
    test_heads,
)
from cel_numpy.tasks import EXAMPLES, get_task
from cel_numpy.theory import TrainConfig, loadings, sample_batch, train
from cel_numpy.theory.data import TASK_A

FAST = os.environ.get("CEL_NUMPY_FAST") == "1"
STEPS = 800 if FAST else 3000  # the c-head forms within ~500 steps
N_DISCOVERY, N_HELDOUT = (200, 200) if FAST else (500, 500)

result = train(TrainConfig(steps=STEPS, log_every=STEPS), np.random.default_rng(0))
params, world = result.params, result.config.world
c_load, s_load = loadings(params, sample_batch(np.random.default_rng(1), world, 8192, task=TASK_A))
c_head = int(np.argmax(np.abs(c_load)))
print("c-loadings per head:", np.round(c_load, 3), "-> the c-head is", c_head)

# %% [markdown]
# ## Panels and an evaluator
#
# Items are fixed samples of the theory world stored as ordinary task `Item`s (content-hashed
# ids), so the same routine runs on them as on text tasks. Discovery and held-out panels share
# no item. An `Evaluator` answers one question: for these items and these conditions (tuples of
# `(layer, head)` to ablate; `()` is intact), which examples are correct?

# %%
task_a, task_b = TheoryTask("A", world), TheoryTask("B", world)
discovery, heldout = build_panels(task_a, N_DISCOVERY, N_HELDOUT, seed=0)
assert not {it.id for it in discovery} & {it.id for it in heldout}
ev = TheoryEvaluator(params, task_a)
(intact,) = ev.evaluate_many(discovery, [()])
print(f"intact: {sum(r.correct for r in intact)}/{len(intact)} discovery examples correct")

# %% [markdown]
# ## Stage 1 by hand: the singleton screen

# %%
singles = [((0, h),) for h in range(ev.n_heads)]
results = ev.evaluate_many(discovery, singles)
scored = []
for cond, res in zip(singles, results):
    s = paired_summary([r.correct for r in intact], [r.correct for r in res])
    scored.append(Scored(cond, s.correct, s.rescued, s.damaged))
    print(
        f"{condition_name(cond)}: correct {s.correct:3d}  rescued {s.rescued:3d}  "
        f"damaged {s.damaged:3d}  gain {s.gain:+4d}"
    )
ranked = rank_singletons(scored)
nominees = [s.heads[0] for s in ranked[:10]]  # only 4 heads here, so all are nominees
print("screen ranking:", [condition_name(s.heads) for s in ranked])

# %% [markdown]
# ## Stage 2 by hand: pairs and triples of nominees
#
# With 10 nominees this is 45 pairs + 120 triples; with our 4 heads, 6 + 4.

# %%
reused, new = joint_enumeration(nominees)
joint_results = ev.evaluate_many(discovery, new)
joint_scored = [s for s in scored if s.heads in reused]
for cond, res in zip(new, joint_results):
    s = paired_summary([r.correct for r in intact], [r.correct for r in res])
    joint_scored.append(Scored(cond, s.correct, s.rescued, s.damaged))
finalists = rank_joint(joint_scored)[:10]
for k, f in enumerate(finalists[:5], 1):
    print(f"finalist {k}: {condition_name(f.heads):16s} gain {f.gain:+d}")
assert (0, c_head) in finalists[0].heads

# %% [markdown]
# ## Held-out check of the rank-1 set, by hand
#
# `paired_summary` gives the exact McNemar p-value (binomial test of rescued among the
# discordant examples) and Newcombe's 95% interval for the gain rate.

# %%
top = finalists[0].heads
ho_intact, ho_top = ev.evaluate_many(heldout, [(), top])
ho = paired_summary([r.correct for r in ho_intact], [r.correct for r in ho_top])
print(
    f"held-out: rescued {ho.rescued}, damaged {ho.damaged}, gain rate {ho.gain_rate:+.3f} "
    f"[{ho.ci_low:+.3f}, {ho.ci_high:+.3f}], p = {ho.p_value:.2g}"
)

# %% [markdown]
# ## The same through the CLI
#
# The command line does all of the above, plus confirmation, the cross-task check and a
# report, in a run directory that can be resumed (rerun the same command) and is validated
# (edit a record and the run refuses). Here we hand it the very parameters trained above:
#
#     cel-numpy localize --model theory:params.npz --task A --discovery 200 --heldout 200 \
#         --out runs/tutorial05

# %%
from cel_numpy.cli import main  # noqa: E402 - a new cell of the tutorial

out = Path("runs/tutorial05")
shutil.rmtree(out, ignore_errors=True)  # a fresh run each time this tutorial runs
out.mkdir(parents=True)
np.savez(out.parent / "tutorial05_params.npz", K=params["K"], V=params["V"])
status = main(
    [
        "localize",
        "--model",
        f"theory:{out.parent / 'tutorial05_params.npz'}",
        "--task",
        "A",
        "--discovery",
        str(N_DISCOVERY),
        "--heldout",
        str(N_HELDOUT),
        "--out",
        str(out),
    ]
)
assert status == 0

# %% [markdown]
# ## Reading the report
#
# `report.json` is for programs, `report.md` for people (with `singletons.png`, `finalists.png`,
# `crosstask.png`). The primary result is the discovery rank-1 set on the held-out panel.

# %%
report = json.loads((out / "report.json").read_text())
primary = report["primary"]
print("rank-1 set:", primary["name"])
print(
    "held-out:",
    {
        k: primary["heldout"][k]
        for k in ("rescued", "damaged", "gain_rate", "ci_low", "ci_high", "p_value")
    },
)
print(
    "task B:  ",
    {k: primary["crosstask"]["theory-B"][k] for k in ("gain_rate", "ci_low", "ci_high", "p_value")},
)
print((out / "report.md").read_text()[:1200])

# %%
assert [0, c_head] in primary["heads"]
assert primary["heldout"]["gain"] > 0 and primary["heldout"]["p_value"] < 0.01
assert primary["crosstask"]["theory-B"]["gain"] < 0
assert primary["name"] == condition_name(finalists[0].heads)  # the CLI found what we found by hand

# %% [markdown]
# ## Your own task, from a JSONL file
#
# Any task can come from a file: one JSON object per line, a *choice* item
# (`"prompt"`, `"choices"`, `"answer"`: the index of the correct choice) or a *generate* item
# (`"prompt"`, `"answer"`: text), each with an `"id"` and optionally a `"cluster"` (items of one
# cluster stay in one panel). An optional first line holds the task's options (docs/tasks.md).
# The package ships a worked example: 24 "opposite of" questions, two phrasings per word pair,
# one cluster per pair. The same file works on the command line:
# `cel-numpy localize --model smollm2 --task path/to/opposites.jsonl ...`.
# HellaSwag and BoolQ are such files too, made from the real validation splits by
# `cel-numpy fetch hellaswag` / `boolq` (`--task hellaswag`).

# %%
path = EXAMPLES / "opposites.jsonl"
print("\n".join(path.read_text().splitlines()[:3]))
opposites = get_task(str(path))
n_clusters = len({it.cluster for it in opposites.items})
print(opposites.name, opposites.scoring, len(opposites.items), "items,", n_clusters, "clusters")

smollm2 = cn.load_model("smollm2")
(intact,) = LMEvaluator(smollm2, opposites).evaluate_many(opposites.items, [()])
print("SmolLM2 intact:", sum(r.correct for r in intact), "/", len(intact), "correct")

# the held-out test of one head set on this file (the Python API takes the file's path)
file_out = Path("runs/tutorial05-opposites")
shutil.rmtree(file_out, ignore_errors=True)
tested = test_heads(file_out, lambda task, ref: LMEvaluator(smollm2, task), path, "L3H1",
                    n_discovery=8, n_heldout=12, seed=0, progress=False)  # fmt: skip
held = tested["heldout"]["heldout"]["finalists"][0]
print({k: held[k] for k in ("name", "correct", "rescued", "damaged")})
manifest = json.loads((file_out / "manifest.json").read_text())
print("the run records the file:", manifest["task"]["file_sha256"][:16], "...")

# %%
assert opposites.scoring == "choice" and len(opposites.items) == 24 and n_clusters == 12
assert len(intact) == 24 and held["name"] == "L3H1" and 0 <= held["correct"] <= 12
assert manifest["task"]["file_sha256"] == opposites.sha256
