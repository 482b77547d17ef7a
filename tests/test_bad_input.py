"""Bad input: damaged model files, odd text, impossible options -- one clear line each,
never a crash.

* CASES: every bad input of docs/bad_input.md, run through the real command line (`main`) in
  process: exactly one line on stderr, "cel-numpy CMD: error: ...", exit status 2, and the
  message the table quotes. `python tests/test_bad_input.py` prints the table rows; a test
  checks that the table in docs/bad_input.md quotes what the commands print now.
* Fuzz: seeded random truncations and bit flips of the committed tiny fixtures (two HF folders,
  the .npz export) and of a GGUF file written here. Every outcome is a successful load or a
  ModelFileError whose one-line message names the file; a flip inside tensor data must load.
* Tokenizer properties (hypothesis): decode(encode(s)) == s for arbitrary Unicode, GPT-2 and
  SmolLM2 vocabularies; text that is not valid Unicode is a PromptError.
* Options and prompts that depend on the model are checked before its weights are read.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from helpers import (
    SMOLLM2_MISSING_BYTES,
    chat_argv,
    copy_fixture,
    gguf_of_arch,
    rewrite_safetensors,
    run_cli,
    smollm2_mix,
    theory_params,
    tiny_chat_model,
    with_tokenizer,
    write_tiny_gguf,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cel_numpy as cn
from cel_numpy.cli import main
from cel_numpy.errors import ModelFileError, OptionError, PromptError, UserError
from cel_numpy.models.model import InvalidHeadError

FIXTURES = Path(__file__).parent / "fixtures"
DOC = Path(__file__).parent.parent / "docs/bad_input.md"


# =========================================================================== helpers


def with_tokenizer_json(folder: Path, split_regex: str) -> Path:
    """The 96-token byte-level vocabulary as a tokenizer.json whose pre_tokenizer splits on
    `split_regex` before ByteLevel."""
    from cel_numpy.models.tokenizer import bytes_to_unicode

    b2u = bytes_to_unicode()
    spec = {
        "version": "1.0",
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": split_regex},
                    "behavior": "Isolated",
                    "invert": False,
                },
                {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False},
            ],
        },  # fmt: skip
        "post_processor": None,
        "decoder": {"type": "ByteLevel"},
        "model": {
            "type": "BPE",
            "vocab": {b2u[b]: b - 32 for b in range(32, 128)},
            "merges": [],
        },
    }
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    return folder


def edit_config(folder: Path, **changes) -> Path:
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, **changes}))
    return folder


# =========================================================================== the table's cases


@dataclass(frozen=True)
class Case:
    id: str
    what: str  # the bad input, for the table
    setup: Callable[[Path], list[str]]  # tmp dir -> argv
    expect: str  # regex the one-line message must match
    status: int = 2
    os_dependent: bool = (
        False  # the OS's own wording (root vs user): not quoted verbatim in the table
    )


def _gguf(tmp: Path, edit: Callable[[bytearray, Path], None] | None = None) -> Path:
    path = tmp / "tiny.gguf"
    write_tiny_gguf(path, smollm2_mix)
    if edit is not None:
        data = bytearray(path.read_bytes())
        edit(data, path)
        path.write_bytes(bytes(data))
    return path


def _gguf_array_length(data: bytearray, path: Path) -> None:
    """Set a high bit of the token-type array's length: 2^52 items claimed."""
    import gguf

    field = gguf.GGUFReader(path).fields["tokenizer.ggml.token_type"]
    data[field.offset + sum(int(p.nbytes) for p in field.parts[:4]) + 6] ^= 0x10


def _npz(tmp: Path, drop: str | None = None, replace: dict | None = None) -> Path:
    with np.load(FIXTURES / "tiny_gpt2.npz") as z:
        arrays = {k: z[k] for k in z.files if k != drop}
    arrays.update(replace or {})
    path = tmp / "model.npz"
    np.savez(path, **arrays)
    return path


def _unwritable(tmp: Path) -> Path:
    """A directory this process cannot create entries in (sysfs when running as root)."""
    if os.geteuid() == 0:
        return Path("/sys/cel-numpy-test")
    ro = tmp / "readonly"
    ro.mkdir()
    ro.chmod(0o555)
    return ro / "run"


def _localize(model: str, out: Path | str, *extra: str) -> list[str]:
    return [
        "localize",
        "--model",
        model,
        "--out",
        str(out),
        "--discovery",
        "4",
        "--heldout",
        "4",
        "--quiet",
        *extra,
    ]


def _test_heads(out: Path | str, *extra: str) -> list[str]:
    """test-heads of L1H1 on SmolLM2's agreement task (refused before the model is read)."""
    return ["test-heads", "--model", "smollm2", "--task", "agreement", "--heads", "L1H1",
            "--out", str(out), *extra]  # fmt: skip


def _explain(out: Path | str, *extra: str) -> list[str]:
    """explain L1H1 of SmolLM2 on ioi (refused before the model is read)."""
    return ["explain", "--model", "smollm2", "--task", "ioi", "--heads", "L1H1",
            "--out", str(out), *extra]  # fmt: skip


def _manifest_mismatch(tmp: Path) -> list[str]:
    params = theory_params(tmp)
    argv = _localize(f"theory:{params}", tmp / "run", "--task", "A", "--stage", "baseline")
    assert run_cli(argv)[0] == 0
    return argv[:-2] + ["--seed", "1", "--stage", "baseline"]


def _lock_held(tmp: Path) -> list[str]:
    (tmp / "run").mkdir()
    (tmp / "run" / "lock").write_text(
        f"1 {socket.gethostname()} 2026-01-01T00:00:00\n"
    )  # pid 1 always runs
    return _localize(f"theory:{theory_params(tmp)}", tmp / "run", "--task", "A")


def _lock_damaged(tmp: Path) -> list[str]:
    (tmp / "run").mkdir()
    (tmp / "run" / "lock").write_text("-3 \x00\x00\n")
    return _localize(f"theory:{theory_params(tmp)}", tmp / "run", "--task", "A")


def _finished_baseline(tmp: Path) -> list[str]:
    argv = _localize(f"theory:{theory_params(tmp)}", tmp / "run", "--task", "A")
    assert run_cli(argv + ["--stage", "baseline"])[0] == 0
    return argv + ["--stage", "screen"]


def _manifest_wrong_shape(tmp: Path) -> list[str]:
    argv = _finished_baseline(tmp)
    (tmp / "run" / "manifest.json").write_text("[1, 2, 3]\n")
    return argv


def _done_wrong_shape(tmp: Path) -> list[str]:
    argv = _finished_baseline(tmp)
    (tmp / "run" / "baseline.done.json").write_text('"done"\n')
    return argv


def _set_weight(folder: Path, name: str, index: int, value: float) -> Path:
    def edit(w):
        w[name] = w[name].copy()
        w[name].flat[index] = value

    return rewrite_safetensors(folder, edit)


def _overlapping(folder: Path) -> Path:
    """model.safetensors whose ln_f.bias points at the bytes of ln_f.weight."""
    data = (folder / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    header["transformer.ln_f.bias"]["data_offsets"] = header["transformer.ln_f.weight"][
        "data_offsets"
    ]
    text = json.dumps(header).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + data[8 + n :])
    return folder


