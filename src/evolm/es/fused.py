"""An optional fused CPU kernel for ``ParamSet.perturb`` / ``restore`` (one pass instead of five).

The exact-restore scheme of ``evolm.es.params`` computes, per element, the perturbed value
``n = theta + d`` (``d = a * eps``), the value restore will compute, ``n - d``, compares its bit
pattern with ``theta`` and records the originals that would not come back. With torch ops that is
five passes over memory plus a ``nonzero`` scan; this kernel does it in one loop (measured gain in
docs/benchmarks.md: ES's iteration time over pure generation).

Design decisions:

- Built on first use with ``torch.utils.cpp_extension.load_inline`` (needs a C++ compiler and ninja;
  30-80 s, cached, so later processes load it in about a second). If the build fails, or
  ``EVOLM_FUSED=0`` is set, ``kernel()`` returns None and the torch path is used: same exactness,
  slower. ``ParamSet`` uses one path for a perturb and its restore. The ES engine asks for the kernel
  before its timed loop, so a build never lands in an update's timings or the progress bar's ETA.
- The build folder is keyed by what the binary depends on: ``$EVOLM_CACHE/torch_extensions/
  evolm_es_fused_v2-<key>``, the key a hash of the torch version and install path (torch's build file names its include
  paths, so two venvs must not share a folder), the Python ABI tag, the C++
  compiler's ``--version`` line and the kernel source and flags (spelled out in ``key.json`` there),
  so two environments never rebuild each other's kernel. Every build is announced on stderr.
- Builds are serialised by an OS lock (``flock`` on ``evolm.lock`` in the build folder), which the
  kernel drops when its holder dies, however it dies. torch's own ``lock`` file is not: a process
  killed mid-build leaves it and torch then waits for it forever. Holding the OS lock proves no live
  evolm process is building there, so a ``lock`` file found then is stale and removed. A process that
  cannot get the OS lock within ``BUILD_WAIT_S`` (another build still running) says so and uses the
  torch path.
- Compiled with ``-ffp-contract=off``: ``d = a * eps`` is rounded to float32 before the add, in
  perturb and in restore alike, so the comparison made at perturb time predicts restore bit for bit.
  (The perturbed weights can differ from the torch path's in the last bit where torch fuses the
  multiply-add; runs are reproducible on one machine, as the seed log's replay promises.)
- Only contiguous float32 CPU tensors; anything else takes the torch path.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from functools import lru_cache
from pathlib import Path
from typing import Iterator

import torch

from evolm.models import cache_dir

_SOURCE = r"""
#include <torch/extension.h>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

std::vector<torch::Tensor> perturb(torch::Tensor theta, torch::Tensor eps, double factor) {
  // Blocks of B elements: a vectorisable loop computes the perturbed values and a mismatch flag per
  // element into L1-resident buffers; a scan of the flags (8 at a time) records the originals that
  // restore would not give back; then the block is written. One read of theta and eps, one write.
  constexpr int64_t B = 1024;
  const int64_t n = theta.numel();
  float* t = theta.data_ptr<float>();
  const float* e = eps.data_ptr<float>();
  const float a = static_cast<float>(factor);
  std::vector<int64_t> idx;
  std::vector<float> val;
  alignas(64) float now[B];
  alignas(64) uint8_t lost[B];
  for (int64_t s = 0; s < n; s += B) {
    const int64_t m = std::min(B, n - s);
    const float* ts = t + s;
    const float* es = e + s;
    for (int64_t j = 0; j < m; ++j) {
      const float d = a * es[j];
      const float nw = ts[j] + d;
      const float back = nw - d;
      uint32_t x, y;
      std::memcpy(&x, &back, 4);
      std::memcpy(&y, &ts[j], 4);
      now[j] = nw;
      lost[j] = static_cast<uint8_t>(x != y);
    }
    int64_t j = 0;
    for (; j + 8 <= m; j += 8) {
      uint64_t w;
      std::memcpy(&w, lost + j, 8);
      if (w == 0) continue;
      for (int64_t q = j; q < j + 8; ++q)
        if (lost[q]) { idx.push_back(s + q); val.push_back(ts[q]); }
    }
    for (; j < m; ++j)
      if (lost[j]) { idx.push_back(s + j); val.push_back(ts[j]); }
    std::memcpy(t + s, now, m * sizeof(float));
  }
  auto where = torch::empty({(int64_t)idx.size()}, torch::kInt64);
  auto orig = torch::empty({(int64_t)val.size()}, torch::kFloat32);
  if (!idx.empty()) {
    std::memcpy(where.data_ptr<int64_t>(), idx.data(), idx.size() * sizeof(int64_t));
    std::memcpy(orig.data_ptr<float>(), val.data(), val.size() * sizeof(float));
  }
  return {where, orig};
}

