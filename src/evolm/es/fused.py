"""An optional fused CPU kernel for ``ParamSet.perturb`` / ``restore`` (one pass instead of five).

The exact-restore scheme of ``evolm.es.params`` computes, per element, the perturbed value
``n = theta + d`` (``d = a * eps``), the value restore will compute, ``n - d``, compares its bit
pattern with ``theta`` and records the originals that would not come back. With torch ops that is
five passes over memory plus a ``nonzero`` scan; this kernel does it in one loop (measured gain in
docs/benchmarks.md: ES's iteration time over pure generation).

Design decisions:

- Built on first use with ``torch.utils.cpp_extension.load_inline`` (needs a C++ compiler and ninja;
  ~30 s, cached under ``$EVOLM_CACHE/torch_extensions``, so later processes load it in about a
  second; a build lock older than five minutes, left by a killed build, is removed). If the
  build fails, or ``EVOLM_FUSED=0`` is set, ``kernel()`` returns None and the torch path is used:
  same exactness, slower. ``ParamSet`` uses one path for a perturb and its restore.
- Compiled with ``-ffp-contract=off``: ``d = a * eps`` is rounded to float32 before the add, in
  perturb and in restore alike, so the comparison made at perturb time predicts restore bit for bit.
  (The perturbed weights can differ from the torch path's in the last bit where torch fuses the
  multiply-add; runs are reproducible on one machine, as the seed log's replay promises.)
- Only contiguous float32 CPU tensors; anything else takes the torch path.
"""

from __future__ import annotations

import os
from functools import lru_cache

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
STALE_LOCK_S = 300


@lru_cache(maxsize=None)
def kernel():
    """The compiled module (``perturb(theta, eps, factor) -> (where, originals)``, ``restore``), or None."""
    if os.environ.get("EVOLM_FUSED", "1") == "0":
        return None
    try:
        import logging
        import sys
        import time

        from torch.utils.cpp_extension import load_inline

        build = cache_dir() / "torch_extensions" / NAME
        build.mkdir(parents=True, exist_ok=True)
        lock = build / "lock"  # torch waits forever on a lock left by a build that was killed
        if lock.exists() and time.time() - lock.stat().st_mtime > STALE_LOCK_S:
            lock.unlink(missing_ok=True)
        if not any(build.glob("*.so")):
            print(f"[evolm] building the fused ES kernel once (~30 s) in {build}", file=sys.stderr, flush=True)
        _ninja_on_path()
        logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
        return load_inline(name=NAME, cpp_sources=[_SOURCE], functions=["perturb", "restore"],
                           extra_cflags=["-O3", "-ffp-contract=off"], build_directory=str(build), verbose=False)
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
