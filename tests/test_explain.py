"""cel_numpy.explain against independent computations: the model's own logits (direct logit
attribution adds up to them), its own ablation (patching), explicit eigenvalues of the full
(V, V) OV circuit, hand-built heads with known answers, and a planted model whose harmful head
writes a known constant."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import FIXTURES, PlantedTask, copy_fixture, planted_model, run_cli, with_tokenizer

import cel_numpy as cn
from cel_numpy.explain import (
    FIRST,
    OTHER,
    attended_lift,
    attended_lifts,
    copying_score,
    direct_logit_attribution,
    explain,
    final_norm_scale,
    forward_patched,
    ov_circuit,
    ov_copying_scores,
    role_shares,
    token_char_spans,
    token_roles,
    write_explanation,
)
from cel_numpy.tasks import TASKS, make_panels

FAMILIES = ["tiny_gpt2", "tiny_llama", "tiny_qwen2"]


def tiny(name: str):
    return cn.load_model(FIXTURES / name, dtype="float64")


def batch(rng, model, lengths=(7, 5, 9)):
    """Left-padded random prompts of the given lengths: ids, mask (B, T)."""
    V = model.config.vocab_size
    return model.pad([list(rng.integers(0, V, size=n)) for n in lengths])


# --------------------------------------------------------------------------- direct attribution


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("ablate", [None, "L1H2", "L0H1+L1H0"])
def test_direct_logit_attribution_adds_up_to_the_logits(name, ablate):
    """Every component (embed, each head, each b_O, each MLP, the biases) through the frozen
    final norm sums to the model's own logits, hence to any logit difference."""
    rng = np.random.default_rng(0)
    model = tiny(name)
    ids, mask = batch(rng, model)
    logits, cache = model.run_with_cache(ids, mask, ablate=ablate)
    tokens = [3, 17, 42]
    for b in range(ids.shape[0]):
        for t in (ids.shape[1] - 1, ids.shape[1] - 3):
            names, contrib = direct_logit_attribution(model, cache, b, t, tokens)
            assert contrib.shape == (len(names), 3)
            np.testing.assert_allclose(contrib.sum(axis=0), logits[b, t, tokens], atol=1e-10)
            diff = contrib[:, 0] - contrib[:, 1]
            assert abs(diff.sum() - (logits[b, t, 3] - logits[b, t, 17])) < 1e-10
            if ablate:  # a removed head writes nothing
                for head in cn.heads.parse_heads(ablate):
                    assert np.all(contrib[names.index(cn.heads.head_name(head))] == 0)


def test_frozen_scale_is_the_intact_one():
    """With another run's scale the components no longer add up (the scale is really frozen),
    and the scale equals 1/rms of the final residual computed by hand."""
    rng = np.random.default_rng(1)
    model = tiny("tiny_llama")
    ids, mask = batch(rng, model)
    logits, cache = model.run_with_cache(ids, mask)
    resid = cache["blocks.1.resid_post"][0, -1]  # (D,)
    scale = final_norm_scale(model, resid)
    by_hand = 1 / np.sqrt(np.mean(resid**2) + model.config.norm_eps)
    assert abs(scale.item() - by_hand) < 1e-12
    _, contrib = direct_logit_attribution(model, cache, 0, ids.shape[1] - 1, [5], 2 * scale)
    assert abs(contrib.sum() - logits[0, -1, 5]) > 1e-3


# --------------------------------------------------------------------------- patching


@pytest.mark.parametrize("name", FAMILIES)
def test_patching_every_removed_head_back_gives_the_intact_model(name):
    rng = np.random.default_rng(2)
    model = tiny(name)
    ids, mask = batch(rng, model)
    removed = [(0, 1), (1, 0), (1, 3)]
    _, cache = model.run_with_cache(ids, mask)
    intact = model.next_token_logits(ids, mask)
    patches = {(l, h): cache[f"blocks.{l}.attn.z"][:, h] for l, h in removed}
    np.testing.assert_allclose(
        forward_patched(model, ids, mask, removed, patches), intact, atol=1e-10
    )
    # no patches: the model's own zero ablation
    np.testing.assert_allclose(
        forward_patched(model, ids, mask, removed, {}),
        model.next_token_logits(ids, mask, ablate=removed),
        atol=1e-10,
    )
    # one head put back = the other two removed, when that head is below them (its input
    # is then the intact one)
    one = {(0, 1): patches[(0, 1)]}
    np.testing.assert_allclose(
        forward_patched(model, ids, mask, removed, one),
        model.next_token_logits(ids, mask, ablate=[(1, 0), (1, 3)]),
        atol=1e-10,
    )


