"""Running model-written Python with its tests: a fresh, limited, isolated process per program.

    check_program(program, tests, timeout=3.0) -> bool    True iff every test passes
    run_program(program, tests, timeout=3.0, setup="") -> RunResult   the outcome, for reports

The file that runs is `setup + "\\n" + program + "\\n" + "\\n".join(tests)` (the MBPP layout of
the paper's released scorer): it passes iff it exits with status 0 within the timeout.

Every program gets (`sandbox_launch.py` does the setting up):
  * a fresh `python -I` process (no user site, no PYTHON* variables, no script directory on the
    path), an empty environment, stdin closed, an empty temporary working directory, its own
    session (the whole process group is killed at the timeout);
  * setrlimit: CPU seconds (ceil(timeout) + 1), address space (512 MiB), file size (1 MiB),
    open files (64), processes (32), no core files;
  * its output captured and capped (64 KiB of stdout and of stderr are kept, the rest read and
    dropped, so a flood neither fills memory nor blocks the program);
  * where Linux namespaces are available (`isolation()` says so; checked once per process by
    running a probe program): no network (an empty network namespace), a read-only view of every
    file system (the working directory is a private 16 MiB tmpfs that vanishes with the run), its
    own /proc and process numbering (no other process can be seen or signalled), a nested user
    namespace without capabilities, and every process it started killed when it ends. As root,
    the program runs as nobody (uid 65534) either way.

Outcomes: "passed" (exit status 0), "failed" (another exit status: a failed assert, an
exception), "timed_out" (killed at the wall-clock timeout), "crashed" (killed by a signal such as
SIGSEGV), "limit" (stopped by a resource limit: CPU time, memory, file size, open files,
processes -- read from the signal or from the last line of the traceback, so a program can fake
this label, never a pass). What it guarantees and what it does not: docs/design.md, "Running
model-written code".

Consent: code runs only when the user asked for it (`--allow-code-execution`, or
CEL_NUMPY_ALLOW_CODE_EXECUTION=1; `require_consent` raises a one-line OptionError otherwise).
Calling `check_program` or `run_program` yourself is that consent.
"""

from __future__ import annotations

import functools
import json
import math
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from cel_numpy.errors import OptionError, UserError

CONSENT_VARIABLE = "CEL_NUMPY_ALLOW_CODE_EXECUTION"
OUTCOMES = ("passed", "failed", "timed_out", "crashed", "limit")
LAUNCHER = Path(__file__).with_name("sandbox_launch.py")


class SandboxError(UserError, RuntimeError):
    """The sandbox itself could not be set up (never a score: the run stops)."""


@dataclass(frozen=True)
class Limits:
    """Resource limits of one program (setrlimit), and how much of its output is kept."""

    memory_bytes: int = 512 * 2**20  # RLIMIT_AS
    file_bytes: int = 2**20  # RLIMIT_FSIZE: largest file it can write
    open_files: int = 64  # RLIMIT_NOFILE
    processes: int = 32  # RLIMIT_NPROC (per user: threads count too)
    output_bytes: int = 64 * 2**10  # kept of stdout and of stderr, each
    tmpfs_bytes: int = 16 * 2**20  # size of the private working directory (isolated runs)

    def rlimits(self, timeout: float) -> dict[str, int]:
        """setrlimit names -> value (soft = hard) for a program with this wall-clock timeout."""
        return {
            "RLIMIT_CPU": int(math.ceil(timeout)) + 1,
            "RLIMIT_AS": self.memory_bytes,
            "RLIMIT_FSIZE": self.file_bytes,
            "RLIMIT_NOFILE": self.open_files,
            "RLIMIT_NPROC": self.processes,
            "RLIMIT_CORE": 0,
        }


LIMITS = Limits()


@dataclass(frozen=True)
class RunResult:
    """What happened to one program."""

    outcome: str  # one of OUTCOMES
    returncode: int | None  # exit status; -N: killed by signal N; None: timed out
    stdout: str  # at most Limits.output_bytes of it (decoded with replacement)
    stderr: str
    truncated: bool  # more output was written than was kept
    seconds: float  # wall time, start to end of the process group
    isolated: bool  # ran with the namespaces of `isolation()`

    @property
    def passed(self) -> bool:
        return self.outcome == "passed"


