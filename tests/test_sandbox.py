"""The code sandbox: real programs pass and fail as they should; hostile ones are contained.

Every hostile program below is written so that it would PASS if its attack worked (it asserts
that it got what it wanted): a contained attack is a failed problem. Each test also checks that
nothing outside the program's directory changed (a guarded folder with a file, per test), that
no process of the run is left behind, and the test process itself is the parent that survives.
The hostile tests need the OS isolation (Linux namespaces) this machine provides: they fail,
never skip, where it is missing -- some attacks (signalling every process of the user) are only
contained by it.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import pytest

from cel_numpy import sandbox
from cel_numpy.errors import OptionError
from cel_numpy.sandbox import LIMITS, check_program, run_program
from cel_numpy.tasks.mbpp import Mbpp

FIXTURE = Path(__file__).parent / "fixtures" / "mbpp_sample.json"
SHORT = 1.5  # seconds: the timeout of hostile programs that run until stopped


@pytest.fixture(scope="module")
def mbpp_sample():
    return json.loads(FIXTURE.read_text())


@pytest.fixture
def guarded(tmp_path):
    """A folder outside the sandbox with one file; the test fails if either changes."""
    folder = tmp_path / "guarded"
    folder.mkdir()
    (folder / "keep.txt").write_text("precious\n")
    yield folder
    assert sorted(p.name for p in folder.iterdir()) == ["keep.txt"], "a file appeared or vanished"
    assert (folder / "keep.txt").read_text() == "precious\n", "a file outside was changed"


def leftover_processes() -> list[str]:
    """Command lines of live processes that belong to a sandbox run (its work directory)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if b"cel-numpy-sandbox-" in cmdline and int(pid) != os.getpid():
            found.append(cmdline.decode(errors="replace"))
    return found


def contained(program: str, timeout: float = SHORT, tests=()) -> sandbox.RunResult:
    """Run a hostile program: it must not pass and must leave no process behind."""
    assert sandbox.isolation().available, (
        f"this machine should give the sandbox OS isolation: {sandbox.isolation().reason}"
    )
    result = run_program(program, list(tests), timeout)
    assert result.isolated
    assert not result.passed, f"attack succeeded:\n{result.stdout}\n{result.stderr}"
    assert leftover_processes() == []
    return result


# --------------------------------------------------------------------------- real programs


def test_gold_solutions_pass_and_broken_ones_fail(mbpp_sample):
    for row in mbpp_sample["rows"]:
        if row["test_setup_code"]:
            continue
        assert check_program(row["code"], row["test_list"]), row["task_id"]
        broken = row["code"] + "\n" + row["code"].split("(")[0].replace("def ", "") + " = None"
        assert not check_program(broken, row["test_list"]), row["task_id"]


def test_setup_code_runs_before_the_program_as_in_the_released_scorer(mbpp_sample):
    """Problem 367's setup builds trees with Node before the program defines Node: under the
    released layout (setup, program, tests) even its own solution fails, with a NameError."""
    (row,) = [r for r in mbpp_sample["rows"] if r["task_id"] == 367]
    result = run_program(row["code"], row["test_list"], setup=row["test_setup_code"])
    assert result.outcome == "failed"
    assert "NameError: name 'Node' is not defined" in result.stderr
    assert check_program(row["code"] + "\n" + row["test_setup_code"], row["test_list"])


def test_outcomes_of_ordinary_failures():
    assert run_program("def f(:\n", []).outcome == "failed"  # a syntax error
    assert run_program("def f(): return 1", ["assert f() == 2"]).outcome == "failed"
    assert run_program("raise SystemExit(3)", []).returncode == 3
    assert run_program("import ctypes\nctypes.string_at(0)", []).outcome == "crashed"


def test_the_program_runs_in_an_empty_environment_and_directory():
    program = (
        "import os, sys\n"
        "assert dict(os.environ) == {} or set(os.environ) <= {'LC_CTYPE'}, dict(os.environ)\n"
        "assert os.listdir('.') == ['program.py'], os.listdir('.')\n"
        "assert sys.stdin is None or sys.stdin.read() == ''\n"
        "assert sys.flags.isolated == 1\n"
    )
    result = run_program(program, [])
    assert result.passed, result.stderr


