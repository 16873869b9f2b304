"""Counter noise on CUDA in Triton kernels: fill, perturb, restore and update, one launch per tensor (or chunk).

``evolm.es.noise.CounterNoise`` defines the noise (a 32-bit hash of the element index with two key words,
its top 20 bits indexing an 18 KB quantile table) and ``evolm.es.params.ParamSet`` the arithmetic around
it. On the CPU the compiled C++ kernel (``evolm.es.fused``) computes both in one loop; on a GPU the torch
ops of ``counter_indices`` are ~30 separate int64 kernels per 2^20-element chunk (about 60k launches per
member at 1.5B parameters). This module does the same work in one Triton kernel per tensor (per 2^22-element
chunk for the perturb, which records restore corrections) and must give the same bits.

Design decisions:

- Same bits as the torch ops and the CPU kernel, by construction: the hash in uint32 (wrapping multiply,
  logical shifts: what the C++ kernel computes, and what the torch ops compute in int64 with 32-bit
  masks), an integer table index, one load from the table, and IEEE single-precision ``*``, ``+``, ``-``
  each rounded on its own in the order ``ParamSet``'s torch path uses:
  perturb ``d = round(a * eps)``, ``theta' = round(theta + d)``, restore's ``round(theta' - d)`` predicted
  and compared bit for bit with ``theta`` (the originals that would not come back are recorded, as the
  torch path does); restore ``theta' - d`` then the corrections; the masters path (lower-precision
  models) ``cast(round(master + d))`` with round-to-nearest-even (bfloat16 rounded in integer ops, as
  torch's ``c10::BFloat16`` does: Triton's interpreter truncates in its own float-to-bfloat16 cast, and
  integer ops give the same bits on every backend); the update ``acc = 0``,
  ``acc = round(acc + round(c_d * eps_d))`` in direction order, ``theta + round(scale * acc)``.
  Scalars (``a``, ``c_d``, ``scale``) are rounded to float32 first, as torch does with a Python scalar.
- No fused multiply-add, enforced twice on NVIDIA GPUs. Triton's NVIDIA backend contracts ``a * b + c``
  into an FMA by default (``enable_fp_fusion``, default on unless ``TRITON_DEFAULT_FP_FUSION=0``; it
  also passes ``--fmad=false`` to ptxas when off). Every launch here passes ``enable_fp_fusion=False``,
  and on CUDA (not ROCm) every float multiply, add and subtract is written as inline PTX with an
  explicit rounding modifier (``mul.rn.f32``, ``add.rn.f32``, ``sub.rn.f32``): the PTX ISA lets the
  optimiser (ptxas) fuse only mul/add *without* a rounding modifier into an FMA and treats those with one
  conservatively (and, without ``.ftz``, they keep subnormals, as torch's CUDA kernels do). Under Triton's interpreter
  (``TRITON_INTERPRET=1``, numpy on the CPU, which cannot run inline assembly) the plain operators run,
  and numpy rounds float32 ``*`` / ``+`` / ``-`` one by one. What is checked without a GPU
  (``tests/test_counter_triton.py``): the interpreter gives the torch ops' bits; and every kernel compiled
  for sm_80 and sm_90 by Triton's own LLVM and the ptxas it ships has no ``fma`` in its PTX and no
  ``FFMA`` in its SASS (``cuobjdump``), where the same kernels written with plain operators under Triton's
  default fusion have one FFMA per multiply-add. Either measure alone removes them. Not yet checked:
  the bits on a real GPU (``evolm.es.noise_speed.benchmark_counter_noise`` compares them with the torch ops' when one is lent).
- Chosen only for CUDA tensors when Triton imports (``usable``); ``EVOLM_TRITON=0`` turns it off (the
  torch ops then run, same bits, more launches). ``EVOLM_TRITON=interpret`` together with
  ``TRITON_INTERPRET=1`` lets CPU tensors take this path too, for the tests only: the CPU's own paths
  (C++ kernel, torch ops) are otherwise never replaced. evolm imports and runs without triton; this
  module is imported only when a non-CPU tensor (or that test setting) asks for it.
- Perturb works in chunks of ``PERTURB_CHUNK`` (2^22) elements: the kernel writes the perturbed values in
  place, a 1-byte "would not restore" flag per element and the original value where the flag is set
  (a masked store: ~0.6% of lanes write), then ``nonzero`` gathers the corrections (one device sync per
  chunk, as the torch path has). Fill, restore and the update need no temporaries: one launch per
  tensor. The update's finiteness check (``write=False``) writes one flag per block, read once.
- Tensors must be contiguous with fewer than 2^32 elements (the element index is one 32-bit word).
"""