def _nested_config(folder: Path) -> Path:
    (folder / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    return folder


CASES = [
    # ------------------------------------------------------------------ model files
    Case(
        "folder-without-config",
        "a folder without config.json",
        lambda t: ["inspect", "--model", str((t / "empty").mkdir() or t / "empty")],
        r"empty: no config\.json \(not a Hugging Face model folder\)",
    ),
    Case(
        "unknown-architecture",
        "config.json with model_type mistral",
        lambda t: [
            "inspect",
            "--model",
            str(edit_config(copy_fixture(t, "tiny_llama"), model_type="mistral")),
        ],
        r"config\.json: unsupported architecture 'mistral' in config\.json; "
        r"supported model_type: gpt2, llama",
    ),
    Case(
        "gemma3-softcapping",
        "a Gemma 3 config.json with final_logit_softcapping",
        lambda t: [
            "inspect",
            "--model",
            str(edit_config(copy_fixture(t, "tiny_gemma3"), final_logit_softcapping=30.0)),
        ],
        r"config\.json: gemma3 final_logit_softcapping=30\.0 is not supported \(Gemma 3 has none\)",
    ),
    Case(
        "config-bad-value",
        "config.json with n_head 0",
        lambda t: ["inspect", "--model", str(edit_config(copy_fixture(t, "tiny_gpt2"), n_head=0))],
        r"config\.json: n_head must be a positive integer, got 0",
    ),
    Case(
        "config-truncated",
        "config.json cut in half",
        lambda t: [
            "inspect",
            "--model",
            str(_truncate(copy_fixture(t, "tiny_gpt2"), "config.json", 0.5)),
        ],
        r"config\.json: invalid JSON .*download it again",
    ),
    Case(
        "no-weights",
        "a folder with config.json but no weights",
        lambda t: [
            "inspect",
            "--model",
            str(_drop(copy_fixture(t, "tiny_gpt2"), "model.safetensors")),
        ],
        r"no model\.safetensors or model\.safetensors\.index\.json",
    ),
    Case(
        "safetensors-truncated",
        "model.safetensors cut in half (an interrupted download)",
        lambda t: [
            "inspect",
            "--model",
            str(_truncate(copy_fixture(t, "tiny_gpt2"), "model.safetensors", 0.5)),
        ],
        r"model\.safetensors: tensor \S+ ends at byte \d+, past the end of the file \(\d+ bytes\); "
        r".*download it again",
    ),
    Case(
        "safetensors-header-past-end",
        "model.safetensors whose header length points past the end",
        lambda t: [
            "inspect",
            "--model",
            str(
                _patch(
                    copy_fixture(t, "tiny_gpt2"), "model.safetensors", 0, struct.pack("<Q", 10**9)
                )
            ),
        ],
        r"model\.safetensors: the header length field points past the end of the file \(\d+ "
        r"bytes\): not a safetensors file",
    ),
    Case(
        "safetensors-garbage-header",
        "model.safetensors with a damaged header (not JSON)",
        lambda t: [
            "inspect",
            "--model",
            str(_patch(copy_fixture(t, "tiny_gpt2"), "model.safetensors", 8, b"\xff" * 16)),
        ],
        r"model\.safetensors: the safetensors header is not valid JSON; "
        r"the file is damaged or truncated",
    ),
    Case(
        "wrong-file",
        "an HTML error page saved as model.safetensors",
        lambda t: [
            "inspect",
            "--model",
            str(
                _replace(
                    copy_fixture(t, "tiny_gpt2"),
                    "model.safetensors",
                    b"<!DOCTYPE html><html><body>404 Not Found</body></html>\n",
                )
            ),
        ],
        r"model\.safetensors: the header length field points past the end of the file \(\d+ "
        r"bytes\): not a safetensors file",
    ),
    Case(
        "wrong-dtype",
        "a weight stored as int32",
        lambda t: [
            "inspect",
            "--model",
            str(
                rewrite_safetensors(
                    copy_fixture(t, "tiny_gpt2"),
                    lambda w: w.update(
                        {"transformer.ln_f.weight": w["transformer.ln_f.weight"].astype(np.int32)}
                    ),
                )
            ),
        ],
        r"tensor transformer\.ln_f\.weight is stored as I32, not as floating point",
    ),
    Case(
        "wrong-shape",
        "weights that do not match config.json (n_positions 64 -> 128)",
        lambda t: [
            "inspect",
            "--model",
            str(edit_config(copy_fixture(t, "tiny_gpt2"), n_positions=128)),
        ],
        r"tensor transformer\.wpe\.weight has shape \(64, 32\), the config needs \(128, 32\): "
        r"the config and the weights do not belong together",
    ),
    Case(
        "missing-tensor",
        "a checkpoint without one tensor",
        lambda t: [
            "inspect",
            "--model",
            str(
                rewrite_safetensors(
                    copy_fixture(t, "tiny_llama"),
                    lambda w: w.pop("model.layers.1.mlp.up_proj.weight"),
                )
            ),
        ],
        r"checkpoint has no tensor 'model\.layers\.1\.mlp\.up_proj\.weight' "
        r"\(needed for blocks\.1\.mlp\.W_in\)",
    ),
    Case(
        "too-many-layers",
        "config.json claiming 100000 layers",
        lambda t: [
            "inspect",
            "--model",
            str(edit_config(copy_fixture(t, "tiny_llama"), num_hidden_layers=100000)),
        ],
        r"the config says 100000 layers but the checkpoint holds only \d+ tensors",
    ),
    Case(
        "weight-nan",
        "a NaN in a weight",
        lambda t: [
            "inspect",
            "--model",
            str(_set_weight(copy_fixture(t, "tiny_gpt2"), "transformer.ln_f.weight", 3, np.nan)),
        ],
        r"tensor ln_f\.weight holds 1 non-finite values \(NaN or Inf\) of 32; the "
        r"file is damaged: download it again",
    ),
    Case(
        "weight-too-large",
        "a weight finite in the file (float64) but past float32's range",
        lambda t: [
            "inspect",
            "--model",
            str(_npz(t, replace={"ln_f.w": np.full(32, 1e300)})),
        ],
        r"tensor ln_f\.w holds 32 non-finite values \(NaN or Inf\) of 32; finite in the file but "
        r"too large for float32: load it as float64",
    ),
    Case(
        "logits-non-finite",
        "finite weights whose logits overflow float32 (ln_f scaled by 1e38)",
        lambda t: [
            "generate",
            "--model",
            str(
                rewrite_safetensors(
                    with_tokenizer(copy_fixture(t, "tiny_gpt2")),
                    lambda w: w.update(
                        {"transformer.ln_f.weight": w["transformer.ln_f.weight"] * 1e38}
                    ),
                )
            ),
            "hello",
        ],
        r"the model produced non-finite logits \(NaN or Inf\), which are never scored",
    ),
    Case(
        "safetensors-overlap",
        "two tensors of model.safetensors sharing bytes",
        lambda t: ["inspect", "--model", str(_overlapping(copy_fixture(t, "tiny_gpt2")))],
        r"model\.safetensors: tensors transformer\.ln_f\.\w+ and transformer\.ln_f\.\w+ share "
        r"bytes \d+ to \d+",
    ),
    Case(
        "npz-object-array",
        "a .npz with an extra array of Python objects",
        lambda t: [
            "inspect",
            "--model",
            str(_npz(t, replace={"extra": np.array([{"a": 1}], dtype=object)})),
        ],
        r"model\.npz: array 'extra' holds Python objects \(dtype object\)",
    ),
    Case(
        "config-huge-number",
        "config.json with rms_norm_eps 10^400",
        lambda t: [
            "inspect",
            "--model",
            str(edit_config(copy_fixture(t, "tiny_llama"), rms_norm_eps=10**400)),
        ],
        r"tiny_llama/config\.json: rms_norm_eps must be a positive number, got 100000000000\.\.\. "
        r"\(401 digits\)",
    ),
    Case(
        "config-nested",
        "config.json nested 100000 levels deep",
        lambda t: ["inspect", "--model", str(_nested_config(copy_fixture(t, "tiny_gpt2")))],
        r"tiny_gpt2/config\.json: JSON nested too deeply to be a model config",
    ),
    Case(
        "merges-malformed",
        "a merges.txt line with three tokens",
        lambda t: [
            "inspect",
            "--model",
            str(_replace(with_tokenizer(copy_fixture(t, "tiny_gpt2")), "merges.txt", b"a b c\n")),
        ],
        r"tiny_gpt2/merges\.txt:1: malformed merge 'a b c' \(expected 'a b'\)",
    ),
    Case(
        "tokenizer-regex-invalid",
        "a tokenizer.json pre_tokenizer regex that does not compile",
        lambda t: [
            "inspect",
            "--model",
            str(with_tokenizer_json(copy_fixture(t, "tiny_gpt2"), "(a")),
        ],
        r"tiny_gpt2/tokenizer\.json: invalid pre_tokenizer regex '\(a' \(",
    ),
    Case(
        "tokenizer-regex-backtracking",
        "a pre_tokenizer regex that backtracks catastrophically (a or aa, repeated, then c; "
        "on 40 a's)",
        lambda t: [
            "generate",
            "--model",
            str(with_tokenizer_json(copy_fixture(t, "tiny_gpt2"), "(a|aa)+c")),
            "a" * 40,
        ],
        r"tiny_gpt2/tokenizer\.json: the pre_tokenizer regex '\(a\|aa\)\+c' did not finish on a "
        r"piece of 40 characters \(catastrophic backtracking\)",
    ),
    Case(
        "tokenizer-nested",
        "a tokenizer.json nested 100000 levels deep",
        lambda t: [
            "inspect",
            "--model",
            str(
                _replace(
                    copy_fixture(t, "tiny_gpt2"), "tokenizer.json", b"[" * 100_000 + b"]" * 100_000
                )
            ),
        ],
        r"tiny_gpt2/tokenizer\.json: JSON nested too deeply to be a tokenizer file",
    ),
    Case(
        "tokenizer-damaged",
        "a truncated vocab.json next to the weights",
        lambda t: [
            "inspect",
            "--model",
            str(_truncate(with_tokenizer(copy_fixture(t, "tiny_gpt2")), "vocab.json", 0.5)),
        ],
        r"vocab\.json: invalid JSON \(",
    ),
    Case(
        "gguf-truncated-header",
        "a GGUF file cut inside its header",
        lambda t: [
            "inspect",
            "--model",
            str(_gguf(t, lambda d, p: d.__delitem__(slice(300, None)))),
        ],
        r"tiny\.gguf: unreadable GGUF file \(IndexError: the header runs past the end of the "
        r"file\); the file may be truncated or damaged: delete it and download it "
        r"again \(cel-numpy fetch NAME, for a known model\)",
    ),
    Case(
        "gguf-truncated-data",
        "a GGUF file cut inside its tensor data",
        lambda t: [
            "inspect",
            "--model",
            str(_gguf(t, lambda d, p: d.__delitem__(slice(len(d) - 100, None)))),
        ],
        r"tiny\.gguf: unreadable GGUF file \(ValueError: tensor \S+ ends at byte \d+, past the "
        r"end of the file \(\d+ bytes\)\); the file may be truncated",
    ),
    Case(
        "gguf-array-length",
        "a GGUF metadata array whose length runs past the end (one bit flipped)",
        lambda t: ["inspect", "--model", str(_gguf(t, _gguf_array_length))],
        r"tiny\.gguf: unreadable GGUF file \(ValueError: metadata array at byte \d+ claims \d+ "
        r"items, more than the file holds\)",
    ),
    Case(
        "gguf-not-gguf",
        "a text file named model.gguf",
        lambda t: [
            "inspect",
            "--model",
            str(_write(t, "model.gguf", b"this is not a model\n" * 10)),
        ],
        r"model\.gguf: unreadable GGUF file \(ValueError: GGUF magic invalid\)",
    ),
    Case(
        "gguf-architecture",
        "a GGUF file of an unsupported architecture (falcon)",
        lambda t: ["inspect", "--model", str(gguf_of_arch(t, "falcon"))],
        r"falcon\.gguf: GGUF architecture 'falcon' is not supported; "
        r"supported: llama, qwen2, gemma3 \(use a GGUF",
    ),
    Case(
        "npz-not-zip",
        "a .npz file that is not a zip archive",
        lambda t: ["inspect", "--model", str(_write(t, "model.npz", b"\x00" * 100))],
        r"model\.npz: not an \.npz file \(no zip signature\); not a cel-numpy \.npz export, "
        r"or damaged",
    ),
    Case(
        "npz-truncated",
        "a .npz export cut in half",
        lambda t: ["inspect", "--model", str(_truncate_file(_npz(t), 0.5))],
        r"model\.npz: unreadable \.npz file \(BadZipFile: File is not a zip file\)",
    ),
    Case(
        "npz-no-config",
        "a .npz without config_json",
        lambda t: ["inspect", "--model", str(_npz(t, drop="config_json"))],
        r"model\.npz: no config_json entry; not a cel-numpy \.npz export",
    ),
    Case(
        "npz-missing-array",
        "a .npz without one weight",
        lambda t: ["inspect", "--model", str(_npz(t, drop="blocks.1.mlp.W_out"))],
        r"model\.npz: checkpoint has no tensor 'blocks\.1\.mlp\.W_out'",
    ),
    Case(
        "npz-wrong-dtype",
        "a .npz weight stored as int64",
        lambda t: [
            "inspect",
            "--model",
            str(_npz(t, replace={"ln_f.w": np.ones(32, dtype=np.int64)})),
        ],
        r"model\.npz: tensor ln_f\.w is stored as int64, not as floating point",
    ),
    Case(
        "unknown-suffix",
        "a weights file of an unknown kind (weights.bin)",
        lambda t: ["inspect", "--model", str(_write(t, "weights.bin", b"\x00"))],
        r"weights\.bin: don't know how to load this file: expected a Hugging Face folder, "
        r"a \.gguf or a \.npz file",
    ),
    Case(
        "unknown-model",
        "a model name that is neither known nor a path",
        lambda t: ["inspect", "--model", "llama-7b"],
        r"model 'llama-7b' not found: give a known name \(smollm2, qwen2\.5-coder-0\.5b, "
        r"gemma-3-270m\), "
        r"a Hugging Face folder, a \.gguf or a \.npz file",
    ),
    Case(
        "fetch-unknown",
        "fetching an unknown name",
        lambda t: ["fetch", "llama-7b"],
        r"unknown name 'llama-7b'; known names: boolq, gemma-3-270m, gpt2-tokenizer, hellaswag, "
        r"mbpp, "
        r"qwen2.5-coder-0.5b, smollm2",
    ),
    # ------------------------------------------------------------------ prompts
    Case(
        "empty-prompt",
        "an empty prompt",
        lambda t: ["generate", "--model", str(with_tokenizer(copy_fixture(t, "tiny_gpt2"))), ""],
        r"the prompt is empty: give some text",
    ),
    Case(
        "prompt-too-long",
        "a prompt longer than the context window (64 tokens)",
        lambda t: [
            "generate",
            "--model",
            str(with_tokenizer(copy_fixture(t, "tiny_gpt2"))),
            "x" * 60,
        ],
        r"the prompt is 60 characters, at least 60 tokens: more than the 48 tokens that the "
        r"context of 64 leaves with --max-new-tokens 16: shorten it",
    ),
    Case(
        "max-new-tokens-past-context",
        "--max-new-tokens as long as the context window (64 tokens): no prompt could fit",
        lambda t: [
            "generate",
            "--model",
            str(with_tokenizer(copy_fixture(t, "tiny_gpt2"))),
            "Hello",
            "--max-new-tokens",
            "64",
        ],
        r"--max-new-tokens 64 leaves no room for a prompt in the model's context of 64 tokens: "
        r"give at most 63",
    ),
    Case(
        "prompt-not-unicode",
        "a prompt with invalid UTF-8 bytes (Python passes them on as lone surrogates)",
        lambda t: [
            "generate",
            "--model",
            str(with_tokenizer(copy_fixture(t, "tiny_gpt2"))),
            "caf\udcc3",
        ],
        r"text is not valid Unicode: lone surrogate U\+DCC3 at character 3",
    ),
    Case(
        "prompt-no-tokenizer",
        "text for a model without tokenizer files",
        lambda t: ["generate", "--model", str(copy_fixture(t, "tiny_gpt2")), "hello"],
        r"was loaded without tokenizer files \(tokenizer\.json or vocab\.json \+ merges\.txt\): "
        r"pass token ids",
    ),
    Case(
        "task-prompt-too-long",
        "localizing a task whose prompts exceed the model's context",
        lambda t: _localize(
            str(with_tokenizer(copy_fixture(t, "tiny_gpt2"))),
            t / "run",
            "--task",
            "capitals",
            "--cross-tasks",
            "none",
        ),
        r"a prompt of task 'capitals' \((discovery|heldout) panel\) is \d+ characters, at least "
        r"\d+ tokens: more than the 64 tokens of the model's context: use a model with a longer "
        r"context or another task \(a task file: shorten the item\)",
    ),
    # ------------------------------------------------------------------ options
    Case(
        "head-malformed",
        "--ablate 1-2",
        lambda t: [
            "generate",
            "--model",
            str(with_tokenizer(copy_fixture(t, "tiny_gpt2"))),
            "hi",
            "--ablate",
            "1-2",
        ],
        r"--ablate: '1-2' is not a head name: write heads as L3H1 \(layer 3, head 1, counted "
        r"from 0\), several as L3H1\+L5H0",
    ),
    Case(
        "head-dotted",
        "--ablate 3.1 (the dotted spelling of earlier versions)",
        lambda t: ["generate", "--model", "smollm2", "hi", "--ablate", "3.1"],
        r"--ablate: '3\.1' is not a head name: write L3H1 for layer 3, head 1",
    ),
    Case(
        "head-out-of-range",
        "--ablate L7H0 on a 2-layer model (checked before the weights are read)",
        lambda t: [
            "generate",
            "--model",
            str(_truncate(with_tokenizer(copy_fixture(t, "tiny_gpt2")), "model.safetensors", 0.5)),
            "hi",
            "--ablate",
            "L7H0",
        ],
        r"--ablate: head L7H0 is not in the model: it has 2 layers x 4 heads, L0H0 to L1H3 "
        r"\(counted from 0\)",
    ),
    Case(
        "head-twice",
        "--ablate L1H2,l1h2 (the same head twice)",
        lambda t: ["generate", "--model", "smollm2", "hi", "--ablate", "L1H2,l1h2"],
        r"--ablate: L1H2 is given twice",
    ),
    Case(
        "unknown-task",
        "localize --task capital (a typo)",
        lambda t: _localize("smollm2", t / "run", "--task", "capital"),
        r"unknown task 'capital'; known tasks: agreement, antonyms, arithmetic, arithmetic_2shot, "
        r"arithmetic_chat, capitals, greater_than, induction, ioi, hellaswag, boolq, mbpp, or a "
        r"\.jsonl task file \(docs/tasks\.md\)",
    ),
    Case(
        "unknown-cross-task",
        "localize --cross-tasks ioi,nope",
        lambda t: _localize(
            "smollm2", t / "run", "--task", "capitals", "--cross-tasks", "ioi,nope"
        ),
        r"unknown task 'nope'; known tasks: ",
    ),
    Case(
        "unknown-localize-model",
        "localize --model gpt-2 (not a known name or a path)",
        lambda t: _localize("gpt-2", t / "run", "--task", "ioi"),
        r"--model 'gpt-2' not found: give a known name \(smollm2, qwen2\.5-coder-0\.5b, "
        r"gemma-3-270m, "
        r"theory, "
        r"theory:PATH/params\.npz\), a Hugging Face folder, a \.gguf or a \.npz file",
    ),
    Case(
        "theory-task",
        "localize --model theory --task arithmetic (checked before training)",
        lambda t: _localize("theory", t / "run", "--task", "arithmetic"),
        r"--model theory has tasks A and B \(theory-A, theory-B\), not 'arithmetic'",
    ),
    Case(
        "panel-too-large",
        "localize --task greater_than --discovery 5000 --heldout 5000",
        lambda t: [
            "localize",
            "--model",
            "smollm2",
            "--task",
            "greater_than",
            "--out",
            str(t / "run"),
            "--discovery",
            "5000",
            "--heldout",
            "5000",
        ],
        r"task 'greater_than' can produce at most 7760 distinct items; "
        r"--discovery 5000 \+ --heldout 5000 = 10000: ask for fewer",
    ),
    Case(
        "fold-alone",
        "localize --fold 1 without --folds",
        lambda t: _localize("smollm2", t / "run", "--task", "capitals", "--fold", "1"),
        r"--fold k and --folds K go together \(e\.g\. --fold 0 --folds 3\)",
    ),
    Case(
        "fold-out-of-range",
        "localize --fold 3 --folds 3",
        lambda t: _localize(
            "smollm2", t / "run", "--task", "capitals", "--fold", "3", "--folds", "3"
        ),  # fmt: skip
        r"--fold 3 --folds 3: want --folds K >= 2 and 0 <= --fold < K",
    ),
    Case(
        "fold-theory",
        "localize --model theory --fold 0 --folds 3",
        lambda t: _localize("theory", t / "run", "--task", "A", "--fold", "0", "--folds", "3"),
        r"--fold: the theory tasks draw fresh samples \(no finite cluster space to split into "
        r"folds\); run theory without --fold",
    ),
    Case(
        "fold-too-small",
        "localize --task agreement --fold 0 --folds 50 (50 clusters)",
        lambda t: _localize(
            "smollm2", t / "run", "--task", "agreement", "--fold", "0", "--folds", "50"
        ),  # fmt: skip
        r"task 'agreement' has 50 clusters: 50 folds leave fold 0 1, and a discovery and a "
        r"held-out panel need one each: use fewer --folds",
    ),
    Case(
        "resample-one-cluster",
        "test-heads --ablation resample on a held-out panel of one cluster",
        lambda t: [
            "test-heads",
            "--model",
            "smollm2",
            "--task",
            "agreement",
            "--heads",
            "L1H1",
            "--heldout",
            "2",
            "--ablation",
            "resample",
            "--out",
            str(t / "run"),
        ],
        r"resample ablation takes each item's donor from another cluster: the panel has 2 items "
        r"and its largest cluster 2; it needs at least twice as many items as its largest "
        r"cluster holds \(use a larger panel or another ablation\)",
    ),
    Case(
        "batch-size-zero",
        "localize --batch-size 0",
        lambda t: _localize("smollm2", t / "run", "--task", "ioi", "--batch-size", "0"),
        r"--batch-size must be >= 1, got 0",
    ),
    Case(
        "intact-memory-zero",
        "localize --intact-memory 0",
        lambda t: _localize("smollm2", t / "run", "--task", "ioi", "--intact-memory", "0"),
        r"argument --intact-memory: expected gigabytes above 0 and at most 1e6, such as 4, got '0'",
    ),
    Case(
        "matched-gate-zero",
        "localize --matched-gate 0",
        lambda t: _localize(
            "smollm2", t / "run", "--task", "ioi", "--matched-null", "20", "--matched-gate", "0"
        ),  # fmt: skip
        r"argument --matched-gate: expected a p-value threshold in \(0, 1\], such as 0.05, "
        r"got '0'",
    ),
    Case(
        "matched-gate-alone",
        "localize --matched-gate without --matched-null",
        lambda t: _localize("smollm2", t / "run", "--task", "ioi", "--matched-gate", "0.05"),
        r"--matched-gate gates the matched null: it needs --matched-null R",
    ),
    Case(
        "null-seed-alone",
        "localize --null-seed without --null-sets (no null would run)",
        lambda t: _localize("smollm2", t / "run", "--task", "ioi", "--null-seed", "3"),
        r"--null-seed has no effect without --null-sets N: add it, or drop --null-seed",
    ),
    Case(
        "candidates-without-gradient",
        "localize --candidates 50 with the exact screen",
        lambda t: _localize("smollm2", t / "run", "--task", "ioi", "--candidates", "50"),
        r"--candidates has no effect without --screen gradient: add it, or drop --candidates",
    ),
    Case(
        "resample-seed-alone",
        "test-heads --resample-seed without --ablation resample",
        lambda t: _test_heads(t / "run", "--resample-seed", "1"),
        r"--resample-seed has no effect without --ablation resample: add it, or drop "
        r"--resample-seed",
    ),
    Case(
        "resample-seed-negative",
        "test-heads --ablation resample --resample-seed -1",
        lambda t: _test_heads(t / "run", "--ablation", "resample", "--resample-seed", "-1"),
        r"--resample-seed must be >= 0, got -1",
    ),
    Case(
        "matched-null-huge",
        "localize --matched-null 1000000",
        lambda t: _localize("smollm2", t / "run", "--task", "ioi", "--matched-null", "1000000"),
        r"--matched-null 1000000: each replicate is one more best-of-pool pick, tested on "
        r"held-out; at most 10,000 are run",
    ),
    Case(
        "stage-unknown",
        "localize --stage joint-search",
        lambda t: _localize("smollm2", t / "run", "--task", "ioi", "--stage", "joint-search"),
        r"--stage must be one of baseline, screen, joint, confirm, heldout, nulls, matched-pool, "
        r"matched-null, crosstask, report, got 'joint-search'",
    ),
    Case(
        "not-a-number",
        "localize --discovery many",
        lambda t: _localize("smollm2", t / "run", "--task", "ioi", "--discovery", "many"),
        r"^cel-numpy localize: error: argument --discovery: invalid int value: 'many' "
        r"\(see cel-numpy localize --help\)$",
    ),
    Case(
        "out-is-a-file",
        "localize --out pointing at an existing file",
        lambda t: _localize("smollm2", _write(t, "notes.txt", b"x"), "--task", "ioi"),
        r"--out \S+notes\.txt is an existing file, not a directory",
    ),
    Case(
        "out-empty",
        "localize --out '' (an empty path would mean the current folder)",
        lambda t: _localize("smollm2", "", "--task", "ioi"),
        r"argument --out: is empty: give a folder, e\.g\. --out results/my-run",
    ),
    Case(
        "theory-out-empty",
        "theory --out ''",
        lambda t: ["theory", "--out", "", "--quiet"],
        r"--out is empty: give a folder, e\.g\. --out results/my-run",
    ),
    Case(
        "out-under-a-file",
        "localize --out under an existing file",
        lambda t: _localize("smollm2", _write(t, "notes.txt", b"x") / "run", "--task", "ioi"),
        r"cannot write to --out \S+notes\.txt/run: Not a directory",
    ),
    Case(
        "out-unwritable",
        "localize --out in a directory the user cannot write to",
        lambda t: _localize("smollm2", _unwritable(t), "--task", "ioi"),
        r"cannot write to --out \S+: (Permission denied|Operation not permitted)",
        os_dependent=True,
    ),
    Case(
        "theory-option",
        "theory --p-a 1.5",
        lambda t: ["theory", "--p-a", "1.5", "--out", str(t / "theory")],
        r"--p-a must lie in \[0, 1\], got 1\.5",
    ),
    Case(
        "theory-heads-huge",
        "theory --heads 1000000",
        lambda t: ["theory", "--heads", "1000000", "--out", str(t / "theory")],
        r"--heads must lie in \[1, 64\] \(the analysis ablates every set of up to 3 heads\), "
        r"got 1000000",
    ),
    Case(
        "theory-batch-huge",
        "theory --batch 1000000000 (the numbers are this machine's memory)",
        lambda t: ["theory", "--batch", "1000000000", "--out", str(t / "theory")],
        r"--batch 1000000000 needs about \S+ GiB with --heads 4, more than half of this "
        r"machine's \S+ GiB: use a smaller --batch",
        os_dependent=True,
    ),
    Case(
        "theory-lr-inf",
        "theory --lr inf",
        lambda t: ["theory", "--lr", "inf", "--out", str(t / "theory")],
        r"--lr must be a finite number > 0, got inf",
    ),
    Case(
        "theory-lr-diverges",
        "theory --lr 1e6 (training diverges)",
        lambda t: ["theory", "--lr", "1e6", "--steps", "50", "--quiet", "--out", str(t / "th")],
        r"training diverged at step \d+ \(batch loss \S+, first \S+\): lower the learning rate "
        r"\(--lr, now 1e\+06\)",
    ),
    Case(
        "theory-init-overflows",
        "theory --init 1e308 (the initial loss overflows: not the learning rate's fault)",
        lambda t: ["theory", "--init", "1e308", "--steps", "5", "--quiet", "--out", str(t / "th")],
        r"the loss of the initial weights is nan, not a number: lower the init scale "
        r"\(now 1e\+308: --init, or --sweep-scales in a sweep; the theory wants a small one\)",
    ),
    Case(
        "theory-sweep-scales-inf",
        "theory --sweep-init --sweep-scales 1e-3,inf",
        lambda t: ["theory", "--sweep-init", "--sweep-scales", "1e-3,inf", "--out", str(t / "th")],
        r"--sweep-scales must be finite numbers > 0, got '1e-3,inf'",
    ),
    Case(
        "theory-seed-negative",
        "theory --seed -1",
        lambda t: ["theory", "--seed", "-1", "--out", str(t / "th")],
        r"--seed must be 0 or more \(a NumPy seed\), got -1",
    ),
    Case(
        "ablate-empty",
        "--ablate ''",
        lambda t: ["generate", "--model", "smollm2", "hi", "--ablate", ""],
        r"--ablate: an empty head list",
    ),
    Case(
        "ablate-repeated-head",
        "--ablate L1H2 --ablate L1H2 (repeated --ablate adds up; the same head twice is refused)",
        lambda t: ["generate", "--model", "smollm2", "hi", "--ablate", "L1H2", "--ablate", "L1H2"],
        r"--ablate: L1H2 is given twice",
    ),
    Case(
        "cross-task-twice",
        "localize --cross-tasks ioi,ioi",
        lambda t: _localize("smollm2", t / "run", "--task", "capitals", "--cross-tasks", "ioi,ioi"),
        r"--cross-tasks: 'ioi' is given twice",
    ),
    Case(
        "cross-tasks-empty",
        "localize --cross-tasks '' (not silently every task)",
        lambda t: _localize("smollm2", t / "run", "--task", "capitals", "--cross-tasks", ""),
        r"--cross-tasks '' names no task: give task names \(a,b\), all or none",
    ),
    Case(
        "cross-tasks-none-in-a-list",
        "localize --cross-tasks none,ioi",
        lambda t: _localize(
            "smollm2", t / "run", "--task", "capitals", "--cross-tasks", "none,ioi"
        ),  # fmt: skip
        r"--cross-tasks: 'none' stands alone; give it by itself, or list task names",
    ),
    Case(
        "tau-with-a-language-model",
        "localize --tau 0.5 with a language model (theory only)",
        lambda t: _localize("smollm2", t / "run", "--task", "ioi", "--tau", "0.5"),
        r"--tau has no effect without --model theory: add it, or drop --tau",
    ),
    Case(
        "theory-seed-with-a-language-model",
        "test-heads --theory-seed 3 with a language model",
        lambda t: [
            "test-heads",
            "--model",
            "smollm2",
            "--task",
            "ioi",
            "--heads",
            "L1H1",
            "--theory-seed",
            "3",
            "--out",
            str(t / "run"),
        ],  # fmt: skip
        r"--theory-seed has no effect without --model theory: add it, or drop --theory-seed",
    ),
    Case(
        "theory-seed-with-a-params-file",
        "localize --theory-seed 3 with a trained theory:PATH",
        lambda t: _localize(
            f"theory:{_write(t, 'params.npz', b'x')}",
            t / "run",
            "--task",
            "A",
            "--theory-seed",
            "3",
        ),
        r"--theory-seed trains a new theory model; theory:\S+params\.npz is trained already: drop "
        r"--theory-seed, or give --model theory",
    ),
    Case(
        "out-inside-a-run",
        "localize --out inside another run's directory",
        lambda t: _localize("smollm2", _run_dir(t) / "panels", "--task", "ioi"),
        r"--out \S+panels is inside the run directory \S+run: give a folder of its own",
    ),
    Case(
        "plan-out-inside-a-run",
        "localize --plan --out inside another run's directory (as the run refuses it)",
        lambda t: [*_localize("smollm2", _run_dir(t) / "x", "--task", "ioi"), "--plan"],
        r"--out \S+x is inside the run directory \S+run",
    ),
    Case(
        "plan-out-is-a-file",
        "localize --plan --out an existing file (as the run refuses it)",
        lambda t: [
            *_localize("smollm2", _write(t, "notes.txt", b"x"), "--task", "ioi"),
            "--plan",
        ],  # fmt: skip
        r"--out \S+notes\.txt is an existing file, not a directory",
    ),
    Case(
        "theory-out-inside-a-run",
        "theory --out inside a run directory",
        lambda t: ["theory", "--out", str(_run_dir(t) / "theory"), "--quiet"],
        r"--out \S+theory is inside the run directory \S+run",
    ),
    Case(
        "summarize-missing",
        "summarize a path that does not exist",
        lambda t: ["summarize", str(t / "nothere")],
        r"nothere does not exist: give a run directory",
    ),
    Case(
        "summarize-empty-dir",
        "summarize an empty folder",
        lambda t: ["summarize", str((t / "empty").mkdir() or t / "empty")],
        r"empty is not a run directory \(no manifest\.json\): give the --out of a localize or "
        r"test-heads run",
    ),
    Case(
        "summarize-truncated-manifest",
        "summarize a run whose manifest.json was cut short",
        lambda t: ["summarize", str(_truncate(_run_dir(t), "manifest.json", 0.5))],
        r"manifest\.json: invalid JSON .*; the run directory is damaged: rerun its command with "
        r"a fresh --out",
    ),
    Case(
        "out-holds-another-report",
        "test-heads --out naming a folder that holds explain's report.json (no manifest.json)",
        lambda t: _test_heads(_write((t / "ex").mkdir() or t / "ex", "report.json", b"{}").parent),
        r"--out \S+ex holds report\.json but no manifest\.json: it is not a run directory, and "
        r"the run would overwrite that file: give a folder of its own",
    ),
    Case(
        "summarize-a-file",
        "summarize a file",
        lambda t: ["summarize", str(_write(t, "notes.txt", b"x"))],
        r"notes\.txt is a file, not a run directory",
    ),
    Case(
        "demo-heldout",
        "demo --heldout 0 (checked before the theory step)",
        lambda t: ["demo", "--out", str(t / "demo"), "--heldout", "0"],
        r"^cel-numpy demo: error: --heldout and --workers must be >= 1 and --seed >= 0 "
        r"\(got 0, 2, 2026\)$",
    ),
    # ------------------------------------------------------------------ run directories
    Case(
        "run-different-options",
        "rerunning into a run directory made with other options (--seed 1)",
        _manifest_mismatch,
        r"manifest\.json describes a different run \(seed: 0 there, 1 now\); use a fresh --out",
    ),
    Case(
        "lock-held",
        "a run directory another live process writes to",
        _lock_held,
        r"lock is held by pid 1 on \S+: another run is writing here",
    ),
    Case(
        "lock-damaged",
        "a lock file whose content is not 'PID HOST TIME', its flock free",
        _lock_damaged,
        r"run/lock is damaged \(not 'PID HOST TIME'\); no run holds it now: delete it and rerun",
    ),
    Case(
        "manifest-wrong-shape",
        "manifest.json holding valid JSON of another shape (a list)",
        _manifest_wrong_shape,
        r"run/manifest\.json holds a JSON list, not the object cel-numpy writes; the run "
        r"directory is damaged: rerun its command with a fresh --out",
    ),
    Case(
        "done-wrong-shape",
        "a done-file holding valid JSON of another shape (a string)",
        _done_wrong_shape,
        r"run/baseline\.done\.json holds a JSON str, not the object cel-numpy writes; use a fresh",
    ),
    # ------------------------------------------------------------------ limits (round 3)
    Case(
        "chat-template-power",
        "a chat template computing 10 ** (10 ** 9) (jinja2 would fold it while compiling)",
        lambda t: _chat_run(t, "{{ 10 ** (10 ** 9) }}"),
        r"tokenizer_config\.json: the chat template failed \(over a limit: 10 \*\* 1000000000 has "
        r"more than 65536 bits\)",
    ),
    Case(
        "chat-template-include",
        "a chat template with {% include %} (any other failure too: 1/0, recursion, deep nesting)",
        lambda t: _chat_run(t, "{% include 'x' %}"),
        r"tokenizer_config\.json: the chat template failed \(TypeError: no loader",
    ),
    Case(
        "prompts-changed",
        "resuming a run whose chat prompts now render differently (a template reading the date)",
        lambda t: _prompts_changed(t),
        r"manifest\.json: the heldout panel's prompts now render differently from when the run "
        r"started",
    ),
    Case(
        "attention-too-large",
        "attention on 400 tokens, every head (checked before the weights are read)",
        lambda t: [
            "attention",
            "--model",
            str(tiny_chat_model(t, "x")),
            "x" * 400,
            "--layer",
            "0",
            "--out",
            str(t / "a.png"),
        ],
        r"a picture of 4 heads on 400 tokens would be [\d,]+ x [\d,]+ pixels, more than 60 "
        r"million: give a text of at most 347 tokens \(one head with --head: at most 392\)",
    ),
    Case(
        "batch-size-memory",
        "test-heads --batch-size 10^12 (the numbers are this machine's memory)",
        lambda t: [
            "test-heads",
            "--model",
            str(tiny_chat_model(t, "x")),
            "--task",
            "capitals",
            "--heads",
            "L0H0",
            "--heldout",
            "4",
            "--discovery",
            "4",
            "--out",
            str(t / "run"),
            "--batch-size",
            "1000000000000",
        ],
        r"--batch-size 1000000000000 needs about \S+ GiB with prompts of up to \d+ tokens",
    ),
    Case(
        "null-sets-beyond-heads",
        "localize --null-sets 8 on a model of 8 heads (checked before the weights are read)",
        lambda t: _localize(
            str(with_tokenizer(copy_fixture(t, "tiny_gpt2"))),
            t / "run",
            "--task",
            "capitals",
            "--null-sets",
            "8",
        ),
        r"--null-sets 8: the rank-1 set may be a single head, and a model of 8 heads has only 7",
    ),
    Case(
        "null-sets-cost",
        "test-heads --null-sets 1000000",
        lambda t: [
            "test-heads",
            "--model",
            "smollm2",
            "--task",
            "capitals",
            "--heads",
            "L0H0",
            "--out",
            str(t / "run"),
            "--null-sets",
            "1000000",
        ],
        r"--null-sets 1000000: each set is one more held-out evaluation of every item; at most "
        r"10,000 are run",
    ),
    Case(
        "prompt-two-megabytes",
        "a 2,000,000-character prompt (refused by its length, before it is encoded)",
        lambda t: [
            "generate",
            "--model",
            str(with_tokenizer(copy_fixture(t, "tiny_gpt2"))),
            "x" * 2_000_000,
        ],
        r"the prompt is 2,000,000 characters, at least 2,000,000 tokens: more than the 48 tokens "
        r"that the context of 64 leaves with --max-new-tokens 16",
    ),
    Case(
        "gguf-metadata-items",
        "a GGUF header of 1,048,577 empty strings in one array (8 MB)",
        lambda t: ["inspect", "--model", str(_gguf_many_strings(t, (1 << 20) + 1))],
        r"the header declares 1,048,577 items in one metadata array, more than any model has",
    ),
    Case(
        "index-escapes-folder",
        "model.safetensors.index.json naming the shard ../outside/x.safetensors",
        lambda t: ["inspect", "--model", str(_index_naming(t, "../outside/x.safetensors"))],
        r"model\.safetensors\.index\.json: lists shard '\.\./outside/x\.safetensors', which is "
        r"not a file name in the model folder",
    ),
    Case(
        "control-characters",
        "a tensor name holding ESC ] 52 (set the clipboard) and BEL",
        lambda t: ["inspect", "--model", str(_tensor_named(t, "\x1b]52;c;aGk=\x07"))],
        r"tensor \\x1b\]52;c;aGk=\\x07 has unknown dtype 'Q7'",
    ),
    Case(
        "model-type-list",
        'config.json with "model_type": ["llama"]',
        lambda t: ["inspect", "--model", str(_config_with(t, "tiny_llama", model_type=["llama"]))],
        r"unsupported architecture \"\['llama'\]\" in config\.json",
    ),
    Case(
        "index-nested",
        "model.safetensors.index.json nested 100000 levels deep",
        lambda t: ["inspect", "--model", str(_index_text(t, "[" * 100_000 + "]" * 100_000))],
        r"model\.safetensors\.index\.json: JSON nested too deeply to be a safetensors index",
    ),
    Case(
        "layers-fewer-than-tensors",
        "config.json with num_hidden_layers 1 for a checkpoint of 2 layers",
        lambda t: [
            "inspect",
            "--model",
            str(_config_with(t, "tiny_llama", num_hidden_layers=1)),
        ],
        r"the config says 1 layers but the checkpoint holds tensors of layer 1 "
        r"\(model\.layers\.1\.\S+\): the layer count is wrong",
    ),
    Case(
        "added-token-empty",
        "a tokenizer.json added token with empty text",
        lambda t: ["inspect", "--model", str(_empty_added_token(t))],
        r"special token 95 has empty text, which would be inserted between every two characters",
    ),
    Case(
        "model-fifo",
        "a FIFO named model.gguf (reading it would wait forever)",
        lambda t: ["inspect", "--model", str(_fifo(t / "model.gguf"))],
        r"model\.gguf: a FIFO, not a regular file: give the model file itself",
    ),
    Case(
        "model-empty",
        "--model '' (would mean the current folder)",
        lambda t: ["inspect", "--model", ""],
        r"the model \(--model\) is empty: give a file or folder",
    ),
    # ------------------------------------------------------------------ explain
    Case(
        "explain-theory",
        "explain on the theory model",
        lambda t: [
            "explain",
            "--model",
            "theory",
            "--task",
            "ioi",
            "--heads",
            "L0H1",
            "--out",
            str(t / "x"),
        ],
        r"explain reads a language model's attention and unembedding: give --model smollm2",
    ),
    Case(
        "test-heads-empty-heads",
        "test-heads --heads '' (a set to test needs a head; 'intact' is no set)",
        lambda t: [
            "test-heads",
            "--model",
            "theory",
            "--task",
            "A",
            "--heads",
            "",
            "--out",
            str(t / "run"),
        ],  # fmt: skip
        r"--heads: an empty head list: write heads as L3H1 \(layer 3, head 1, counted from 0\), "
        r"several as L3H1\+L5H0$",
    ),
    Case(
        "explain-no-heads",
        "explain with --heads intact (no head to explain)",
        lambda t: [
            "explain",
            "--model",
            "smollm2",
            "--task",
            "ioi",
            "--heads",
            "intact",
            "--out",
            str(t / "x"),
        ],
        r"--heads: name at least one head, e\.g\. L13H2 or L8H1\+L13H2",
    ),
    Case(
        "explain-negative-seed",
        "explain --seed -1",
        lambda t: _explain(t / "x", "--seed", "-1"),
        r"--seed must be at least 0, got -1",
    ),
    Case(
        "explain-empty-panel",
        "explain --heldout 0",
        lambda t: _explain(t / "x", "--heldout", "0"),
        r"--heldout must be at least 1, got 0",
    ),
    Case(
        "explain-head-not-in-model",
        "explain with a head the model does not have (tiny GPT-2: 2 layers x 4 heads)",
        lambda t: [
            "explain",
            "--model",
            str(with_tokenizer(copy_fixture(t, "tiny_gpt2"))),
            "--task",
            "agreement",
            "--heads",
            "L5H0",
            "--heldout",
            "4",
            "--out",
            str(t / "x"),
        ],
        r"head L5H0 is not in the model: it has 2 layers x 4 heads",
    ),
    Case(
        "explain-out-in-a-run",
        "explain --out naming a run directory (its report.json would be overwritten)",
        lambda t: [
            "explain",
            "--model",
            "smollm2",
            "--task",
            "ioi",
            "--heads",
            "L0H1",
            "--out",
            str(_run_dir(t)),
        ],
        r"--out \S+run is inside the run directory \S+run, whose report\.json explain would "
        r"overwrite: give a folder of its own",
    ),
    # ------------------------------------------------------------------ summarize --json
    Case(
        "summarize-json-in-another-run",
        "summarize --json into a run directory not among those summarized",
        lambda t: ["summarize", str(t / "a"), "--json", str(_run_dir(t) / "summary.json")],
        r"--json \S+summary\.json is inside the run directory \S+run: write the summary elsewhere",
    ),
    Case(
        "summarize-json-folder",
        "summarize --json naming a folder",
        lambda t: ["summarize", str(t / "a"), "--json", str(t)],
        r"--json \S+ is a folder: give a file name, e\.g\. summary\.json",
    ),
]


def _run_dir(tmp: Path) -> Path:
    """A folder holding a run's manifest.json (these checks read only its format)."""
    (tmp / "run").mkdir()
    _write(tmp / "run", "manifest.json", b'{"format": "cel-numpy.localize/2"}\n')
    return tmp / "run"


def test_a_cross_task_that_is_the_task_is_left_out_with_a_note(capsys):
    """--task capitals --cross-tasks ioi,capitals (one list for a loop over its own tasks, as
    round 1's documented command): capitals is not a cross task of itself, and stderr says so."""
    from argparse import Namespace

    from cel_numpy.localize.cli import lm_tasks, theory_task_names

    task, cross = lm_tasks(Namespace(task="capitals", cross_tasks="ioi,capitals"))
    assert task.name == "capitals" and [t.name for t in cross] == ["ioi", "capitals"]
    note = capsys.readouterr().err.strip()
    assert note == (
        "cel-numpy: note: --cross-tasks capitals is the --task itself: its held-out panel is "
        "the primary test, so it is not tested again as a cross task"
    )
    assert theory_task_names(Namespace(task="A", cross_tasks="b,a")) == ("A", ["B", "A"])
    assert "--cross-tasks a is the --task itself" in capsys.readouterr().err
    lm_tasks(Namespace(task="capitals", cross_tasks="ioi"))
    assert capsys.readouterr().err == ""


def _chat_run(tmp: Path, template: str) -> list[str]:
    """test-heads on a tiny chat model whose template is `template` (arithmetic_chat renders it)."""
    return ["test-heads", *chat_argv(tiny_chat_model(tmp, template), tmp / "run")]


def _prompts_changed(tmp: Path) -> list[str]:
    argv = _chat_run(tmp, "{{ messages[0].content }}") + ["--stage", "heldout"]
    assert run_cli(argv)[0] == 0
    manifest = json.loads((tmp / "run" / "manifest.json").read_text())
    manifest["prompt_hashes"]["heldout"] = "0" * 64  # as if rendered on another day
    (tmp / "run" / "manifest.json").write_text(json.dumps(manifest))
    return argv


def _gguf_many_strings(tmp: Path, n: int) -> Path:
    """A GGUF file (version 3, no tensors) whose one metadata array holds n empty strings."""
    key = b"tokenizer.ggml.tokens"
    header = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key
    array = struct.pack("<IIQ", 9, 8, n)  # ARRAY of STRING, n items
    path = tmp / "many.gguf"
    path.write_bytes(header + array + bytes(8 * n))
    return path


def _index_naming(tmp: Path, shard: str) -> Path:
    folder = copy_fixture(tmp, "tiny_gpt2")
    (tmp / "outside").mkdir()
    shutil.move(folder / "model.safetensors", tmp / "outside" / "x.safetensors")
    index = {"weight_map": {"transformer.wte.weight": shard}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return folder


def _index_text(tmp: Path, text: str) -> Path:
    folder = copy_fixture(tmp, "tiny_gpt2")
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors.index.json").write_text(text)
    return folder


def _tensor_named(tmp: Path, name: str) -> Path:
    """tiny_gpt2 with one more header entry, named `name`, of an unknown dtype."""
    folder = copy_fixture(tmp, "tiny_gpt2")
    data = (folder / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    header[name] = {"dtype": "Q7", "shape": [1], "data_offsets": [0, 1]}
    text = json.dumps(header, ensure_ascii=False).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + data[8 + n :])
    return folder


def _config_with(tmp: Path, fixture: str, **changes) -> Path:
    folder = copy_fixture(tmp, fixture)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))
    return folder


