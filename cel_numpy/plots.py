"""Matplotlib figures. matplotlib is imported inside each function, never at import; without a
display it draws with the Agg backend (a notebook's inline backend, or MPLBACKEND, is kept).

Attention:
    attention_pattern(model, text, layer, head=None, ablate=None, path=None) -> AttentionPicture
        one head's pattern with token labels on both axes; head=None: a grid of every head of the
        layer; ablate="L3H1+...": the same picture intact and with those heads removed

Theory world:
    plot_theory_task_losses(log, closed_form, path)   task losses over training + closed-form levels
    plot_theory_loadings(log, path)                   per-head c- and s-loadings over training
    plot_theory_ablations(heads, path)                per-head ablation effect on both tasks
    plot_concentration_vs_init(records, path)         concentration index against sigma0
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass, field

import numpy as np

from cel_numpy.errors import InvalidHeadError, PromptError
from cel_numpy.heads import head_name, heads_name, parse_heads


def _pyplot():
    import matplotlib

    if "matplotlib.pyplot" not in sys.modules and not os.environ.get("MPLBACKEND"):
        matplotlib.use("Agg")  # files only; a notebook sets MPLBACKEND to its inline backend
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: str | os.PathLike) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    _pyplot().close(fig)


def plot_theory_task_losses(log: dict, closed_form: dict, path: str | os.PathLike) -> None:
    """log: {"step": (L,), "loss_a": (L,), "loss_b": (L,), "loss_joint": (L,)};
    closed_form {joint, a, b}."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for key, name, color in (
        ("loss_a", "task A", "C0"),
        ("loss_b", "task B", "C1"),
        ("loss_joint", "joint", "C2"),
    ):
        ax.plot(log["step"], log[key], color=color, label=name)
    for key, name, color in (("a", "A", "C0"), ("b", "B", "C1"), ("joint", "joint", "C2")):
        ax.axhline(
            closed_form[key], color=color, linestyle="--", linewidth=1, label=f"closed form {name}"
        )
    ax.axhline(0.5, color="grey", linestyle=":", linewidth=1, label="no c-feature (0.5)")
    ax.set_xlabel("step")
    ax.set_ylabel("loss on fresh samples")
    ax.set_yscale("log")
    ax.set_title("Theory model: task losses during training")
    ax.legend(fontsize=7, ncol=2)
    _save(fig, path)


def plot_theory_loadings(log: dict, path: str | os.PathLike) -> None:
    """log: {"step": (L,), "c_loading": (L, H), "s_loading": (L, H)}."""
    plt = _pyplot()
    fig, (ax_c, ax_s) = plt.subplots(1, 2, figsize=(9.0, 3.6), sharex=True)
    H = log["c_loading"].shape[1]
    for h in range(H):
        ax_c.plot(log["step"], log["c_loading"][:, h], label=f"head {h}")
        ax_s.plot(log["step"], log["s_loading"][:, h], label=f"head {h}")
    ax_c.set_title(r"c-loading $E[a_{h,c}]\,V_h\cdot w_c$")
    ax_s.set_title(r"s-loading $E[a_{h,s}]\,V_h\cdot w_s$")
    for ax in (ax_c, ax_s):
        ax.axhline(0.0, color="grey", linewidth=0.5)
        ax.set_xlabel("step")
    ax_c.legend(fontsize=7)
    _save(fig, path)


def plot_theory_ablations(heads: list[dict], path: str | os.PathLike) -> None:
    """heads: [{"head", "ablate_delta_a", "ablate_delta_b"}, ...] (ablated minus intact loss)."""
    plt = _pyplot()
    idx = np.array([h["head"] for h in heads])
    d_a = np.array([h["ablate_delta_a"] for h in heads])
    d_b = np.array([h["ablate_delta_b"] for h in heads])
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    ax.bar(idx - 0.2, d_a, width=0.4, label="task A")
    ax.bar(idx + 0.2, d_b, width=0.4, label="task B")
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_xticks(idx)
    ax.set_xlabel("ablated head")
    ax.set_ylabel("loss change (ablated - intact)")
    ax.set_title("Single-head ablations (below 0 = the task improves)")
    ax.legend()
    _save(fig, path)


