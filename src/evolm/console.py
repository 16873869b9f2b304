"""What evolm prints while it works: one-line status messages and progress bars with ETA.

Design decisions:

- ``say_for(quiet)`` returns the printer a job uses for its ``[evolm] ...`` lines (flushed at once, so
  a log tailed by a scheduler shows them as they happen); ``quiet`` silences them for library use and
  tests. Errors never go through it: they are raised (``evolm.errors``) and printed by the CLI.
- ``progress_bar`` is tqdm with the settings every long loop shares (stdout, dynamic width, ETA), or
  None when disabled, so callers write ``if bar: bar.update(1)``.
"""

from __future__ import annotations

import sys
from typing import Callable

Say = Callable[..., None]


def say_for(quiet: bool = False) -> Say:
    """A ``print`` that flushes, or a no-op when ``quiet``."""
    if quiet:
        return lambda *args: None
    return lambda *args: print(*args, flush=True)


def progress_bar(total: int, desc: str, unit: str = "it", initial: int = 0, enabled: bool = True, leave: bool = True):
    """A tqdm progress bar with ETA on stdout, or None when not ``enabled``."""
    if not enabled:
        return None
    from tqdm.auto import tqdm  # imported on use: tqdm.auto probes for notebooks at import

    return tqdm(total=total, initial=initial, desc=desc, unit=unit, dynamic_ncols=True, file=sys.stdout, leave=leave)