def _empty_added_token(tmp: Path) -> Path:
    folder = tiny_chat_model(tmp, "x")
    spec = json.loads((folder / "tokenizer.json").read_text())
    spec["added_tokens"] = [{"id": 95, "content": "", "special": True}]
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    return folder


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _truncate(folder: Path, name: str, fraction: float) -> Path:
    _truncate_file(folder / name, fraction)
    return folder


def _truncate_file(path: Path, fraction: float) -> Path:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * fraction)])
    return path


def _drop(folder: Path, name: str) -> Path:
    (folder / name).unlink()
    return folder


def _patch(folder: Path, name: str, offset: int, patch: bytes) -> Path:
    data = bytearray((folder / name).read_bytes())
    data[offset : offset + len(patch)] = patch
    (folder / name).write_bytes(bytes(data))
    return folder


def _write(where: Path, name: str, content: bytes) -> Path:
    path = where / name
    path.write_bytes(content)
    return path


def _replace(folder: Path, name: str, content: bytes) -> Path:
    _write(folder, name, content)
    return folder


def run_case(case: Case, tmp: Path) -> tuple[int, str]:
    argv = case.setup(tmp)
    try:
        return run_cli(argv)
    finally:
        ro = tmp / "readonly"
        if ro.exists():
            ro.chmod(0o755)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_clear_line(case, tmp_path):
    status, err = run_case(case, tmp_path)
    lines = err.splitlines()
    assert len(lines) == 1, f"expected exactly one line on stderr, got:\n{err}"
    assert status == case.status, err
    assert re.match(r"cel-numpy [\w-]+: error: ", lines[0]), lines[0]
    assert re.search(case.expect, lines[0]), lines[0]
    assert "Traceback" not in err


