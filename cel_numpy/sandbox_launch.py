"""The first process of a sandboxed run: sets up isolation and limits, then runs the program.

Run by `cel_numpy.sandbox` as `python -I -S sandbox_launch.py CONFIG_JSON` with an empty
environment, stdin closed, its own session and the program at WORKDIR/program.py. Standard library
only (it runs before any isolation, with -I -S: no site-packages, no user paths). Never imported
by the package.

Isolated (Linux namespaces; see docs/design.md, "Running model-written code"):

    launcher (host)   unshare user+mount+net+pid+ipc+uts namespaces (root of them: the caller)
     `- init (pid 1)  mount_setattr("/", recursive read-only, nosuid, private); a fresh tmpfs on
         |            WORKDIR holding only program.py; a fresh /proc; waits for the program and
         |            writes its wait status on the status pipe; when it exits, the kernel kills
         |            every process left in the namespace
         `- program   a nested user namespace (uid 1000, no capabilities over the mounts);
                      setrlimit; the no-new-processes seccomp filter; "ready" on the status
                      pipe; exec python -I program.py

Not isolated: setrlimit, the seccomp filter, "ready", exec python -I program.py.

The status pipe (fd given in the config) is closed on exec, so the program cannot write to it:
"ready" means the sandbox is set up, "status N" is the program's raw wait status, and anything
else (a line starting with "error") is a setup failure the parent reports as an error, never as
a score.
"""

import ctypes
import json
import os
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC = 2, 4, 8
MS_PRIVATE = 1 << 18
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID = 1, 2
AT_FDCWD, AT_RECURSIVE = -100, 0x8000
SYS_MOUNT_SETATTR = 442  # the same number on every architecture since Linux 5.12
PR_SET_PDEATHSIG, PR_SET_SECCOMP, PR_SET_NO_NEW_PRIVS = 1, 22, 38
SIGKILL = 9
INNER_UID = 1000  # the program's uid inside its nested user namespace

LIBC = ctypes.CDLL(None, use_errno=True)


class MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def die_with_parent() -> None:
    """SIGKILL this process when its parent dies (Linux; a no-op elsewhere)."""
    if sys.platform.startswith("linux"):
        parent = os.getppid()
        LIBC.prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the request took effect
            os._exit(1)


def map_ids(inside: int, outside_uid: int, outside_gid: int) -> None:
    """Map one id of the new user namespace onto the caller's (the only mapping allowed
    without privilege)."""
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"{inside} {outside_uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"{inside} {outside_gid} 1")


def read_only_root() -> None:
    """Every mount read-only and nosuid, recursively, and private (nothing propagates out)."""
    attr = MountAttr(MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID, 0, MS_PRIVATE, 0)
    result = LIBC.syscall(
        ctypes.c_long(SYS_MOUNT_SETATTR),
        ctypes.c_int(AT_FDCWD),
        ctypes.c_char_p(b"/"),
        ctypes.c_uint(AT_RECURSIVE),
        ctypes.byref(attr),
        ctypes.c_size_t(ctypes.sizeof(attr)),
    )
    check(result, "mount_setattr(/, read-only)")


def private_workdir(workdir: str, source: bytes, tmpfs_bytes: int) -> None:
    """A fresh tmpfs on the work directory (capped; gone with the namespace) holding
    program.py."""
    options = f"size={tmpfs_bytes},nr_inodes=1024,mode=0755".encode()
    check(LIBC.mount(b"tmpfs", workdir.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, options), "tmpfs")
    check(LIBC.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None), "proc")
    os.chdir(workdir)
    with open("program.py", "wb") as f:
        f.write(source)


# seccomp: no new processes (threads allowed). The machine's audit arch and syscall numbers.
SECCOMP_MODE_FILTER = 2
RET_KILL_PROCESS, RET_ALLOW, RET_ERRNO = 0x80000000, 0x7FFF0000, 0x00050000
EPERM, EAGAIN, ENOSYS = 1, 11, 38
CLONE_THREAD = 0x00010000
LD_W_ABS, JEQ_K, JGE_K, JSET_K, RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
ARCHES = {
    # machine: (AUDIT_ARCH_*, clone, clone3, fork and vfork where they exist)
    "x86_64": (0xC000003E, 56, 435, (57, 58)),
    "aarch64": (0xC00000B7, 220, 435, ()),
}


class SockFilter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    ]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(SockFilter))]


