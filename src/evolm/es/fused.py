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
- Counter noise (``evolm.es.noise.CounterNoise``): ``counter_perturb`` / ``counter_restore`` /
  ``counter_update`` compute each block's noise from its key (hash in uint32, lookup in the 18 KB
  quantile table) inside the same loops, so no noise tensor is ever written; ``counter_fill`` fills a
  buffer for other consumers. The per-member loops (hash, lookup, perturb, restore) have AVX-512 and
  AVX2 clones chosen at run time (GCC ``target_clones``, GCC >= 11 on x86-64): integer ops and
  separately rounded float mul/add/sub only, so every clone gives the same bits (CPU time per element
  of perturb + restore on this EPYC, 16M elements, a scratch timing on a loaded machine: 1.65 -> 1.2 ns, the
  table path 0.49 ns; measured alone, benchmarks/noise_sources.py). AVX-512's
  gather instruction was tried for the lookup and was slower than scalar loads here. The float
  arithmetic is the perturb's above, and the update rounds each product and sum on its own. Tested
  bit-identical to the torch ops.
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
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

constexpr int64_t B = 1024;

// Per-member loops are compiled for AVX-512 (x86-64-v4) and AVX2 besides the baseline, chosen at run
// time (GCC function multi-versioning). Only float mul/add/sub (no FMA: -ffp-contract=off) and exact
// integer ops are vectorised, so every clone gives the same bits.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11
#define EVOLM_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define EVOLM_CLONES
#endif

