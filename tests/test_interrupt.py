"""Interrupted localization runs: Ctrl-C and SIGKILL mid-stage, then resume.

A real `cel-numpy localize` runs in a subprocess on a random 8-head theory model (params.npz
written here; 84 joint conditions, so a stage can be caught in the middle). The subprocess runs
through a small driver that logs every stage it enters and every condition it evaluates, and
can sleep per condition so the test can interrupt it during the joint stage. After the
interruption the same command is rerun, and the test checks that

  * no finished condition is evaluated again: the resumed run evaluates exactly the joint
    conditions that were not complete on disk, in plan order, and nothing of the finished stages;
  * no partial record is accepted: a torn (unterminated) line left by a kill is dropped, a half
    line appended to a finished stage's records is refused, an edited record of an unfinished
    stage fails its block's checksum (<stage>.sums);
  * the results equal those of an uninterrupted run: every records file byte for byte, every
    done-file apart from its timestamp, finalists.json and report.json;
  * a second writer is refused by the lock while the first runs; a lock left by SIGKILL is
    taken over with a note (its pid is no longer running).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from cel_numpy.cli import main
from cel_numpy.theory.model import init_params

N_DISCOVERY = N_HELDOUT = 30
N_JOINT = 28 + 56  # pairs and triples of 8 nominees
STAGES = ("baseline", "screen", "joint", "confirm", "heldout", "crosstask")

DRIVER = r"""
import os, signal, sys, time

# A shell without job control starts background commands with SIGINT ignored, and Python then
# never turns SIGINT into KeyboardInterrupt: restore the default so that these tests send the
# same Ctrl-C however the test suite itself was started (e.g. `make test &` in a script).
signal.signal(signal.SIGINT, signal.default_int_handler)
from cel_numpy.localize import evaluate, routine

LOG, DELAY = os.environ["CEL_TEST_LOG"], float(os.environ.get("CEL_TEST_DELAY", "0"))


def log(line):
    with open(LOG, "a") as fh:
        fh.write(line + "\n")


run_stage = routine.Localizer._run_stage
evaluate_condition = evaluate.TheoryEvaluator.evaluate_condition


def logged_stage(self, stage, *args, **kwargs):
    log(f"stage {stage}")
    return run_stage(self, stage, *args, **kwargs)


def logged_condition(self, items, cond):
    log(f"eval {evaluate.condition_name(cond)}")
    time.sleep(DELAY)
    return evaluate_condition(self, items, cond)


routine.Localizer._run_stage = logged_stage
evaluate.TheoryEvaluator.evaluate_condition = logged_condition
from cel_numpy.cli import main

sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(params.npz, driver script, finished reference run directory)."""
    root = tmp_path_factory.mktemp("interrupt")
    params = init_params(
        np.random.default_rng(0), n_heads=8, n_types=8, d_content=8, init_scale=1.0
    )
    np.savez(root / "params.npz", **params)
    driver = root / "driver.py"
    driver.write_text(DRIVER)
    reference = root / "reference"
    assert main(argv(root / "params.npz", reference) + ["--quiet"]) == 0
    return root / "params.npz", driver, reference


def argv(params: Path, out: Path) -> list[str]:
    return [
        "localize",
        "--model",
        f"theory:{params}",
        "--task",
        "A",
        "--discovery",
        str(N_DISCOVERY),
        "--heldout",
        str(N_HELDOUT),
        "--out",
        str(out),
    ]


# Seconds per condition of a run the test interrupts mid-joint-stage (the joint stage then lasts
# 175 x 0.1 s: time enough to send the signal).
SLOW = 0.1


def start(
    driver: Path, params: Path, out: Path, log: Path, delay: float, *extra: str
) -> subprocess.Popen:
    env = {
        **os.environ,
        "CEL_TEST_LOG": str(log),
        "CEL_TEST_DELAY": str(delay),
        "OPENBLAS_NUM_THREADS": "1",
    }
    return subprocess.Popen(
        [sys.executable, str(driver), *argv(params, out), *extra],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def wait_for_joint_records(proc: subprocess.Popen, out: Path, timeout: float = 60.0) -> None:
    """Return once the joint stage has appended its first chunk of blocks and their checksums
    (the run is mid-stage)."""
    records = out / "joint.sums"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if records.exists() and records.stat().st_size > 0:
            return
        if proc.poll() is not None:
            pytest.fail(
                f"the run ended (status {proc.returncode}) before the joint stage: "
                f"{proc.stderr.read()}"
            )
        time.sleep(0.02)
    proc.kill()
    pytest.fail("the joint stage did not start within the timeout")


def complete_blocks(records: Path) -> list[str]:
    """Names of the blocks whose every line (one per discovery item) is on disk,
    newline-terminated."""
    lines = records.read_bytes().split(b"\n")[
        :-1
    ]  # the part after the last newline is not a record
    names = [json.loads(line)["block"] for line in lines]
    blocks = []
    for i in range(0, len(names) - N_DISCOVERY + 1, N_DISCOVERY):
        assert len(set(names[i : i + N_DISCOVERY])) == 1, f"blocks interleaved at line {i + 1}"
        blocks.append(names[i])
    return blocks


def kept_blocks(out: Path, stage: str) -> list[str]:
    """The complete blocks a resume keeps: those with a checksum line in <stage>.sums (a kill
    between writing a block and its checksum leaves the block to be recomputed)."""
    path = out / f"{stage}.sums"
    sums = path.read_bytes().split(b"\n")[:-1] if path.exists() else []
    blocks = complete_blocks(out / f"{stage}.jsonl")
    assert [line.split(b" ", 1)[1].decode() for line in sums] == blocks[: len(sums)]
    return blocks[: len(sums)]


def evaluations_by_stage(log: Path) -> dict[str, list[str]]:
    """Condition names evaluated in each stage, in order, from the driver's log."""
    by_stage: dict[str, list[str]] = {}
    stage = None
    for line in log.read_text().splitlines():
        kind, name = line.split(" ", 1)
        if kind == "stage":
            stage = name
            by_stage.setdefault(stage, [])
        else:
            by_stage[stage].append(name)
    return by_stage