def plot_concentration_vs_init(records: list[dict], path: str | os.PathLike) -> None:
    """records: [{"init_scale", "seed", "concentration"}, ...] from `sweep_init`."""
    plt = _pyplot()
    scales = np.array([r["init_scale"] for r in records])
    conc = np.array([r["concentration"] for r in records])
    fig, ax = plt.subplots(figsize=(6.0, 3.8))
    ax.scatter(scales, conc, alpha=0.6, label="one seed")
    uniq = np.unique(scales)
    ax.plot(
        uniq,
        [conc[scales == s].mean() for s in uniq],
        color="C1",
        marker="o",
        label="mean over seeds",
    )
    ax.set_xscale("log")
    ax.set_ylim(0, 1.05)
    ax.set_xlabel(r"init scale $\sigma_0$")
    ax.set_ylabel(r"concentration $\max|\beta_h| / \sum|\beta_h|$")
    ax.set_title("Concentration of the c-feature vs init scale")
    ax.legend()
    _save(fig, path)


# =========================================================================== attention


@dataclass
class AttentionPicture:
    """A drawn attention figure and the data behind it.

    patterns[condition][i] is the (T, T) pattern drawn for heads[i] (rows: query positions,
    columns: key positions; each row sums to 1 over the keys the query may see). condition is
    "intact", or the removed heads' name ("L3H1+L5H0").
    """

    figure: object  # matplotlib.figure.Figure
    tokens: list[str]  # T labels, one per position
    layer: int
    heads: tuple[int, ...]  # the heads drawn, in order
    patterns: dict[str, np.ndarray] = field(default_factory=dict)  # condition -> (n, T, T)
    path: str | None = None


def token_labels(model, ids) -> list[str]:
    """One readable label per token: a leading space as '␣', newlines and tabs escaped."""
    labels = []
    for i in ids:
        text = model.decode([int(i)]) if model.tokenizer is not None else str(int(i))
        labels.append(text.replace(" ", "\u2423").replace("\n", "\\n").replace("\t", "\\t"))
    return labels


def attention_pattern(
    model,
    text,
    layer: int,
    head: int | None = None,
    *,
    ablate=None,
    ablation: str = "zero",
    reference=None,
    mean_z=None,
    path: str | os.PathLike | None = None,
) -> AttentionPicture:
    """Draw the attention pattern of head `head` of layer `layer` on `text` (both 0-based).

    text: a string, or a list of token ids (models without a tokenizer). head=None draws every
    head of the layer in a grid. ablate (any spelling of cel_numpy.heads, e.g. "L10H3+L11H5"):
    draw the intact model and the model with those heads removed side by side (removing a head
    acts on its output z, so only layers above the lowest removed one can change).
    ablation / reference / mean_z: as in Model.logits. path: also save the figure there as PNG.
    Returns an AttentionPicture (the figure and the patterns drawn).
    """
    c = model.config
    if not (isinstance(layer, (int, np.integer)) and 0 <= layer < c.n_layers):
        raise InvalidHeadError(
            f"layer {layer!r} is not in the model: it has {c.n_layers} layers, 0 to "
            f"{c.n_layers - 1} (counted from 0)"
        )
    if head is not None and not (isinstance(head, (int, np.integer)) and 0 <= head < c.n_heads):
        raise InvalidHeadError(
            f"head {head!r} is not in layer {layer}: it has {c.n_heads} heads, 0 to "
            f"{c.n_heads - 1} (counted from 0)"
        )
    removed = parse_heads(ablate, what="ablate") if ablate is not None else ()
    ids = model.encode(text) if isinstance(text, str) else [int(i) for i in text]
    if not ids:
        raise PromptError("the text encodes to no tokens: give some text")
    if len(ids) > c.n_ctx:
        raise PromptError(
            f"the text is {len(ids)} tokens, more than the model's context of {c.n_ctx}: shorten it"
        )
    heads = tuple(range(c.n_heads)) if head is None else (int(head),)
    check_attention_size(len(heads), 2 if removed else 1, len(ids))
    # layers 0..layer only, and only that layer's pattern kept (no logits, no other activations)
    patterns = {"intact": model.attention_pattern([ids], layer)[0][list(heads)]}  # (n, T, T)
    if removed:
        ablated = model.attention_pattern(
            [ids], layer, ablate=removed, ablation=ablation, reference=reference, mean_z=mean_z
        )
        patterns[heads_name(removed)] = ablated[0][list(heads)]  # (n, T, T)
    picture = AttentionPicture(None, token_labels(model, ids), int(layer), heads, patterns)
    picture.figure = _draw_attention(picture, removed)
    if path is not None:
        picture.figure.savefig(path, dpi=DPI)
        picture.path = str(path)
    return picture


