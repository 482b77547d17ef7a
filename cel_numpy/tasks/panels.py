"""Discovery and held-out panels: disjoint by cluster, de-duplicated, deterministic for a seed.

Items of one cluster (`Item.cluster`: the same country, antonym pair, subject noun...) are not
independent evidence, so a cluster belongs to one panel only: the discovery and held-out panels
share no cluster (asserted here, tested for every task), and the held-out test treats the
cluster as its unit (`cel_numpy.localize.stats`).

For a `TemplateTask` (finite indexed space per subtask, clusters by `cluster_shape` and
`item_in_cluster`) each panel has equal subtask shares, remainders going to the first subtasks
in order (held-out continuing where discovery stopped). Clusters:

    1. min(C, n_discovery + n_heldout) distinct clusters are drawn (`rng.choice`, no
       replacement) and split in proportion to the two panel sizes, at least one each: with
       enough clusters every item has a cluster of its own; with fewer (capitals has 152
       countries) the two panels hold about the same number of items per cluster.
       With `shared_clusters` the draw is one for all subtasks, otherwise one per subtask.
    2. A panel's items of a subtask are spread over its clusters round-robin (sizes differ by at
       most one, continuing across subtasks), and each cluster's items are distinct indices
       within it (`rng.choice` again).

For example capitals (165 clusters), discovery 100 + held-out 300: 41 and 124 clusters, 2-3
items per country in each panel; 20 + 300: 10 and 155 clusters.
`panel_layout(task, n_discovery, n_heldout)` gives these numbers for any request.

A task with a fixed list of items (`task.items`: a JSONL task file, HellaSwag, BoolQ) is split
by cluster: the clusters are shuffled (`rng.permutation`), and taken in that order, each whole
into discovery until it holds n_discovery items, then into held-out until it holds n_heldout
(a cluster that would overfill a panel gives it the items needed, in the file's order, and its
other items are left out of both panels). Each panel is then in file order. With a fold, only the
clusters of that fold (by hash, as for large template spaces) are used.

Folds (independent replications): with `fold=(k, K)` the clusters of each subtask are split
into K disjoint folds by a seed fixed per (task, K) -- the same split for every panel seed and
every subtask with as many clusters -- and both panels take their clusters from fold k only,
so replications on different folds share no cluster, in discovery or held-out. A space of at
most `_FOLD_PERMUTE_LIMIT` clusters is permuted once and dealt round-robin (fold sizes differ by
at most one); a larger one (arithmetic) assigns cluster c to fold sha256(task, K, c) mod K,
and clusters are drawn uniformly and kept when they fall in fold k. `fold_sizes(task, K)`
gives the clusters per fold.

Any other object following the `Task` protocol (the theory tasks) is served by drawing
`task.sample` in rounds and keeping first occurrences of each `Item.id`, an item going to the
panel its cluster is already in (a new cluster: discovery until it is full), giving up (with an
error) after a fixed number of rounds that add nothing new.
"""

from __future__ import annotations

import hashlib
import zlib

import numpy as np

from cel_numpy.errors import OptionError
from cel_numpy.limits import check_whole_numbers
from cel_numpy.tasks.base import Item, Task
from cel_numpy.tasks.template import TemplateTask

_FALLBACK_STALL_ROUNDS = 50
_FOLD_PERMUTE_LIMIT = 10**6  # clusters per subtask up to which folds come from one permutation

Fold = tuple[int, int]  # (k, K): fold k of K, 0 <= k < K


def check_fold(task: Task, fold: Fold | None) -> None:
    """A fold is (k, K) with K >= 2 and 0 <= k < K, on a template task (OptionError otherwise)."""
    if fold is None:
        return
    k, K = fold
    if not (isinstance(K, (int, np.integer)) and K >= 2 and 0 <= k < K):
        raise OptionError(f"--fold {k} --folds {K}: want --folds K >= 2 and 0 <= --fold < K")
    if isinstance(getattr(task, "items", None), list):
        in_fold = {it.cluster for it in task.items if _in_fold(task, "", fold, it.cluster)}
        if len(in_fold) < 2:
            raise OptionError(
                f"task {task.name!r}: {K} folds leave fold {k} {len(in_fold)} cluster(s), and a "
                f"discovery and a held-out panel need one each: {fewer_folds(K)}"
            )
        return
    if not isinstance(task, TemplateTask):
        raise OptionError(
            f"task {task.name!r} draws fresh samples (no finite cluster space to split into "
            "folds): run it without --fold"
        )
    for subtask in task.subtasks:
        if _pool_size(task, subtask, fold) < 2:
            n = task.cluster_shape(subtask)[0]
            raise OptionError(
                f"task {task.name!r} has {n} clusters: {K} folds leave fold {k} "
                f"{_pool_size(task, subtask, fold)}, and a discovery and a held-out panel need "
                f"one each: {fewer_folds(K)}"
            )