def table_message(case: Case, tmp: Path) -> str:
    """The case's stderr line with the temporary folder written as DIR and this host as HOST."""
    _, err = run_case(case, tmp)
    line = err.strip().replace(str(tmp), "DIR").replace(socket.gethostname(), "HOST")
    return line.replace("|", "\\|")


def table_rows(tmp_root: Path) -> list[str]:
    rows = []
    for case in CASES:
        tmp = tmp_root / case.id
        tmp.mkdir()
        rows.append(
            f"| {case.what} | `{table_message(case, tmp)}` | test_bad_input.py::{case.id} |"
        )
    return rows


def test_docs_table_quotes_what_the_commands_print(tmp_path):
    """docs/bad_input.md shows, for every case, the line the command prints now."""
    doc = DOC.read_text(encoding="utf-8")
    quoted = {}
    for line in doc.splitlines():
        m = re.match(r"\| .* \| `(.*)` \| test_bad_input\.py::(\S+) \|$", line)
        if m:
            quoted[m.group(2)] = m.group(1)
    assert set(quoted) == {c.id for c in CASES}, "docs/bad_input.md and CASES list different cases"
    for case in CASES:
        if case.os_dependent:
            continue
        tmp = tmp_path / case.id
        tmp.mkdir()
        assert quoted[case.id] == table_message(case, tmp), (
            f"docs/bad_input.md is out of date for {case.id}"
        )


