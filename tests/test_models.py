"""Real-model code on the tiny fixtures: parity with transformers, invariants, loaders, CLI.

Fixtures (scripts/write_fixtures.py): tiny random HF folders and float64 reference logits from
transformers for a LEFT-padded batch. Tolerances: float64 1e-4 (we see ~1e-14: the only
difference is summation order), float32 1e-3 (we see ~2e-6: float32 rounding over 2 layers).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import cel_numpy as cn
from cel_numpy.cli import UserError
from cel_numpy.errors import OptionError
from cel_numpy.models.config import ConfigError, ModelConfig
from cel_numpy.models.model import InvalidHeadError, NoTokenizerError
from cel_numpy.models.transformer import flatten_params, transformer_forward, unflatten_params

FIXTURES = Path(__file__).parent / "fixtures"
HF_FIXTURES = ["tiny_gpt2", "tiny_llama", "tiny_llama_tied", "tiny_qwen2", "tiny_gemma3"]
TOL = {"float64": 1e-4, "float32": 1e-3}


def reference(name: str) -> dict:
    with np.load(FIXTURES / f"{name}_reference.npz") as z:
        return {k: z[k] for k in z.files}


_MODELS: dict = {}


def load(source: str, dtype: str = "float64"):
    """Loaded once per (fixture, dtype): tests never mutate a model."""
    key = (source, dtype)
    if key not in _MODELS:
        _MODELS[key] = cn.load_model(FIXTURES / source, dtype=dtype)
    return _MODELS[key]


# --------------------------------------------------------------------------- parity


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("source", HF_FIXTURES + ["tiny_gpt2.npz"])
def test_parity_with_transformers(source, dtype):
    name = source.removesuffix(".npz")
    ref = reference(name)
    model = load(source, dtype)
    ids, mask = ref["input_ids"], ref["attention_mask"]
    real = mask.astype(bool)  # (B, T): compare real positions only
    cases = {
        "intact": (model.logits(ids, mask), ref["logits"]),
        "one head": (
            model.logits(ids, mask, ablate=[(int(ref["ablate_layer"]), int(ref["ablate_head"]))]),
            ref["logits_ablated"],
        ),
        "pair": (
            model.logits(ids, mask, ablate=[tuple(p) for p in ref["ablate_pairs"]]),
            ref["logits_ablated_pair"],
        ),
    }
    for case, (ours, theirs) in cases.items():
        assert ours.dtype == np.dtype(dtype), f"{case}: logits are {ours.dtype}, model is {dtype}"
        err = np.abs(ours - theirs)[real].max()
        assert err < TOL[dtype], f"{source} {dtype} {case}: max |diff| {err:.2e} >= {TOL[dtype]}"
    unpadded = model.logits(ref["unpadded_ids"])
    assert np.abs(unpadded - ref["logits_unpadded"]).max() < TOL[dtype]
    # the reference's own position ids are what our left-padding convention computes
    _, cache = model.run_with_cache(ids, mask)
    np.testing.assert_array_equal(cache["positions"], ref["position_ids"])


def test_list_input_is_left_padded_like_the_reference():
    ref = reference("tiny_llama")
    model = load("tiny_llama")
    prompts = [list(row[m.astype(bool)]) for row, m in zip(ref["input_ids"], ref["attention_mask"])]
    ids, mask = model.pad(prompts)
    np.testing.assert_array_equal(mask, ref["attention_mask"])
    logits = model.logits(prompts)
    real = mask.astype(bool)
    assert np.abs(logits - ref["logits"])[real].max() < 1e-10


def test_npz_export_equals_hf_folder():
    a, b = load("tiny_gpt2"), load("tiny_gpt2.npz")
    fa, fb = flatten_params(a.params), flatten_params(b.params)
    assert fa.keys() == fb.keys()
    for k in fa:
        np.testing.assert_array_equal(fa[k], fb[k], err_msg=k)


# --------------------------------------------------------------------------- invariants


@pytest.mark.parametrize("source", HF_FIXTURES)
def test_head_mask_of_ones_is_bitwise_identical(source):
    model = load(source, "float32")
    ref = reference(source)
    c = model.config
    plain, _ = transformer_forward(model.params, c, ref["input_ids"], ref["attention_mask"])
    ones, _ = transformer_forward(
        model.params,
        c,
        ref["input_ids"],
        ref["attention_mask"],
        head_mask=np.ones((c.n_layers, c.n_heads)),
    )
    np.testing.assert_array_equal(plain, ones)
    np.testing.assert_array_equal(
        plain, model.logits(ref["input_ids"], ref["attention_mask"], ablate=[])
    )


@pytest.mark.parametrize("source", HF_FIXTURES)
def test_batch_equals_one_by_one(source):
    model = load(source)
    rng = np.random.default_rng(0)
    prompts = [list(rng.integers(0, model.config.vocab_size, n)) for n in (5, 2, 9)]
    batch = model.logits(prompts)  # (3, 9, V) left-padded
    for b, p in enumerate(prompts):
        alone = model.logits([p])[0]  # (n, V)
        np.testing.assert_allclose(batch[b, -len(p) :], alone, atol=1e-10, err_msg=f"prompt {b}")


def test_joint_ablation_of_one_head_equals_single_and_lower_layers_untouched():
    model = load("tiny_llama")
    ids = reference("tiny_llama")["unpadded_ids"]
    single, c1 = model.run_with_cache(ids, ablate=[(1, 2)])
    double, _ = model.run_with_cache(ids, ablate=[(1, 2), (1, 2)])
    np.testing.assert_array_equal(single, double)
    _, c0 = model.run_with_cache(ids)
    np.testing.assert_array_equal(
        c0["blocks.1.resid_pre"], c1["blocks.1.resid_pre"]
    )  # layer 0 unchanged
    assert not np.allclose(c0["blocks.1.resid_post"], c1["blocks.1.resid_post"])


def test_gqa_ablation_removes_one_query_head_and_keeps_its_kv_group():
    model = load("tiny_llama")  # 4 query heads, 2 kv heads: heads 2 and 3 share group 1
    ids = reference("tiny_llama")["unpadded_ids"]
    _, intact = model.run_with_cache(ids)
    _, ablated = model.run_with_cache(ids, ablate=[(1, 2)])
    z, z_abl = ablated["blocks.1.attn.z"], ablated["blocks.1.attn.z_ablated"]
    assert np.all(z_abl[:, 2] == 0)
    np.testing.assert_array_equal(
        z_abl[:, 3], intact["blocks.1.attn.z"][:, 3]
    )  # same kv group, untouched
    np.testing.assert_array_equal(z, intact["blocks.1.attn.z"])  # z before ablation unchanged
    np.testing.assert_array_equal(ablated["blocks.1.attn.k"], intact["blocks.1.attn.k"])


def test_mean_ablation_uses_mean_z_over_real_reference_positions():
    model = load("tiny_llama")
    ref = reference("tiny_llama")
    reference_ids = [
        list(r[m.astype(bool)]) for r, m in zip(ref["input_ids"], ref["attention_mask"])
    ]
    _, cache = model.run_with_cache(reference_ids)
    real = cache["attention_mask"].astype(bool)  # (B, T)
    expected = np.stack(
        [cache[f"blocks.{l}.attn.z"].transpose(0, 2, 1, 3)[real].mean(axis=0) for l in range(2)]
    )
    np.testing.assert_allclose(model.mean_z(reference_ids), expected, atol=1e-12)  # (L, H, E)
    np.testing.assert_allclose(model.mean_z(reference_ids, batch_size=1), expected, atol=1e-12)

    ids = ref["unpadded_ids"]
    mean_abl, c = model.run_with_cache(
        ids, ablate=[(1, 2)], ablation="mean", reference=reference_ids
    )
    np.testing.assert_allclose(
        c["blocks.1.attn.z_ablated"][0, 2], np.broadcast_to(expected[1, 2], (7, 8)), atol=1e-12
    )
    zero_abl = model.logits(ids, ablate=[(1, 2)])
    assert not np.allclose(mean_abl, zero_abl)
    np.testing.assert_array_equal(
        mean_abl, model.logits(ids, ablate=[(1, 2)], ablation="mean", mean_z=expected)
    )


def test_ablation_errors_are_one_line():
    model = load("tiny_llama")
    ids = [[1, 2, 3]]
    with pytest.raises(
        InvalidHeadError,
        match=r"^ablate: head L2H0 is not in the model: it has 2 layers x 4 heads, L0H0 to L1H3 "
        r"\(counted from 0\)$",
    ):
        model.logits(ids, ablate=[(2, 0)])
    with pytest.raises(OptionError, match="pairs"):
        model.logits(ids, ablate=[(1, 2, 3)])
    with pytest.raises(UserError, match="reference"):
        model.logits(ids, ablate=[(1, 2)], ablation="mean")
    with pytest.raises(UserError, match="zero, mean"):
        model.logits(ids, ablate=[(1, 2)], ablation="resample")
    with pytest.raises(ValueError, match="wrap one prompt"):
        model.logits([1, 2, 3])


# --------------------------------------------------------------------------- named activations


def test_named_activations_are_consistent():
    model = load("tiny_llama_tied")
    ref = reference("tiny_llama_tied")
    logits, cache = model.run_with_cache(ref["input_ids"], ref["attention_mask"])
    c = model.config
    B, T = ref["input_ids"].shape
    for name in cache.names():
        assert cache[name] is not None, name
    assert cache["blocks.0.attn.pattern"].shape == (B, c.n_heads, T, T)
    assert cache["blocks.0.attn.k"].shape == (B, c.n_kv_heads, T, c.d_head)
    np.testing.assert_allclose(cache["blocks.1.attn.pattern"].sum(-1), 1.0, atol=1e-12)
    np.testing.assert_array_equal(cache["blocks.0.resid_post"], cache["blocks.1.resid_pre"])
    np.testing.assert_array_equal(cache["blocks.0.resid_pre"], cache["embed"])
    stacked = cache.stack("attn.z")
    assert stacked.shape == (c.n_layers, B, c.n_heads, T, c.d_head)
    # pads never receive attention
    real = ref["attention_mask"].astype(bool)
    pattern = cache["blocks.0.attn.pattern"]  # (B, H, T, S)
    for b in range(B):
        assert np.all(pattern[b][:, real[b]][:, :, ~real[b]] == 0), (
            f"row {b}: a real query attends to padding"
        )
    with pytest.raises(KeyError, match="unknown activation"):
        cache["blocks.0.attn.nope"]
    np.testing.assert_array_equal(logits, cache["logits"])


def test_float32_residual_stream_stays_float32():
    model = load("tiny_gpt2", "float32")
    _, cache = model.run_with_cache([[1, 2, 3, 4]])
    for name in (
        "embed",
        "blocks.1.resid_mid",
        "blocks.1.resid_post",
        "blocks.1.mlp.post",
        "logits",
    ):
        assert cache[name].dtype == np.float32, (
            f"{name} is {cache[name].dtype}: a float64 constant promoted it?"
        )


def test_partial_unembedding_matches_full():
    model = load("tiny_gpt2")
    ids = reference("tiny_gpt2")["unpadded_ids"]
    full, _ = transformer_forward(model.params, model.config, ids)
    cols = np.array([3, 17, 95])
    part, _ = transformer_forward(
        model.params, model.config, ids, logit_positions=slice(-2, None), logit_columns=cols
    )
    np.testing.assert_allclose(part, full[:, -2:, cols], atol=1e-12)


# --------------------------------------------------------------------------- generation


@pytest.mark.parametrize("source", ["tiny_gpt2", "tiny_llama"])
def test_kv_cache_generation_equals_recomputation(source):
    model = load(source)
    rng = np.random.default_rng(1)
    prompts = [list(rng.integers(0, 96, n)) for n in (3, 6, 1)]
    cached = model.generate_ids(prompts, 8)
    recomputed = model.generate_ids(prompts, 8, use_cache=False)
    assert cached == recomputed
    assert [len(r) for r in cached] == [8, 8, 8]
    # each row of the batch equals that prompt generated alone
    for p, row in zip(prompts, cached):
        assert model.generate_ids([p], 8) == [row]
    # the cached step's logits equal a full forward over prompt + generated tokens
    seq = prompts[1] + cached[1][:4]
    full = model.logits([seq])[0, -1]
    ids, mask = model.pad([prompts[1]])
    _, cache = transformer_forward(model.params, model.config, ids, mask, keep_activations=False)
    past = cache.kv
    for t in cached[1][:4]:
        mask = np.concatenate([mask, [[1]]], axis=1)
        step, cache = transformer_forward(
            model.params, model.config, np.array([[t]]), mask, past=past
        )
        past = cache.kv
    np.testing.assert_allclose(step[0, -1], full, atol=1e-10)


def test_generation_with_ablation_and_eos():
    model = load("tiny_llama")
    prompt = [5, 6, 7]
    intact = model.generate_ids([prompt], 6)[0]
    ablated = model.generate_ids([prompt], 6, ablate=[(0, 0), (1, 1)])
    assert model.generate_ids([prompt], 6, ablate=[(0, 0), (1, 1)], use_cache=False) == ablated
    assert len(intact) == 6


def test_no_tokenizer_means_a_clear_error_for_text():
    model = load("tiny_llama")
    assert model.tokenizer is None
    with pytest.raises(NoTokenizerError, match="without tokenizer files"):
        model.generate("hello")


# --------------------------------------------------------------------------- loaders


def test_config_validation_and_roundtrip():
    cfg = load("tiny_llama").config
    assert (
        cfg.n_heads == 4 and cfg.n_kv_heads == 2 and cfg.group_size == 2 and not cfg.tied_embeddings
    )
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    for model in (load("tiny_llama"), load("tiny_llama_tied"), load("tiny_gpt2")):
        assert model.n_params() == model.config.n_params()
    assert load("tiny_llama_tied").config.rope_base == 1e5
    with pytest.raises(ConfigError, match="must divide"):
        ModelConfig(**{**cfg.to_dict(), "n_kv_heads": 3})
    with pytest.raises(ConfigError, match="unknown model family 'mamba'"):
        ModelConfig(**{**cfg.to_dict(), "family": "mamba"})


@pytest.mark.parametrize(
    "fixture, key, value, message",
    [
        ("tiny_llama", "num_hidden_layers", 0, "num_hidden_layers must be a positive integer"),
        ("tiny_llama", "num_key_value_heads", 3, "num_key_value_heads=3 must divide num_attenti"),
        ("tiny_llama", "max_position_embeddings", -1, "max_position_embeddings must be a positi"),
        ("tiny_gpt2", "n_layer", 0, "n_layer must be a positive integer, got 0"),
        ("tiny_gpt2", "layer_norm_epsilon", -1.0, "layer_norm_epsilon must be a positive number"),
    ],
)  # fmt: skip
def test_a_bad_config_value_is_named_as_the_file_names_it(fixture, key, value, message):
    """ModelConfig checks its own fields (n_layers, n_kv_heads, ...); an error from a
    config.json names the key the file has, for the file's family."""
    hf = json.loads((FIXTURES / fixture / "config.json").read_text())
    with pytest.raises(ConfigError) as err:
        ModelConfig.from_hf_config({**hf, key: value})
    assert str(err.value).startswith(message), err.value


