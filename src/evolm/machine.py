"""What this machine offers a run: usable CPU cores, a CUDA GPU and its free memory, available RAM, Ray.

``config.resolve_auto`` turns the ``"auto"`` defaults (``model.device``, ``model.dtype``, ``model.threads``,
``distributed.workers``, ``generation.vllm_*``) into concrete values from these readings once, when a job
config is validated; the run directory then records the resolved values.

Design decisions:

- **Usable cores** (``usable_cores``): ``OMP_NUM_THREADS`` when set (the usual way to pin a process's
  threads; the test suite sets it to 1 so every pytest-xdist worker stays single-threaded and no tiny
  run starts Ray), else the cores this process may run on (``os.sched_getaffinity``), capped by a
  cgroup CPU quota (cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``) rounded down, at least 1. A
  container limited to 2 CPUs on a 64-core host is 2 cores, not 64.
- **bf16 matrix units on the CPU** (``cpu_bf16_native``): Intel AMX (``amx_bf16``, Sapphire Rapids and
  later), which torch's oneDNN uses for bfloat16 matmuls. On the 2-core Xeon this project measured, a bf16
  1024^3 product ran at 6.8x float32's rate and an ES iteration at 1.74-1.80x (docs/benchmarks.md, "CPU
  dtype"). A CPU without AMX is not counted: on the 2-core AMD EPYC this project also ran on, a bf16 ES
  update had not finished after 14 min where a float32 one took ~4 (docs/results.md).
  ``EVOLM_CPU_BF16=0`` / ``1`` overrides the reading (the test suite sets 0, as it sets
  ``OMP_NUM_THREADS``, so a default config means the same on every CI machine).
- Nothing here imports torch or Ray at module level: the CUDA reading imports torch when asked, Ray is
  only looked up (``find_spec``), never imported.
"""

from __future__ import annotations

import importlib.util
import math
import os
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")


def cgroup_cpu_limit(root: Path = CGROUP) -> float | None:
    """The CPU quota of this process's cgroup in CPUs (``2.0`` for ``cpu.max = "200000 100000"``), or None
    when there is none (no cgroup file, ``max``, or an unreadable value)."""
    try:
        text = (root / "cpu.max").read_text().split()
        if len(text) == 2 and text[0] != "max":
            return int(text[0]) / int(text[1])
        if text:
            return None
    except (OSError, ValueError, ZeroDivisionError):
        pass
    try:  # cgroup v1
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None


def usable_cores() -> tuple[int, str]:
    """How many cores this process may use, and where the number comes from (for the start-up line)."""
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if env:
        try:
            n = int(env)
        except ValueError:
            n = 0
        if n >= 1:
            return n, f"OMP_NUM_THREADS={n}"
    try:
        cores = len(os.sched_getaffinity(0))
        why = f"{cores} cores"
    except (AttributeError, OSError):  # not on Linux
        cores = os.cpu_count() or 1
        why = f"{cores} cores"
    quota = cgroup_cpu_limit()
    if quota is not None and math.floor(quota) < cores:
        cores = max(1, math.floor(quota))
        why = f"cgroup quota {quota:g} CPUs"
    return max(1, cores), why


def cuda_available() -> bool:
    """Whether torch sees a CUDA GPU (imports torch)."""
    import torch

    return torch.cuda.is_available()


def onednn_available() -> bool:
    """Whether this torch build can run oneDNN's float32 matmul (x86 wheels can; some ARM builds cannot; imports
    torch): ``generation.cpu_matmul = "auto"`` (``evolm.backends.cpu_matmul``)."""
    import torch

    return bool(torch.backends.mkldnn.is_available())


def cpu_bf16_native() -> tuple[bool, str]:
    """Whether this CPU multiplies bfloat16 matrices in hardware (AMX), and why (for the start-up line):
    ``EVOLM_CPU_BF16`` (0 or 1) when set, else torch's AMX reading (imports torch), else /proc/cpuinfo's
    ``amx_bf16`` flag."""
    env = os.environ.get("EVOLM_CPU_BF16", "").strip().lower()
    if env in ("0", "1", "false", "true", "no", "yes", "off", "on"):
        yes = env in ("1", "true", "yes", "on")
        return yes, f"EVOLM_CPU_BF16={env}"
    try:
        import torch

        yes = bool(torch.cpu._is_amx_tile_supported())
    except (ImportError, AttributeError, RuntimeError):
        try:
            yes = any(line.startswith("flags") and " amx_bf16" in line
                      for line in Path("/proc/cpuinfo").read_text().splitlines())
        except OSError:
            yes = False
    return yes, "a CPU with AMX bf16 matrix units" if yes else "a CPU without AMX"


def cuda_free_fraction(device: str = "cuda") -> tuple[float, float]:
    """``(free, total)`` memory of a CUDA device in GiB (``torch.cuda.mem_get_info``)."""
    import torch

    free, total = torch.cuda.mem_get_info(torch.device(device))
    return free / 2**30, total / 2**30


def available_ram_gb() -> float:
    """RAM available to new allocations in GiB (``MemAvailable`` of /proc/meminfo; elsewhere the free pages)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30
    except (ValueError, OSError, AttributeError):
        return 4.0


def ray_importable() -> bool:
    """Whether Ray is installed (looked up, not imported)."""
    try:
        return importlib.util.find_spec("ray") is not None
    except (ImportError, ValueError):
        return False