@dataclass(frozen=True)
class Isolation:
    available: bool
    reason: str  # why not (empty when available)


# --------------------------------------------------------------------------- consent


def consent_given() -> bool:
    """The user allowed running model-written code (the flag sets the variable too, so worker
    processes inherit the consent)."""
    return os.environ.get(CONSENT_VARIABLE, "") not in ("", "0")


def grant_consent() -> None:
    """What `--allow-code-execution` does: consent for this process and its children."""
    os.environ[CONSENT_VARIABLE] = "1"


def require_consent(what: str) -> None:
    """OptionError (one line, exit 2) unless the user allowed code execution."""
    if not consent_given():
        raise OptionError(
            f"{what} runs Python code written by the model on this machine (in a sandbox, "
            "docs/design.md 'Running model-written code'); allow it with --allow-code-execution "
            f"or {CONSENT_VARIABLE}=1"
        )


# --------------------------------------------------------------------------- running


def program_text(program: str, tests: list[str], setup: str = "") -> str:
    """The file that runs: setup, the program, then the tests (the released scorer's layout)."""
    return setup + "\n" + program + "\n" + "\n".join(tests) + "\n"


def run_program(
    program: str,
    tests: list[str],
    timeout: float = 3.0,
    *,
    setup: str = "",
    limits: Limits = LIMITS,
    isolate: bool | None = None,
) -> RunResult:
    """Run setup + program + tests in the sandbox; isolate None: whenever `isolation()` allows.

    isolate=True where isolation is unavailable raises SandboxError; False runs without the
    namespaces (limits only).
    """
    if not timeout > 0:
        raise OptionError(f"timeout must be > 0 seconds, got {timeout!r}")
    iso = isolation()
    if isolate is None:
        isolate = iso.available
    elif isolate and not iso.available:
        raise SandboxError(f"sandbox isolation is unavailable here: {iso.reason}")
    return _run(program_text(program, tests, setup), timeout, limits, bool(isolate))


def check_program(program: str, tests: list[str], timeout: float = 3.0) -> bool:
    """True iff the program with its tests exits with status 0 within `timeout` seconds."""
    return run_program(program, tests, timeout).passed


def _run(source: str, timeout: float, limits: Limits, isolate: bool) -> RunResult:
    workdir = tempfile.mkdtemp(prefix="cel-numpy-sandbox-")
    try:
        (Path(workdir) / "program.py").write_text(source, encoding="utf-8")
        return _supervise(workdir, timeout, limits, isolate)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _supervise(workdir: str, timeout: float, limits: Limits, isolate: bool) -> RunResult:
    """Start the launcher, collect capped output and its status until exit or the deadline."""
    status_r, status_w = os.pipe()
    config = {
        "workdir": workdir,
        "isolate": isolate,
        "python": sys.executable,
        "limits": limits.rlimits(timeout),
        "tmpfs_bytes": limits.tmpfs_bytes,
        "no_new_processes": can_forbid_new_processes(),
        "status_fd": status_w,
    }
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", str(LAUNCHER), json.dumps(config)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={},
            cwd=workdir,
            start_new_session=True,
            pass_fds=(status_w,),
        )
    finally:
        os.close(status_w)
    streams = {proc.stdout: bytearray(), proc.stderr: bytearray(), status_r: bytearray()}
    caps = {proc.stdout: limits.output_bytes, proc.stderr: limits.output_bytes, status_r: 4096}
    truncated, timed_out = False, False
    deadline = start + timeout
    with selectors.DefaultSelector() as sel:
        for stream in streams:
            sel.register(stream, selectors.EVENT_READ)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            for key, _ in sel.select(left):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                buf = streams[key.fileobj]
                room = max(0, caps[key.fileobj] - len(buf))
                buf += chunk[:room]
                truncated |= len(chunk) > room and key.fd != status_r
    if not timed_out:
        timed_out = not _wait_unreaped(proc, deadline)
    _kill_group(proc)
    proc.wait()
    seconds = time.monotonic() - start
    for stream in (proc.stdout, proc.stderr):
        stream.close()
    os.close(status_r)
    lines = streams[status_r].decode("utf-8", "replace").splitlines()
    errors = [line for line in lines if line.startswith("error")]
    if errors or "ready" not in lines and not timed_out:
        said = errors[0] if errors else f"the launcher exited with status {proc.returncode}"
        raise SandboxError(f"the code sandbox could not be set up: {said}")
    if isolate:
        raw = [int(line.split()[1]) for line in lines if line.startswith("status ")]
        returncode = os.waitstatus_to_exitcode(raw[0]) if raw and not timed_out else None
    else:
        returncode = None if timed_out else proc.returncode
    stdout = bytes(streams[proc.stdout]).decode("utf-8", "replace")
    stderr = bytes(streams[proc.stderr]).decode("utf-8", "replace")
    return RunResult(
        outcome=_outcome(returncode, stderr, timed_out),
        returncode=returncode,
        stdout=stdout,
        stderr=stderr,
        truncated=truncated,
        seconds=seconds,
        isolated=isolate,
    )