def test_a_config_field_the_file_does_not_have_is_named_by_where_it_came_from():
    """head_dim absent: d_head is derived, and said so; a GPT-2 file with n_ctx (not
    n_positions) is named by n_ctx; a quoted value is never renamed."""
    llama = json.loads((FIXTURES / "tiny_llama" / "config.json").read_text())
    llama = {k: v for k, v in llama.items() if k != "head_dim"}
    with pytest.raises(ConfigError, match=r"^rotary needs an even d_head \(hidden_size / num_"):
        ModelConfig.from_hf_config({**llama, "hidden_size": 4, "num_attention_heads": 4,
                                    "num_key_value_heads": 2})  # fmt: skip
    gpt2 = json.loads((FIXTURES / "tiny_gpt2" / "config.json").read_text())
    gpt2 = {k: v for k, v in gpt2.items() if k != "n_positions"}
    with pytest.raises(ConfigError, match=r"^n_ctx must be a positive integer, got 0"):
        ModelConfig.from_hf_config({**gpt2, "n_ctx": 0})
    with pytest.raises(ConfigError, match=r"'n_layers d_model'"):
        ModelConfig.from_hf_config({**llama, "hidden_act": "n_layers d_model"})


def test_tied_unembedding_is_a_view():
    model = load("tiny_llama_tied")
    assert np.shares_memory(model.params["unembed"]["W_U"], model.params["embed"]["W_E"])