void restore(torch::Tensor theta, torch::Tensor eps, double factor) {
  const int64_t n = theta.numel();
  float* t = theta.data_ptr<float>();
  const float* e = eps.data_ptr<float>();
  const float a = static_cast<float>(factor);
  for (int64_t i = 0; i < n; ++i) {
    const float d = a * e[i];
    t[i] = t[i] - d;
  }
}
"""


NAME = "evolm_es_fused_v2"
CFLAGS = ["-O3", "-ffp-contract=off"]
BUILD_WAIT_S = 600.0
"""How long a process waits for another one's build of the kernel before it uses the torch path."""


def build_key() -> dict:
    """What the compiled kernel depends on: torch version, Python ABI, C++ compiler, source and flags."""
    import hashlib
    import subprocess
    import sysconfig

    compiler = os.environ.get("CXX", "c++")
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
        version = version.strip().splitlines()[0] if version.strip() else "unknown"
    except (OSError, subprocess.SubprocessError):
        version = "none"
    # torch's build.ninja names the include paths of the torch it builds against: two installs of the
    # same version at different paths (two venvs) would otherwise rebuild each other's folder in turn
    return {"torch": torch.__version__, "torch_path": os.path.dirname(torch.__file__),
            "python": sysconfig.get_config_var("SOABI") or sys.implementation.cache_tag,
            "compiler": f"{compiler}: {version}",
            "source": hashlib.sha256((_SOURCE + " ".join(CFLAGS)).encode()).hexdigest()[:16]}


def build_dir(key: dict | None = None) -> Path:
    """``$EVOLM_CACHE/torch_extensions/evolm_es_fused_v2-<hash of build_key()>``."""
    import hashlib

    key = key or build_key()
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    return cache_dir() / "torch_extensions" / f"{NAME}-{digest}"


def _say(message: str) -> None:
    print(f"[evolm] {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def build_lock(build: Path, wait_s: float | None = None) -> Iterator[bool]:
    """Hold the folder's OS lock (``flock``; released by the kernel when the holder dies); yields False
    if another process held it for ``wait_s`` seconds (default ``BUILD_WAIT_S``)."""
    wait_s = BUILD_WAIT_S if wait_s is None else wait_s
    try:
        import fcntl
    except ImportError:  # not POSIX: no OS lock; torch's own lock file is all there is
        yield True
        return
    with open(build / "evolm.lock", "a+") as f:
        deadline, told = time.monotonic() + wait_s, False
        while True:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                if time.monotonic() >= deadline:
                    _say(f"another process has been building the fused ES kernel in {build} for over {wait_s:.0f} s; "
                         "using the torch ops (same results, slower)")
                    yield False
                    return
                if not told:
                    f.seek(0)
                    holder = f.read().strip() or "?"
                    _say(f"waiting for process {holder} to finish building the fused ES kernel in {build}")
                    told = True
                time.sleep(0.2)
        try:
            f.seek(0)
            f.truncate()
            f.write(str(os.getpid()))
            f.flush()
            yield True
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


@lru_cache(maxsize=None)
def kernel():
    """The compiled module (``perturb(theta, eps, factor) -> (where, originals)``, ``restore``), or None."""
    if os.environ.get("EVOLM_FUSED", "1") == "0":
        return None
    try:
        import logging

        from torch.utils.cpp_extension import load_inline

        key = build_key()
        build = build_dir(key)
        build.mkdir(parents=True, exist_ok=True)
        if not (build / "key.json").exists():
            (build / "key.json").write_text(json.dumps(key, indent=2) + "\n")
        with build_lock(build) as held:
            if not held:
                return None
            # holding the OS lock, no live evolm process is inside torch's build here: a torch lock
            # file is a killed build's, and torch would wait for it forever
            (build / "lock").unlink(missing_ok=True)
            fresh = not (build / f"{NAME}.so").exists()
            if fresh:
                _say(f"building the fused ES kernel (about a minute, once per torch, Python and compiler) in {build}")
            t0 = time.perf_counter()
            _ninja_on_path()
            logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
            module = load_inline(name=NAME, cpp_sources=[_SOURCE], functions=["perturb", "restore"],
                                 extra_cflags=CFLAGS, build_directory=str(build), verbose=False)
            if fresh:
                _say(f"fused ES kernel built in {time.perf_counter() - t0:.0f} s")
            return module
    except Exception:  # no compiler, no ninja, no headers: the torch path is exact too
        return None


def _ninja_on_path() -> None:
    """torch runs ``ninja`` from PATH; the pip package (a dependency) lives in the venv's bin, which
    is not on PATH when ``.venv/bin/evolm`` is run directly."""
    import shutil

    if shutil.which("ninja"):
        return
    import ninja  # a dependency of evolm; only its binary's location is needed

    os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")


def usable(tensor, eps) -> bool:
    """Whether the kernel can take this tensor and its noise (contiguous float32 on the CPU)."""
    return (tensor.device.type == "cpu" and tensor.dtype == torch.float32 and eps.dtype == torch.float32
            and tensor.is_contiguous() and eps.is_contiguous() and eps.device.type == "cpu")
