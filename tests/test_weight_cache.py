"""The weight cache (cel_numpy.models.weight_cache): float32 weights written once, mapped by every
process. Checked against the model file itself and against the `safetensors` package (an
independent reader of the cache's format)."""

import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

import cel_numpy as cn
from cel_numpy.localize.workers import auto_workers, intact_cache_budget, memory_split
from cel_numpy.models import fast, weight_cache
from cel_numpy.models import loaders as loaders_module
from cel_numpy.models.transformer import flatten_params

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture()
def tiny_tied(tmp_path, monkeypatch):
    """A copy of the tied-embedding tiny Llama folder and an empty cache root."""
    monkeypatch.setenv("CEL_NUMPY_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "tiny_llama_tied"
    shutil.copytree(FIXTURES / "tiny_llama_tied", folder)
    return folder


def assert_same_params(a, b):
    fa, fb = flatten_params(a.params), flatten_params(b.params)
    assert fa.keys() == fb.keys()
    for name in fa:
        assert fa[name].shape == fb[name].shape, name
        assert np.array_equal(fa[name], fb[name]), f"{name} differs between the two loads"


@pytest.mark.download  # fetches the benchmark data, a model or a vocabulary
def test_smollm2_from_the_cache_equals_the_dequantized_gguf():
    cached = cn.load_model("smollm2")  # written on the first load ever, mapped afterwards
    again = cn.load_model("smollm2")
    plain = cn.load_model("smollm2", weight_cache=False)
    assert cached.weight_cache is not None and cached.weight_cache.is_file()
    assert plain.weight_cache is None
    assert_same_params(cached, plain)
    assert_same_params(again, plain)
    assert cached.config == plain.config
    text = "The capital of Japan is<|im_end|> \u00e9t\u00e9"
    assert cached.tokenizer.encode(text) == plain.tokenizer.encode(text)
    assert cached.tokenizer.chat_template == plain.tokenizer.chat_template
    flat = flatten_params(cached.params)
    assert not any(a.flags.writeable for a in flat.values()), "mapped weights must be read-only"
    with pytest.raises(ValueError, match="read-only"):
        cached.params["blocks"][0]["attn"]["W_Q"][0, 0, 0] = 1.0
    # the file is a safetensors file: the package's own reader finds the same tensors
    independent = load_file(str(cached.weight_cache))
    stored = {k for k in flat if k != "unembed.W_U"}  # tied: W_U is the transpose of W_E
    assert set(independent) == stored
    for name in stored:
        assert np.array_equal(independent[name], flat[name]), name
    assert np.shares_memory(flat["unembed.W_U"], flat["embed.W_E"])
    assert weight_cache.verify_entry(cached.weight_cache)
    # the fast engine's fused matrices: mapped from the cache, equal to the ones built in memory
    mapped, built = fast.prepare(cached), fast.prepare(plain)
    for lm, lb in zip(mapped.layers, built.layers):
        assert np.array_equal(lm.W_qkv, lb.W_qkv) and np.array_equal(lm.W_up, lb.W_up)
        assert not lm.W_qkv.flags.writeable
    ids = [cached.encode("The capital of France is")]
    assert cached.generate_ids(ids, 4) == plain.generate_ids(ids, 4)


def test_a_hit_reads_nothing_but_the_cache(tiny_tied, monkeypatch):
    first = cn.load_model(tiny_tied, weight_cache=True)
    assert first.weight_cache.parent == Path(weight_cache.weights_dir())

    def refuse(*args):
        raise AssertionError("a cache hit read the model file")

    monkeypatch.setattr(loaders_module, "_load_file", refuse)
    second = cn.load_model(tiny_tied, weight_cache=True)
    assert second.weight_cache == first.weight_cache
    assert_same_params(first, second)
    assert second.n_params() == first.n_params()


def test_a_changed_model_file_gets_a_new_entry(tiny_tied):
    first = cn.load_model(tiny_tied, weight_cache=True)
    weights = tiny_tied / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data)  # same bytes, new modification time: a new identity
    second = cn.load_model(tiny_tied, weight_cache=True)
    assert second.weight_cache != first.weight_cache
    assert_same_params(first, second)


