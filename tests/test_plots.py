"""Attention pictures: the figure is written, and the data behind it is the model's attention.

Checked on the data the figure draws (the arrays of its images), not on what the function says it
drew: every plotted row sums to 1 over the keys a query may see, nothing is drawn above the
diagonal, and layer 0's pattern equals a softmax recomputed by hand from the weights.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import cel_numpy as cn
from cel_numpy.cli import main as run_cli
from cel_numpy.errors import InvalidHeadError
from cel_numpy.plots import attention_pattern

FIXTURES = Path(__file__).parent / "fixtures"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def images(picture) -> list[np.ndarray]:
    """The arrays the figure's axes actually show, in drawing order."""
    return [np.asarray(im.get_array()) for ax in picture.figure.axes for im in ax.get_images()]


def with_tokenizer(tmp_path: Path) -> Path:
    """tiny_gpt2 plus a 96-token byte-level vocabulary (printable ASCII, no merges)."""
    from cel_numpy.models.tokenizer import bytes_to_unicode

    folder = tmp_path / "tiny_gpt2_tok"
    shutil.copytree(FIXTURES / "tiny_gpt2", folder)
    b2u = bytes_to_unicode()
    (folder / "vocab.json").write_text(json.dumps({b2u[b]: b - 32 for b in range(32, 128)}))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    return folder


def layer0_pattern_by_hand(model, ids: list[int]) -> np.ndarray:
    """(H, T, T) softmax(q k^T / sqrt(E) + causal) of GPT-2's layer 0, from the weights."""
    p, c = model.params, model.config
    x = p["embed"]["W_E"][ids] + p["pos_embed"]["W_pos"][np.arange(len(ids))]  # (T, D)
    blk = p["blocks"][0]
    xc = x - x.mean(-1, keepdims=True)
    ln = xc / np.sqrt((xc * xc).mean(-1, keepdims=True) + c.norm_eps)
    ln = ln * blk["ln1"]["w"] + blk["ln1"]["b"]
    q = np.einsum("td,hde->hte", ln, blk["attn"]["W_Q"]) + blk["attn"]["b_Q"][:, None]
    k = np.einsum("td,hde->hte", ln, blk["attn"]["W_K"]) + blk["attn"]["b_K"][:, None]
    scores = np.einsum("hte,hse->hts", q, k) / np.sqrt(c.d_head)  # (H, T, T)
    T = len(ids)
    scores = np.where(np.tril(np.ones((T, T), bool)), scores, -np.inf)
    w = np.exp(scores - scores.max(-1, keepdims=True))
    return w / w.sum(-1, keepdims=True)


def test_one_head_figure_is_written_and_its_rows_sum_to_one(tmp_path):
    model = cn.load_model(with_tokenizer(tmp_path), dtype="float64")
    text = "When Mary and John went"
    out = tmp_path / "head.png"
    picture = attention_pattern(model, text, 0, 2, path=out)
    assert out.read_bytes()[:8] == PNG_MAGIC and out.stat().st_size > 5000
    T = len(model.encode(text))
    assert picture.tokens == [model.decode([i]).replace(" ", "\u2423") for i in model.encode(text)]
    [drawn] = images(picture)
    assert drawn.shape == (T, T)
    np.testing.assert_allclose(drawn.sum(axis=1), 1.0, atol=1e-12)  # every row: a distribution
    assert np.all(np.triu(drawn, k=1) == 0)  # a query never sees a later key
    np.testing.assert_allclose(
        drawn, layer0_pattern_by_hand(model, model.encode(text))[2], atol=1e-12
    )
    axis = picture.figure.axes[0]
    labels = [t.get_text() for t in axis.get_xticklabels()]
    assert labels == picture.tokens == [t.get_text() for t in axis.get_yticklabels()]


def test_head_grid_draws_every_head_of_the_layer(tmp_path):
    model = cn.load_model(FIXTURES / "tiny_llama")  # no tokenizer: token ids label the axes
    ids = [5, 17, 3, 44, 9, 60]
    picture = attention_pattern(model, ids, 1, path=tmp_path / "grid.png")
    drawn = images(picture)
    assert len(drawn) == model.config.n_heads == len(picture.heads)
    _, cache = model.run_with_cache([ids])
    for h, image in enumerate(drawn):
        np.testing.assert_array_equal(image, cache["blocks.1.attn.pattern"][0, h])
        np.testing.assert_allclose(image.sum(axis=1), 1.0, atol=1e-5)
    assert picture.tokens == [str(i) for i in ids]
    titles = [ax.get_title() for ax in picture.figure.axes if ax.get_images()]
    assert titles == [f"L1H{h}" for h in range(model.config.n_heads)]


