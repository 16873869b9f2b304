"""The sandbox for model-written code: normal outcomes, limits, and attacks that must be contained.

Every attack runs at every isolation level available here (bwrap, unshare, rlimits-only). A test
whose protection a level cannot give (``sandbox.protections``) is skipped with the reason; with
bwrap as root none is skipped. After every run the test checks that no process of the program is
left (by a token in its environment), that the evaluator has no zombie children, and that the
temporary directory is gone.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import tempfile
import uuid
from pathlib import Path

import pytest

from evolm import sandbox

LEVELS = sandbox.available_isolations()


@pytest.fixture(autouse=True)
def private_tempdir(tmp_path, monkeypatch):
    """Point tempfile at a directory of this test and check the sandbox leaves nothing in it."""
    root = tmp_path / "tempdirs"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    yield root
    assert list(root.iterdir()) == [], "the sandbox left a temporary directory behind"


def leftovers(token: str) -> list[int]:
    """Live processes whose environment carries ``token`` (zombies have an empty environment)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/environ", "rb") as f:
                    if token.encode() in f.read():
                        found.append(int(name))
            except OSError:
                pass
    return found


def zombie_children() -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
                if fields[0] == b"Z" and int(fields[1]) == os.getpid():
                    found.append(int(name))
            except (OSError, IndexError, ValueError):
                pass
    return found


def run(code: str, tests: str = "", **kwargs) -> sandbox.SandboxResult:
    """``run_code`` plus the containment checks every test wants."""
    token = uuid.uuid4().hex
    result = sandbox.run_code(code, tests, env={"EVOLM_TEST_TOKEN": token}, **kwargs)
    assert result.status in sandbox.STATUSES
    assert leftovers(token) == [], f"processes survived the sandbox: {result}"
    assert zombie_children() == []
    return result


def needs(level: str, **wanted: bool) -> None:
    got = sandbox.protections(level)
    missing = [name for name, value in wanted.items() if value and not getattr(got, name)]
    if missing:
        why = {"unprivileged": "as root without bwrap the program drops to nobody only when the interpreter "
                               "is world-readable" if os.geteuid() == 0 else "it runs as the evaluator's own user",
               "read_only_root": "only bwrap mounts the root read-only",
               "pid_namespace": "only bwrap gives a pid namespace",
               "network_namespace": "no network namespace could be created"}
        pytest.skip(f"isolation '{level}' does not give {', '.join(missing)} here: "
                    + "; ".join(why[m] for m in missing) + " (install bubblewrap for full containment)")


# -- normal outcomes -------------------------------------------------------------------------------


@pytest.mark.parametrize("level", LEVELS)
def test_pass_fail_and_errors(level):
    code = "def add(a, b):\n    return a + b\n"
    ok = run(code, "assert add(2, 3) == 5\nprint('done')", isolation=level)
    assert (ok.status, ok.returncode, ok.stdout, ok.isolation) == ("passed", 0, "done\n", level)
    wrong = run(code, "assert add(2, 3) == 6", isolation=level)
    assert wrong.status == "failed" and "AssertionError in tests" in wrong.reason
    assert "<tests>" in wrong.stderr and "sandbox.py" not in wrong.stderr
    assert run("def f(:\n    pass", "", isolation=level).reason.startswith("SyntaxError in code")
    assert run("import no_such_module_xyz", "", isolation=level).status == "failed"
    assert run("x = 1", "raise ValueError('nope')", isolation=level).reason == "ValueError in tests: nope"


@pytest.mark.parametrize("level", LEVELS)
def test_exiting_early_is_not_a_pass(level):
    for early_exit in ("import sys\nsys.exit(0)", "exit()", "import os\nos._exit(0)"):
        result = run(early_exit, "assert False", isolation=level)
        assert result.status == "failed", (early_exit, result)


