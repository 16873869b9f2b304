"""Run model-written Python (MBPP, HumanEval completions) against its tests, contained.

``run_code(code, tests, timeout_s=5, memory_mb=512)`` returns a ``SandboxResult`` and never raises
into its caller; ``run_many(jobs, max_workers=2)`` checks many programs with bounded parallelism.

Design decisions:

- The program runs in a fresh Python process (``python -I``: no user site, no PYTHON* variables, no
  script directory on ``sys.path``), started in its own session, with a clean environment and a
  temporary working directory that is deleted afterwards. The child is this very file run as a
  script (``_child_main``), so there is one place for the whole sandbox.
- Isolation, strongest first, chosen once per process by probing (``isolation()``):

  ``bwrap``: bubblewrap with a read-only root, fresh tmpfs ``/tmp`` (size-capped) holding the working
  directory, new network, pid, ipc and uts namespaces, ``--die-with-parent``, ``--new-session``.
  The interpreter's directories that live under the host's ``/tmp`` (a checkout or venv there) are
  re-bound read-only over the fresh tmpfs; the rest of the host ``/tmp`` stays hidden. Killing the
  namespace's init (its host pid comes from ``--info-fd``) makes the kernel kill and reap every
  process inside, including daemonised ones.

  ``unshare``: ``unshare --net`` (plus ``--map-root-user`` when not root): no network, but the host
  filesystem and pid space.

  ``rlimits-only``: a plain child process; Python's socket constructors are replaced by ones that
  raise (best effort: a program that execs another binary or uses ctypes is not stopped).

  Without a pid namespace the child first forks a *supervisor* (a child subreaper, so orphans and
  daemonised grandchildren are re-parented to it) that kills and reaps every descendant when the
  program ends or when the evaluator asks it to stop (SIGTERM). Nothing is orphaned to init.
- In every mode the program process sets resource limits on itself before running any model code:
  ``RLIMIT_CPU`` (soft = ``cpu_s``, hard = +1), ``RLIMIT_AS`` (``memory_mb``), ``RLIMIT_FSIZE``,
  ``RLIMIT_NOFILE``, ``RLIMIT_CORE = 0`` and ``RLIMIT_NPROC``, and ``PR_SET_NO_NEW_PRIVS``.
  ``RLIMIT_NPROC`` counts every task of a *real uid* machine-wide and does not apply to root at all,
  so when the evaluator runs as root the program drops to ``nobody`` (uid 65534) and its limit is
  ``tasks nobody already has + max_processes``. Dropping needs the interpreter's files readable by
  ``nobody``: under bwrap any prefix behind a private directory (e.g. ``/root/.pyenv``) is re-bound
  into reach; without bwrap the drop happens only when the stdlib is world-readable already.
  ``protections(level)`` says which protections a level actually gives on this machine.
- A wall-clock deadline (``timeout_s``, measured from process start) stops the whole tree: the bwrap
  namespace init is SIGKILLed; a supervisor is sent SIGTERM and, after a grace period, the process
  group is SIGKILLed. stdout and stderr are read incrementally; more than ``max_output_bytes`` in
  total stops the program (status ``resource-limit``) so a flood fills neither memory nor disk.
- The program runs as a module named ``solution`` (not ``__main__``, so ``if __name__ ==
  "__main__":`` demo blocks in completions are skipped, as in the HumanEval harness): first ``code``,
  then ``tests`` in the same namespace. It reports how it ended on a private pipe.

Statuses (``SandboxResult.status``) and how each is detected:

- ``passed``: code and tests ran to the end (report "ok") and the process exited 0.
- ``failed``: the program's own fault: any exception in code or tests (AssertionError, SyntaxError,
  NameError, RecursionError, ...), ``SystemExit`` before the tests finished (so ``sys.exit(0)`` is not
  a pass), or an exit without reaching the end of the tests (``os._exit``).
- ``timeout``: the wall-clock deadline passed and the sandbox stopped it.
- ``resource-limit``: a limit stopped it: MemoryError or an OSError with ENOMEM/EFBIG/EAGAIN/EMFILE
  (address space, file size, process count, open files), death by SIGXCPU/SIGXFSZ/SIGKILL not sent
  by the sandbox (CPU hard limit, OOM killer), or output above ``max_output_bytes``.
- ``crashed``: the sandbox could not start or run the program (reason says why), or the program
  died of another signal (SIGSEGV from a C-level stack overflow, SIGABRT, ...).

Known limits: the sandbox protects the machine and the evaluator, not the reward. A program that
deliberately tampers with the child's report pipe or interpreter state could fake a pass.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import sys
import time

# -- child side: runs as ``python -I -B sandbox.py --sandbox-child CONFIG`` ------------------------
# Only the standard library, and nothing here may trust the program it runs.

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_NO_NEW_PRIVS = 38


def _prctl(option: int, value: int) -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except Exception:
        pass


def _child_main(cfg: dict) -> None:
    os.write(cfg["report_fd"], b"started\n")
    if cfg["supervise"]:
        _supervisor(cfg)  # never returns in the supervisor; returns in the forked program process
    _program(cfg)


class _Stop(Exception):
    pass


def _supervisor(cfg: dict) -> None:
    """Fork the program process, wait for it, then kill and reap every descendant; exit with the
    program's status (``128 + N`` for signal N, like bwrap). SIGTERM from the evaluator stops it."""
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)  # orphans of the program are re-parented to us, not to init

    def on_term(_signum, _frame):
        raise _Stop

    signal.signal(signal.SIGTERM, on_term)
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)  # the evaluator died: clean up too
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.setpgid(0, 0)
        return
    status = None
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: its pgid stays valid
    except (_Stop, ChildProcessError):
        pass
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        _, status = os.waitpid(pid, 0)
    except ChildProcessError:
        status = None
    _kill_descendants()
    if status is None:
        os._exit(1)
    os._exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))