# =========================================================================== fuzz


def mutations(data: bytes, rng: np.random.Generator, n: int, header_bytes: int):
    """n damaged copies: truncations and 1-3 bit flips, half of them inside
    the first header_bytes."""
    for k in range(n):
        near_header = k % 4 >= 2
        hi = min(len(data), header_bytes) if near_header else len(data)
        if k % 2 == 0:
            cut = int(rng.integers(0, hi))
            yield f"truncated to {cut} bytes", data[:cut], False
        else:
            out = bytearray(data)
            flips = [int(rng.integers(0, hi)) for _ in range(int(rng.integers(1, 4)))]
            for pos in flips:
                out[pos] ^= 1 << int(rng.integers(0, 8))
            yield f"bits flipped at {flips}", bytes(out), min(flips) >= header_bytes


def data_start(path: Path) -> int:
    """Where tensor data begins: a flip past this point changes weights, not structure."""
    if path.suffix == ".gguf":
        import gguf

        return int(gguf.GGUFReader(path).data_offset)
    return 8 + struct.unpack("<Q", path.read_bytes()[:8])[0]  # safetensors


def test_fuzz_damaged_model_files_load_or_fail_cleanly(tmp_path):
    """Seeded random truncations and bit flips: a clean load or a one-line ModelFileError
    naming the file."""
    rng = np.random.default_rng(20261130)
    gguf_path = tmp_path / "orig.gguf"
    write_tiny_gguf(gguf_path, smollm2_mix)
    targets = [  # (label, source, file inside a folder or None, cases)
        ("tiny_gpt2 safetensors", FIXTURES / "tiny_gpt2", "model.safetensors", 80),
        ("tiny_gpt2 config", FIXTURES / "tiny_gpt2", "config.json", 30),
        ("tiny_llama safetensors", FIXTURES / "tiny_llama", "model.safetensors", 80),
        ("tiny_llama config", FIXTURES / "tiny_llama", "config.json", 30),
        ("tiny_gpt2.npz", FIXTURES / "tiny_gpt2.npz", None, 60),
        ("gguf", gguf_path, None, 120),
    ]
    outcomes: dict[str, int] = {}
    for label, source, member, n in targets:
        work = tmp_path / label.replace(" ", "_")
        if member:
            shutil.copytree(source, work)
            target, load = work / member, work
        else:
            work.mkdir()
            target = load = work / f"model{source.suffix}"
        original = (source / member if member else source).read_bytes()
        header = (
            data_start(source / member)
            if member == "model.safetensors"
            else data_start(source)
            if source.suffix == ".gguf"
            else len(original)
        )
        for what, damaged, data_only in mutations(original, rng, n, header):
            target.write_bytes(damaged)
            try:
                cn.load_model(load)  # flipped exponent bits make NaN/Inf: refused, named
                outcome = "loaded"
            except ModelFileError as err:
                message = str(err)
                assert "\n" not in message, f"{label}, {what}: multi-line message {message!r}"
                assert target.name in message or load.name in message, (
                    f"{label}, {what}: {message!r} names no file"
                )
                assert not data_only or "non-finite values" in message, (
                    f"{label}, {what}: a flip inside tensor data must load (or make a NaN/Inf "
                    f"weight), got {message!r}"
                )
                outcome = "ModelFileError"
            except Exception as err:
                pytest.fail(f"{label}, {what}: {type(err).__name__} escaped: {err}")
            outcomes[f"{label}: {outcome}"] = outcomes.get(f"{label}: {outcome}", 0) + 1
        target.write_bytes(original)
    assert sum(outcomes.values()) == 400
    for (
        label,
        *_,
    ) in targets:  # both outcomes occur: the damage is neither always benign nor always fatal
        assert outcomes.get(f"{label}: ModelFileError", 0) > 0, outcomes
    for label in ("tiny_gpt2 safetensors", "tiny_llama safetensors", "gguf"):
        assert outcomes.get(f"{label}: loaded", 0) > 0, outcomes


