"""Run untrusted Python (model-written code) in a separate, limited process.

Model-written code never runs in taut's process. `run_python(source, limits)` writes the source
into a fresh temporary directory and starts a small launcher (`python -I -S -c LAUNCHER`) with a
scrubbed environment (PATH, LANG, HOME and TMPDIR only: no inherited tokens or keys), stdin from
/dev/null, stdout and stderr into files outside that directory, and its own session. The
launcher applies the isolation and limits, then `exec`s a fresh interpreter on the program.

What is applied, and where (`isolation()` reports what this machine supports):

| guarantee | Linux as root | Linux, other users | macOS / others |
|---|---|---|---|
| CPU time (RLIMIT_CPU), file size (RLIMIT_FSIZE), open files, no core dumps | yes | yes | yes |
| address space (RLIMIT_AS) | yes | yes | not enforced by macOS |
| wall-clock timeout, then SIGKILL | yes | yes | yes |
| process count | yes: RLIMIT_NPROC on a fresh unprivileged uid | RLIMIT_NPROC, counting all of the user's processes | same as Linux users |
| no network | new network namespace (only a down loopback) | a new user + network namespace where unprivileged ones are allowed, else **not isolated** | **not isolated** |
| no unix sockets on the host (socket files are outside any network namespace) | a seccomp filter refuses `socket(AF_UNIX)` and `io_uring_setup` (x86_64, aarch64) | same | **not isolated** |
| no writes outside its directory | a fresh unprivileged uid; its own mount namespace with every host mount read-only (`mount_setattr`, Linux 5.12+) and one private tmpfs at /tmp (also at /var/tmp, /dev/shm) holding the work directory /tmp/work | **not isolated** (it can write wherever the user can) | **not isolated** |
| total disk written | that tmpfs's size (`Limits.disk_bytes`) | RLIMIT_FSIZE per file only | RLIMIT_FSIZE per file only |
| no System V / POSIX IPC objects left behind | its own IPC namespace | **not isolated** | **not isolated** |
| no stray processes after the run | a new PID namespace: killing its first process kills all | process-group kill (a child that calls setsid escapes) | process-group kill |

As root, RLIMIT_NPROC does not bind (the kernel exempts root), so the launcher drops to a random
unprivileged uid (and gid) in 1,000,000–1,999,999 that owns nothing but the work directory; the
process limit then counts exactly the program's processes. That uid cannot read a directory
such as /root (mode 0700), so when the running interpreter lives there the program runs under
the first world-readable `python3` found in /usr/bin, /usr/local/bin, /bin (`Limits.python`
overrides). World-readable files stay readable to the program; nothing of taut's process
(memory, open files, environment) is.

A run never raises for anything the program does: a crash, a limit hit or a timeout come back as
an `Outcome` that did not pass. Errors in taut's own use of the sandbox (e.g. a launcher that
cannot apply an isolation it reported as available) are raised as `SandboxError`.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import secrets
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

log = logging.getLogger(__name__)

LAUNCHER_ERROR = 125            # the launcher could not set the sandbox up (it says why on a pipe of its own)
WALL_TIMEOUT = 124              # the launcher killed the program at the wall-clock limit
UID_RANGE = (1_000_000, 2_000_000)
SYSTEM_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3")


class SandboxError(RuntimeError):
    """The sandbox itself failed (not the program run in it)."""


@dataclass(frozen=True)
class Limits:
    cpu_seconds: int = 5                 # CPU time per process (RLIMIT_CPU)
    wall_seconds: float = 10.0           # wall clock for the whole run
    memory_bytes: int = 256 * 2**20      # address space per process (RLIMIT_AS)
    file_bytes: int = 1 * 2**20          # largest file written, stdout and stderr included (RLIMIT_FSIZE)
    processes: int = 4                   # processes and threads (RLIMIT_NPROC)
    open_files: int = 64                 # RLIMIT_NOFILE
    disk_bytes: int = 16 * 2**20         # all it writes: work directory and private /tmp together (as root)
    output_bytes: int = 64 * 2**10       # stdout / stderr kept in the outcome
    python: str | None = None            # interpreter for the program (default: see the module docstring)


@dataclass(frozen=True)
class Outcome:
    passed: bool                 # exited with status 0 within every limit
    status: str                  # "ok", "exit N", "signal NAME", "timeout"
    stdout: str
    stderr: str
    seconds: float


@dataclass(frozen=True)
class Isolation:
    """What this machine lets the sandbox enforce (see the module docstring's table)."""

    platform: str
    root: bool
    drop_uid: bool               # runs as a fresh unprivileged uid (root only)
    network: str                 # "netns", "userns+netns" or "none"
    mounts: bool                 # own mount + IPC namespaces: read-only host mounts, one size-limited tmpfs
    seccomp: bool                # a seccomp filter refuses socket(AF_UNIX) and io_uring_setup
    pid_namespace: bool
    memory_limit: bool           # RLIMIT_AS is enforced

    def missing(self) -> list[str]:
        gaps = []
        if self.network == "none":
            gaps.append("network")
        if not self.seccomp:
            gaps.append("unix sockets on this machine")
        if not (self.drop_uid and self.mounts):
            gaps.append("writes outside the work directory")
        if not self.mounts:
            gaps.append("total disk written")
        if not self.pid_namespace:
            gaps.append("stray processes that call setsid")
        if not self.memory_limit:
            gaps.append("memory")
        return gaps


# ---------------------------------------------------------------------------------------------
# the launcher: runs as its own process, sets the sandbox up, then execs the program
# ---------------------------------------------------------------------------------------------

LAUNCHER = r'''
import ctypes, json, os, resource, signal, sys
cfg = json.loads(sys.argv[1])
errors = cfg["error_fd"]                      # setup failures go here; closed when the program is exec'd
os.set_inheritable(errors, False)
libc = ctypes.CDLL(None, use_errno=True)
NEWNS, NEWIPC, NEWPID, NEWNET, NEWUSER = 0x00020000, 0x08000000, 0x20000000, 0x40000000, 0x10000000
MS_NOSUID, MS_NODEV, MS_BIND, MS_REC, MS_PRIVATE = 0x2, 0x4, 0x1000, 0x4000, 0x40000
SYS_MOUNT_SETATTR, AT_FDCWD, AT_RECURSIVE, MOUNT_ATTR_RDONLY = 442, -100, 0x8000, 0x1

class SockFprog(ctypes.Structure):                # a seccomp filter: its length in instructions, its code
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]

def fail(what):
    os.write(errors, f"{what} failed: {os.strerror(ctypes.get_errno())}".encode())
    os._exit(125)

def unshare(flags, what):
    if libc.unshare(flags) != 0:
        fail(what)

def mount(source, target, fstype, flags, data):
    if libc.mount(source, target, fstype, flags, data) != 0:
        fail(f"mount {target.decode()}")

if cfg["network"] == "netns":
    unshare(NEWNET, "unshare(network)")
elif cfg["network"] == "userns+netns":
    uid, gid = os.getuid(), os.getgid()
    unshare(NEWUSER | NEWNET, "unshare(user, network)")
    with open("/proc/self/setgroups", "w") as f: f.write("deny")
    with open("/proc/self/uid_map", "w") as f: f.write(f"{uid} {uid} 1")
    with open("/proc/self/gid_map", "w") as f: f.write(f"{gid} {gid} 1")
if cfg["mounts"]:
    unshare(NEWNS | NEWIPC, "unshare(mount, ipc)")
    mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None)
    # every mount read-only, then one size-limited tmpfs, the only place the program can write: the
    # private /tmp (also seen at /var/tmp and /dev/shm) holding the work directory /tmp/work
    read_only = (ctypes.c_uint64 * 4)(MOUNT_ATTR_RDONLY, 0, 0, 0)          # struct mount_attr
    if libc.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, b"/", AT_RECURSIVE, read_only, ctypes.sizeof(read_only)) != 0:
        fail("mount_setattr(/, read-only)")
    with open("program.py", "rb") as f:               # the cwd: the host's work directory, about to be hidden
        program = f.read()
    mount(b"tmpfs", b"/tmp", b"tmpfs", MS_NOSUID | MS_NODEV, f"size={cfg['disk_bytes']},mode=1777".encode())
    for target in cfg["tmp_aliases"]:
        mount(b"/tmp", target.encode(), None, MS_BIND, None)
    os.mkdir("/tmp/work")
    with open("/tmp/work/program.py", "wb") as f:
        f.write(program)
    if cfg["uid"] is not None:
        os.chown("/tmp/work", cfg["uid"], cfg["uid"])
        os.chown("/tmp/work/program.py", cfg["uid"], cfg["uid"])
    os.chdir("/tmp/work")
if cfg["pid_namespace"]:
    unshare(NEWPID, "unshare(pid)")

launcher = os.getpid()
child = os.fork()
if child == 0:
    try:
        parent = launcher
        if cfg["pid_namespace"]:
            if cfg["mounts"]:
                mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV, None)
            # This process is the new PID namespace's init, and the kernel drops every signal whose
            # action is the default for an init: as init, the program would ignore SIGXCPU and run
            # on to the CPU hard limit. So this one stays init (reaping orphans, passing the
            # program's status on) and the program runs as its child.
            parent = os.getpid()
            program = os.fork()
            if program:
                os.close(errors)
                while True:
                    pid, status = os.wait()
                    if pid == program:
                        os._exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))
        for name, value in cfg["rlimits"].items():
            hard = value + 1 if name == "RLIMIT_CPU" else value          # SIGXCPU at the limit, SIGKILL a second later
            resource.setrlimit(getattr(resource, name), (value, hard))
        if cfg["uid"] is not None:
            os.setgroups([])
            os.setresgid(cfg["uid"], cfg["uid"], cfg["uid"])
            os.setresuid(cfg["uid"], cfg["uid"], cfg["uid"])
        libc.prctl(1, signal.SIGKILL)                     # PR_SET_PDEATHSIG: die with its parent
        libc.prctl(38, 1, 0, 0, 0)                        # PR_SET_NO_NEW_PRIVS
        if cfg["seccomp"]:
            bpf = bytes.fromhex(cfg["seccomp"])
            if libc.prctl(22, 2, ctypes.byref(SockFprog(len(bpf) // 8, bpf))) != 0:   # PR_SET_SECCOMP, FILTER
                fail("seccomp")
        if os.getppid() != parent:
            os._exit(137)                                 # the parent was killed before PDEATHSIG was set
        os.execve(cfg["python"], [cfg["python"], "-I", "-S", "program.py"], cfg["env"])
    except BaseException as err:
        os.write(errors, f"starting the program failed: {err!r}".encode())
        os._exit(125)

import time
deadline = time.monotonic() + cfg["wall_seconds"]
while True:
    pid, status = os.waitpid(child, os.WNOHANG)
    if pid:
        break
    if time.monotonic() > deadline:
        os.kill(child, signal.SIGKILL)                    # in a PID namespace: every process in it
        os.waitpid(child, 0)
        os._exit(124)
    time.sleep(0.005)
if os.WIFSIGNALED(status):
    os._exit(128 + os.WTERMSIG(status))
os._exit(os.WEXITSTATUS(status))
'''


# ---------------------------------------------------------------------------------------------
# running a program
# ---------------------------------------------------------------------------------------------


def run_python(source: str, limits: Limits = Limits()) -> Outcome:
    """Run `source` as `program.py` in a fresh directory under the limits; never raises for
    anything the program does."""
    iso = isolation()
    python = program_python(limits, iso)
    uid = secrets.randbelow(UID_RANGE[1] - UID_RANGE[0]) + UID_RANGE[0] if iso.drop_uid else None
    with tempfile.TemporaryDirectory(prefix="taut-sandbox-") as base:
        work, logs = Path(base) / "work", Path(base) / "logs"
        work.mkdir()
        logs.mkdir(mode=0o700)
        (work / "program.py").write_text(source, encoding="utf-8")
        if uid is not None:
            os.chmod(base, 0o711)                    # the program may pass through, not list
            os.chown(work, uid, uid)
            os.chown(work / "program.py", uid, uid)
        home = "/tmp/work" if iso.mounts else str(work)   # with private mounts, the program is copied there
        config = {
            "network": iso.network, "mounts": iso.mounts, "pid_namespace": iso.pid_namespace,
            "tmp_aliases": [p for p in ("/var/tmp", "/dev/shm") if os.path.isdir(p)],
            "disk_bytes": limits.disk_bytes, "seccomp": seccomp_filter().hex() if iso.seccomp else None,
            "uid": uid, "python": python,
            "wall_seconds": limits.wall_seconds, "rlimits": rlimits(limits, iso),
            "env": {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": home, "TMPDIR": home,
                    "PYTHONDONTWRITEBYTECODE": "1"},
        }
        t0 = time.perf_counter()
        setup_errors, config["error_fd"] = os.pipe()
        with open(logs / "stdout", "wb") as out, open(logs / "stderr", "wb") as err:
            try:
                process = subprocess.Popen(
                    [sys.executable, "-I", "-S", "-c", LAUNCHER, json.dumps(config)], cwd=work,
                    env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                    start_new_session=True, close_fds=True, pass_fds=(config["error_fd"],))
            finally:
                os.close(config["error_fd"])
            try:
                code = process.wait(timeout=limits.wall_seconds + 5.0)
            except subprocess.TimeoutExpired:            # the launcher itself hung: a backstop
                _kill_group(process.pid)
                code = process.wait()
        _kill_group(process.pid)                          # anything left in the session
        if uid is not None and not iso.pid_namespace:
            _kill_uid(uid)
        seconds = time.perf_counter() - t0
        stdout, stderr = _head(logs / "stdout", limits.output_bytes), _head(logs / "stderr", limits.output_bytes)
        os.set_blocking(setup_errors, False)
        try:
            failure = os.read(setup_errors, 4096).decode("utf-8", errors="replace")
        except BlockingIOError:                          # a writer still open: the launcher wrote nothing
            failure = ""
        finally:
            os.close(setup_errors)
    if failure:
        raise SandboxError(f"the sandbox could not be set up: {failure}")
    return Outcome(passed=code == 0, status=_status(code), stdout=stdout, stderr=stderr, seconds=seconds)


def rlimits(limits: Limits, iso: Isolation) -> dict[str, int]:
    out = {
        "RLIMIT_CPU": limits.cpu_seconds,
        "RLIMIT_FSIZE": limits.file_bytes,
        "RLIMIT_NOFILE": limits.open_files,
        "RLIMIT_CORE": 0,
        "RLIMIT_NPROC": limits.processes,
    }
    if iso.memory_limit:
        out["RLIMIT_AS"] = limits.memory_bytes
    return out


def _status(code: int) -> str:
    if code == 0:
        return "ok"
    if code == WALL_TIMEOUT:
        return "timeout"
    if code > 128:
        try:
            return f"signal {signal.Signals(code - 128).name}"
        except ValueError:
            return f"signal {code - 128}"
    if code < 0:                                          # the launcher itself was killed
        return f"signal {signal.Signals(-code).name}"
    return f"exit {code}"


def _head(path: Path, limit: int) -> str:
    with open(path, "rb") as f:
        return f.read(limit).decode("utf-8", errors="replace")


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _kill_uid(uid: int) -> None:
    """Kill every process of the sandbox's uid (without a PID namespace, a child that called
    setsid escapes the group kill)."""
    subprocess.run([sys.executable, "-I", "-S", "-c",
                    "import os, signal, sys; u = int(sys.argv[1]); os.setresgid(u, u, u); os.setresuid(u, u, u); "
                    "os.kill(-1, signal.SIGKILL)", str(uid)],
                   env={}, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)


# ---------------------------------------------------------------------------------------------
# the seccomp filter: no unix sockets (the network namespace does not cover socket files)
# ---------------------------------------------------------------------------------------------

AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
SYSCALLS = {"x86_64": {"socket": 41, "io_uring_setup": 425}, "aarch64": {"socket": 198, "io_uring_setup": 425}}
AF_UNIX, EACCES = 1, 13


def seccomp_filter() -> bytes:
    """A classic-BPF seccomp program for this machine's architecture: `socket(AF_UNIX, ...)` and
    `io_uring_setup` (whose rings create sockets past the filter) fail with EACCES, so no socket
    file on the host can be reached; everything else is allowed. System calls of another ABI have
    other numbers: 32-bit ones kill the process, x32 ones (numbers from 0x40000000) fail. Reads
    `struct seccomp_data`: nr at byte 0, arch at 4, the low half of args[0] at 16 (little-endian)."""
    machine = platform.machine()
    nr = SYSCALLS[machine]
    load, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06          # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JGE|K, BPF_RET|K
    allow, deny, kill = 0x7FFF0000, 0x00050000 | EACCES, 0x80000000
    program = [                                           # (code, jump if true, jump if false, k)
        (load, 0, 0, 4),                                  # 0: arch
        (jeq, 1, 0, AUDIT_ARCH[machine]),                 # 1: this ABI: go on at 3
        (ret, 0, 0, kill),                                # 2
        (load, 0, 0, 0),                                  # 3: syscall number
        (jge, 5, 0, 0x40000000),                          # 4: x32 numbers: deny (10)
        (jeq, 4, 0, nr["io_uring_setup"]),                # 5: deny (10)
        (jeq, 0, 2, nr["socket"]),                        # 6: socket: look at its domain (7), else allow (9)
        (load, 0, 0, 16),                                 # 7: args[0], the domain
        (jeq, 1, 0, AF_UNIX),                             # 8: deny (10)
        (ret, 0, 0, allow),                               # 9
        (ret, 0, 0, deny),                                # 10
    ]
    return b"".join(struct.pack("=HBBI", *instruction) for instruction in program)


# ---------------------------------------------------------------------------------------------
# what this machine supports
# ---------------------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def isolation() -> Isolation:
    """Probe once which isolation this machine allows (each probe is a short-lived process)."""
    linux = sys.platform.startswith("linux")
    root = hasattr(os, "geteuid") and os.geteuid() == 0
    if not linux:
        iso = Isolation(sys.platform, root, drop_uid=False, network="none", mounts=False, seccomp=False,
                        pid_namespace=False, memory_limit=False)
    else:
        network = "none"
        if root and _probe("netns"):
            network = "netns"
        elif not root and _probe("userns+netns"):
            network = "userns+netns"
        iso = Isolation(sys.platform, root, drop_uid=root and _probe_setuid(), network=network,
                        mounts=root and _probe("mounts"), seccomp=_probe_seccomp(),
                        pid_namespace=root and _probe("pid"), memory_limit=True)
    if iso.missing():
        log.warning("sandbox: not isolated on this machine: %s (docs/transfer.md)", ", ".join(iso.missing()))
    return iso


_PROBES = {
    "netns": "libc.unshare(0x40000000) == 0",
    "userns+netns": "libc.unshare(0x10000000 | 0x40000000) == 0",
    "mounts": "libc.unshare(0x00020000 | 0x08000000) == 0 and libc.mount(b'none', b'/', None, 0x4000 | 0x40000, None) == 0"
              " and libc.syscall(442, -100, b'/', 0x8000, (ctypes.c_uint64 * 4)(1, 0, 0, 0), 32) == 0",
    "pid": "libc.unshare(0x20000000) == 0",
}


def _probe(name: str) -> bool:
    code = f"import ctypes, sys; libc = ctypes.CDLL(None, use_errno=True); sys.exit(0 if {_PROBES[name]} else 1)"
    return subprocess.run([sys.executable, "-I", "-S", "-c", code], env={}, capture_output=True).returncode == 0


def _probe_seccomp() -> bool:
    """Whether the filter installs here and refuses an AF_UNIX socket."""
    if platform.machine() not in SYSCALLS:
        return False
    code = ("import ctypes, socket, sys; libc = ctypes.CDLL(None, use_errno=True); bpf = bytes.fromhex(sys.argv[1])\n"
            "class SockFprog(ctypes.Structure): _fields_ = [('len', ctypes.c_ushort), ('filter', ctypes.c_char_p)]\n"
            "libc.prctl(38, 1, 0, 0, 0); libc.prctl(22, 2, ctypes.byref(SockFprog(len(bpf) // 8, bpf)))\n"
            "try: socket.socket(socket.AF_UNIX)\nexcept PermissionError: sys.exit(0)\nsys.exit(1)")
    return subprocess.run([sys.executable, "-I", "-S", "-c", code, seccomp_filter().hex()], env={},
                          capture_output=True).returncode == 0


def _probe_setuid() -> bool:
    u = UID_RANGE[0]
    code = f"import os; os.setgroups([]); os.setresgid({u}, {u}, {u}); os.setresuid({u}, {u}, {u})"
    return subprocess.run([sys.executable, "-I", "-S", "-c", code], env={}, capture_output=True).returncode == 0


def program_python(limits: Limits, iso: Isolation) -> str:
    """The interpreter the program runs under: `limits.python`, else this one when an unprivileged
    uid can reach it, else the first world-readable system `python3`."""
    if limits.python is not None:
        return limits.python
    current = os.path.realpath(sys.executable)
    if not iso.drop_uid:
        return current
    import sysconfig

    if world_readable(current) and world_readable(sysconfig.get_paths()["stdlib"]):
        return current
    for candidate in SYSTEM_PYTHONS:
        if os.path.exists(candidate) and world_readable(os.path.realpath(candidate)):
            return os.path.realpath(candidate)
    raise SandboxError(f"no interpreter the sandbox's unprivileged uid can run: {current} is in a directory other "
                       f"users cannot enter and none of {', '.join(SYSTEM_PYTHONS)} is usable; set Limits.python")


def world_readable(path: str) -> bool:
    """Whether any user can reach `path` (every parent directory searchable, the path readable)."""
    p = Path(path)
    for parent in reversed(p.parents):
        if not os.stat(parent).st_mode & stat.S_IXOTH:
            return False
    return bool(os.stat(p).st_mode & stat.S_IROTH)


def describe() -> dict:
    """`isolation()` as a plain dict, with the gaps listed (written into evaluation metadata, docs)."""
    iso = isolation()
    return {**asdict(iso), "not_isolated": iso.missing()}


__all__ = ["Isolation", "Limits", "Outcome", "SandboxError", "describe", "isolation", "run_python"]