def _kill_descendants() -> None:
    """SIGKILL every descendant and reap our children until none is left (bounded rounds)."""
    me = os.getpid()
    for _ in range(200):
        parents = {}
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    with open(f"/proc/{name}/stat", "rb") as f:
                        parents[int(name)] = int(f.read().rsplit(b")", 1)[1].split()[1])
                except (OSError, ValueError, IndexError):
                    pass
        tree, frontier = set(), [me]
        while frontier:
            p = frontier.pop()
            for child, parent in parents.items():
                if parent == p and child not in tree:
                    tree.add(child)
                    frontier.append(child)
        for p in tree:
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return  # no children left at all
            if pid == 0:
                break
        time.sleep(0.002)


def _program(cfg: dict) -> None:
    """Limit ourselves, become unprivileged, then run solution and tests; report; exit."""
    import builtins
    import resource

    report_fd = cfg["report_fd"]
    with open(cfg["solution"], encoding="utf-8") as f:
        solution = f.read()
    with open(cfg["tests"], encoding="utf-8") as f:
        tests = f.read()
    for limit, value in ((resource.RLIMIT_AS, cfg["memory_bytes"]), (resource.RLIMIT_FSIZE, cfg["file_size_bytes"]),
                         (resource.RLIMIT_NOFILE, 256), (resource.RLIMIT_CORE, 0),
                         (resource.RLIMIT_NPROC, cfg["nproc"])):
        resource.setrlimit(limit, (value, value))
    resource.setrlimit(resource.RLIMIT_CPU, (cfg["cpu_s"], cfg["cpu_s"] + 1))
    if cfg["uid"] is not None:
        os.setgroups([])
        os.setgid(cfg["uid"])
        os.setuid(cfg["uid"])
    if cfg["supervise"]:  # bwrap sets it itself (and the supervisor has imported ctypes already)
        _prctl(_PR_SET_NO_NEW_PRIVS, 1)
    if cfg["block_sockets"]:
        _disable_sockets()
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # oversize writes raise OSError(EFBIG) instead
    module = type(sys)("solution")
    module.__dict__["__builtins__"] = builtins
    sys.modules["solution"] = module
    os.write(report_fd, b"running\n")
    phase = "code"
    try:
        exec(compile(solution, "<solution>", "exec"), module.__dict__)
        phase = "tests"
        exec(compile(tests, "<tests>", "exec"), module.__dict__)
        outcome = {"outcome": "ok"}
    except SystemExit as e:
        outcome = {"outcome": "exit", "phase": phase, "code": repr(e.code)[:100]}
    except BaseException as e:
        outcome = {"outcome": "error", "phase": phase, "type": type(e).__name__,
                   "errno": getattr(e, "errno", None), "message": str(e)[:300]}
        try:  # the traceback without this runner's frame
            import traceback

            traceback.print_exception(type(e), e, e.__traceback__.tb_next)
        except BaseException:
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    try:
        os.write(report_fd, (json.dumps(outcome) + "\n").encode())
    except BaseException:
        pass
    os._exit(0 if outcome["outcome"] == "ok" else 1)