# ========================================================================= loaders: specific checks


def test_bf16_safetensors_load_as_the_rounded_weights(tmp_path):
    """BF16 (how most HF checkpoints ship) is read as the top 16 bits of float32."""
    from safetensors.numpy import load_file

    folder = copy_fixture(tmp_path, "tiny_llama")
    weights = load_file(folder / "model.safetensors")
    header = {}
    blobs, offset = [], 0
    for name, w in weights.items():
        bits = (w.astype(np.float32).view(np.uint32) >> 16).astype("<u2")  # truncation to bf16
        header[name] = {
            "dtype": "BF16",
            "shape": list(w.shape),
            "data_offsets": [offset, offset + bits.nbytes],
        }
        blobs.append(bits.tobytes())
        offset += bits.nbytes
    text = json.dumps(header).encode()
    (folder / "model.safetensors").write_bytes(
        struct.pack("<Q", len(text)) + text + b"".join(blobs)
    )
    model = cn.load_model(folder)
    expected = (weights["model.norm.weight"].view(np.uint32) & 0xFFFF0000).view(np.float32)
    np.testing.assert_array_equal(model.params["ln_final"]["w"], expected)
    assert (
        np.abs(model.params["ln_final"]["w"] - weights["model.norm.weight"]).max() > 0
    )  # really rounded