DPI = 120  # of the saved attention figure
MAX_FIGURE_PIXELS = 60_000_000  # about 240 MB of RGBA while drawing


def attention_layout(n: int, n_conditions: int, T: int) -> tuple[int, int, float]:
    """(rows, cols, inches per panel) of the figure for n heads, n_conditions conditions and
    T tokens: one head side by side; one condition a near-square grid; else heads x conditions."""
    if n == 1:
        rows, cols = 1, n_conditions
    elif n_conditions == 1:
        cols = math.ceil(math.sqrt(n))
        rows = math.ceil(n / cols)
    else:
        rows, cols = n_conditions, n
    size = 0.9 + 0.16 * T if n == 1 else 0.6 + 0.09 * T
    return rows, cols, size


def figure_pixels(n: int, n_conditions: int, T: int) -> tuple[int, int]:
    """(width, height) in pixels of the saved attention figure."""
    rows, cols, size = attention_layout(n, n_conditions, T)
    return round((cols * size + 1.0) * DPI), round((rows * size + 0.6) * DPI)


def check_attention_size(n: int, n_conditions: int, T: int) -> None:
    """PromptError when the figure for T tokens would pass MAX_FIGURE_PIXELS (checked before
    any forward pass: drawing it would take gigabytes and its labels would be unreadable)."""
    width, height = figure_pixels(n, n_conditions, T)
    if width * height <= MAX_FIGURE_PIXELS:
        return
    fits = _most_tokens(n, n_conditions, T)
    what = "one head" if n == 1 else f"{n} heads"
    one = _most_tokens(1, n_conditions, T)  # --head helps only if one head fits at this length
    other = ""
    if n > 1:
        other = (
            " (or draw one head with --head)"
            if one == T
            else f" (one head with --head: at most {one})"
        )
    raise PromptError(
        f"a picture of {what} on {T} tokens would be {width:,} x {height:,} pixels, more than "
        f"{MAX_FIGURE_PIXELS // 10**6} million: give a text of at most {fits} tokens{other}"
    )


def _most_tokens(n: int, n_conditions: int, T: int) -> int:
    """The longest text, at most T tokens, whose figure of n heads fits MAX_FIGURE_PIXELS."""
    return next(
        t
        for t in range(T, 0, -1)
        if math.prod(figure_pixels(n, n_conditions, t)) <= MAX_FIGURE_PIXELS
    )