def _disable_sockets() -> None:
    """rlimits-only mode: make Python's socket constructors raise (no namespace to cut the network)."""
    import _socket
    import socket

    def refuse(*_args, **_kwargs):
        raise PermissionError(errno.EACCES, "network access is disabled in the sandbox")

    class NoSocket(socket.socket):
        def __init__(self, *_args, **_kwargs):
            refuse()

    for module in (socket, _socket):
        module.socket = NoSocket
        for name in ("socketpair", "fromfd", "create_connection", "create_server", "getaddrinfo"):
            if hasattr(module, name):
                setattr(module, name, refuse)
    socket.SocketType = NoSocket


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--sandbox-child":
    try:
        _child_main(json.loads(sys.argv[2]))
    finally:  # only reached when the sandbox itself failed before running the program
        os._exit(70)


# -- evaluator side --------------------------------------------------------------------------------
# Imported only here so that the child (this file run as a script) starts without them.

import math  # noqa: E402
import selectors  # noqa: E402
import shutil  # noqa: E402
import stat  # noqa: E402
import subprocess  # noqa: E402
import sysconfig  # noqa: E402
import tempfile  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from functools import lru_cache  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Iterable  # noqa: E402

_THIS_FILE = os.path.abspath(__file__)

STATUSES = ("passed", "failed", "timeout", "crashed", "resource-limit")
ISOLATION_LEVELS = ("bwrap", "unshare", "rlimits-only")
"""Strongest first."""

SANDBOX_UID = 65534
"""``nobody``: the uid a program runs as when the evaluator is root."""

_GRACE_S = 3.0
"""How long a stopped sandbox gets to clean up and exit before its group is SIGKILLed."""

_RESOURCE_ERRNOS = {errno.ENOMEM, errno.EFBIG, errno.EAGAIN, errno.EMFILE, errno.ENFILE, errno.ENOSPC}
_RESOURCE_SIGNALS = {signal.SIGXCPU, signal.SIGXFSZ, signal.SIGKILL}


@dataclass(frozen=True)
class SandboxResult:
    """How one program ended. ``status`` is one of ``STATUSES``; see the module docstring."""

    status: str
    returncode: int | None
    """Exit code of the program, ``-N`` when killed by signal N, None when it never ran."""
    stdout: str
    stderr: str
    """Both capped; together at most ``max_output_bytes``."""
    duration_s: float
    isolation: str
    """The isolation level it ran under: "bwrap", "unshare" or "rlimits-only"."""
    reason: str = ""
    """One line on why it did not pass (exception type and message, signal, limit hit)."""

    @property
    def passed(self) -> bool:
        return self.status == "passed"


@dataclass(frozen=True)
class Protections:
    """What an isolation level gives on this machine (tests skip attacks a level cannot stop)."""

    isolation: str
    network_namespace: bool
    """No network at all (else only Python's socket constructors are disabled)."""
    read_only_root: bool
    """The host filesystem is read-only; only a private tmpfs /tmp is writable."""
    pid_namespace: bool
    """The program cannot see or signal host processes."""
    unprivileged: bool
    """The program runs as a uid other than the evaluator's (``nobody`` under root), so it cannot
    signal the evaluator or write its files, and RLIMIT_NPROC applies."""