def test_model_checks_run_before_weights_are_read(tmp_path, monkeypatch):
    """check_config sees the config first; a rejected option costs no weight read."""
    from cel_numpy.models import loaders

    reads = []
    real = loaders.read_safetensors_tensor
    monkeypatch.setattr(
        loaders, "read_safetensors_tensor", lambda f, e: reads.append(e) or real(f, e)
    )

    def refuse(config):
        raise OptionError(f"no thanks: {config.n_layers} layers")

    with pytest.raises(OptionError, match="no thanks: 2 layers"):
        loaders.load_model(FIXTURES / "tiny_gpt2", check_config=refuse)
    assert reads == []
    loaders.load_model(FIXTURES / "tiny_gpt2")
    assert reads, "the monkeypatched reader is the one in use"


def test_error_types_keep_their_old_bases():
    from cel_numpy.localize.rundir import RunDirError
    from cel_numpy.models.config import ConfigError
    from cel_numpy.models.fetch import FetchError
    from cel_numpy.models.model import NoTokenizerError
    from cel_numpy.models.tokenizer import TokenizerError

    for cls, old in [
        (ConfigError, ValueError),
        (TokenizerError, ValueError),
        (FetchError, RuntimeError),
        (InvalidHeadError, ValueError),
        (NoTokenizerError, RuntimeError),
        (RunDirError, UserError),
        (OptionError, ValueError),
        (PromptError, ValueError),
    ]:
        assert issubclass(cls, UserError) and issubclass(cls, old), cls
    assert issubclass(TokenizerError, ModelFileError)