def test_a_cut_entry_is_reported_and_rebuilt(tiny_tied, capsys):
    entry = cn.load_model(tiny_tied, weight_cache=True).weight_cache
    size = entry.stat().st_size
    with open(entry, "r+b") as f:
        f.truncate(size - 100)
    model = cn.load_model(tiny_tied, weight_cache=True)
    assert "is unusable" in capsys.readouterr().err
    assert entry.stat().st_size == size
    assert_same_params(model, cn.load_model(tiny_tied, weight_cache=False))


def test_a_flipped_byte_fails_verification(tiny_tied):
    entry = cn.load_model(tiny_tied, weight_cache=True).weight_cache
    assert weight_cache.verify_entry(entry)
    with open(entry, "r+b") as f:
        f.seek(-5, 2)
        byte = f.read(1)
        f.seek(-5, 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert not weight_cache.verify_entry(entry)


def test_concurrent_writers_leave_one_complete_file(tmp_path):
    rng = np.random.default_rng(0)
    arrays = {f"w{i}": rng.standard_normal((64, 33), dtype=np.float32) for i in range(4)}
    path = tmp_path / "entry.safetensors"
    threads = [
        threading.Thread(target=weight_cache.write_file, args=(path, arrays, {"key": "k"}))
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [p.name for p in tmp_path.iterdir()] == ["entry.safetensors"], "temporary files left"
    read = load_file(str(path))
    assert all(np.array_equal(read[k], arrays[k]) for k in arrays)
    assert weight_cache.verify_entry(path)


def test_an_unwritable_cache_loads_without_it(tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder would be")
    monkeypatch.setenv("CEL_NUMPY_CACHE", str(blocker))
    model = cn.load_model(FIXTURES / "tiny_llama_tied", weight_cache=True)
    assert model.weight_cache is None
    assert "could not write the weight cache" in capsys.readouterr().err
    assert_same_params(model, cn.load_model(FIXTURES / "tiny_llama_tied", weight_cache=False))


def test_auto_workers_counts_shared_weights_once():
    GB = 10**9
    # 8 cores, 10 GB free: 1 GB of weights once, 2 GB per worker -> 4 workers
    assert auto_workers(8, 10 * GB, 1 * GB, 2 * GB).workers == 4
    assert auto_workers(2, 10 * GB, 1 * GB, 2 * GB).workers == 2  # the cores cap it
    assert auto_workers(8, 1 * GB, 1 * GB, 2 * GB).workers == 1  # never fewer than one
    assert auto_workers(3, None, 1 * GB, 2 * GB).workers == 3  # memory unknown: the cores


def test_hand_set_intact_budget_counts_per_worker_in_the_auto_plan():
    """--intact-memory 12 (GB) on 2 cores with 24 GB free and 0.1 GB of shared weights: each
    worker needs 1 GiB + 12 GB, so memory allows one worker, not the two the default allows."""
    GB, GiB = 10**9, 1 << 30
    assert memory_split(GB // 10, True) == (GB // 10, 2 * GiB)
    assert memory_split(GB // 10, True, 12 * GB) == (GB // 10, GiB + 12 * GB)
    assert memory_split(GB // 10, False, 12 * GB) == (0, GiB + 12 * GB + GB // 10)
    assert auto_workers(2, 24 * GB, *memory_split(GB // 10, True)).workers == 2
    assert auto_workers(2, 24 * GB, *memory_split(GB // 10, True, 12 * GB)).workers == 1
    assert auto_workers(2, 24 * GB, *memory_split(GB // 10, True, 4 * GB)).workers == 2


def test_workers_auto_plans_with_the_hand_set_intact_budget(monkeypatch, capsys):
    from cel_numpy import limits
    from cel_numpy.localize import cli, workers

    GB = 10**9
    monkeypatch.setattr(limits, "available_memory", lambda: 24 * GB)
    monkeypatch.setattr(workers, "available_cores", lambda: 2)
    pool = cli.make_worker_pool("auto", GB // 10, True)
    assert pool is not None and pool.n_workers == 2
    pool.shutdown()
    assert cli.make_worker_pool("auto", GB // 10, True, intact_gigabytes=12) is None
    assert "--workers auto: 1 worker" in capsys.readouterr().err.splitlines()[-1]


def test_hand_set_intact_budget_warns_when_the_workers_may_not_fit(monkeypatch, capsys):
    from cel_numpy import limits
    from cel_numpy.localize import cli

    GB = 10**9
    monkeypatch.setattr(limits, "available_memory", lambda: 20 * GB)

    class TwoWorkers:
        n_workers = 2

    assert cli.intact_cache_plan(TwoWorkers(), GB // 10, True, gigabytes=12) == 12 * GB
    err = capsys.readouterr().err
    assert "warning: 2 workers with this --intact-memory may need 26.2 GB" in err
    assert "more than the 20.0 GB available" in err
    assert cli.intact_cache_plan(TwoWorkers(), GB // 10, True, gigabytes=4) == 4 * GB
    assert "warning" not in capsys.readouterr().err


def test_intact_cache_budget_is_half_the_memory_left_per_worker():
    GiB = 1 << 30
    # 24 GiB free, 0.5 GiB of weights once, 2 workers of 2 GiB: 9.75 GiB spare each, half kept
    assert intact_cache_budget(24 * GiB, GiB // 2, 2, 2 * GiB) == GiB + int(9.75 * GiB) // 2
    # weights counted per worker (not shared): 1 GiB less spare each
    assert intact_cache_budget(24 * GiB, 0, 2, 3 * GiB) == GiB + int(9 * GiB) // 2
    assert intact_cache_budget(3 * GiB, GiB, 2, 2 * GiB) == GiB  # nothing spare: the default
    assert intact_cache_budget(None, 0, 1) == GiB  # memory unknown: the default
    assert intact_cache_budget(1 << 40, 0, 1) == 16 * GiB  # capped


def test_activation_bytes_counts_each_priced_array_once():
    """The per-worker price of activations (`workers.activation_bytes`) against its terms
    written out for Gemma 3 270M's shapes (config.json of google/gemma-3-270m): the batch's
    intact pass, one wave's layer, two attention blocks, three unembedding slabs, the
    interpreter; a vocabulary 1,000 tokens larger costs exactly 3 x 512 x 1,000 floats more;
    a generation task adds the wave's K/V at every layer and the decode cache's budget."""
    from dataclasses import replace

    from cel_numpy.localize.workers import INTERPRETER_BYTES, activation_bytes, memory_split
    from cel_numpy.models.config import ModelConfig

    gemma = ModelConfig(
        family="llama", n_layers=18, n_heads=4, n_kv_heads=1, d_model=640, d_head=256,
        d_mlp=2048, vocab_size=262_144, n_ctx=32_768, norm_eps=1e-6,
    )  # fmt: skip
    intact = 4096 * 18 * (640 + 4 * 256 + 2 * 256) * 4
    wave = 8192 * (3 * 640 + 4 * 256 + 2 * 256 + 3 * 2048) * 4
    unembed = 3 * 512 * 262_144 * 4
    want = intact + wave + unembed + 2 * (256 << 20) + INTERPRETER_BYTES
    assert activation_bytes(gemma) == want
    bigger = replace(gemma, vocab_size=263_144)
    assert activation_bytes(bigger) - activation_bytes(gemma) == 3 * 512 * 1000 * 4
    assert activation_bytes(gemma, batch_tokens=2048) == want - intact // 2
    wave_kv = 8192 * 18 * 2 * 256 * 4
    assert activation_bytes(gemma, generation=True) == want + wave_kv + (512 << 20)
    GB = 10**9
    assert memory_split(GB, True, 2 * GB, want) == (GB, want + 2 * GB)
    assert memory_split(GB, False, 2 * GB, want) == (0, want + 2 * GB + GB)