def _draw_attention(picture: AttentionPicture, removed) -> object:
    plt = _pyplot()
    conditions = list(picture.patterns)
    n, T = len(picture.heads), len(picture.tokens)
    rows, cols, size = attention_layout(n, len(conditions), T)
    if n == 1:  # one head: intact (and ablated) side by side
        cells = [(cond, 0) for cond in conditions]
    elif len(conditions) == 1:  # one layer's heads in a near-square grid
        cells = [(conditions[0], i) for i in range(n)]
    else:  # every head of the layer, intact above, ablated below
        cells = [(cond, i) for cond in conditions for i in range(n)]
    fig, axes = plt.subplots(
        rows, cols, figsize=(cols * size + 1.0, rows * size + 0.6), squeeze=False
    )
    font = 8 if n == 1 else 5
    image = None
    for k, ax in enumerate(axes.flat):
        if k >= len(cells):
            ax.axis("off")
            continue
        cond, i = cells[k]
        image = ax.imshow(picture.patterns[cond][i], cmap="Blues", vmin=0.0, vmax=1.0)
        title = head_name((picture.layer, picture.heads[i]))
        if (picture.layer, picture.heads[i]) in removed:
            title += " (removed)"
        if n == 1 and len(conditions) > 1:  # one head: the condition goes in the title
            title += "\n" + ("intact" if cond == "intact" else f"without {cond}")
        r, col = divmod(k, cols)
        if n > 1 and len(conditions) > 1 and r > 0:
            title = ""  # the row label names the condition; the top row names the heads
        ax.set_title(title, fontsize=font + 2)
        ax.set_xticks(range(T))
        ax.set_yticks(range(T))
        ax.set_xticklabels(picture.tokens if r == rows - 1 or n == 1 else [], rotation=90)
        ax.set_yticklabels(picture.tokens if col == 0 else [])
        ax.tick_params(labelsize=font, length=0)
        if n > 1 and len(conditions) > 1 and col == 0:
            label = "intact" if cond == "intact" else f"without {cond}"
            ax.set_ylabel(label, fontsize=font + 3)
    fig.supxlabel("key (attended to)", fontsize=9)
    fig.supylabel("query", fontsize=9)
    fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8, label="attention weight")
    return fig


def plot_explanation(report: dict, path: str | os.PathLike) -> None:
    """One row per head of a `cel_numpy.explain` report (its `to_dict()`): attention shares from
    the answer position (whole panel, rescued items), direct logit attribution to the reference
    and the competitor on rescued and damaged items, and the logit difference on rescued items
    intact, without the set, and without the set but this head restored."""
    plt = _pyplot()
    heads = report["per_head"]
    fig, axes = plt.subplots(len(heads), 3, figsize=(13, 3.0 * len(heads) + 0.6), squeeze=False)
    roles = report["roles"]
    for row, h in zip(axes, heads):
        ax = row[0]
        x = np.arange(len(roles))
        ax.bar(x - 0.2, [h["shares"][r] for r in roles], 0.4, label="panel")
        ax.bar(x + 0.2, [h["shares_rescued"][r] for r in roles], 0.4, label="rescued")
        ax.set_xticks(x)
        ax.set_xticklabels(roles, rotation=30, fontsize=8)
        ax.set_ylabel("attention share")
        ax.set_title(
            f"{h['head']}: where it looks (OV copying {h['ov_copying']:+.2f}, "
            f"lift {h['attended_lift']:+.1f})",
            fontsize=9,
        )
        ax.legend(fontsize=7)
        ax = row[1]
        kinds = ("rescued", "damaged")
        x = np.arange(len(kinds))
        for k, (what, label) in enumerate(
            (("reference", "to the reference"), ("competitor", "to the competitor"))
        ):
            ax.bar(x + (k - 0.5) * 0.4, [h["dla"][kd][what] for kd in kinds], 0.4, label=label)
        ax.axhline(0, color="black", lw=0.6)
        ax.set_xticks(x)
        ax.set_xticklabels([f"{kd} (n={h['dla'][kd]['n']})" for kd in kinds], fontsize=8)
        ax.set_ylabel("direct logit attribution")
        ax.set_title(f"{h['head']}: what it writes (intact run)", fontsize=9)
        ax.legend(fontsize=7)
        ax = row[2]
        rs = h["restore"]
        if rs.get("n"):
            keys = ("logit_diff_intact", "logit_diff_removed", "logit_diff_restored")
            ax.bar(range(3), [rs[k] for k in keys], color=["grey", "tab:green", "tab:red"])
            ax.set_xticks(range(3))
            ax.set_xticklabels(["intact", "set removed", f"{h['head']} restored"], fontsize=8)
            ax.axhline(0, color="black", lw=0.6)
            ax.set_title(
                f"rescued items (n={rs['n']}): restoring undoes {rs['undone']:.0%}", fontsize=9
            )
        else:
            ax.text(0.5, 0.5, "no rescued items", ha="center", va="center")
            ax.set_xticks([])
        ax.set_ylabel("logit(ref) - logit(competitor)")
    fig.suptitle(f"{report['heads']} on {report['task']} ({report['model']})", fontsize=10)
    _save(fig, path)