def test_unknown_architecture_is_one_line(tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(FIXTURES / "tiny_llama", folder)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "model_type": "mistral"}))
    with pytest.raises(
        UserError, match=r"unsupported architecture 'mistral'.*supported model_type: gpt2, llama"
    ):
        cn.load_model(folder)


def test_truncated_safetensors_is_one_line(tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(FIXTURES / "tiny_llama", folder)
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(UserError, match=r"model.safetensors.*download it again") as err:
        cn.load_model(folder)
    assert "\n" not in str(err.value)


def test_missing_model_and_unknown_suffix(tmp_path):
    with pytest.raises(UserError, match="not found"):
        cn.load_model(tmp_path / "nope")
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(UserError, match="don't know how to load"):
        cn.load_model(tmp_path / "weights.bin")


def test_sharded_safetensors_index(tmp_path):
    from safetensors.numpy import load_file, save_file

    folder = tmp_path / "sharded"
    folder.mkdir()
    shutil.copy(FIXTURES / "tiny_llama" / "config.json", folder)
    tensors = load_file(FIXTURES / "tiny_llama" / "model.safetensors")
    names = sorted(tensors)
    shards = {
        "model-00001-of-00002.safetensors": names[::2],
        "model-00002-of-00002.safetensors": names[1::2],
    }
    weight_map = {}
    for shard, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, folder / shard)
        weight_map.update(dict.fromkeys(keys, shard))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    ref = reference("tiny_llama")
    logits = cn.load_model(folder, dtype="float64").logits(ref["input_ids"], ref["attention_mask"])
    assert np.abs(logits - ref["logits"])[ref["attention_mask"].astype(bool)].max() < 1e-10