from __future__ import annotations

import os
import time

import numpy as np
import torch

try:
    import triton
    import triton.language as tl
except Exception:  # not installed, or broken: the torch ops are used
    triton = tl = None

BLOCK = 1024
FP_FUSION = False
"""Triton's ``enable_fp_fusion`` for every launch here: off, so ``a * b + c`` is never contracted into an FMA."""
PERTURB_CHUNK = 1 << 22
"""Elements per perturb launch: its flag and original-value buffers are 5 B per element (20 MB)."""


def triton_available() -> bool:
    """Whether Triton imports here (it may still have no GPU to run on)."""
    return triton is not None


def interpreting() -> bool:
    """Whether Triton's interpreter runs the kernels (``TRITON_INTERPRET=1``, set before triton was imported)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def usable(*tensors: torch.Tensor) -> bool:
    """Whether these tensors (the weights, the table, ...) can take the Triton path: Triton importable,
    ``EVOLM_TRITON`` not 0, all contiguous on one CUDA device with fewer than 2^32 elements (CPU tensors only
    under the interpreter with ``EVOLM_TRITON=interpret``, for the tests)."""
    mode = os.environ.get("EVOLM_TRITON", "1")
    if triton is None or mode == "0":
        return False
    device = tensors[0].device
    if device.type == "cpu" and not (mode == "interpret" and interpreting()):
        return False
    return all(t.device == device and t.is_contiguous() and t.numel() < 1 << 32 for t in tensors)


def _explicit_rounding(device: torch.device) -> bool:
    """Inline PTX with ``.rn`` for every float op: on NVIDIA GPUs (not ROCm, not the interpreter)."""
    return device.type == "cuda" and torch.version.hip is None and not interpreting()


def _f32(x: float) -> float:
    """``x`` rounded to float32 (as torch rounds a Python scalar it multiplies a float32 tensor by)."""
    return float(np.float32(x))


if triton is not None:

    @triton.jit
    def _mul(a, b, ASM: tl.constexpr):
        if ASM:
            return tl.inline_asm_elementwise("mul.rn.f32 $0, $1, $2;", "=r,r,r", [a, b], dtype=tl.float32,
                                             is_pure=True, pack=1)
        else:
            return a * b

    @triton.jit
    def _add(a, b, ASM: tl.constexpr):
        if ASM:
            return tl.inline_asm_elementwise("add.rn.f32 $0, $1, $2;", "=r,r,r", [a, b], dtype=tl.float32,
                                             is_pure=True, pack=1)
        else:
            return a + b

    @triton.jit
    def _sub(a, b, ASM: tl.constexpr):
        if ASM:
            return tl.inline_asm_elementwise("sub.rn.f32 $0, $1, $2;", "=r,r,r", [a, b], dtype=tl.float32,
                                             is_pure=True, pack=1)
        else:
            return a - b

    @triton.jit
    def _cast(x, DTYPE: tl.constexpr):
        """float32 ``x`` rounded to nearest even in ``DTYPE``; bfloat16 in integer ops (torch's own rounding)."""
        if DTYPE == tl.bfloat16:
            b = x.to(tl.uint32, bitcast=True)
            b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
            b = tl.where(x != x, 0x7FC0, b)  # NaN: torch's quiet NaN
            return b.to(tl.uint16).to(tl.bfloat16, bitcast=True)
        else:
            return x.to(DTYPE)

    @triton.jit
    def _counter_values(table_ptr, i, k0, k1):
        """Noise of element indices ``i`` (uint32) with key words ``k0, k1`` (uint32): evolm.es.noise's hash."""
        m1 = tl.full((1,), 0x21F0AAAD, tl.uint32)
        m2 = tl.full((1,), 0x735A2D97, tl.uint32)
        x = i ^ k0
        x = x ^ (x >> 16)  # mix1
        x = x * m1
        x = x ^ (x >> 15)
        x = x * m2
        x = x ^ (x >> 15)
        x = x ^ k1
        x = x ^ (x >> 16)  # mix2: mix1 without its last xorshift
        x = x * m1
        x = x ^ (x >> 15)
        x = x * m2
        u = x >> 12  # the top 20 bits
        cell = (u >> 8).to(tl.int32)
        inside = (u & 255).to(tl.int32)
        index = tl.where(cell == 0, 4096 + inside, tl.where(cell == 4095, 4352 + inside, cell))
        return tl.load(table_ptr + index)

    @triton.jit
    def _element_index(start, offs):
        return (start + offs).to(tl.uint32)

    @triton.jit(do_not_specialize=["n", "k0", "k1", "start"])
    def _fill_kernel(out_ptr, table_ptr, n, k0, k1, start, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        e = _counter_values(table_ptr, _element_index(start, offs), k0.to(tl.uint32), k1.to(tl.uint32))
        tl.store(out_ptr + offs, e, mask=offs < n)

    @triton.jit(do_not_specialize=["n", "k0", "k1", "start", "factor"])
    def _perturb_kernel(theta_ptr, lost_ptr, orig_ptr, table_ptr, n, k0, k1, start, factor,
                        BLOCK: tl.constexpr, ASM: tl.constexpr):
        """theta' = theta + round(a * eps) in place; flags (and originals) where theta' - d != theta."""
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        e = _counter_values(table_ptr, _element_index(start, offs), k0.to(tl.uint32), k1.to(tl.uint32))
        theta = tl.load(theta_ptr + offs, mask=mask, other=0.0)
        d = _mul(e, factor, ASM)
        new = _add(theta, d, ASM)
        back = _sub(new, d, ASM)
        lost = back.to(tl.int32, bitcast=True) != theta.to(tl.int32, bitcast=True)
        tl.store(theta_ptr + offs, new, mask=mask)
        tl.store(lost_ptr + offs, lost.to(tl.int8), mask=mask)
        tl.store(orig_ptr + offs, theta, mask=mask & lost)

    @triton.jit(do_not_specialize=["n", "k0", "k1", "factor"])
    def _restore_kernel(theta_ptr, table_ptr, n, k0, k1, factor, BLOCK: tl.constexpr, ASM: tl.constexpr):
        """theta = theta' - round(a * eps) in place (the corrections are written afterwards)."""
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        e = _counter_values(table_ptr, offs.to(tl.uint32), k0.to(tl.uint32), k1.to(tl.uint32))
        theta = tl.load(theta_ptr + offs, mask=mask, other=0.0)
        tl.store(theta_ptr + offs, _sub(theta, _mul(e, factor, ASM), ASM), mask=mask)

    @triton.jit(do_not_specialize=["n", "k0", "k1", "factor"])
    def _perturb_masters_kernel(live_ptr, master_ptr, table_ptr, n, k0, k1, factor,
                                BLOCK: tl.constexpr, ASM: tl.constexpr):
        """live = cast(master + round(a * eps)) (round to nearest even into the model's dtype)."""
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        e = _counter_values(table_ptr, offs.to(tl.uint32), k0.to(tl.uint32), k1.to(tl.uint32))
        master = tl.load(master_ptr + offs, mask=mask, other=0.0)
        value = _add(master, _mul(e, factor, ASM), ASM)
        tl.store(live_ptr + offs, _cast(value, live_ptr.dtype.element_ty), mask=mask)

    @triton.jit(do_not_specialize=["n", "members", "scale"])
    def _update_kernel(target_ptr, live_ptr, flags_ptr, table_ptr, keys_ptr, coefs_ptr, members, n, scale,
                       WRITE: tl.constexpr, BLOCK: tl.constexpr, ASM: tl.constexpr):
        """theta += round(scale * acc), acc = sum over members in order of round(c_d * eps_d), from 0.
        ``WRITE`` false: only a flag per block, set if any new value (or its cast to the live dtype) is not finite."""
        pid = tl.program_id(0)
        offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        i = offs.to(tl.uint32)
        acc = tl.zeros((BLOCK,), tl.float32)
        for d in range(members):
            k0 = tl.load(keys_ptr + 2 * d).to(tl.uint32)
            k1 = tl.load(keys_ptr + 2 * d + 1).to(tl.uint32)
            c = tl.load(coefs_ptr + d)
            acc = _add(acc, _mul(_counter_values(table_ptr, i, k0, k1), c, ASM), ASM)
        theta = tl.load(target_ptr + offs, mask=mask, other=0.0)
        new = _add(theta, _mul(acc, scale, ASM), ASM)
        if WRITE:
            tl.store(target_ptr + offs, new, mask=mask)
        else:
            cast = _cast(new, live_ptr.dtype.element_ty).to(tl.float32)
            bad = ((new - new) != 0.0) | ((cast - cast) != 0.0)  # x - x is 0 for finite x, NaN for inf and NaN
            tl.store(flags_ptr + pid, tl.max((bad & mask).to(tl.int32), axis=0))


def _grid(n: int) -> tuple[int]:
    return (triton.cdiv(n, BLOCK),)


def counter_fill_triton(out: torch.Tensor, table: torch.Tensor, k0: int, k1: int, start: int) -> torch.Tensor:
    """Write the noise of elements ``start .. start + out.numel() - 1`` of the tensor with key words
    ``(k0, k1)`` into ``out`` (float32, contiguous, on the table's device); returns ``out``."""
    n = out.numel()
    if start < 0 or start + n > 1 << 32:
        raise ValueError("counter noise addresses elements 0 .. 2^32 - 1 of a tensor; this tensor is larger")
    if n:
        _fill_kernel[_grid(n)](out, table, n, int(k0) & 0xFFFFFFFF, int(k1) & 0xFFFFFFFF, int(start),
                               BLOCK=BLOCK, enable_fp_fusion=FP_FUSION)
    return out


def counter_perturb_triton(theta: torch.Tensor, table: torch.Tensor, k0: int, k1: int,
                           factor: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Perturb flat float32 ``theta`` in place, ``theta + round(factor * eps)``; returns the corrections
    ``(where, originals)`` restore must write back (the elements ``theta' - d`` would not return)."""
    n = theta.numel()
    chunk = min(PERTURB_CHUNK, max(n, 1))
    lost = torch.empty(chunk, dtype=torch.int8, device=theta.device)
    orig = torch.empty(chunk, dtype=torch.float32, device=theta.device)
    asm = _explicit_rounding(theta.device)
    wheres, values = [], []
    for a in range(0, n, chunk):
        m = min(chunk, n - a)
        _perturb_kernel[_grid(m)](theta[a:a + m], lost, orig, table, m, int(k0) & 0xFFFFFFFF, int(k1) & 0xFFFFFFFF, a,
                                  _f32(factor), BLOCK=BLOCK, ASM=asm, enable_fp_fusion=FP_FUSION)
        where = lost[:m].nonzero().view(-1)
        if where.numel():
            wheres.append(where + a)
            values.append(orig[where])
    if not wheres:
        return (torch.empty(0, dtype=torch.int64, device=theta.device),
                torch.empty(0, dtype=torch.float32, device=theta.device))
    return torch.cat(wheres), torch.cat(values)


def counter_restore_triton(theta: torch.Tensor, table: torch.Tensor, k0: int, k1: int, factor: float) -> None:
    """``theta - round(factor * eps)`` in place (the perturb's corrections are the caller's to write)."""
    n = theta.numel()
    if n:
        _restore_kernel[_grid(n)](theta, table, n, int(k0) & 0xFFFFFFFF, int(k1) & 0xFFFFFFFF, _f32(factor),
                                  BLOCK=BLOCK, ASM=_explicit_rounding(theta.device), enable_fp_fusion=FP_FUSION)


def counter_perturb_masters_triton(live: torch.Tensor, master: torch.Tensor, table: torch.Tensor, k0: int, k1: int,
                                   factor: float) -> None:
    """``live = cast(master + round(factor * eps))``: a lower-precision model perturbed from its float32 masters."""
    n = live.numel()
    if n:
        _perturb_masters_kernel[_grid(n)](live, master, table, n, int(k0) & 0xFFFFFFFF, int(k1) & 0xFFFFFFFF,
                                          _f32(factor), BLOCK=BLOCK, ASM=_explicit_rounding(live.device),
                                          enable_fp_fusion=FP_FUSION)


def counter_update_triton(target: torch.Tensor, table: torch.Tensor, keys: list[tuple[int, int]], coefficients: list[float],
                          scale: float, write: bool, live: torch.Tensor | None = None) -> bool:
    """The counter update of float32 ``target`` (weights, or masters): ``target + round(scale * acc)``,
    ``acc = sum_d round(c_d * eps_d)`` over ``keys``/``coefficients`` in order. ``write=False`` changes nothing
    and returns whether every new value, and its cast to ``live``'s dtype (the model's, when ``target`` are
    its masters), would be finite."""
    n = target.numel()
    if n == 0:
        return True
    device = target.device
    members = len(keys)
    key_words = torch.tensor([[int(k0) & 0xFFFFFFFF, int(k1) & 0xFFFFFFFF] for k0, k1 in keys] or [[0, 0]],
                             dtype=torch.int64).to(device)
    coefs = torch.tensor([float(c) for c in coefficients] or [0.0], dtype=torch.float32).to(device)
    grid = _grid(n)
    flags = torch.zeros(1 if write else grid[0], dtype=torch.int32, device=device)
    _update_kernel[grid](target, target if live is None else live, flags, table, key_words, coefs, members, n, _f32(scale),
                         WRITE=bool(write), BLOCK=BLOCK, ASM=_explicit_rounding(device), enable_fp_fusion=FP_FUSION)
    return True if write else not bool(flags.any())


# -- timing (for benchmarks/gpu_check.py) ----------------------------------------------------------