def test_limits_are_what_the_docs_say():
    assert LIMITS.rlimits(3.0) == {
        "RLIMIT_CPU": 4,
        "RLIMIT_AS": 512 * 2**20,
        "RLIMIT_FSIZE": 2**20,
        "RLIMIT_NOFILE": 64,
        "RLIMIT_NPROC": 32,
        "RLIMIT_CORE": 0,
    }


def test_threads_still_work():
    program = "import threading\nout = []\nt = threading.Thread(target=out.append, args=(1,))\n"
    program += "t.start(); t.join()\nassert out == [1]\n"
    assert check_program(program, [])


# --------------------------------------------------------------------------- hostile programs


def test_infinite_loop_times_out():
    result = contained("while True:\n    pass\n")
    assert result.outcome == "timed_out" and result.returncode is None


def test_sleeping_forever_times_out():
    assert contained("import time\ntime.sleep(10**6)\n").outcome == "timed_out"


def test_fork_bomb_is_stopped():
    result = contained("import os\nwhile True:\n    os.fork()\n")
    assert result.outcome == "limit", result.stderr
    assert "Resource temporarily unavailable" in result.stderr


def test_a_child_process_cannot_be_started_to_outlive_the_run(guarded):
    program = (
        "import subprocess\n"
        f"subprocess.Popen(['sh', '-c', 'sleep 2; echo late > {guarded}/late.txt'])\n"
    )
    assert contained(program).outcome == "limit"


def test_memory_bomb_is_stopped():
    for program in (
        "x = bytearray(2**31)\n",
        "b = []\nwhile True:\n    b.append(bytearray(10**8))\n",
    ):
        result = contained(program, timeout=10.0)
        assert result.outcome == "limit", result.stderr
        assert result.stderr.strip().endswith("MemoryError")


def test_megabytes_of_output_are_capped_and_do_not_block():
    result = contained("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n")
    assert result.outcome == "timed_out"
    assert result.truncated and len(result.stdout) == LIMITS.output_bytes
    result = contained("import sys\nsys.stderr.write('y' * 50_000_000)\nassert False\n")
    assert result.truncated and len(result.stderr) == LIMITS.output_bytes


def test_a_big_file_is_stopped_by_the_file_size_limit():
    result = contained("open('big', 'wb').write(b'0' * (4 * 2**20))\n")
    assert result.outcome == "limit", result.stderr


def test_many_files_fill_only_the_private_directory(guarded):
    program = "for i in range(40):\n    open(f'f{i}', 'wb').write(b'0' * (2**20 - 1))\n"
    result = contained(program)
    assert "No space left on device" in result.stderr, result.stderr


def test_writing_files_outside_its_directory_fails(guarded):
    targets = [guarded / "new.txt", guarded / "keep.txt", Path("/tmp/cel-numpy-sandbox-escape")]
    program = "written = 0\n"
    for target in targets:
        program += (
            f"try:\n    open({str(target)!r}, 'a').write('pwned')\n    written += 1\n"
            "except OSError:\n    pass\n"
        )
    program += "assert written\n"
    contained(program)
    assert not targets[2].exists()


def test_deleting_files_outside_its_directory_fails(guarded):
    program = (
        "import os, shutil\n"
        "removed = 0\n"
        f"for act in (lambda: os.remove({str(guarded / 'keep.txt')!r}),\n"
        f"            lambda: shutil.rmtree({str(guarded)!r}),\n"
        f"            lambda: os.rename({str(guarded / 'keep.txt')!r}, 'stolen')):\n"
        "    try:\n        act()\n        removed += 1\n    except OSError:\n        pass\n"
        "assert removed\n"
    )
    contained(program)