// The perturb of one block of m elements: n = t + d (d = a * e, rounded: no FMA under
// -ffp-contract=off), restore's n - d compared bit for bit with t; the originals that would not come
// back are recorded (global index, value); the block is written. One read of t and e, one write.
EVOLM_CLONES static void perturb_block(float* t, const float* e, float a, int64_t s, int64_t m,
                          std::vector<int64_t>& idx, std::vector<float>& val) {
  alignas(64) float now[B];
  alignas(64) uint8_t lost[B];
  const float* ts = t + s;
  for (int64_t j = 0; j < m; ++j) {
    const float d = a * e[j];
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

static std::vector<torch::Tensor> corrections(const std::vector<int64_t>& idx, const std::vector<float>& val) {
  auto where = torch::empty({(int64_t)idx.size()}, torch::kInt64);
  auto orig = torch::empty({(int64_t)val.size()}, torch::kFloat32);
  if (!idx.empty()) {
    std::memcpy(where.data_ptr<int64_t>(), idx.data(), idx.size() * sizeof(int64_t));
    std::memcpy(orig.data_ptr<float>(), val.data(), val.size() * sizeof(float));
  }
  return {where, orig};
}

std::vector<torch::Tensor> perturb(torch::Tensor theta, torch::Tensor eps, double factor) {
  const int64_t n = theta.numel();
  float* t = theta.data_ptr<float>();
  const float* e = eps.data_ptr<float>();
  const float a = static_cast<float>(factor);
  std::vector<int64_t> idx;
  std::vector<float> val;
  for (int64_t s = 0; s < n; s += B) perturb_block(t, e + s, a, s, std::min(B, n - s), idx, val);
  return corrections(idx, val);
}

// t -= round(a * e), element by element (restore)
EVOLM_CLONES static void subtract_block(float* t, const float* e, float a, int64_t m) {
  for (int64_t i = 0; i < m; ++i) {
    const float d = a * e[i];
    t[i] = t[i] - d;
  }
}

void restore(torch::Tensor theta, torch::Tensor eps, double factor) {
  subtract_block(theta.data_ptr<float>(), eps.data_ptr<float>(), static_cast<float>(factor), theta.numel());
}

// ---- counter noise (evolm.es.noise.CounterNoise): element i of a tensor with key words (k0, k1) has
// the hash h = mix2(mix1(i ^ k0) ^ k1) in uint32 arithmetic (what the torch reference computes in int64
// with 32-bit masks); u = h >> 12, cell c = u >> 8; its value is table[c] in the bulk and
// table[4096 + (u & 255)] or table[4352 + (u & 255)] in the two outer cells. Integer ops are exact, so
// the vectorised clones (AVX-512 / AVX2, chosen at run time where the CPU has them) and the plain one agree.
static inline uint32_t mix1(uint32_t x) {
  x ^= x >> 16; x *= 0x21f0aaadu;
  x ^= x >> 15; x *= 0x735a2d97u;
  return x ^ (x >> 15);
}

static inline uint32_t mix2(uint32_t x) {  // mix1 without its last xorshift: only the top 20 bits are used
  x ^= x >> 16; x *= 0x21f0aaadu;
  x ^= x >> 15; return x * 0x735a2d97u;
}

EVOLM_CLONES static void counter_index(uint32_t* __restrict out, int64_t s, int m, uint32_t k0, uint32_t k1) {
  const uint32_t first = static_cast<uint32_t>(s);  // element indices are < 2^32 (checked in Python)
  for (int j = 0; j < m; ++j) {
    const uint32_t u = mix2(mix1((first + static_cast<uint32_t>(j)) ^ k0) ^ k1) >> 12;
    const uint32_t c = u >> 8, t = u & 255u;
    out[j] = c == 0u ? 4096u + t : (c == 4095u ? 4352u + t : c);
  }
}

// noise of elements s .. s + m - 1 (m <= B) into e
EVOLM_CLONES static void counter_block(float* e, const float* table, uint32_t k0, uint32_t k1, int64_t s, int64_t m) {
  alignas(64) uint32_t ix[B];
  counter_index(ix, s, static_cast<int>(m), k0, k1);
  for (int64_t j = 0; j < m; ++j) e[j] = table[ix[j]];
}

void counter_fill(torch::Tensor out, torch::Tensor table, int64_t k0, int64_t k1, int64_t start) {
  const int64_t n = out.numel();
  float* o = out.data_ptr<float>();
  const float* tab = table.data_ptr<float>();
  for (int64_t s = 0; s < n; s += B) counter_block(o + s, tab, (uint32_t)k0, (uint32_t)k1, start + s, std::min(B, n - s));
}

std::vector<torch::Tensor> counter_perturb(torch::Tensor theta, torch::Tensor table, int64_t k0, int64_t k1, double factor) {
  const int64_t n = theta.numel();
  float* t = theta.data_ptr<float>();
  const float* tab = table.data_ptr<float>();
  const float a = static_cast<float>(factor);
  std::vector<int64_t> idx;
  std::vector<float> val;
  alignas(64) float e[B];
  for (int64_t s = 0; s < n; s += B) {
    const int64_t m = std::min(B, n - s);
    counter_block(e, tab, (uint32_t)k0, (uint32_t)k1, s, m);
    perturb_block(t, e, a, s, m, idx, val);
  }
  return corrections(idx, val);
}

void counter_restore(torch::Tensor theta, torch::Tensor table, int64_t k0, int64_t k1, double factor) {
  const int64_t n = theta.numel();
  float* t = theta.data_ptr<float>();
  const float* tab = table.data_ptr<float>();
  const float a = static_cast<float>(factor);
  alignas(64) float e[B];
  for (int64_t s = 0; s < n; s += B) {
    const int64_t m = std::min(B, n - s);
    counter_block(e, tab, (uint32_t)k0, (uint32_t)k1, s, m);
    subtract_block(t + s, e, a, m);
  }
}

// theta += round(scale * acc), acc = sum over d, in order, of round(c_d * eps_d) (from 0), per element;
// keys: int64 (D, 2), coefs: float64 (D). write = false only checks that every new value is finite.
EVOLM_CLONES static bool counter_update_loop(float* t, int64_t n, const float* tab, const int64_t* k, const float* c,
                                             int64_t D, float sc, bool write) {
  alignas(64) float e[B];
  alignas(64) float acc[B];
  for (int64_t s = 0; s < n; s += B) {
    const int64_t m = std::min(B, n - s);
    std::fill(acc, acc + m, 0.0f);
    for (int64_t d = 0; d < D; ++d) {
      counter_block(e, tab, (uint32_t)k[2 * d], (uint32_t)k[2 * d + 1], s, m);
      const float cd = c[d];
      for (int64_t j = 0; j < m; ++j) {
        const float p = cd * e[j];
        acc[j] = acc[j] + p;
      }
    }
    float* ts = t + s;
    if (write) {
      for (int64_t j = 0; j < m; ++j) {
        const float step = sc * acc[j];
        ts[j] = ts[j] + step;
      }
    } else {
      for (int64_t j = 0; j < m; ++j) {
        const float step = sc * acc[j];
        if (!std::isfinite(ts[j] + step)) return false;
      }
    }
  }
  return true;
}

bool counter_update(torch::Tensor theta, torch::Tensor table, torch::Tensor keys, torch::Tensor coefs, double scale,
                    bool write) {
  const int64_t D = coefs.numel();
  const double* c64 = coefs.data_ptr<double>();
  std::vector<float> c(D);
  for (int64_t d = 0; d < D; ++d) c[d] = static_cast<float>(c64[d]);
  return counter_update_loop(theta.data_ptr<float>(), theta.numel(), table.data_ptr<float>(), keys.data_ptr<int64_t>(),
                             c.data(), D, static_cast<float>(scale), write);
}
"""


NAME = "evolm_es_fused_v2"
FUNCTIONS = ["perturb", "restore", "counter_fill", "counter_perturb", "counter_restore", "counter_update"]
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
            module = load_inline(name=NAME, cpp_sources=[_SOURCE], functions=FUNCTIONS,
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


def usable_counter(tensor, table) -> bool:
    """Whether the kernel can perturb / update this tensor with counter noise from ``table`` in place
    (contiguous float32 on the CPU, fewer than 2^32 elements)."""
    return (tensor.device.type == "cpu" and tensor.dtype == torch.float32 and tensor.is_contiguous()
            and tensor.numel() < 1 << 32 and table.device.type == "cpu")


def usable(tensor, eps) -> bool:
    """Whether the kernel can take this tensor and its noise (contiguous float32 on the CPU)."""
    return (tensor.device.type == "cpu" and tensor.dtype == torch.float32 and eps.dtype == torch.float32
            and tensor.is_contiguous() and eps.is_contiguous() and eps.device.type == "cpu")