def fewer_folds(K: int) -> str:
    """The fix for a fold too small to split: fewer folds, or none at --folds 2 (the least)."""
    return "use fewer --folds" if K > 2 else "run without --fold and --folds, or add clusters"


def _fold_seed(task: TemplateTask, K: int) -> int:
    """The seed of the split into K folds: fixed per (task, K), never the panel seed. Subtasks
    with as many clusters get the same split, so a cluster index that names one unit in every
    subtask stays in one fold."""
    return zlib.crc32(f"folds/{task.name}/{K}".encode())


def fold_members(task: TemplateTask, subtask: str, fold: Fold) -> np.ndarray:
    """The cluster indices of fold k of K of a subtask (sorted), for spaces up to
    _FOLD_PERMUTE_LIMIT clusters: one seeded permutation dealt round-robin."""
    k, K = fold
    n = task.cluster_shape(subtask)[0]
    assert n <= _FOLD_PERMUTE_LIMIT, "large spaces assign folds by hash (_in_fold)"
    perm = np.random.default_rng(_fold_seed(task, K)).permutation(n)
    return np.sort(perm[k::K])


def _in_fold(task, subtask: str, fold: Fold, cluster) -> bool:
    """Fold of one cluster of a large space or of an item list: sha256(task, K, cluster) mod K
    == k."""
    k, K = fold
    key = f"{task.name}/{K}/{cluster}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "big") % K == k


def _pool_size(task: TemplateTask, subtask: str, fold: Fold | None) -> int:
    """Clusters a subtask's panels may draw from: all, or about C / K in a fold."""
    n = task.cluster_shape(subtask)[0]
    if fold is None:
        return n
    k, K = fold
    return n // K + (k < n % K) if n <= _FOLD_PERMUTE_LIMIT else n // K


def _choose_clusters(task, subtask, count: int, rng, fold: Fold | None) -> np.ndarray:
    """`count` distinct clusters of a subtask, uniformly from the whole space or from a fold."""
    n = task.cluster_shape(subtask)[0]
    if fold is None:
        return rng.choice(n, count, replace=False)
    if n <= _FOLD_PERMUTE_LIMIT:
        return rng.choice(fold_members(task, subtask, fold), count, replace=False)
    chosen: dict[int, None] = {}
    while len(chosen) < count:
        for c in rng.integers(n, size=2 * fold[1] * (count - len(chosen))):
            if len(chosen) < count and int(c) not in chosen and _in_fold(task, subtask, fold, c):
                chosen[int(c)] = None
    return np.fromiter(chosen, dtype=np.int64, count=count)


def fold_sizes(task: TemplateTask, K: int) -> list[int]:
    """Clusters in each of the K folds (the first subtask's; shared-cluster tasks have one)."""
    return [_pool_size(task, task.subtasks[0], (k, K)) for k in range(K)]


def max_panel_items(task: TemplateTask) -> int:
    """Largest n_discovery + n_heldout accepted for a template task:
    K * (smallest subtask space)."""
    return len(task.subtasks) * min(task.space_size(s) for s in task.subtasks)