# =========================================================================== command line behaviour


def test_debug_shows_the_traceback(tmp_path):
    argv = ["inspect", "--model", str(tmp_path)]
    with pytest.raises(ModelFileError, match="no config.json"):
        main(["--debug", *argv])
    with pytest.raises(ModelFileError, match="no config.json"):
        main([*argv, "--debug"])
    assert run_cli(argv)[0] == 2


def test_a_bug_is_one_line_with_exit_status_1(monkeypatch):
    from cel_numpy.models import cli as models_cli

    def broken(args):
        return {}["missing"]

    monkeypatch.setattr(models_cli, "cmd_fetch", broken)
    status, err = run_cli(["fetch", "smollm2"])
    assert status == 1
    assert err.splitlines() == [
        "cel-numpy fetch: internal error: KeyError: 'missing' (a bug in cel-numpy: rerun with "
        "--debug for the traceback and report it)"
    ]


# =========================================================================== tokenizer


@pytest.fixture(scope="module")
def gpt2():
    from cel_numpy.models.fetch import fetch
    from cel_numpy.models.tokenizer import BPETokenizer

    folder = fetch("gpt2-tokenizer")
    return BPETokenizer.from_gpt2_files(folder / "encoder.json", folder / "vocab.bpe")


@pytest.fixture(scope="module")
def smollm2():
    import gguf

    from cel_numpy.models.fetch import fetch
    from cel_numpy.models.tokenizer import BPETokenizer

    return BPETokenizer.from_gguf_fields(gguf.GGUFReader(fetch("smollm2")))


TEXT = st.text(st.characters(codec="utf-8"), max_size=60)  # every code point but surrogates
SMOLLM2_TEXT = st.text(
    st.characters(codec="utf-8").filter(
        lambda ch: not set(SMOLLM2_MISSING_BYTES) & set(ch.encode())
    ),
    max_size=60,
)
FUZZ = settings(
    max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)


@pytest.mark.download
@FUZZ
@given(text=TEXT)
def test_gpt2_round_trips_any_unicode(gpt2, text):
    assert gpt2.decode(gpt2.encode(text)) == text


@pytest.mark.download
@FUZZ
@given(text=SMOLLM2_TEXT)
def test_smollm2_round_trips_any_unicode_it_can_spell(smollm2, text):
    """Exact for every character whose UTF-8 bytes all have tokens; SmolLM2 lacks a few bytes
    (U+0004, U+0006, ..., and the lead bytes of planes 4-11: see BPETokenizer), which HF
    drops too."""
    assert set(smollm2.missing_bytes) == set(SMOLLM2_MISSING_BYTES)
    assert smollm2.decode(smollm2.encode(text)) == text


@pytest.mark.download
@FUZZ
@given(text=TEXT, where=st.integers(0, 60), surrogate=st.integers(0xD800, 0xDFFF))
def test_text_with_a_lone_surrogate_is_a_prompt_error(gpt2, text, where, surrogate):
    bad = text[:where] + chr(surrogate) + text[where:]
    with pytest.raises(
        PromptError,
        match=rf"lone surrogate U\+{surrogate:04X} at character {min(where, len(text))}",
    ):
        gpt2.encode(bad)


def test_empty_and_too_long_prompts_through_the_model_api(tmp_path):
    """Model raises PromptError (a UserError and a ValueError) with one line saying what to do."""
    model = cn.load_model(with_tokenizer(copy_fixture(tmp_path, "tiny_gpt2")))
    assert model.encode("") == []
    with pytest.raises(PromptError, match="every prompt needs at least one token"):
        model.generate("", max_new_tokens=2)
    with pytest.raises(
        PromptError, match="65 tokens exceed the model's context of 64 tokens: shorten the prompt"
    ):
        model.logits([model.encode("x" * 65)])
    with pytest.raises(PromptError, match="exceed the model's context of 64 tokens"):
        model.generate("x" * 60, max_new_tokens=10)


def test_the_model_api_refuses_what_it_would_misread(tmp_path):
    """Each of these used to give a result: a string read as one prompt per character, layer -1
    as the last block run on the embeddings, batch_size -1 as no batch (all zeros), a mask of
    0.5 or of zeros weighing keys, a float id truncated. Now each is one line saying what to
    give."""
    from cel_numpy.errors import InvalidHeadError, OptionError

    model = cn.load_model(with_tokenizer(copy_fixture(tmp_path, "tiny_gpt2")))
    ids, mask = model.pad([[5, 7, 9], [3, 4]])
    refused = [
        (PromptError, "a string is one prompt, so pass \\[text\\]", lambda: model.logits("hello")),
        (PromptError, "a string is one prompt", lambda: model.mean_z("hello")),
        (InvalidHeadError, "layer -1 is not in", lambda: model.attention_pattern(ids, -1)),
        (InvalidHeadError, "layer 2 is not in", lambda: model.attention_pattern(ids, 2)),
        (OptionError, "batch_size must be a", lambda: model.mean_z(ids, mask, batch_size=-1)),
        (OptionError, "batch_size must be a", lambda: model.row_mean_z(ids, batch_size=0)),
        (PromptError, "needs at least one 1", lambda: model.logits(ids, np.zeros_like(mask))),
        (PromptError, "only 0 \\(padding\\) and 1", lambda: model.logits(ids, mask * 0.5)),
        (PromptError, r"attention_mask has shape \(2, 2\)", lambda: model.logits(ids, mask[:, 1:])),
        (PromptError, "different lengths with an attention_mask",
         lambda: model.logits([[1, 2], [3]], [[1, 1], [1, 1]])),
        (PromptError, "must be integers, got 1.7", lambda: model.decode([1.7])),
        (PromptError, "must be integers, got True", lambda: model.decode([True])),
        (PromptError, "token id -1 is out of range", lambda: model.decode([-1])),
        (OptionError, "max_new_tokens must be an integer >= 0, got -5",
         lambda: model.generate("hello", -5)),
        (OptionError, "got 2.0", lambda: model.generate("hello", 2.0)),
        (PromptError, "must be integers, got 57.5",
         lambda: model.generate_ids([[5, 7]], 2, stop_ids=[57.5])),
    ]  # fmt: skip
    for error, message, call in refused:
        with pytest.raises(error, match=message) as info:
            call()
        assert "\n" not in str(info.value)
    with pytest.raises(OptionError, match="dtype must be float32 or float64, got None"):
        cn.load_model(with_tokenizer(copy_fixture(tmp_path / "b", "tiny_gpt2")), dtype=None)
    assert model.logits(ids, mask).shape == (2, 3, 96)  # what is right still runs
    assert model.decode(np.array([5, 7])) == model.decode([5, 7])


if __name__ == "__main__":  # print the rows of the table in docs/bad_input.md
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        print("\n".join(table_rows(Path(tmp))))


def test_a_refused_command_leaves_no_empty_out_folder(tmp_path):
    """--out is created first (to prove it writable); a refusal after that removes it again
    when nothing was written, and keeps a folder that existed or holds anything."""
    (tmp_path / "empty").mkdir()
    argv = _localize(str(tmp_path / "empty"), tmp_path / "new" / "run", "--task", "ioi")
    status, err = run_cli(argv)
    assert status == 2 and "no config.json" in err, err
    assert not (tmp_path / "new" / "run").exists() and (tmp_path / "new").is_dir()
    (tmp_path / "kept").mkdir()
    status, _ = run_cli(_localize(str(tmp_path / "empty"), tmp_path / "kept", "--task", "ioi"))
    assert status == 2 and (tmp_path / "kept").is_dir()


def test_only_a_cel_numpy_manifest_marks_a_run_directory(tmp_path):
    """explain --out and summarize --json refuse a folder inside a run; another project's
    manifest.json (or an unreadable one) higher up is no run and refuses nothing."""
    from cel_numpy.outdir import run_directory_holding

    (tmp_path / "manifest.json").write_text('{"name": "a web extension"}')
    assert run_directory_holding(tmp_path / "out" / "x.json") is None
    (tmp_path / "manifest.json").write_text("[" * 100_000)
    assert run_directory_holding(tmp_path / "out") is None
    (tmp_path / "manifest.json").write_text('{"format": "cel-numpy.localize/2"}')
    assert run_directory_holding(tmp_path / "out" / "x.json") == tmp_path.resolve()


@pytest.mark.parametrize(
    "extra, option, companion",
    [
        (["--matched-seed", "4"], "--matched-seed", "--matched-null R"),
        (["--matched-pool", "400"], "--matched-pool", "--matched-null R"),
    ],
)
def test_a_matched_null_option_without_the_matched_null_is_refused(tmp_path, extra, option,
                                                                   companion):  # fmt: skip
    status, err = run_cli(_localize("theory", tmp_path / "run", "--task", "A", *extra))
    assert status == 2 and f"{option} has no effect without {companion}" in err, err
    model = f"theory:{theory_params(tmp_path)}"
    argv = _localize(model, tmp_path / "run", "--task", "A", *extra, "--matched-null", "20")
    status, err = run_cli([*argv, "--stage", "baseline"])
    assert status == 0, err  # with its companion the option is taken