# -- public API ------------------------------------------------------------------------------------


def run_code(
    code: str,
    tests: str = "",
    timeout_s: float = 5.0,
    memory_mb: int = 512,
    *,
    cpu_s: float | None = None,
    file_size_mb: int = 16,
    max_processes: int = 32,
    max_output_bytes: int = 64 * 1024,
    tmpfs_mb: int = 64,
    isolation: str | None = None,
    env: dict[str, str] | None = None,
) -> SandboxResult:
    """Run ``code`` then ``tests`` in one namespace inside the sandbox; never raises (bar Ctrl-C).

    ``cpu_s`` defaults to ``ceil(timeout_s) + 1`` (a backstop; the wall clock normally fires first),
    ``file_size_mb`` caps each written file, ``max_processes`` the extra processes and threads,
    ``tmpfs_mb`` the bwrap ``/tmp``. ``isolation`` forces a level (default: the strongest available).
    ``env`` adds variables to the program's otherwise minimal environment.
    """
    start = time.monotonic()
    level = isolation or "?"
    try:
        level = isolation or _best_isolation()
        if level not in available_isolations():
            return _result("crashed", None, b"", b"", start, level, f"isolation '{level}' is not available here")
        return _run(code, tests, level, start, _Limits.make(timeout_s, memory_mb, cpu_s, file_size_mb,
                                                            max_processes, max_output_bytes, tmpfs_mb), env)
    except Exception as e:  # the evaluator must carry on whatever happens here
        return _result("crashed", None, b"", b"", start, level, f"sandbox error: {type(e).__name__}: {e}")


def run_many(jobs: Iterable[tuple[str, str]], max_workers: int = 2, **limits) -> list[SandboxResult]:
    """``run_code(code, tests, **limits)`` for each ``(code, tests)``, at most ``max_workers`` at a
    time (threads that wait on child processes); results in input order."""
    jobs = list(jobs)
    if max_workers <= 1 or len(jobs) <= 1:
        return [run_code(c, t, **limits) for c, t in jobs]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="sandbox") as pool:
        return list(pool.map(lambda job: run_code(job[0], job[1], **limits), jobs))


def isolation() -> str:
    """The strongest isolation level that works here: "bwrap", "unshare" or "rlimits-only"."""
    return _best_isolation()


@lru_cache(maxsize=None)
def available_isolations() -> tuple[str, ...]:
    """Every level that works here, strongest first (probed once per process)."""
    found = []
    if _probe(_bwrap_argv):
        found.append("bwrap")
    if _probe(_unshare_argv):
        found.append("unshare")
    found.append("rlimits-only")
    return tuple(found)


def protections(level: str | None = None) -> Protections:
    """The protections ``level`` (default: the best available) gives on this machine."""
    level = level or _best_isolation()
    return Protections(
        isolation=level,
        network_namespace=level in ("bwrap", "unshare"),
        read_only_root=level == "bwrap",
        pid_namespace=level == "bwrap",
        unprivileged=_drop_uid(level) is not None or (level == "bwrap" and os.geteuid() != 0),
    )


# -- evaluator side --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Limits:
    timeout_s: float
    memory_bytes: int
    cpu_s: int
    file_size_bytes: int
    max_processes: int
    max_output_bytes: int
    tmpfs_bytes: int

    @staticmethod
    def make(timeout_s, memory_mb, cpu_s, file_size_mb, max_processes, max_output_bytes, tmpfs_mb) -> "_Limits":
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 (got {timeout_s})")
        cpu = math.ceil(timeout_s) + 1 if cpu_s is None else max(1, math.ceil(cpu_s))
        mb = 1 << 20
        return _Limits(float(timeout_s), int(memory_mb * mb), cpu, int(file_size_mb * mb), int(max_processes),
                       int(max_output_bytes), int(tmpfs_mb * mb))


@lru_cache(maxsize=None)
def _best_isolation() -> str:
    return available_isolations()[0]