def test_flatten_unflatten_roundtrip():
    params = load("tiny_gpt2").params
    flat = flatten_params(params)
    assert "blocks.1.attn.W_Q" in flat and "embed.W_E" in flat
    again = flatten_params(unflatten_params(flat))
    assert again.keys() == flat.keys()


# --------------------------------------------------------------------------- CLI


def tiny_folder_with_tokenizer(tmp_path: Path) -> Path:
    """tiny_gpt2 plus a 96-token byte-level vocabulary (printable ASCII, no merges)."""
    from cel_numpy.models.tokenizer import bytes_to_unicode

    folder = tmp_path / "tiny_gpt2_tok"
    shutil.copytree(FIXTURES / "tiny_gpt2", folder)
    b2u = bytes_to_unicode()
    (folder / "vocab.json").write_text(json.dumps({b2u[b]: b - 32 for b in range(32, 128)}))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    return folder


def run_cli(argv: list[str]) -> int:
    from cel_numpy.models.cli import register

    parser = argparse.ArgumentParser(prog="cel-numpy")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_inspect(capsys):
    assert run_cli(["inspect", "--model", str(FIXTURES / "tiny_llama")]) == 0
    out = capsys.readouterr().out
    for expected in ("family            llama", "layers            2", "kv-heads          2",
                     "vocab             96", "F32 100%",
                     f"{load('tiny_llama').n_params():,}"):  # fmt: skip
        assert expected in out, out