def test_tests_share_the_solution_namespace_and_skip_main_blocks():
    code = "import math\nLIMIT = 3\ndef f(x):\n    return math.floor(x)\nif __name__ == '__main__':\n    f(input())\n"
    assert run(code, "assert f(2.7) == 2 and LIMIT == 3\nassert __name__ == 'solution'").passed


def test_environment_is_clean(monkeypatch):
    monkeypatch.setenv("EVOLM_SECRET_FOR_TEST", "hunter2")
    result = run("import os", "assert 'EVOLM_SECRET_FOR_TEST' not in os.environ\nprint(os.getcwd())")
    assert result.passed, result


def test_output_under_the_cap_is_kept():
    result = run("print('a' * 1000)\nimport sys\nprint('b' * 10, file=sys.stderr)", max_output_bytes=4096)
    assert result.passed and result.stdout == "a" * 1000 + "\n" and result.stderr == "b" * 10 + "\n"


def test_run_many_keeps_order():
    jobs = [("def f():\n    return 1", "assert f() == 1"), ("x = 1", "assert x == 2"), ("while True: pass", ""),
            ("def f(:", ""), ("y = 2", "assert y == 2")]
    results = sandbox.run_many(jobs, max_workers=2, timeout_s=2)
    assert [r.status for r in results] == ["passed", "failed", "timeout", "failed", "passed"]


def test_never_raises(monkeypatch):
    sandbox.available_isolations()  # probe (and cache) before Popen is broken below
    assert sandbox.run_code("x = 1", isolation="no-such-level").status == "crashed"
    bad = sandbox.run_code("x = 1", timeout_s=0)
    assert bad.status == "crashed" and "timeout_s" in bad.reason

    def broken(*_args, **_kwargs):
        raise OSError("no processes for you")

    monkeypatch.setattr(sandbox.subprocess, "Popen", broken)
    result = sandbox.run_code("x = 1", "assert x == 1")
    assert result.status == "crashed" and "no processes for you" in result.reason


def test_isolation_levels():
    assert sandbox.isolation() == LEVELS[0] and LEVELS[-1] == "rlimits-only"
    assert set(LEVELS) <= set(sandbox.ISOLATION_LEVELS)
    if shutil.which("bwrap") and os.geteuid() == 0:  # CI installs bubblewrap as root: it must work
        assert LEVELS[0] == "bwrap"
        got = sandbox.protections("bwrap")
        assert got.network_namespace and got.read_only_root and got.pid_namespace and got.unprivileged


def test_interpreter_under_tmp_is_rebound_over_the_sandbox_tmpfs(monkeypatch):
    # A clean clone (and its .venv) in /tmp is hidden by the sandbox's own tmpfs /tmp unless re-bound.
    with tempfile.TemporaryDirectory(dir="/tmp") as d:
        venv = os.path.join(d, "checkout", ".venv")
        os.makedirs(os.path.join(venv, "bin"))
        monkeypatch.setattr(sandbox, "_interpreter_paths", lambda: [venv, os.path.join(venv, "bin"), "/usr"])
        argv = sandbox._bwrap_argv(d) if shutil.which("bwrap") else sandbox._under_tmp_binds()
        real = str(Path(venv).resolve())
        shown = "/tmp/" + str(Path(real).relative_to(os.path.realpath("/tmp")))
        assert ["--ro-bind", real, shown] == argv[argv.index(real) - 1:argv.index(real) + 2]
        assert argv.count("--ro-bind") - (1 if shutil.which("bwrap") else 0) >= 1
        assert "/usr" not in sandbox._under_tmp_binds() and real + "/bin" not in sandbox._under_tmp_binds()
        if shutil.which("bwrap"):
            assert argv.index("/tmp") < argv.index(real)  # after the tmpfs, or the tmpfs would hide it


