"""The sandbox that runs model-written code: every hostile program ends as a failed run within
its limits, and the test process keeps running. Limits are kept small (the machine is shared).

Where this machine cannot isolate something (`isolation()`), the test for it is skipped with the
reason; on Linux as root (CI, the development machines) everything below runs.
"""

import os
import socket
import time
from pathlib import Path

import pytest

from taut.sandbox import UID_RANGE, Limits, SandboxError, isolation, run_python

SMALL = Limits(cpu_seconds=1, wall_seconds=3.0, memory_bytes=256 * 2**20, file_bytes=256 * 2**10, processes=4,
               output_bytes=4096)


def sandbox_processes() -> list[int]:
    """Pids of live processes owned by a sandbox uid."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                uid = entry.stat().st_uid
            except FileNotFoundError:
                continue
            if UID_RANGE[0] <= uid < UID_RANGE[1]:
                pids.append(int(entry.name))
    return pids


def test_a_plain_program_runs_in_a_fresh_directory_with_a_scrubbed_environment(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws_secret_value")
    out = run_python("import os\nprint(sorted(os.listdir('.')))\nprint(sorted(os.environ))\nprint(os.environ.get('HF_TOKEN'))", SMALL)
    assert out.passed and out.status == "ok"
    listing, names, token = out.stdout.splitlines()
    assert listing == "['program.py']"
    assert "secret" not in out.stdout and "HF_TOKEN" not in names and token == "None"
    assert set(eval(names)) <= {"PATH", "LANG", "HOME", "TMPDIR", "PYTHONDONTWRITEBYTECODE", "LC_CTYPE"}


def test_a_failing_program_is_a_failed_run_not_an_exception():
    out = run_python("raise ValueError('model bug')", SMALL)
    assert not out.passed and out.status == "exit 1" and "ValueError: model bug" in out.stderr


def test_an_infinite_loop_is_stopped_by_the_cpu_limit():
    t0 = time.perf_counter()
    generous_wall = Limits(cpu_seconds=1, wall_seconds=30.0)          # on a busy machine 1 s of CPU takes longer
    out = run_python("while True:\n    pass", generous_wall)
    assert not out.passed and out.status == "signal SIGXCPU"      # the soft limit, not the hard one a second later
    assert time.perf_counter() - t0 < 20


def test_a_sleeping_program_is_stopped_by_the_wall_clock():
    t0 = time.perf_counter()
    out = run_python("import time\ntime.sleep(60)", Limits(wall_seconds=1.0))
    assert not out.passed and out.status == "timeout"
    assert time.perf_counter() - t0 < 4


def test_a_memory_bomb_fails_and_a_modest_allocation_still_works():
    if not isolation().memory_limit:
        pytest.skip("RLIMIT_AS is not enforced on this platform")
    # bytes(n) comes from calloc: the address space grows, the pages stay untouched. A bomb that
    # touches its pages (bytearray) depends on the machine's free memory: in a memory cgroup tighter
    # than the limit the kernel's OOM killer ends it first, and under memory pressure page reclaim
    # can use up its CPU time first (SIGKILL either way, no MemoryError; CI hit one of these). This
    # test is about the address-space limit.
    bomb = run_python("x = []\nwhile True:\n    x.append(bytes(16 * 2**20))", SMALL)
    assert not bomb.passed and "MemoryError" in bomb.stderr
    modest = run_python("x = bytearray(32 * 2**20)\nprint(len(x))", SMALL)
    assert modest.passed, modest.stderr


def test_a_fork_bomb_is_held_to_the_process_limit_and_leaves_nothing_behind():
    # forks until refused, every child sleeping; prints how many forks succeeded
    counting = ("import os, time\nn = 0\nfor _ in range(64):\n    try:\n        pid = os.fork()\n"
                "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(30)\n        os._exit(0)\n"
                "    n += 1\nprint(n, flush=True)")
    out = run_python(counting, SMALL)
    assert out.passed, out.stderr
    assert int(out.stdout) <= SMALL.processes - 1          # the program itself counts as one process
    bomb = run_python("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass", SMALL)
    assert not bomb.passed
    if isolation().drop_uid:
        time.sleep(0.2)
        assert sandbox_processes() == []                   # no sleeper and no bomb process survived


def test_no_network_connection_even_to_this_machine():
    if isolation().network == "none":
        pytest.skip("this machine cannot give the sandbox its own network namespace (docs/transfer.md)")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    try:
        out = run_python(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\nprint('connected')", SMALL)
        outside = run_python("import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=1)\nprint('connected')", SMALL)
    finally:
        server.close()
    assert not out.passed and "connected" not in out.stdout
    assert not outside.passed and "connected" not in outside.stdout


def test_no_writes_outside_its_directory(tmp_path):
    if not isolation().drop_uid:
        pytest.skip("without an unprivileged uid the program can write wherever this user can (docs/transfer.md)")
    name = f"taut-sandbox-escape-{os.getpid()}"
    beside = Path(__file__).parent / name                  # a directory this user owns, outside /tmp
    try:
        out = run_python(f"open({str(beside)!r}, 'w').write('x')", SMALL)
        assert not out.passed and "PermissionError" in out.stderr and not beside.exists()
    finally:
        beside.unlink(missing_ok=True)
    target = tmp_path / "escaped.txt"                      # under /tmp: denied, or hidden by the private /tmp
    out = run_python(f"open({str(target)!r}, 'w').write('x')", SMALL)
    assert not out.passed and not target.exists()
    scratch = run_python(f"open('/tmp/{name}', 'w').write('x')\nprint(open('/tmp/{name}').read())", SMALL)
    if isolation().mounts:                                  # a private /tmp: writable, and gone afterwards
        assert scratch.passed and not Path(f"/tmp/{name}").exists()


def test_output_that_floods_stdout_is_cut_at_the_file_size_limit():
    t0 = time.perf_counter()
    out = run_python("while True:\n    print('x' * 10000)", SMALL)
    assert not out.passed
    assert len(out.stdout) <= SMALL.output_bytes
    assert time.perf_counter() - t0 < SMALL.wall_seconds + 2


def test_setup_failures_raise_and_a_program_cannot_fake_one():
    with pytest.raises(SandboxError, match="starting the program failed"):
        run_python("print(1)", Limits(python="/nonexistent/python3"))
    fake = run_python("import sys\nsys.stderr.write('sandbox launcher: mount failed')\nsys.exit(125)", SMALL)
    assert not fake.passed and fake.status == "exit 125"