def test_the_parents_environment_cannot_be_read(monkeypatch):
    secret = "cel-numpy-test-secret-" + os.urandom(8).hex()
    monkeypatch.setenv("CEL_NUMPY_TEST_SECRET", secret)
    program = (
        "import os\n"
        f"secret = {secret!r}\n"
        "found = secret in repr(dict(os.environ))\n"
        "for pid in os.listdir('/proc'):\n"
        "    try:\n"
        "        found |= secret.encode() in open(f'/proc/{pid}/environ', 'rb').read()\n"
        "    except OSError:\n"
        "        pass\n"
        f"for pid in ({os.getpid()}, {os.getppid()}):\n"
        "    try:\n"
        "        found |= secret.encode() in open(f'/proc/{pid}/environ', 'rb').read()\n"
        "    except OSError:\n"
        "        pass\n"
        "assert found\n"
    )
    result = contained(program)
    assert secret not in result.stdout + result.stderr


def test_no_network_not_even_the_parents_loopback():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        server.settimeout(0.5)
        port = server.getsockname()[1]
        program = (
            "import socket\n"
            f"s = socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
            "s.sendall(b'pwned')\n"
        )
        result = contained(program)
        assert "Connection refused" in result.stderr or "unreachable" in result.stderr
        with pytest.raises(TimeoutError):
            server.accept()
    contained("import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=1)\n")


def test_the_parent_cannot_be_killed_or_signalled():
    parent = os.getpid()
    program = (
        "import os, signal\n"
        "hits = 0\n"
        f"for target in ({parent}, -{os.getpgid(parent)}, os.getppid(), 1):\n"
        "    for sig in (signal.SIGTERM, signal.SIGKILL):\n"
        "        try:\n"
        "            os.kill(target, sig)\n"
        "            hits += 1\n"
        "        except OSError:\n"
        "            pass\n"
        "os.kill(-1, signal.SIGKILL)  # every process it may signal, but itself\n"
        "assert hits\n"
    )
    contained(program)
    assert os.getpid() == parent  # still here: this line ran
    assert check_program("def f(): return 1", ["assert f() == 1"]), "the sandbox still works"


def test_recursion_tricks_fail():
    assert contained("def f():\n    return f()\nf()\n").outcome == "failed"
    deep = "import sys\nsys.setrecursionlimit(10**7)\ndef f(n):\n    return f(n + 1)\nf(0)\n"
    contained(deep, timeout=3.0)  # a crash, MemoryError or the timeout: any of them, not a pass
    nested = "eval('(' * 200000 + ')' * 200000)\n"
    assert contained(nested).outcome in ("failed", "limit")


def test_a_program_cannot_undo_its_read_only_view():
    program = (
        "import ctypes\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "MS_REMOUNT, MS_BIND = 32, 4096\n"
        "assert libc.mount(None, b'/', None, MS_REMOUNT | MS_BIND, None) == 0\n"
    )
    contained(program)


def test_a_sandbox_that_cannot_start_is_an_error_not_a_score(tmp_path, monkeypatch):
    monkeypatch.setattr(sandbox, "LAUNCHER", tmp_path / "missing_launcher.py")
    with pytest.raises(sandbox.SandboxError, match="the code sandbox could not be set up"):
        run_program("pass", [], isolate=False)


# --------------------------------------------------------------------------- consent


def test_the_mbpp_task_refuses_to_run_code_without_consent(mbpp_sample, monkeypatch):
    monkeypatch.delenv(sandbox.CONSENT_VARIABLE, raising=False)
    task = Mbpp(mbpp_sample["rows"], mbpp_sample["prompt_rows"])
    item = task.item_at("mbpp", 0)
    with pytest.raises(OptionError, match="--allow-code-execution"):
        task.is_correct(item, mbpp_sample["rows"][0]["code"])
    monkeypatch.setenv(sandbox.CONSENT_VARIABLE, "1")
    assert task.is_correct(item, mbpp_sample["rows"][0]["code"] + "\n[DONE]")


def test_localize_refuses_mbpp_without_consent_before_any_work(tmp_path, monkeypatch, capsys):
    from cel_numpy.cli import main

    monkeypatch.delenv(sandbox.CONSENT_VARIABLE, raising=False)
    out = tmp_path / "run"
    status = main(["localize", "--model", "smollm2", "--task", "mbpp", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1
    assert err[0].startswith("cel-numpy localize: error: --task mbpp runs Python code written by")
    assert "--allow-code-execution or CEL_NUMPY_ALLOW_CODE_EXECUTION=1" in err[0]
    assert not out.exists()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