@pytest.mark.parametrize(
    "report, raw_rc, stopped_for, status",
    [
        ("started\nrunning\n{\"outcome\": \"ok\"}\n", 0, None, "passed"),
        ("started\nrunning\n{\"outcome\": \"error\", \"type\": \"AssertionError\"}\n", 1, None, "failed"),
        ("started\nrunning\n{\"outcome\": \"error\", \"type\": \"MemoryError\"}\n", 1, None, "resource-limit"),
        ("started\nrunning\n{\"outcome\": \"error\", \"type\": \"BlockingIOError\", \"errno\": 11}\n", 1, None,
         "resource-limit"),
        ("started\nrunning\n{\"outcome\": \"exit\", \"code\": \"0\"}\n", 1, None, "failed"),
        ("started\nrunning\n", 0, None, "failed"),  # os._exit(0) before the end
        ("started\nrunning\n", 128 + signal.SIGXCPU, None, "resource-limit"),
        ("started\nrunning\n", -signal.SIGKILL, None, "resource-limit"),
        ("started\nrunning\n", 128 + signal.SIGSEGV, None, "crashed"),
        ("started\nrunning\n", -9, "timeout", "timeout"),
        ("started\nrunning\n", -9, "output", "resource-limit"),
        ("started\n", 70, None, "crashed"),  # set-up failed before the program ran
        ("", 1, None, "crashed"),  # bwrap could not start
        ("started\nrunning\n{\"outcome\": \"ok\"}\n", 137, None, "crashed"),
    ],
)
def test_classify_outcome(report, raw_rc, stopped_for, status):
    assert sandbox.classify_outcome(report, raw_rc, stopped_for)[0] == status


# -- limits ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("level", LEVELS)
def test_infinite_loop_times_out(level):
    assert run("while True:\n    pass", isolation=level, timeout_s=1).status == "timeout"
    assert run("import time\nwhile True:\n    time.sleep(0.01)", isolation=level, timeout_s=1).status == "timeout"


def test_cpu_limit():
    result = run("while True:\n    pass", timeout_s=30, cpu_s=1)
    assert result.status == "resource-limit" and "SIGXCPU" in result.reason


@pytest.mark.parametrize("level", LEVELS)
def test_memory_bomb(level):
    assert run("x = bytearray(10 ** 10)", isolation=level, memory_mb=256).status == "resource-limit"
    grow = run("chunks = []\nwhile True:\n    chunks.append(bytearray(2 ** 20))", isolation=level, memory_mb=256,
               timeout_s=20)
    assert grow.status == "resource-limit", grow


@pytest.mark.parametrize("level", LEVELS)
def test_stdout_flood_is_capped(level):
    result = run("while True:\n    print('x' * 10000)", isolation=level, max_output_bytes=50_000, timeout_s=20)
    assert result.status == "resource-limit" and result.reason == "output limit reached"
    assert len(result.stdout) + len(result.stderr) <= 50_000


def test_file_size_limit():
    result = run("open('big.bin', 'wb').write(b'x' * (8 * 2 ** 20))", file_size_mb=1)
    assert result.status == "resource-limit" and "File too large" in result.reason


# -- attacks ---------------------------------------------------------------------------------------

FORK_BOMB = """
import os, time
forked = 0
for _ in range(200):
    try:
        pid = os.fork()
    except OSError as e:
        print("fork failed after", forked, flush=True)
        break
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    forked += 1
print("forked", forked, flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("level", LEVELS)
def test_fork_bomb_is_bounded_and_reaped(level):
    result = run(FORK_BOMB, isolation=level, timeout_s=2, max_processes=16)
    assert result.status == "timeout"
    if sandbox.protections(level).unprivileged:  # RLIMIT_NPROC applies
        assert "fork failed after" in result.stdout, result


@pytest.mark.parametrize("level", LEVELS)
def test_daemonised_grandchild_is_killed(level):
    code = ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        time.sleep(60)\n"
            "    os._exit(0)\nos.wait()\n")
    assert run(code, "x = 1", isolation=level).passed


@pytest.fixture
def victim_dir():
    """A root-visible directory outside the sandbox with a file in it (under /var/tmp, which bwrap
    leaves visible but read-only)."""
    base = "/var/tmp" if os.path.isdir("/var/tmp") else None
    path = Path(tempfile.mkdtemp(prefix="evolm-victim-", dir=base))
    path.chmod(0o755)
    (path / "keep.txt").write_text("precious")
    (path / "keep.txt").chmod(0o644)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("level", LEVELS)
def test_cannot_write_or_delete_outside(level, victim_dir):
    needs(level, unprivileged=True)
    code = f"""