def no_new_processes_filter(machine: str) -> list[tuple[int, int, int, int]]:
    """A seccomp BPF program: fork, vfork and clone without CLONE_THREAD fail with EAGAIN (as
    at a process limit), clone3 with ENOSYS (the C library falls back to clone, whose flags a
    filter can read), syscalls of another ABI kill the process. Instructions (code, jt, jf, k)."""
    arch, clone, clone3, forks = ARCHES[machine]
    prog = [
        (LD_W_ABS, 0, 0, 4),  # seccomp_data.arch
        (JEQ_K, 1, 0, arch),
        (RET_K, 0, 0, RET_KILL_PROCESS),
        (LD_W_ABS, 0, 0, 0),  # seccomp_data.nr
        (JGE_K, 0, 1, 0x40000000),  # x32 numbers on x86_64
        (RET_K, 0, 0, RET_ERRNO | EPERM),
        (JEQ_K, 0, 1, clone3),
        (RET_K, 0, 0, RET_ERRNO | ENOSYS),
    ]
    for nr in forks:
        prog += [(JEQ_K, 0, 1, nr), (RET_K, 0, 0, RET_ERRNO | EAGAIN)]
    prog += [
        (JEQ_K, 0, 3, clone),
        (LD_W_ABS, 0, 0, 16),  # seccomp_data.args[0], low 32 bits: the clone flags
        (JSET_K, 1, 0, CLONE_THREAD),
        (RET_K, 0, 0, RET_ERRNO | EAGAIN),
        (RET_K, 0, 0, RET_ALLOW),
    ]
    return prog


def forbid_new_processes() -> None:
    """Install `no_new_processes_filter` on this process (inherited across exec)."""
    prog = no_new_processes_filter(os.uname().machine)
    table = (SockFilter * len(prog))(*[SockFilter(*ins) for ins in prog])
    fprog = SockFprog(len(prog), table)
    check(LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(no_new_privs)")
    check(LIBC.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0), "seccomp")


def set_limits(limits: dict) -> None:
    import resource

    for name, value in limits.items():
        resource.setrlimit(getattr(resource, name), (value, value))


def run_program(config: dict, status) -> None:
    """Limits, "ready", exec: this process becomes `python -I program.py`."""
    set_limits(config["limits"])
    if config["no_new_processes"]:
        forbid_new_processes()
    status.write("ready\n")
    status.flush()
    os.execve(config["python"], [config["python"], "-I", "program.py"], {})


def init(config: dict, source: bytes, status) -> None:
    """pid 1 of the new namespaces: mounts, then the program in a child; reports its status."""
    die_with_parent()
    read_only_root()
    private_workdir(config["workdir"], source, config["tmpfs_bytes"])
    pid = os.fork()
    if pid == 0:
        try:
            check(LIBC.unshare(CLONE_NEWUSER), "unshare(nested user namespace)")
            map_ids(INNER_UID, 0, 0)
            run_program(config, status)
        except BaseException as err:  # reported to the parent, never scored
            status.write(f"error {type(err).__name__}: {err}\n")
            status.flush()
        os._exit(125)
    _, wait_status = os.waitpid(pid, 0)
    status.write(f"status {wait_status}\n")
    status.flush()


def isolated(config: dict, source: bytes, status) -> None:
    uid, gid = os.getuid(), os.getgid()
    flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
    check(LIBC.unshare(flags), "unshare(user, mount, network, pid namespaces)")
    map_ids(0, uid, gid)
    pid = os.fork()  # the first child is pid 1 of the new pid namespace
    if pid == 0:
        try:
            init(config, source, status)
        except BaseException as err:
            status.write(f"error {type(err).__name__}: {err}\n")
            status.flush()
            os._exit(125)
        os._exit(0)
    os.waitpid(pid, 0)


def main() -> None:
    config = json.loads(sys.argv[1])
    status = os.fdopen(config["status_fd"], "w")
    os.set_inheritable(status.fileno(), False)  # closed when the program is exec'd
    try:
        die_with_parent()
        with open(os.path.join(config["workdir"], "program.py"), "rb") as f:
            source = f.read()
        if config["isolate"]:
            isolated(config, source, status)
        else:
            run_program(config, status)
    except BaseException as err:
        status.write(f"error {type(err).__name__}: {err}\n")
        status.flush()
        os._exit(125)


if __name__ == "__main__":
    main()
