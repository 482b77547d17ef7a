"""Hostile and odd inputs that must not pass silently (the reliability rounds): each is refused
in one line naming the file or option, or handled and said; run through the command line where
a user would meet it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from helpers import (
    FIXTURES,
    copy_fixture,
    localize_argv,
    rewrite_safetensors,
    run_cli,
    theory_params,
    with_tokenizer,
)

# --------------------------------------------------------------------------- --workers


def test_workers_beyond_the_chunks_are_not_started_and_beyond_the_cores_warned(
    tmp_path, monkeypatch
):
    """--workers 100 on a 4-head model: never more worker processes than a stage has chunks
    (2 here), a one-line warning about the cores, and the records of a sequential run."""
    from cel_numpy.localize import workers

    sizes = []
    real = workers.ProcessPoolExecutor

    def spy(max_workers, **kwargs):
        sizes.append(max_workers)
        return real(max_workers=max_workers, **kwargs)

    monkeypatch.setattr(workers, "ProcessPoolExecutor", spy)
    params = theory_params(tmp_path)
    status, err = run_cli(localize_argv(params, tmp_path / "many", "--workers", "100"))
    assert status == 0, err
    cores = workers.available_cores()
    assert err.splitlines() == [
        f"cel-numpy localize: warning: --workers 100 is more than the {cores} CPU cores here: "
        "the extra workers only compete for them (each stage starts at most one worker per "
        "piece of work: a chunk of conditions or a slice of a large panel)"
    ]
    assert sizes and max(sizes) <= 2, sizes  # the largest stage has 2 chunks of 8 conditions
    status, err = run_cli(localize_argv(params, tmp_path / "one"))
    assert status == 0, err
    for name in ("baseline", "screen", "joint", "confirm", "heldout", "crosstask"):
        a, b = (tmp_path / d / f"{name}.jsonl" for d in ("many", "one"))
        assert a.read_bytes() == b.read_bytes(), name
    assert (
        json.loads((tmp_path / "many" / "report.json").read_text())["primary"]
        == json.loads((tmp_path / "one" / "report.json").read_text())["primary"]
    )


# --------------------------------------------------------------------------- output


def test_a_non_utf8_path_is_printed_with_a_replacement_not_a_crash(tmp_path):
    """--out with a byte that is not UTF-8: the run finishes, prints its paths (the bad byte
    replaced) and exits 0; nothing fails after the work is done."""
    import os
    import subprocess
    import sys

    params = theory_params(tmp_path)
    out = os.fsencode(tmp_path) + b"/caf\xe9-run"
    argv = [a if isinstance(a, bytes) else a.encode() for a in localize_argv(params, Path("X"))]
    argv[argv.index(b"X")] = out
    env = {**os.environ, "PYTHONIOENCODING": "utf-8", "OPENBLAS_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable.encode(), b"-m", b"cel_numpy.cli", *argv], capture_output=True, env=env
    )
    assert proc.returncode == 0, proc.stderr
    report = proc.stdout.decode("utf-8").splitlines()[-1]
    assert report == f"report: {tmp_path}/caf\ufffd-run/report.md", report
    assert os.path.exists(out + b"/report.md")


# --------------------------------------------------------------------------- odd inputs, API


def test_repeated_ablate_removes_every_head_given(tmp_path):

    model = str(with_tokenizer(copy_fixture(tmp_path, "tiny_gpt2")))
    outputs = {}
    for name, flags in {
        "repeated": ["--ablate", "L0H1", "--ablate", "L1H3"],
        "joined": ["--ablate", "L0H1+L1H3"],
        "last only": ["--ablate", "L1H3"],
    }.items():
        import contextlib
        import io

        from cel_numpy.cli import main

        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert (
                main(["generate", "--model", model, "hello", "--max-new-tokens", "4", *flags]) == 0
            )
        outputs[name] = out.getvalue()
    assert outputs["repeated"] == outputs["joined"]
    assert outputs["repeated"] != outputs["last only"]


def test_float_token_ids_and_head_indices_are_refused_through_the_api():

    import cel_numpy as cn
    from cel_numpy.errors import OptionError, PromptError

    model = cn.load_model(FIXTURES / "tiny_gpt2")
    with pytest.raises(PromptError, match=r"token ids must be integers, got 2\.5 \(float\)"):
        model.logits([[1, 2.5, 3]])
    with pytest.raises(PromptError, match=r"token ids must be integers, got 1\.0"):
        model.generate_ids([[1.0, 2.0]], max_new_tokens=1)
    with pytest.raises(PromptError, match="token ids must be integers"):
        model.logits(np.array([[1.0, 2.0]]))
    with pytest.raises(PromptError, match=r"token id -1 is out of range: the vocabulary has ids 0"):
        model.logits([[5, -1]])
    with pytest.raises(PromptError, match="token id 96 is out of range"):
        model.logits([[96]])
    with pytest.raises(OptionError, match="is not a head"):
        model.logits([[1, 2]], ablate=[(0, 1.0)])
    with pytest.raises(OptionError, match="is not a head"):
        model.logits([[1, 2]], ablate=[(0.0, 1)])
    assert model.logits([[1, 2]], ablate=[(np.int64(0), 1)]).shape[-1] == 96


# --------------------------------------------------------------------------- run directories


def test_a_lock_naming_an_impossible_pid_is_taken_over(tmp_path):
    import socket

    params = theory_params(tmp_path)
    out = tmp_path / "run"
    out.mkdir()
    (out / "lock").write_text(f"{10**20} {socket.gethostname()} 2026-01-01T00:00:00\n")
    status, err = run_cli(localize_argv(params, out, "--stage", "baseline"))
    assert status == 0, err
    assert err.splitlines() == [
        f"cel-numpy: taking over the stale lock {out / 'lock'} of pid {10**20} on "
        f"{socket.gethostname()} (not running; it was killed before it could remove the lock)"
    ]
    assert not (out / "lock").exists()


# --------------------------------------------------------------------------- model identity


def tiny_lm(tmp: Path) -> Path:

    return with_tokenizer(copy_fixture(tmp, "tiny_gpt2"))


def lm_argv(model: str, out: str, stage: str) -> list[str]:
    return [
        "localize", "--model", model, "--task", "agreement", "--discovery", "4", "--heldout",
        "4", "--cross-tasks", "none", "--out", out, "--stage", stage, "--quiet",
    ]  # fmt: skip


def test_a_model_folder_is_the_files_the_loader_reads_not_its_path(tmp_path, monkeypatch):
    """The run directory inside the model folder, an added README, and `./tiny_gpt2` vs an
    absolute path: the same model, so the rerun resumes. Changed bytes are another
    model (a tokenizer file changed), and the refusal names the field that differs."""
    folder = tiny_lm(tmp_path)
    status, err = run_cli(lm_argv(str(folder), str(folder / "run"), "baseline"))
    assert status == 0, err
    (folder / "README.md").write_text("notes\n")
    monkeypatch.chdir(tmp_path)
    status, err = run_cli(lm_argv("./tiny_gpt2", "tiny_gpt2/run", "screen"))
    assert status == 0, err
    manifest = json.loads((folder / "run" / "manifest.json").read_text())
    assert manifest["model"]["resolved_path"] == str(folder.resolve())

    (folder / "merges.txt").write_text("#version: 0.3\n")  # same size, other bytes
    status, err = run_cli(lm_argv("./tiny_gpt2", "tiny_gpt2/run", "screen"))
    assert status == 2
    assert re.fullmatch(
        r"cel-numpy localize: error: tiny_gpt2/run/manifest\.json describes a different run "
        r'\(model\.file_sha256: "[0-9a-f]{64}" there, "[0-9a-f]{64}" now\); use a fresh --out\n',
        err,
    ), err


def test_a_folder_that_is_no_model_is_refused_before_anything_is_hashed(tmp_path, monkeypatch):
    from cel_numpy.localize import cli as localize_cli

    folder = tmp_path / "downloads"
    folder.mkdir()
    (folder / "big.bin").write_bytes(b"\0" * 1000)

    def no_hashing(path):
        raise AssertionError(f"hashed {path} before checking it is a model")

    monkeypatch.setattr(localize_cli, "file_identity", no_hashing)
    status, err = run_cli(lm_argv(str(folder), str(tmp_path / "run"), "baseline"))
    assert status == 2
    assert err == (
        f"cel-numpy localize: error: {folder}: no config.json (not a Hugging Face model folder)\n"
    )


# --------------------------------------------------------------------------- a full disk


def test_a_full_disk_while_writing_the_report_names_it_and_leaves_no_tmp(tmp_path):
    """report.json.tmp made a link to /dev/full (every write: ENOSPC): the error names
    report.json, says what to do, and the temporary file is gone; the rerun then finishes."""
    params = theory_params(tmp_path)
    out = tmp_path / "run"
    assert run_cli(localize_argv(params, out, "--stage", "crosstask"))[0] == 0
    (out / "report.json.tmp").symlink_to("/dev/full")
    status, err = run_cli(localize_argv(params, out))
    assert status == 2
    assert err == (
        f"cel-numpy localize: error: cannot write {out / 'report.json'}: No space left on "
        "device; free some space, then rerun the same command to resume\n"
    )
    assert not (out / "report.json.tmp").exists() and not (out / "report.json.tmp").is_symlink()
    assert run_cli(localize_argv(params, out))[0] == 0


def test_a_full_disk_while_appending_records_names_the_records_file(tmp_path, monkeypatch):
    import errno
    import os

    real_fsync = os.fsync

    def fsync(fd):
        if os.readlink(f"/proc/self/fd/{fd}").endswith("screen.jsonl"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    params = theory_params(tmp_path)
    out = tmp_path / "run"
    status, err = run_cli(localize_argv(params, out))
    assert status == 2
    assert err == (
        f"cel-numpy localize: error: cannot write {out / 'screen.jsonl'}: No space left on "
        "device; free some space, then rerun the same command to resume\n"
    )
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert run_cli(localize_argv(params, out))[0] == 0


# --------------------------------------------------------------------------- non-finite logits


@pytest.mark.parametrize("task", ["agreement", "greater_than"])  # choice- and generate-scored
def test_non_finite_logits_in_a_localization_are_an_error_not_a_score(tmp_path, task):
    """Finite weights whose logits overflow float32: the baseline stops with one line; no
    records are written as if the NaN/Inf were an answer."""
    folder = rewrite_safetensors(
        tiny_lm(tmp_path),
        lambda w: w.update({"transformer.ln_f.weight": w["transformer.ln_f.weight"] * 1e38}),
    )
    out = tmp_path / "run"
    argv = lm_argv(str(folder), str(out), "baseline")
    argv[argv.index("agreement")] = task
    status, err = run_cli(argv)
    assert status == 2, err
    assert err.splitlines()[-1].startswith("cel-numpy localize: error: ")
    assert "non-finite logits (NaN or Inf), which are never scored" in err
    assert len(err.splitlines()) == 1
    records = out / "baseline.jsonl"
    assert not records.exists() or records.read_bytes() == b""


@pytest.mark.parametrize(
    "line",
    [b"5", b"[1, 2]", b"[" * 100_000 + b"]" * 100_000, b'{"id": "x"}'],
    ids=["a-number", "a-list", "nested-100000-deep", "missing-fields"],
)
def test_a_panel_line_of_the_wrong_shape_is_one_line(tmp_path, line):
    params = theory_params(tmp_path)
    out = tmp_path / "run"
    assert run_cli(localize_argv(params, out, "--stage", "baseline"))[0] == 0
    panel = out / "panels" / "heldout.jsonl"
    lines = panel.read_bytes().split(b"\n")
    lines[2] = line
    panel.write_bytes(b"\n".join(lines))
    status, err = run_cli(localize_argv(params, out, "--stage", "baseline"))
    assert status == 2
    assert err == f"cel-numpy localize: error: {panel}:3: malformed panel line; use a fresh --out\n"


def test_an_inf_in_a_gguf_weight_is_one_line_without_numpy_warnings(tmp_path):
    """Through a real process (where NumPy's RuntimeWarnings would reach stderr): an Inf stored
    in a GGUF weight is refused at load in exactly one line naming the tensor."""
    import os
    import subprocess
    import sys

    import gguf
    from helpers import all_f32, write_tiny_gguf

    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, all_f32)
    tensor = next(t for t in gguf.GGUFReader(path).tensors if t.name == "blk.1.attn_norm.weight")
    data = bytearray(path.read_bytes())
    data[tensor.data_offset : tensor.data_offset + 4] = np.float32(np.inf).tobytes()
    path.write_bytes(bytes(data))
    proc = subprocess.run(
        [sys.executable, "-m", "cel_numpy.cli", "generate", "--model", str(path), "hi"],
        capture_output=True,
        text=True,
        env={**os.environ, "OPENBLAS_NUM_THREADS": "1"},
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        f"cel-numpy generate: error: {path}: tensor blk.1.attn_norm.weight holds 1 non-finite "
        "values (NaN or Inf) of 32; the file is damaged: download it again"
    ], proc.stderr


def test_overflowing_logits_are_one_line_without_numpy_warnings(tmp_path):
    """Finite weights whose forward overflows float32, in a real process: NumPy's overflow
    RuntimeWarnings do not reach stderr; the one line says what happened."""
    import os
    import subprocess
    import sys

    from helpers import rewrite_safetensors

    folder = rewrite_safetensors(
        tiny_lm(tmp_path),
        lambda w: w.update({"transformer.ln_f.weight": w["transformer.ln_f.weight"] * 1e38}),
    )
    proc = subprocess.run(
        [sys.executable, "-m", "cel_numpy.cli", "generate", "--model", str(folder), "hello"],
        capture_output=True,
        text=True,
        env={**os.environ, "OPENBLAS_NUM_THREADS": "1"},
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        "cel-numpy generate: error: the model produced non-finite logits (NaN or Inf), which are "
        "never scored: its weights overflow in this dtype (try float64: generate and attention "
        "--dtype float64, or load_model(..., dtype='float64')) or the model file is damaged"
    ], proc.stderr