import os, shutil
target = {str(victim_dir)!r}
for attempt in (lambda: open(os.path.join(target, 'pwned'), 'w').write('x'),
                lambda: os.remove(os.path.join(target, 'keep.txt')),
                lambda: open(os.path.join(target, 'keep.txt'), 'w').write('gone'),
                lambda: shutil.rmtree(target)):
    try:
        attempt()
    except OSError:
        pass
open('inside.txt', 'w').write('fine')  # the working directory is writable
"""
    assert run(code, "assert open('inside.txt').read() == 'fine'", isolation=level).passed
    assert sorted(p.name for p in victim_dir.iterdir()) == ["keep.txt"]
    assert (victim_dir / "keep.txt").read_text() == "precious"


@pytest.mark.parametrize("level", LEVELS)
def test_read_only_root_protects_world_writable_files(level, victim_dir):
    needs(level, read_only_root=True)
    victim_dir.chmod(0o777)
    (victim_dir / "keep.txt").chmod(0o666)  # only the read-only mount can protect these
    code = f"""
import os
for attempt in (lambda: open({str(victim_dir / 'pwned')!r}, 'w').write('x'),
                lambda: open({str(victim_dir / 'keep.txt')!r}, 'w').write('gone'),
                lambda: os.remove({str(victim_dir / 'keep.txt')!r})):
    try:
        attempt()
        print('attack worked')
    except OSError as e:
        print(e.strerror)
"""
    result = run(code, "x = 1", isolation=level)
    assert result.passed and result.stdout.count("Read-only file system") == 3, result
    assert sorted(p.name for p in victim_dir.iterdir()) == ["keep.txt"]
    assert (victim_dir / "keep.txt").read_text() == "precious"


@pytest.mark.parametrize("level", LEVELS)
def test_private_tmp(level):
    needs(level, read_only_root=True)
    name = f"/tmp/evolm-pwned-{uuid.uuid4().hex}"
    assert run(f"open({name!r}, 'w').write('x')", f"assert open({name!r}).read() == 'x'", isolation=level).passed
    assert not os.path.exists(name)


@pytest.mark.parametrize("level", LEVELS)
def test_no_network(level):
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.setblocking(False)
    port = server.getsockname()[1]
    try:
        code = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\ns.sendall(b'pwned')\n"
        result = run(code, isolation=level)
        assert result.status == "failed" and "Error" in result.reason, result
        if not sandbox.protections(level).network_namespace:
            assert "network access is disabled" in result.reason
        with pytest.raises(BlockingIOError):
            server.accept()
    finally:
        server.close()


@pytest.mark.parametrize("level", LEVELS)
def test_cannot_kill_the_evaluator(level):
    needs(level, unprivileged=True)
    me = os.getpid()
    code = f"""
import os, signal
for target in ({me}, os.getppid()):
    try:
        os.kill(target, signal.SIGKILL)
    except OSError as e:
        print(type(e).__name__)
"""
    result = run(code, "x = 1", isolation=level)
    # we are still here; the program was refused the evaluator and still ran to the end
    assert result.passed and result.stdout.startswith(("ProcessLookupError", "PermissionError")), result


@pytest.mark.parametrize("level", LEVELS)
def test_kill_everything_stays_inside(level):
    needs(level, pid_namespace=True)
    result = run("import os, signal\nos.kill(-1, signal.SIGKILL)\nimport time\ntime.sleep(5)", isolation=level,
                 timeout_s=3)
    assert result.status in ("resource-limit", "timeout", "crashed", "failed")