def test_intact_vs_removed_heads(tmp_path):
    model = cn.load_model(FIXTURES / "tiny_llama")
    ids = [5, 17, 3, 44, 9, 60]
    # removing L0H1 acts on its output: layer 0's patterns stay, layer 1's change
    same = attention_pattern(model, ids, 0, ablate="L0H1")
    assert list(same.patterns) == ["intact", "L0H1"]
    np.testing.assert_array_equal(same.patterns["intact"], same.patterns["L0H1"])
    picture = attention_pattern(model, ids, 1, 3, ablate=[(0, 1)], path=tmp_path / "pair.png")
    intact, ablated = images(picture)
    _, cache = model.run_with_cache([ids], ablate="L0H1")
    np.testing.assert_array_equal(ablated, cache["blocks.1.attn.pattern"][0, 3])
    assert not np.allclose(intact, ablated)
    for image in (intact, ablated):
        np.testing.assert_allclose(image.sum(axis=1), 1.0, atol=1e-5)
    titles = [ax.get_title() for ax in picture.figure.axes if ax.get_images()]
    assert titles == ["L1H3\nintact", "L1H3\nwithout L0H1"]
    grid = attention_pattern(model, ids, 1, ablate="L0H1+L1H0")
    assert len(images(grid)) == 2 * model.config.n_heads
    assert grid.figure.axes[0].get_title() == "L1H0 (removed)"


def test_bad_layer_or_head_is_one_line():
    model = cn.load_model(FIXTURES / "tiny_llama")
    with pytest.raises(InvalidHeadError, match=r"^layer 2 is not in the model: it has 2 layers"):
        attention_pattern(model, [1, 2], 2)
    with pytest.raises(InvalidHeadError, match=r"^head 4 is not in layer 0: it has 4 heads"):
        attention_pattern(model, [1, 2], 0, 4)
    with pytest.raises(ValueError, match=r"^ablate: 'L0-H1' is not a head name"):
        attention_pattern(model, [1, 2], 0, 0, ablate="L0-H1")


def test_cli_attention_writes_a_png(tmp_path, capsys):
    folder = with_tokenizer(tmp_path)
    out = tmp_path / "a.png"
    argv = ["attention", "--model", str(folder), "Mary and John", "--layer", "1", "--out", str(out)]
    assert run_cli(argv + ["--head", "0", "--ablate", "L0H2"]) == 0
    assert out.read_bytes()[:8] == PNG_MAGIC
    assert "layer 1, head 0, intact and without L0H2, 13 tokens: wrote" in capsys.readouterr().out
    out.unlink()
    assert run_cli(argv) == 0 and out.exists()
    for extra, message in [
        (["--layer", "5"], "--layer 5: the model has 2 layers, 0 to 1 (counted from 0)"),
        (["--head", "4"], "--head 4: the model has 4 heads per layer, 0 to 3 (counted from 0)"),
        (["--ablate", "0.2"], "--ablate: '0.2' is not a head name: write L0H2 for layer 0, head 2"),
    ]:
        capsys.readouterr()
        assert run_cli(argv + extra) == 2
        assert capsys.readouterr().err == f"cel-numpy attention: error: {message}\n"
    assert run_cli(argv[:-1] + [str(tmp_path / "a.pdf")]) == 2
    assert "must be a .png file" in capsys.readouterr().err


def test_a_picture_too_large_suggests_one_head_only_where_one_head_fits():
    """4 heads on 360 tokens: one head fits, so --head is the other way out; on 400 tokens one
    head does not fit either, and the message says how many tokens it would take."""
    from cel_numpy.errors import PromptError
    from cel_numpy.plots import MAX_FIGURE_PIXELS, check_attention_size, figure_pixels

    assert (
        np.prod(figure_pixels(1, 1, 360)) <= MAX_FIGURE_PIXELS < np.prod(figure_pixels(1, 1, 400))
    )
    with pytest.raises(PromptError, match=r"at most 347 tokens \(or draw one head with --head\)$"):
        check_attention_size(4, 1, 360)
    with pytest.raises(
        PromptError, match=r"at most 347 tokens \(one head with --head: at most 392\)$"
    ):
        check_attention_size(4, 1, 400)
    assert (
        np.prod(figure_pixels(1, 1, 392)) <= MAX_FIGURE_PIXELS < np.prod(figure_pixels(1, 1, 393))
    )
