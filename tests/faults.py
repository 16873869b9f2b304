"""Fault injection for the kill / resume tests: run the real ``evolm`` CLI in a forked child process and
kill it at a chosen moment.

Two ways to kill, both a real SIGKILL (no ``finally``, no ``atexit``, nothing flushed):

- from outside: ``run_cli(argv, signal_when=(predicate, signum))`` polls the run directory and sends the
  signal once the predicate holds (e.g. "metrics.jsonl has update 1"), as a user or a scheduler would;
- from inside, at an exact point of evolm's own code: ``run_cli(argv, prepare=...)`` runs a *hook* in
  the child before the CLI starts. A hook wraps one function (``os.replace`` into a given path, a
  method's n-th call, the n-th JSONL append) so that the child SIGKILLs itself there: after a
  checkpoint's temporary directory is complete but before it is renamed, between the two renames
  that swap ``final/``, in the middle of writing a metrics line, in the middle of generating.

Forking (instead of a new interpreter) keeps each child cheap: torch, transformers and the test's
registered toy tasks are already imported. The child's stdout and stderr go to a log file.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

KILLED = -signal.SIGKILL


@dataclass
class Outcome:
    rc: int
    """Exit status, or minus the signal that ended the child (``KILLED`` for SIGKILL)."""
    log: str
    """Everything the child printed (stdout and stderr)."""


def die() -> None:
    """SIGKILL this process, now."""
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)  # never reached


def run_cli(argv: list[str], log: Path, *, prepare: Callable[[], None] | None = None,
            signal_when: tuple[Callable[[], bool], int] | None = None, timeout: float = 900.0) -> Outcome:
    """Run ``evolm argv`` in a forked child (``prepare()`` first, in the child) and wait for it."""
    log = Path(log)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        rc = 99
        try:
            out = open(log, "w", buffering=1)
            os.dup2(out.fileno(), 1)
            os.dup2(out.fileno(), 2)
            sys.stdout = sys.stderr = out
            signal.signal(signal.SIGINT, signal.default_int_handler)
            if prepare is not None:
                prepare()
            from evolm.commands import main

            rc = main(argv)
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 1
        except BaseException:
            traceback.print_exc()
            rc = 98
        finally:
            try:
                sys.stdout.flush()
            finally:
                os._exit(rc)
    deadline = time.monotonic() + timeout
    sent = False
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if signal_when is not None and not sent and signal_when[0]():
            os.kill(pid, signal_when[1])
            sent = True
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise TimeoutError(f"evolm {' '.join(argv)} did not end within {timeout:.0f} s; log:\n{log.read_text()}")
        time.sleep(0.005)
    rc = os.waitstatus_to_exitcode(status)
    return Outcome(rc, log.read_text() if log.exists() else "")


# -- hooks: each returns a ``prepare`` callable that arms the kill in the child ------------------------

def kill_on_replace(dst: str, *, src: str | None = None, when: str = "before", nth: int = 1) -> Callable[[], None]:
    """Die at the ``nth`` ``os.replace`` into a path matching regex ``dst`` (and from ``src``), just
    ``before`` or ``after`` it happens."""

    def prepare():
        real = os.replace
        seen = [0]

        def replace(a, b, *args, **kwargs):
            if re.search(dst, os.fspath(b)) and (src is None or re.search(src, os.fspath(a))):
                seen[0] += 1
                if seen[0] == nth and when == "before":
                    die()
                real(a, b, *args, **kwargs)
                if seen[0] == nth and when == "after":
                    die()
                return
            real(a, b, *args, **kwargs)

        os.replace = replace

    return prepare


def kill_on_call(owner, attribute: str, nth: int, *, after: bool = False) -> Callable[[], None]:
    """Die at the ``nth`` call of ``owner.attribute`` (a class or module attribute), before it runs
    (or ``after`` it returned)."""

    def prepare():
        real = getattr(owner, attribute)
        seen = [0]

        def wrapper(*args, **kwargs):
            seen[0] += 1
            if seen[0] == nth and not after:
                die()
            out = real(*args, **kwargs)
            if seen[0] == nth and after:
                die()
            return out

        setattr(owner, attribute, wrapper)

    return prepare


def kill_mid_append(file_name: str, nth: int) -> Callable[[], None]:
    """Die halfway through writing the ``nth`` JSONL record appended to a file called ``file_name``
    (the first half of the line is on disk, fsynced: a torn record)."""

    def prepare():
        from evolm import runs

        real = runs.append_jsonl
        seen = [0]

        def append(path, record):
            if Path(path).name == file_name:
                seen[0] += 1
                if seen[0] == nth:
                    line = runs.to_json(record) + "\n"
                    with open(path, "a") as f:
                        f.write(line[: len(line) // 2])
                        f.flush()
                        os.fsync(f.fileno())
                    die()
            real(path, record)

        runs.append_jsonl = append

    return prepare


def both(*prepares: Callable[[], None]) -> Callable[[], None]:
    def prepare():
        for p in prepares:
            p()

    return prepare