def _result(status, returncode, out: bytes, err: bytes, start, level, reason="") -> SandboxResult:
    return SandboxResult(status, returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"),
                         time.monotonic() - start, level, reason)


def _run(code: str, tests: str, level: str, start: float, limits: _Limits, extra_env) -> SandboxResult:
    hostdir = Path(tempfile.mkdtemp(prefix="evolm-sandbox-"))
    report_r = report_w = info_r = info_w = None
    try:
        os.chmod(hostdir, 0o755)
        (hostdir / "solution.py").write_text(code, encoding="utf-8")
        (hostdir / "tests.py").write_text(tests, encoding="utf-8")
        uid = _drop_uid(level)
        report_r, report_w = os.pipe()
        pass_fds = [report_w]
        if level == "bwrap":
            info_r, info_w = os.pipe()
            pass_fds.append(info_w)
            inside_dir, workdir, popen_cwd = "/tmp/.evolm", "/tmp/work", str(hostdir)
        else:
            workdir = str(hostdir / "work")
            os.mkdir(workdir)
            if uid is not None:
                os.chown(workdir, uid, uid)
            inside_dir, popen_cwd = str(hostdir), workdir
        cfg = {
            "solution": f"{inside_dir}/solution.py",
            "tests": f"{inside_dir}/tests.py",
            "report_fd": report_w,
            "supervise": level != "bwrap",
            "block_sockets": level == "rlimits-only",
            "uid": uid,
            "cpu_s": limits.cpu_s,
            "memory_bytes": limits.memory_bytes,
            "file_size_bytes": limits.file_size_bytes,
            "nproc": limits.max_processes + _tasks_of_uid(os.getuid() if uid is None else uid),
        }
        child = [sys.executable, "-I", "-B", _THIS_FILE, "--sandbox-child", json.dumps(cfg)]
        if level == "bwrap":
            argv = _bwrap_argv(str(hostdir), inside_dir, workdir, limits.tmpfs_bytes, info_w) + child
        elif level == "unshare":
            argv = _unshare_argv() + child
        else:
            argv = child
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
               "HOME": workdir, "TMPDIR": "/tmp" if level == "bwrap" else workdir, "EVOLM_SANDBOX": "1",
               "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        env.update(extra_env or {})
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    cwd=popen_cwd, env=env, pass_fds=pass_fds, start_new_session=True)
        except OSError as e:
            return _result("crashed", None, b"", b"", start, level, f"could not start the sandbox: {e}")
        os.close(report_w)
        report_w = None
        if info_w is not None:
            os.close(info_w)
            info_w = None
        out, err, report, raw_rc, stopped_for = _supervise_child(proc, report_r, info_r, limits, level, start)
        report_r = info_r = None
        status, rc, reason = classify_outcome(report, raw_rc, stopped_for, limits)
        return _result(status, rc, out, err, start, level, reason)
    finally:
        for fd in (report_r, report_w, info_r, info_w):
            if fd is not None:
                os.close(fd)
        _remove_tree(hostdir)