# --------------------------------------------------------------------------- OV copying


@pytest.mark.parametrize("name", FAMILIES)
def test_copying_scores_equal_the_eigenvalues_of_the_full_circuit(name):
    """The factored (E, E) computation against np.linalg.eigvals of the explicit (V, V) map."""
    model = tiny(name)
    scores = ov_copying_scores(model)
    c = model.config
    assert scores.shape == (c.n_layers, c.n_heads)
    for l in range(c.n_layers):
        for h in range(c.n_heads):
            full = np.linalg.eigvals(ov_circuit(model, l, h))  # (V,) mostly ~0
            assert abs(copying_score(full) - scores[l, h]) < 1e-8, (l, h)
    assert np.all(np.abs(scores) <= 1 + 1e-12)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_a_head_whose_ov_is_the_identity_copies(sign):
    """W_V W_O = +-(projection onto E directions) and W_U = W_E^T: the circuit is +-W_E P W_E^T,
    semi-definite, so the score is exactly +1 (copier) or -1 (anti-copier)."""
    model = tiny("tiny_llama")
    rng = np.random.default_rng(3)
    c = model.config
    P, _ = np.linalg.qr(rng.standard_normal((c.d_model, c.d_head)))  # (D, E) orthonormal columns
    block = model.params["blocks"][1]
    block["ln1"]["w"] = np.ones(c.d_model)
    model.params["ln_final"]["w"] = np.ones(c.d_model)
    model.params["unembed"]["W_U"] = model.params["embed"]["W_E"].T
    group = c.n_heads // c.n_kv_heads
    block["attn"]["W_V"][2 // group] = P
    block["attn"]["W_O"][2] = sign * P.T
    assert ov_copying_scores(model)[1, 2] == pytest.approx(sign, abs=1e-12)
    eig = np.linalg.eigvals(ov_circuit(model, 1, 2))
    assert np.all(sign * eig.real > -1e-9)  # the independent check: no eigenvalue of the other sign


def test_copying_score_of_known_spectra():
    assert copying_score(np.array([2.0, 1.0, 0.0])) == 1.0
    assert copying_score(np.array([1.0, -3.0])) == -0.5
    assert copying_score(np.array([1 + 1j, 1 - 1j])) == pytest.approx(2 / (2 * np.sqrt(2)))


def test_attended_lift_by_hand():
    logit = np.array([0.0, 0.0, 3.0, 0.0, -3.0])  # mean 0, std sqrt(18 / 5)
    std = np.sqrt(18 / 5)
    pattern = np.array([0.5, 0.25, 0.25])  # position 0 (the sink) is left out
    assert attended_lift(logit, pattern, [1, 2, 2]) == pytest.approx(3 / std)
    assert attended_lift(logit, pattern, [1, 2, 4]) == pytest.approx(0.0)
    assert attended_lift(logit, np.array([1.0, 0.0]), [1, 2]) == 0.0


@pytest.mark.parametrize("name", ["tiny_gpt2", "tiny_llama"])
def test_attended_lifts_of_all_heads_equal_the_one_head_computation(name):
    from cel_numpy.explain import final_norm_scale, head_logit_vector

    rng = np.random.default_rng(6)
    model = tiny(name)
    ids, mask = batch(rng, model, lengths=(6, 9))
    _, cache = model.run_with_cache(ids, mask)
    for b, n in enumerate((6, 9)):
        row = [int(i) for i in ids[b, -n:]]
        scale = final_norm_scale(model, cache["blocks.1.resid_post"][b, -1])
        lifts = attended_lifts(model, cache, b, row)
        for l in range(2):
            for h in range(model.config.n_heads):
                z = cache[f"blocks.{l}.attn.z"][b, h, -1]
                vec = head_logit_vector(model, z, l, h, scale)
                pattern = cache[f"blocks.{l}.attn.pattern"][b, h, -1, -n:]
                assert lifts[l, h] == pytest.approx(attended_lift(vec, pattern, row), abs=1e-9)


# --------------------------------------------------------------------------- token roles


def test_token_roles_on_character_tokens():
    from helpers import ALPHABET, CharTokenizer

    tok = CharTokenizer(ALPHABET)
    ids = tok.encode("xab\nya")
    spans = token_char_spans(tok, ids)
    assert spans == [(i, i + 1) for i in range(6)]
    roles = token_roles(spans, {"answer": [(1, 3)], "newline": [(3, 4)]}, 0)
    assert roles == [FIRST, "answer", "answer", "newline", OTHER, OTHER]
    shares = role_shares(np.array([0.1, 0.2, 0.3, 0.0, 0.4, 0.0]), roles, ["answer", FIRST, OTHER])
    assert shares == pytest.approx({"answer": 0.5, FIRST: 0.1, OTHER: 0.4})
    # an offset shifts the spans (a chat template around the prompt)
    assert token_roles(spans, {"answer": [(0, 2)]}, 1)[1:3] == ["answer", "answer"]


def test_task_roles_name_the_right_words():
    for name in ("capitals", "antonyms", "ioi", "induction"):
        task = TASKS[name]
        for item in make_panels(task, 5, 5, seed=4)[0]:
            roles = task.roles(item)
            text = {k: [item.prompt[a:b] for a, b in v] for k, v in roles.items()}
            if name in ("capitals", "antonyms"):
                assert text["query"] == [item.prompt.rsplit("\n", 1)[1][: -len(task.separator)]]
                assert len(text["shot answers"]) == 3 and item.answer not in text["shot answers"]
                assert set(text["separators"]) == {task.separator, "\n"}
            elif name == "ioi":
                assert text["IO"] == [item.answer.strip()] and len(text["S"]) == 2
            else:
                assert text["target"] == [item.answer]
                first = item.prompt.split("\n")[0].split(" ")
                assert first.index(text["current"][0]) == first.index(item.answer) - 1


def test_induction_scoring_and_items():
    task = TASKS["induction"]
    item = task.item_at("words", 123456789)
    first, repeat = item.prompt.split("\n")
    words = first.split(" ")
    assert len(set(words)) == len(words) == 6
    assert repeat.split(" ") == words[: len(repeat.split(" "))]
    assert item.answer == words[len(repeat.split(" "))] and item.cluster == item.answer
    assert task.is_correct(item, f" {item.answer} and more")
    assert not task.is_correct(item, "\n" + item.answer)
    assert not task.is_correct(item, "")


# --------------------------------------------------------------------------- the analysis


def test_explain_on_a_planted_harmful_head(tmp_path):
    """Removing the planted head that pushes "b" rescues every item; its direct attribution to
    "b" is the known constant through the frozen norm, and restoring it undoes all."""
    rng = np.random.default_rng(5)
    model = planted_model(rng)
    task = PlantedTask("generate")
    items = task.sample(rng, 12)
    report = explain(model, task, "L1H1", items, batch_size=5)
    assert report.counts["rescued"] == len(items)
    (head,) = report.per_head
    assert head.restore["undone"] == pytest.approx(1.0)
    assert head.restore["intact_token_returns"] == 1.0
    a, b = model.encode("a")[0], model.encode("b")[0]
    for rec in report.items:
        assert (rec.reference_token, rec.competitor_token) == (a, b)
        _, cache = model.run_with_cache([model.encode(rec.prompt)])
        resid = cache["blocks.1.resid_post"][0, -1]
        rstd = 1 / np.sqrt(resid.var() + model.config.norm_eps)
        # z = e_0 -> 10 d_b; W_U[:, b] = 2 d_b; d_b.d_b = 2, d_b.d_a = 0
        assert rec.dla["L1H1"] == pytest.approx([0.0, 40 * rstd], abs=1e-9)
        assert rec.restored["L1H1"] == pytest.approx(rec.logit_diff_intact, abs=1e-9)
    assert head.dla["rescued"]["difference"] < 0
    data = write_explanation(report, tmp_path)
    assert data["counts"]["rescued"] == len(items) and (tmp_path / "explain.png").exists()


def test_explain_command_on_a_fixture(tmp_path):
    folder = with_tokenizer(copy_fixture(tmp_path, "tiny_gpt2"))
    out = tmp_path / "out"
    status, err = run_cli(
        [
            "explain",
            "--model",
            str(folder),
            "--task",
            "agreement",
            "--heads",
            "L1H2+L0H0",
            "--heldout",
            "6",
            "--discovery",
            "4",
            "--out",
            str(out),
            "--quiet",
        ]
    )
    assert status == 0, err
    import json

    report = json.loads((out / "report.json").read_text())
    assert report["heads"] == "L0H0+L1H2" and report["n_items"] == 6
    assert sum(report["counts"].values()) == 6
    assert [h["head"] for h in report["per_head"]] == ["L0H0", "L1H2"]
    for h in report["per_head"]:
        assert sum(h["shares"].values()) == pytest.approx(1.0)
    assert (out / "explain.png").stat().st_size > 0 and (out / "report.md").exists()