def assert_same_results(out: Path, reference: Path, resumed: dict[str, int] | None = None) -> None:
    """Same records, done-files, finalists, panels and report as the uninterrupted reference;
    `resumed`: records each stage's finishing process found already written (default none)."""
    for stage in STAGES:
        assert (out / f"{stage}.jsonl").read_bytes() == (
            reference / f"{stage}.jsonl"
        ).read_bytes(), stage
        done, ref_done = (
            json.loads((d / f"{stage}.done.json").read_text()) for d in (out, reference)
        )
        for key in ("finished", "seconds"):  # when and how long, not what
            done.pop(key), ref_done.pop(key)
        assert ref_done.pop("records_resumed") == 0, stage
        assert done.pop("records_resumed") == (resumed or {}).get(stage, 0), stage
        assert done == ref_done, stage
    for name in ("finalists.json", "panels/discovery.jsonl", "panels/heldout.jsonl"):
        assert (out / name).read_text() == (reference / name).read_text(), name
    report, ref_report = (json.loads((d / "report.json").read_text()) for d in (out, reference))
    report.pop("stage_seconds"), ref_report.pop("stage_seconds")
    assert report == ref_report
    assert not (out / "lock").exists()


def joint_plan(reference: Path) -> list[str]:
    return complete_blocks(reference / "joint.jsonl")


def resume_and_check(driver, params, out, reference, log, on_disk: list[str]) -> str:
    """Rerun the same command; check what it evaluated and what it produced; return its stderr."""
    proc = start(driver, params, out, log, 0.0)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    evaluated = evaluations_by_stage(log)
    for stage in ("baseline", "screen"):
        assert evaluated[stage] == [], (
            f"{stage} was finished, yet evaluated again: {evaluated[stage]}"
        )
    plan = joint_plan(reference)
    assert plan[: len(on_disk)] == on_disk
    assert evaluated["joint"] == plan[len(on_disk) :], (
        "the resumed joint stage must evaluate exactly what was missing"
    )
    assert f"joint      resuming after {len(on_disk)} of {N_JOINT} conditions" in stderr
    n_items = json.loads((reference / "joint.done.json").read_text())["n_records"] // N_JOINT
    assert_same_results(out, reference, {"joint": len(on_disk) * n_items})
    return stderr


def test_ctrl_c_mid_stage_then_resume(setup, tmp_path):
    params, driver, reference = setup
    out = tmp_path / "run"
    proc = start(driver, params, out, tmp_path / "first.log", SLOW, "--quiet")
    wait_for_joint_records(proc, out)

    second = start(driver, params, out, tmp_path / "second.log", 0.0, "--quiet")  # a second writer
    _, err2 = second.communicate(timeout=60)
    assert second.returncode == 2
    assert (
        err2.strip() == f"cel-numpy localize: error: {out / 'lock'} is held by pid {proc.pid} on "
        f"{os.uname().nodename}: another run is writing here"
    ), err2

    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert stderr.splitlines() == [
        "cel-numpy localize: interrupted; rerun the same command to resume"
    ], stderr
    assert not (out / "lock").exists(), "Ctrl-C must release the lock"
    assert not (out / "joint.done.json").exists()
    on_disk = kept_blocks(out, "joint")
    assert 0 < len(on_disk) < N_JOINT, "the interruption should land inside the joint stage"

    resume_and_check(driver, params, out, reference, tmp_path / "resume.log", on_disk)