def _supervise_child(proc: subprocess.Popen, report_fd: int, info_fd: int | None, limits: _Limits, level: str,
                     start: float):
    """Read the child's output with a cap until it ends, stopping it at the deadline or on a flood.

    Returns ``(stdout, stderr, report_text, raw_returncode, stopped_for)``; closes the fds it reads.
    """
    deadline = start + limits.timeout_s
    bufs = {"stdout": bytearray(), "stderr": bytearray(), "report": bytearray(), "info": bytearray()}
    sel = selectors.DefaultSelector()
    streams = {proc.stdout.fileno(): "stdout", proc.stderr.fileno(): "stderr", report_fd: "report"}
    if info_fd is not None:
        streams[info_fd] = "info"
    for fd in streams:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ, streams[fd])
    try:
        pidfd = os.pidfd_open(proc.pid)  # readable once the child exits; the pid stays ours until reaped
        sel.register(pidfd, selectors.EVENT_READ, "exit")
    except (AttributeError, OSError):
        pidfd = None
    inner_pidfd = None  # the bwrap namespace init, once --info-fd tells us its pid
    exited_at = None  # when the direct child exited (it is not reaped until the end)
    stopped_for = None  # "timeout" | "output"
    stop_sent_at = None
    escalated = False
    output = 0

    def child_exited() -> bool:
        if pidfd is not None:
            return False  # the selector reports it
        try:  # WNOWAIT: look without reaping, so the pid (and our process group id) stays valid
            return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:
            return True

    def stop():
        nonlocal stop_sent_at
        stop_sent_at = time.monotonic()
        if inner_pidfd is not None:  # bwrap: the kernel kills and reaps the whole pid namespace
            _pidfd_kill(inner_pidfd)
        elif level == "bwrap":
            _killpg(proc.pid)
        else:
            try:  # the supervisor kills and reaps every descendant, then exits
                os.kill(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    try:
        while True:
            now = time.monotonic()
            if exited_at is None and child_exited():
                exited_at = now
            if exited_at is not None:
                if all(key.data == "exit" for key in sel.get_map().values()):
                    break  # every pipe is at EOF
                if now - exited_at > _GRACE_S:
                    break  # something we cannot reach holds the pipes open; stop reading
                if not escalated:  # the child is gone: finish off stragglers in its group, then drain
                    _killpg(proc.pid)
                    escalated = True
            elif stopped_for is None and now >= deadline:
                stopped_for = "timeout"
                stop()
            elif stop_sent_at is not None and not escalated and now - stop_sent_at > _GRACE_S:
                _killpg(proc.pid)  # the supervisor did not exit in time
                escalated = True
            if exited_at is not None or stop_sent_at is not None or pidfd is None:
                wait = 0.05
            else:
                wait = max(0.0, deadline - now)
            for key, _ in sel.select(timeout=wait):
                name = key.data
                if name == "exit":
                    exited_at = time.monotonic()
                    sel.unregister(key.fd)
                    continue
                try:
                    data = os.read(key.fd, 65536)
                except BlockingIOError:
                    continue
                if not data:
                    sel.unregister(key.fd)
                    continue
                if name in ("stdout", "stderr"):
                    keep = max(0, limits.max_output_bytes - output)
                    bufs[name] += data[:keep]
                    output += len(data)
                    if output > limits.max_output_bytes and stopped_for is None and exited_at is None:
                        stopped_for = "output"
                        stop()
                elif len(bufs[name]) < 65536:
                    bufs[name] += data
                    if name == "info" and inner_pidfd is None:
                        inner_pidfd = _inner_pidfd(bytes(bufs["info"]))
    finally:
        sel.close()
        # the child is dead (or about to be) but not yet reaped, so proc.pid is still our group id
        _killpg(proc.pid)
        try:
            proc.wait(timeout=_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for fd in (pidfd, inner_pidfd, report_fd, info_fd):
            if fd is not None:
                os.close(fd)
        proc.stdout.close()
        proc.stderr.close()
    return bytes(bufs["stdout"]), bytes(bufs["stderr"]), bufs["report"].decode("utf-8", "replace"), \
        proc.returncode, stopped_for


def classify_outcome(report: str, raw_returncode: int | None, stopped_for: str | None,
                     limits: _Limits | None = None) -> tuple[str, int | None, str]:
    """``(status, returncode, reason)`` from the child's report, its raw exit status and whether the
    sandbox stopped it (pure; the rules are listed in the module docstring).

    ``raw_returncode`` is what the evaluator saw: bwrap and the supervisor exit with ``128 + N`` when
    the program died of signal N; ``Popen`` gives ``-N`` when the direct child did.
    """
    rc = raw_returncode
    if rc is not None and rc > 128 and rc - 128 < 65:
        rc = -(rc - 128)
    if stopped_for == "timeout":
        limit = f" {limits.timeout_s:g}s" if limits is not None else ""
        return "timeout", rc, f"wall-clock limit{limit} reached"
    if stopped_for == "output":
        return "resource-limit", rc, "output limit reached"
    lines = [line for line in report.splitlines() if line.strip()]
    if not lines or lines[0] != "started":
        return "crashed", rc, "the sandbox did not start (see stderr)"
    if "running" not in lines[1:2]:
        return "crashed", rc, "the sandbox failed while setting up the program (see stderr)"
    final = None
    if len(lines) > 2:
        try:
            final = json.loads(lines[2])
        except ValueError:
            final = None
    if not isinstance(final, dict):
        final = None
    if final is not None and final.get("outcome") == "ok":
        if rc == 0:
            return "passed", rc, ""
        return "crashed", rc, f"the tests finished but the sandbox process exited with {rc}"
    if final is not None and final.get("outcome") == "error":
        kind, no = final.get("type", "Exception"), final.get("errno")
        where = final.get("phase", "code")
        reason = f"{kind} in {where}: {final.get('message', '')}".strip().rstrip(":")
        if kind == "MemoryError" or (no in _RESOURCE_ERRNOS):
            return "resource-limit", rc, reason
        return "failed", rc, reason
    if final is not None and final.get("outcome") == "exit":
        where = final.get("phase", "code")
        return "failed", rc, f"exit({final.get('code')}) called in {where} before the tests finished"
    if rc is not None and rc < 0:
        sig = -rc
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        if sig in _RESOURCE_SIGNALS:
            return "resource-limit", rc, f"killed by {name} (CPU, file size or memory limit)"
        return "crashed", rc, f"killed by {name}"
    return "failed", rc, f"exited with {rc} before the tests finished"


# -- command lines, probes and helpers (evaluator side) --------------------------------------------


def _bwrap_argv(hostdir: str, inside_dir: str = "/tmp/.evolm", workdir: str = "/tmp/work",
                tmpfs_bytes: int = 64 << 20, info_fd: int | None = None) -> list[str]:
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise FileNotFoundError("bwrap")
    argv = [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
            "--perms", "1777", "--size", str(tmpfs_bytes), "--tmpfs", "/tmp"]
    argv += _under_tmp_binds()
    if os.geteuid() == 0:
        argv += _reachable_binds()
    argv += ["--ro-bind", hostdir, inside_dir, "--perms", "0777", "--dir", workdir, "--chdir", workdir,
             "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
             "--die-with-parent", "--new-session"]
    if os.geteuid() == 0:  # bwrap drops all capabilities; keep the two needed to become nobody
        argv += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    if info_fd is not None:
        argv += ["--info-fd", str(info_fd)]
    return argv + ["--"]


def _unshare_argv() -> list[str]:
    unshare = shutil.which("unshare")
    if unshare is None:
        raise FileNotFoundError("unshare")
    return [unshare, "--net"] + ([] if os.geteuid() == 0 else ["--map-root-user"]) + ["--"]


def _probe(make_argv) -> bool:
    """Whether a sandbox command line starts Python here (run once per level and process)."""
    tmp = tempfile.mkdtemp(prefix="evolm-sandbox-probe-")
    try:
        os.chmod(tmp, 0o755)
        argv = make_argv(tmp) if make_argv is _bwrap_argv else make_argv()
        done = subprocess.run(argv + [sys.executable, "-I", "-c", "import os, json"], stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30, cwd=tmp)
        return done.returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _interpreter_paths() -> list[str]:
    paths = {sys.base_prefix, sys.prefix, sys.exec_prefix, sys.base_exec_prefix, os.path.dirname(_THIS_FILE)}
    for key in ("stdlib", "platstdlib"):
        paths.add(sysconfig.get_paths()[key])
    return sorted(p for p in paths if p and os.path.isdir(p))


def _blocked_ancestor(path: str) -> str | None:
    """The topmost directory on the way to ``path`` that others may not enter (None if all may)."""
    parts = Path(path).resolve().parts
    for i in range(2, len(parts) + 1):
        d = os.path.join(*parts[:i])
        try:
            if not os.stat(d).st_mode & stat.S_IXOTH:
                return d
        except OSError:
            return d
    return None


def _under_tmp_binds() -> list[str]:
    """bwrap arguments that re-bind, read-only, interpreter files that live under ``/tmp``.

    The sandbox's fresh tmpfs ``/tmp`` hides the host's ``/tmp``; a virtual environment or checkout
    there (e.g. a clean clone in ``/tmp``) would vanish with it and the child could not start. Only
    those directories come back, read-only, at the same paths; the rest of the host ``/tmp`` stays
    hidden.
    """
    tmp = os.path.realpath("/tmp")
    # resolved paths, plus the prefix as spelled (the child is started by that path)
    wanted = {str(Path(p).resolve()) for p in _interpreter_paths()} | {os.path.abspath(sys.prefix)}
    args: list[str] = []
    made: set[str] = set()
    bound: list[str] = []
    for real in sorted(wanted):
        root = next((r for r in (tmp, "/tmp") if real.startswith(r + "/")), None)
        if root is None or not os.path.isdir(real) or any(real == b or real.startswith(b + "/") for b in bound):
            continue
        args += _dirs_and_bind(real, root, "/tmp", made)
        bound.append(real)
    return args


def _dirs_and_bind(real: str, top: str, dest_top: str, made: set[str]) -> list[str]:
    """bwrap arguments that create the directories between ``dest_top`` and the destination of ``real``
    (the same path relative to ``top``; ``made`` remembers those already created) and bind ``real``
    there read-only."""
    rel = Path(real).relative_to(top).parts
    args: list[str] = []
    for i in range(1, len(rel)):
        d = os.path.join(dest_top, *rel[:i])
        if d not in made:
            args += ["--perms", "0755", "--dir", d]
            made.add(d)
    return args + ["--ro-bind", real, os.path.join(dest_top, *rel)]


def _reachable_binds() -> list[str]:
    """bwrap arguments that make the interpreter's own files reachable for an unprivileged uid.

    A prefix under a private directory (``/root`` is 0700) is re-bound read-only through a fresh
    0755 tmpfs over the private directory, which also hides the rest of it from the program.
    """
    args: list[str] = []
    mounted: set[str] = set()
    made: set[str] = set()
    bound: list[str] = []
    for real in sorted({str(Path(p).resolve()) for p in _interpreter_paths()}):
        if any(real == b or real.startswith(b + "/") for b in bound):
            continue  # already reachable through a parent bind
        top = _blocked_ancestor(real)
        if top is None:
            continue
        if not any(top == m or top.startswith(m + "/") for m in mounted):
            args += ["--perms", "0755", "--tmpfs", top]
            mounted.add(top)
        args += _dirs_and_bind(real, top, top, made)
        bound.append(real)
    return args


def _drop_uid(level: str) -> int | None:
    """The uid the program runs as, when it differs from ours: ``nobody`` when we are root and it can
    still read the interpreter (always under bwrap, which re-binds it into reach)."""
    if os.geteuid() != 0:
        return None
    if level == "bwrap":
        return SANDBOX_UID
    return SANDBOX_UID if all(_blocked_ancestor(p) is None for p in _interpreter_paths()) else None


def _tasks_of_uid(uid: int) -> int:
    """Tasks (processes and threads) whose real uid is ``uid``: what RLIMIT_NPROC counts."""
    total = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as f:
                fields = dict(line.split(b":", 1) for line in f.read().splitlines() if b":" in line)
            if int(fields[b"Uid"].split()[0]) == uid:
                total += int(fields[b"Threads"])
        except (OSError, KeyError, ValueError):
            continue
    return total


def _inner_pidfd(info: bytes) -> int | None:
    try:
        return os.pidfd_open(int(json.loads(info)["child-pid"]))
    except (ValueError, KeyError, TypeError, OSError, AttributeError):
        return None


def _pidfd_kill(pidfd: int) -> None:
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def _killpg(pgid: int, sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _remove_tree(path: Path) -> None:
    def make_writable(func, p, _exc):
        try:
            os.chmod(os.path.dirname(p), 0o700)
            os.chmod(p, 0o700)
            func(p)
        except OSError:
            pass

    shutil.rmtree(path, onerror=make_writable)
    if path.exists():
        shutil.rmtree(path, ignore_errors=True)