def test_cli_generate_with_ablation(tmp_path, capsys):
    folder = tiny_folder_with_tokenizer(tmp_path)
    model = cn.load_model(folder)
    assert model.decode(model.encode("hello world")) == "hello world"
    argv = [
        "generate",
        "--model",
        str(folder),
        "hello",
        "--max-new-tokens",
        "4",
        "--ablate",
        "L1H2+L0H1",
    ]
    assert run_cli(argv + ["--ablation", "mean"]) == 0
    out = capsys.readouterr().out
    assert "[intact] next token" in out and "[ablated L0H1+L1H2 (mean)]" in out
    expected = model.generate(
        "hello", 4, ablate=[(1, 2), (0, 1)], ablation="mean", reference=[model.encode("hello")]
    )
    assert f"greedy: 'hello' + {expected!r}" in out
    with pytest.raises(UserError, match="not a head name"):
        run_cli(["generate", "--model", str(folder), "hi", "--ablate", "1-2"])
    with pytest.raises(InvalidHeadError, match=r"head L7H0 is not in the model"):
        run_cli(["generate", "--model", str(folder), "hi", "--ablate", "L7H0"])


def test_fill_per_row_is_each_row_with_its_own_fill():
    """Resample ablation's fill per batch row (L, B, H, E): the batch equals each row run alone
    with its own (L, H, E) fill; `row_mean_z` of a row is `mean_z` of that row alone."""
    model = load("tiny_llama")
    rng = np.random.default_rng(0)
    V = model.config.vocab_size
    rows = [list(rng.integers(0, V, size=n)) for n in (3, 7, 5)]
    per_row = model.row_mean_z(rows)  # (L, B, H, E)
    assert per_row.shape[:2] == (model.config.n_layers, 3)
    for b, row in enumerate(rows):
        np.testing.assert_allclose(per_row[:, b], model.mean_z([row]), atol=1e-6)
    donors = per_row[:, [2, 0, 1]]  # row b takes row (b + 2) mod 3's mean
    batch = model.logits(rows, ablate="L0H1+L1H2", ablation="mean", mean_z=donors)
    for b, row in enumerate(rows):
        alone = model.logits([row], ablate="L0H1+L1H2", ablation="mean", mean_z=donors[:, b])
        np.testing.assert_allclose(batch[b, -len(row) :], alone[0], atol=1e-5)
    new = model.generate_ids(rows, 3, ablate="L1H0", ablation="mean", mean_z=donors)
    assert new == [
        model.generate_ids([r], 3, ablate="L1H0", ablation="mean", mean_z=donors[:, b])[0]
        for b, r in enumerate(rows)
    ]