def test_sigkill_mid_stage_torn_line_then_resume(setup, tmp_path):
    params, driver, reference = setup
    out = tmp_path / "run"
    proc = start(driver, params, out, tmp_path / "first.log", SLOW, "--quiet")
    wait_for_joint_records(proc, out)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert (out / "lock").read_text().split()[0] == str(proc.pid), "SIGKILL leaves the lock behind"
    on_disk = kept_blocks(out, "joint")
    assert 0 < len(on_disk) < N_JOINT
    with open(out / "joint.jsonl", "ab") as fh:  # a write cut short: half a record, no newline
        fh.write(b'{"block": "L0H1+L0H2", "panel": "discovery", "heads": [[0, 1], [0')

    stderr = resume_and_check(driver, params, out, reference, tmp_path / "resume.log", on_disk)
    assert f"taking over the stale lock {out / 'lock'} of pid {proc.pid}" in stderr
    assert "lines of an incomplete block)" in stderr  # the torn line was dropped, not parsed


def test_half_line_appended_to_a_finished_stage_is_refused(setup, tmp_path, capsys):
    params, _, reference = setup
    out = tmp_path / "run"
    shutil.copytree(reference, out)
    records = out / "screen.jsonl"
    before = records.read_bytes()
    with open(records, "ab") as fh:
        fh.write(b'{"block": "L0H3", "panel": "disc')
    assert main(argv(params, out) + ["--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"cel-numpy localize: error: {records} does not match screen.done.json (sha256 differs: "
        "edited or corrupted); use a fresh --out, or delete screen.jsonl and screen.done.json "
        "(and every later stage) to redo it"
    ], err
    assert records.read_bytes() == before + b'{"block": "L0H3", "panel": "disc', (
        "a refused run must not touch the records"
    )


def test_ctrl_c_with_worker_processes_is_one_line(setup, tmp_path):
    params, driver, reference = setup
    out = tmp_path / "run"
    proc = start(driver, params, out, tmp_path / "first.log", SLOW, "--quiet", "--workers", "2")
    wait_for_joint_records(proc, out)
    os.killpg(proc.pid, signal.SIGINT)  # the whole process group, workers included
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert stderr.splitlines() == [
        "cel-numpy localize: interrupted; rerun the same command to resume"
    ], stderr
    on_disk = kept_blocks(out, "joint")
    resume_and_check(driver, params, out, reference, tmp_path / "resume.log", on_disk)


# --------------------------------------------------------------------------- worker processes


def children(pid: int) -> list[int]:
    """Live (not zombie) processes whose parent is `pid` (Linux /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # exited meanwhile
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has ended; only its exit status waits for a reaper


def open_files(pid: int) -> set[str]:
    out = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            out.add(os.readlink(fd))
        except OSError:
            pass
    return out


def wait_gone(pids: list[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_killed_parent_takes_its_workers_along_and_the_rerun_resumes(setup, tmp_path, sig):
    """The parent of a --workers 2 run is killed mid-stage (only the parent, not its group): the
    workers end within seconds, none of them ever held the lock, and the same command resumes
    to the uninterrupted result."""
    params, driver, reference = setup
    out = tmp_path / "run"
    proc = start(driver, params, out, tmp_path / "first.log", SLOW, "--quiet", "--workers", "2")
    wait_for_joint_records(proc, out)
    workers = children(proc.pid)
    assert len(workers) == 2, workers
    lock = str(out / "lock")
    assert lock in open_files(proc.pid)
    for pid in workers:
        assert lock not in open_files(pid), "a worker holds the run directory's lock"

    os.kill(proc.pid, sig)
    _, stderr = proc.communicate(timeout=60)
    survivors = wait_gone(workers, 5.0)
    assert survivors == [], f"workers {survivors} outlived their parent"
    if sig == signal.SIGTERM:  # like Ctrl-C: one line, 128 + 15, the lock released
        assert proc.returncode == 143, stderr
        assert stderr.splitlines() == [
            "cel-numpy localize: terminated (SIGTERM); rerun the same command to resume"
        ], stderr
        assert not (out / "lock").exists()
    else:
        assert proc.returncode == -signal.SIGKILL
    on_disk = kept_blocks(out, "joint")
    assert 0 < len(on_disk) < N_JOINT
    resume_and_check(driver, params, out, reference, tmp_path / "resume.log", on_disk)


def test_sigterm_without_workers_is_like_ctrl_c(setup, tmp_path):
    params, driver, reference = setup
    out = tmp_path / "run"
    proc = start(driver, params, out, tmp_path / "first.log", SLOW, "--quiet")
    wait_for_joint_records(proc, out)
    proc.terminate()
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143, stderr
    assert stderr.splitlines() == [
        "cel-numpy localize: terminated (SIGTERM); rerun the same command to resume"
    ], stderr
    assert not (out / "lock").exists(), "SIGTERM must release the lock"
    on_disk = kept_blocks(out, "joint")
    resume_and_check(driver, params, out, reference, tmp_path / "resume.log", on_disk)


def test_a_worker_killed_from_outside_is_one_line_and_the_rerun_resumes(setup, tmp_path):
    """What the out-of-memory killer does: SIGKILL to one worker. The parent stops the others,
    says what happened in one line (exit status 2), and the same command resumes."""
    params, driver, reference = setup
    out = tmp_path / "run"
    proc = start(driver, params, out, tmp_path / "first.log", SLOW, "--quiet", "--workers", "2")
    wait_for_joint_records(proc, out)
    workers = children(proc.pid)
    os.kill(workers[0], signal.SIGKILL)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 2, stderr
    assert stderr.splitlines() == [
        "cel-numpy localize: error: a worker process died (killed from outside, often by the "
        f"out-of-memory killer); the finished conditions are kept in {out}: rerun the same "
        "command to resume (with fewer --workers if memory is short)"
    ], stderr
    assert wait_gone(workers, 5.0) == []
    on_disk = kept_blocks(out, "joint")
    resume_and_check(driver, params, out, reference, tmp_path / "resume.log", on_disk)


# --------------------------------------------------------------------------- block checksums


def unfinished_joint(reference: Path, out: Path, keep_blocks: int) -> None:
    """A copy of the reference run whose joint stage stopped after `keep_blocks` blocks."""
    shutil.copytree(reference, out)
    for name in ("joint.done.json", "finalists.json", "confirm.jsonl", "confirm.done.json"):
        (out / name).unlink()
    for stage in ("heldout", "crosstask"):
        for suffix in (".jsonl", ".done.json", ".sums"):
            (out / f"{stage}{suffix}").unlink(missing_ok=True)
    (out / "confirm.sums").unlink(missing_ok=True)
    for name in ("report.json", "report.md"):
        (out / name).unlink(missing_ok=True)
    records = (out / "joint.jsonl").read_bytes().split(b"\n")[:-1]
    (out / "joint.jsonl").write_bytes(
        b"".join(r + b"\n" for r in records[: keep_blocks * N_DISCOVERY])
    )
    sums = (out / "joint.sums").read_bytes().split(b"\n")[:-1]
    (out / "joint.sums").write_bytes(b"".join(s + b"\n" for s in sums[:keep_blocks]))


def test_an_edited_record_of_an_unfinished_stage_is_refused(setup, tmp_path, capsys):
    """Each appended block carries a sha256 in joint.sums: flipping one record's verdict in a
    complete block of an unfinished stage is refused on resume, naming the block."""
    params, _, reference = setup
    out = tmp_path / "run"
    unfinished_joint(reference, out, keep_blocks=5)
    lines = (out / "joint.jsonl").read_bytes().split(b"\n")
    target = 2 * N_DISCOVERY + 3  # a record of the third block
    record = json.loads(lines[target])
    record["correct"] = not record["correct"]
    lines[target] = json.dumps(record).encode()
    (out / "joint.jsonl").write_bytes(b"\n".join(lines))
    assert main(argv(params, out) + ["--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"cel-numpy localize: error: {out / 'joint.jsonl'}: block {record['block']} does not match "
        "its checksum in joint.sums (edited or corrupted); use a fresh --out, or delete "
        "joint.jsonl and joint.done.json (and every later stage) to redo it"
    ], err


def test_a_block_without_its_checksum_is_recomputed(setup, tmp_path):
    """Killed between a block's records and its checksum: the block is dropped and recomputed,
    and the result equals the uninterrupted run."""
    params, driver, reference = setup
    out = tmp_path / "run"
    unfinished_joint(reference, out, keep_blocks=5)
    sums = (out / "joint.sums").read_bytes().split(b"\n")[:-1]
    (out / "joint.sums").write_bytes(b"".join(s + b"\n" for s in sums[:4]) + sums[4][:20])
    on_disk = kept_blocks(out, "joint")
    assert len(on_disk) == 4
    stderr = resume_and_check(driver, params, out, reference, tmp_path / "resume.log", on_disk)
    assert f"dropped {N_DISCOVERY} lines" in stderr