def _wait_unreaped(proc: subprocess.Popen, deadline: float) -> bool:
    """Wait for the launcher to exit by the deadline without reaping it (its pid stays its process
    group's number, so killing the group afterwards cannot hit a newcomer). False: deadline."""
    while True:
        if hasattr(os, "waitid"):
            info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG)
            if info is not None:
                return True
        elif proc.poll() is not None:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# Last traceback lines that mean a resource limit stopped the program, not its own logic.
_LIMIT_ERRORS = (
    "MemoryError",
    "OSError: [Errno 27] File too large",
    "OSError: [Errno 24] Too many open files",
    "BlockingIOError: [Errno 11] Resource temporarily unavailable",
)
_LIMIT_SIGNALS = (signal.SIGXCPU, signal.SIGXFSZ, signal.SIGKILL)


def _outcome(returncode: int | None, stderr: str, timed_out: bool) -> str:
    if timed_out:
        return "timed_out"
    if returncode == 0:
        return "passed"
    if returncode is not None and returncode < 0:
        return "limit" if -returncode in _LIMIT_SIGNALS else "crashed"
    last = stderr.strip().rsplit("\n", 1)[-1] if stderr.strip() else ""
    return "limit" if last.startswith(_LIMIT_ERRORS) else "failed"


# --------------------------------------------------------------------------- isolation


def can_forbid_new_processes() -> bool:
    """A seccomp filter can stop the program from starting processes (Linux x86_64, aarch64)."""
    return sys.platform.startswith("linux") and os.uname().machine in ("x86_64", "aarch64")


_PROBE = """\
import os, socket
try:
    open("/probe-write-outside", "w")
    raise SystemExit("a file outside the working directory could be created")
except OSError:
    pass
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.settimeout(0.5)
try:
    s.connect(("1.1.1.1", 53))
    raise SystemExit("the network is reachable")
except OSError:
    pass
assert os.getpid() < 10, "its own process numbering"
open("inside.txt", "w").write("x")
"""


@functools.lru_cache(maxsize=1)
def isolation() -> Isolation:
    """Whether programs can run in Linux namespaces here (a probe program run once per process:
    it must be unable to write outside its directory or reach the network, and see its own pid
    numbering)."""
    if not sys.platform.startswith("linux"):
        return Isolation(False, f"Linux namespaces do not exist on {sys.platform}")
    try:
        result = _run(program_text(_PROBE, []), 10.0, LIMITS, isolate=True)
    except SandboxError as err:
        return Isolation(False, str(err).split(": ", 1)[-1])
    if not result.passed:
        last = result.stderr.strip().rsplit("\n", 1)[-1] if result.stderr.strip() else ""
        return Isolation(False, f"the isolation probe {result.outcome}: {last}")
    return Isolation(True, "")


def isolation_notice() -> str | None:
    """One line for the start of a run when programs will run without OS isolation, else None."""
    iso = isolation()
    if iso.available:
        return None
    return (
        "cel-numpy: note: model-written code runs WITHOUT OS isolation here (only process limits "
        f"and a temporary directory: it can read your files and use the network): {iso.reason}"
    )