def _shares(n: int, k: int, start: int) -> list[int]:
    """n split over k subtasks as evenly as possible; the n mod k extras go to
    start, start+1, ..."""
    counts = [n // k] * k
    for j in range(n % k):
        counts[(start + j) % k] += 1
    return counts


def make_panels(
    task: Task, n_discovery: int, n_heldout: int, seed: int, fold: Fold | None = None
) -> tuple[list[Item], list[Item]]:
    """(discovery, heldout): n_discovery and n_heldout distinct items, no cluster in both;
    with fold=(k, K) every cluster of both comes from fold k of K (see the module docstring)."""
    for label, n in (("n_discovery", n_discovery), ("n_heldout", n_heldout)):
        if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 1:
            raise OptionError(
                f"{label} must be a positive integer, got {n!r}: an empty panel measures nothing"
            )
    check_whole_numbers(seed=(seed, 0))  # None would draw fresh entropy: no one could rebuild
    if isinstance(task, str):
        raise OptionError(
            f"make_panels takes a task object, got the name {task!r}: pass "
            "cel_numpy.tasks.get_task(name)"
        )
    check_fold(task, fold)
    rng = np.random.default_rng(seed)
    if isinstance(task, TemplateTask):
        discovery, heldout = _template_panels(task, int(n_discovery), int(n_heldout), rng, fold)
    elif isinstance(getattr(task, "items", None), list):
        discovery, heldout = _list_panels(task, int(n_discovery), int(n_heldout), rng, fold)
    else:
        discovery, heldout = _sampled_panels(task, int(n_discovery), int(n_heldout), rng)
    ids_d, ids_h = [it.id for it in discovery], [it.id for it in heldout]
    assert len(discovery) == n_discovery and len(heldout) == n_heldout, "panel size mismatch"
    assert len(set(ids_d)) == len(ids_d) and len(set(ids_h)) == len(ids_h), (
        "duplicate item inside a panel"
    )
    assert not {it.cluster for it in discovery} & {it.cluster for it in heldout}, (
        "discovery and held-out panels share a cluster"
    )
    return discovery, heldout


def split_clusters(n_clusters: int, n_d: int, n_h: int) -> tuple[int, int]:
    """(clusters for discovery, clusters for held-out): min(C, n_d + n_h) in proportion to
    n_d : n_h."""
    total = min(n_clusters, n_d + n_h)
    if total < 2:
        raise OptionError(
            f"{n_clusters} cluster(s): a discovery and a held-out panel need at least one each"
        )
    c_d = min(max(1, round(total * n_d / (n_d + n_h))), n_d, total - 1)
    c_h = min(total - c_d, n_h)
    return c_d, c_h


def panel_layout(
    task: TemplateTask, n_discovery: int, n_heldout: int, fold: Fold | None = None
) -> dict:
    """How many clusters each panel of a template task gets, and how many items per cluster."""
    if task.shared_clusters:
        c_d, c_h = split_clusters(_pool_size(task, task.subtasks[0], fold), n_discovery, n_heldout)
    else:
        k = len(task.subtasks)
        share_d, share_h = _shares(n_discovery, k, 0), _shares(n_heldout, k, n_discovery % k)
        splits = [
            split_clusters(_pool_size(task, s, fold), q_d, q_h) if q_d and q_h else (q_d, q_h)
            for s, q_d, q_h in zip(task.subtasks, share_d, share_h)
        ]
        c_d, c_h = sum(x for x, _ in splits), sum(y for _, y in splits)
    return {
        "discovery": {"items": n_discovery, "clusters": c_d},
        "heldout": {"items": n_heldout, "clusters": c_h},
    }


def _template_panels(
    task: TemplateTask, n_d: int, n_h: int, rng: np.random.Generator, fold: Fold | None
):
    k = len(task.subtasks)
    limit = max_panel_items(task)
    if n_d + n_h > limit:
        sizes = ", ".join(f"{s}={task.space_size(s)}" for s in task.subtasks)
        raise OptionError(
            f"task {task.name!r}: asked for {n_d} + {n_h} = {n_d + n_h} distinct items, "
            f"the maximum is {limit} (equal shares over {k} subtasks; template spaces {sizes})"
        )
    share_d = _shares(n_d, k, start=0)
    share_h = _shares(n_h, k, start=n_d % k)
    per_subtask_d, per_subtask_h = [], []
    if task.shared_clusters:
        shapes = {task.cluster_shape(s)[0] for s in task.subtasks}
        assert len(shapes) == 1, f"{task.name}: shared clusters need one cluster count"
        first = task.subtasks[0]
        c_d, c_h = split_clusters(_pool_size(task, first, fold), n_d, n_h)
        chosen = _choose_clusters(task, first, c_d + c_h, rng, fold)
        clusters_d, clusters_h = chosen[:c_d], chosen[c_d:]
        cursor_d = cursor_h = 0
        for subtask, q_d, q_h in zip(task.subtasks, share_d, share_h):
            per_subtask_d.append(_draw(task, subtask, clusters_d, q_d, cursor_d, rng, "discovery"))
            per_subtask_h.append(_draw(task, subtask, clusters_h, q_h, cursor_h, rng, "held-out"))
            cursor_d, cursor_h = cursor_d + q_d, cursor_h + q_h
    else:
        for subtask, q_d, q_h in zip(task.subtasks, share_d, share_h):
            if q_d and q_h:
                c_d, c_h = split_clusters(_pool_size(task, subtask, fold), q_d, q_h)
            else:
                c_d, c_h = q_d, q_h
            chosen = _choose_clusters(task, subtask, c_d + c_h, rng, fold)
            per_subtask_d.append(_draw(task, subtask, chosen[:c_d], q_d, 0, rng, "discovery"))
            per_subtask_h.append(_draw(task, subtask, chosen[c_d:], q_h, 0, rng, "held-out"))
    return _interleave(per_subtask_d), _interleave(per_subtask_h)


def _draw(task, subtask, clusters, q, start, rng, panel) -> list[Item]:
    """q distinct items of `subtask` spread round-robin over `clusters`, starting at `start`."""
    if q == 0:
        return []
    n = len(clusters)
    counts = [q // n + (((i - start) % n) < q % n) for i in range(n)]
    size = task.cluster_shape(subtask)[1]
    if max(counts) > size:
        raise OptionError(
            f"task {task.name!r}: the {panel} panel has {n} clusters of {size} {subtask} items, "
            f"too few for {q} of them (items that share a query stay in one panel): ask for fewer"
        )
    columns = []
    for c, count in zip(clusters, counts):
        js = range(size) if count == size else rng.choice(size, count, replace=False)
        columns.append([task.item_in_cluster(subtask, int(c), int(j)) for j in js])
    return _interleave(columns) if columns else []


def _interleave(groups: list[list[Item]]) -> list[Item]:
    """Round-robin over groups (subtasks, clusters), so any prefix of a panel is
    close to balanced."""
    out = []
    for j in range(max((len(g) for g in groups), default=0)):
        out.extend(g[j] for g in groups if j < len(g))
    return out


def _list_panels(task, n_d: int, n_h: int, rng: np.random.Generator, fold: Fold | None = None):
    """Cluster-disjoint panels from a fixed item list, from fold k's clusters only when a fold
    is given (see the module docstring)."""
    position = {it.id: k for k, it in enumerate(task.items)}
    by_cluster: dict[str, list[Item]] = {}
    for it in task.items:
        by_cluster.setdefault(it.cluster, []).append(it)
    clusters = [c for c in by_cluster if fold is None or _in_fold(task, "", fold, c)]
    panels: list[list[Item]] = [[], []]
    wanted = (n_d, n_h)
    p = 0
    for k in rng.permutation(len(clusters)):
        while p < 2 and len(panels[p]) == wanted[p]:
            p += 1
        if p == 2:
            break
        panels[p].extend(by_cluster[clusters[k]][: wanted[p] - len(panels[p])])
    if len(panels[0]) < n_d or len(panels[1]) < n_h:
        raise OptionError(
            f"task {task.name!r} has {len(task.items)} items in {len(clusters)} clusters, too few "
            f"for {n_d} + {n_h} items in cluster-disjoint panels: ask for fewer"
        )
    discovery, heldout = (sorted(panel, key=lambda it: position[it.id]) for panel in panels)
    return discovery, heldout


def _sampled_panels(task: Task, n_d: int, n_h: int, rng: np.random.Generator):
    wanted = n_d + n_h
    seen: set[str] = set()
    discovery: list[Item] = []
    heldout: list[Item] = []
    home: dict[str, list[Item]] = {}  # cluster -> the panel it belongs to
    stalled = 0
    while len(discovery) + len(heldout) < wanted:
        before = len(discovery) + len(heldout)
        for item in task.sample(rng, wanted - before):
            if item.id in seen:
                continue
            panel = home.get(item.cluster)
            if panel is None:
                panel = discovery if len(discovery) < n_d else heldout
                home[item.cluster] = panel
            if len(panel) < (n_d if panel is discovery else n_h):
                seen.add(item.id)
                panel.append(item)
        stalled = stalled + 1 if len(discovery) + len(heldout) == before else 0
        if stalled >= _FALLBACK_STALL_ROUNDS:
            found = len(discovery) + len(heldout)
            raise OptionError(
                f"task {task.name!r}: asked for {n_d} + {n_h} = {wanted} distinct items, but "
                f"{_FALLBACK_STALL_ROUNDS} rounds of sampling found no new item past {found}; "
                f"the maximum appears to be {found}"
            )
    return discovery, heldout


def panel_hash(items: list[Item]) -> str:
    """Order-sensitive hash of a panel's item ids (16 hex chars); raises on an empty panel."""
    if not items:
        raise ValueError("panel_hash of an empty panel")
    return hashlib.sha256("\n".join(it.id for it in items).encode("ascii")).hexdigest()[:16]
