"""Gaussian perturbation noise, addressed by key: (iteration, direction, parameter index).

Design decisions:

- Every random choice in a run is derived from one root seed by key derivation
  (``evolm.seeding.derive_seed(root, "noise", iteration, direction, param)``): never ``seed + small
  offset``, never one seed shared by every tensor.
- Three noise sources behind one call, ``noise.direction(iteration, direction, param_index, numel)``,
  returning a 1-D float32 tensor of ``numel`` standard-normal values:

  ``CounterNoise`` (``es.noise = "counter"``): a pure function of (run noise seed, iteration,
  direction, tensor index, element index), computed in chunks where the weights are: no buffer the
  size of the model, so its memory does not depend on P (one fixed 18 KB lookup table). Per member and
  tensor a 63-bit key is derived (``derive_seed(seed, "counter", iteration, direction, param)``) and
  split into two 32-bit words ``k0, k1``; element i of the tensor gets the 32-bit hash
  ``h = mix2(mix1(i ^ k0) ^ k1)`` (mod 2^32), ``mix1(x)``: ``x ^= x >> 16; x *= 0x21f0aaad;
  x ^= x >> 15; x *= 0x735a2d97; x ^= x >> 15`` (a lowbias32-shaped finaliser with multipliers below
  2^31), ``mix2`` the same without its last xorshift (only the top bits are used). Its top 20 bits
  ``u`` choose the value: ``Q12[u >> 8]`` in the bulk and ``Q20[u]`` in the two outermost of the 4096
  cells, with ``Qk[j] = Phi^-1((j + 0.5) / 2^k)`` computed once in float64 and rounded to float32. The
  distribution is a **quantised Gaussian**: 4094 bulk levels of probability 2^-12 and 2 x 256 tail
  levels of probability 2^-20; symmetric (mean exactly 0), variance 1 - 3.7e-5, kurtosis 2.9991, tails
  cut at |z| = 4.90 (a true normal goes beyond with probability 1e-6). The two-level table gives the
  tails of a 2^20-entry (4 MB) quantile table from 18 KB that stay in a core's L1 cache (a lookup into
  4 MB cost several times more per value on this project's CPU).
  "Independent" means: every element of a member draws its own hash (within a tensor, i -> h is a
  bijection of 32-bit words, so no two elements share one; every (member, tensor) has its own key),
  and the hashes pass the avalanche, uniformity and correlation checks of
  ``tests/test_counter_noise.py`` at their precision. It is a hash, not a cryptographic generator, and
  equal *values* recur, as for any quantised source: 4606 distinct values in all.
  Identity: integer arithmetic (int64 with 32-bit masks in torch, so nothing overflows: a 32-bit
  value times a multiplier below 2^31 stays below 2^63; uint32 in the kernel), a table lookup, and
  IEEE single-precision ``*``, ``+`` and ``-``, each rounded on its own (separate torch ops; the kernel
  is built with ``-ffp-contract=off``, so no fused multiply-add), without transcendental functions. So
  the torch ops on CPU, ``evolm.es.fused`` on CPU, any thread count and CUDA (the same torch ops on
  the device; torch's CUDA kernels round ``*`` and ``+`` as IEEE requires and keep subnormals) compute
  the same bits. On CUDA, when Triton imports, ``evolm.es.noise_triton`` computes the noise (and
  ParamSet's perturb, restore and update) in one kernel per tensor instead of ~30 torch ops per chunk:
  uint32 hash, the same lookup, float ops written with explicit round-to-nearest so none is fused
  (``counter_triton`` chooses it; ``EVOLM_TRITON=0`` keeps the torch ops). The table itself is computed without libm: Wichura's AS241 with a logarithm written in
  ``+ - * /`` and a correctly rounded ``sqrt``, so every IEEE platform gets the same table; its SHA-256
  is pinned here, checked when it is built and recorded in the seed log. Tensors of 2^32 elements or
  more are refused (the element index is one 32-bit word).

  ``StreamNoise``: a fresh PCG64DXSM generator per key, so streams are independent across tensors,
  directions and iterations. Exact but slow on a CPU: ~1.2 s per 134M values per pass, and ES needs
  three passes per member (perturb, restore, update) — more than generation itself costs for short
  completions.

  ``TableNoise`` (Salimans et al. 2017, "Evolution Strategies as a Scalable Alternative to RL"; the
  default of low-rank members; ``es.noise = "auto"`` picks counter otherwise): one table of i.i.d. N(0, 1) float32 values, generated once from the root seed. A member
  (iteration, direction) gets one key-derived offset ``o`` into the table, and its noise over the flattened vector
  of selected parameters is the stretch ``table[o : o + P]`` (P = number of selected parameters):
  tensor k reads ``table[o + start_k : o + start_k + numel_k]``, a view that costs nothing to
  "generate", so perturb/restore/update are memory-bound. The guarantee: **within one member no table
  value is used twice**, so a member's noise is exactly P i.i.d. standard normals and no tensor's
  noise is a copy of another's; this holds whenever the table has at least P entries, which the
  default size ``P + 2^25`` ensures (2^25 distinct member offsets; 168M entries, 672 MB, for
  SmolLM2-135M's 134.5M parameters). Across members, two stretches overlap at shifted positions
  (coordinate-wise correlations stay zero; two members share a value at the same coordinate only
  when their offsets coincide, probability 2^-25). ``es.noise_table_size`` smaller than P trades
  memory for that guarantee: the stretch wraps around and values repeat within a member.
  (Runs made before this scheme used an offset per (iteration, direction, tensor) into a table
  smaller than the model, so tensors could be verbatim copies of stretches of others' noise; their
  seed logs say so and replay with that scheme, ``scheme="tensor"``.)

- Every source describes itself (``describe()``) in the run's seed-log header, with its version and
  parameters, and ``noise_from_header`` rebuilds exactly that source: old runs keep replaying with
  their own generator.
- Determinism of ``table`` and ``stream``: given the same NumPy version, both yield the same values
  on every machine and process (NumPy's ``Generator`` distributions are stable within a version; the
  version is recorded in each run's ``run.json``). Their noise is generated on the CPU and moved to
  the model's device. ``counter`` depends on neither NumPy's distributions nor the device.
"""

from __future__ import annotations

import hashlib
import math
import os
from abc import ABC, abstractmethod
from functools import lru_cache

import numpy as np
import torch

from evolm.seeding import derive_seed


class NoiseSource(ABC):
    """Base class: ``direction(iteration, direction, param_index, numel)`` -> 1-D float32 noise."""

    kind = "base"

    @abstractmethod
    def direction(self, iteration: int, direction: int, param_index: int, numel: int) -> torch.Tensor:
        """The noise of one (iteration, direction, parameter): ``numel`` standard-normal float32 values."""

    def describe(self) -> dict:
        return {"kind": self.kind}

    def to(self, device) -> "NoiseSource":
        return self

    def max_abs(self) -> float:
        """An upper bound of ``|eps|`` over every value this source can return (bounds an update's size)."""
        return STREAM_BOUND


STREAM_BOUND = 64.0
"""A bound of |eps| for generated streams: a float32 normal made from 32 or 64 random bits cannot
exceed ~10 (NumPy's ziggurat tail from 24-bit uniforms stops near 8.3), so 64 is safe by far."""


class StreamNoise(NoiseSource):
    """An independent PCG64DXSM Gaussian stream per (iteration, direction, parameter)."""

    kind = "stream"

    def __init__(self, seed: int, device: str | torch.device = "cpu"):
        self.seed = int(seed)
        self.device = torch.device(device)

    def direction(self, iteration: int, direction: int, param_index: int, numel: int) -> torch.Tensor:
        rng = np.random.Generator(np.random.PCG64DXSM(derive_seed(self.seed, "noise", iteration, direction, param_index)))
        values = torch.from_numpy(rng.standard_normal(numel, dtype=np.float32))
        return values if self.device.type == "cpu" else values.to(self.device)

    def describe(self) -> dict:
        return {"kind": self.kind, "seed": self.seed}

    def to(self, device) -> "StreamNoise":
        self.device = torch.device(device)
        return self


class TableNoise(NoiseSource):
    """Windows into one seeded table of i.i.d. N(0, 1) values.

    ``scheme="member"`` (every new run): ``layout`` maps each perturbed tensor's parameter index to its
    start in the flattened vector of selected parameters; member (iteration, direction) gets one offset
    ``o`` and tensor k the window ``table[o + start_k : o + start_k + numel_k]``, so one member's noise
    is one contiguous stretch of the table and never reuses a value when the table is at least as long
    as the selected parameters (``default_size``). A smaller table (``es.noise_table_size``, to save
    memory) wraps around: then values repeat within a member.
    ``scheme="tensor"`` (runs made before the member scheme; replay only): an offset per
    (iteration, direction, tensor), each window within the table.
    """

    kind = "table"
    SLACK = 1 << 25
    """Extra entries beyond the selected parameters: the number of distinct member offsets."""

    def __init__(self, seed: int, size: int, device: str | torch.device = "cpu", layout: dict[int, int] | None = None,
                 total: int | None = None, scheme: str | None = None):
        self.seed = int(seed)
        self.size = int(size)
        self.scheme = scheme or ("member" if layout is not None else "tensor")
        if self.scheme not in ("member", "tensor"):
            raise ValueError(f"unknown noise table scheme '{self.scheme}'")
        if self.scheme == "member" and (layout is None or total is None):
            raise ValueError("the member scheme needs the parameter layout and total")
        self.layout = dict(layout or {})
        self.total = int(total or 0)
        rng = np.random.Generator(np.random.PCG64DXSM(derive_seed(self.seed, "noise-table")))
        self.table = torch.from_numpy(rng.standard_normal(self.size, dtype=np.float32))
        if torch.device(device).type != "cpu":
            self.table = self.table.to(device)

    @staticmethod
    def default_size(total_numel: int) -> int:
        """Entries of the default table: every selected parameter plus ``SLACK`` distinct member offsets."""
        return int(total_numel) + TableNoise.SLACK

    @property
    def reuses_within_member(self) -> bool:
        """True when the table is shorter than one member's noise (values repeat inside a member)."""
        return self.scheme == "member" and self.size < self.total

    def member_offset(self, iteration: int, direction: int) -> int:
        """Where member (iteration, direction)'s stretch of the table begins."""
        span = self.size - self.total + 1 if self.size >= self.total else self.size
        return derive_seed(self.seed, "noise-member", iteration, direction) % span

    def offset(self, iteration: int, direction: int, param_index: int, numel: int) -> int:
        """Start of the window of one tensor (may exceed the table size when it wraps)."""
        if self.scheme == "member":
            if param_index not in self.layout:
                raise ValueError(f"parameter {param_index} is not in the noise table's layout")
            return self.member_offset(iteration, direction) + self.layout[param_index]
        if numel > self.size:
            raise ValueError(f"noise table ({self.size} values) is smaller than a perturbed tensor ({numel}); raise es.noise_table_size")
        return derive_seed(self.seed, "noise-offset", iteration, direction, param_index) % (self.size - numel + 1)

    def direction(self, iteration: int, direction: int, param_index: int, numel: int) -> torch.Tensor:
        o = self.offset(iteration, direction, param_index, numel) % self.size
        if o + numel <= self.size:
            return self.table[o:o + numel]  # a view: no copy
        pieces, left = [], numel  # a table smaller than the member's noise: wrap around
        while left > 0:
            take = min(left, self.size - o)
            pieces.append(self.table[o:o + take])
            left, o = left - take, 0
        return torch.cat(pieces)

    def max_abs(self) -> float:
        """The largest ``|value|`` in the table (computed once)."""
        if getattr(self, "_max_abs", None) is None:
            lo, hi = torch.aminmax(self.table)
            self._max_abs = max(-float(lo), float(hi))
        return self._max_abs

    def describe(self) -> dict:
        out = {"kind": self.kind, "seed": self.seed, "size": self.size, "scheme": self.scheme}
        if self.scheme == "member":
            out["total"] = self.total
        return out

    def to(self, device) -> "TableNoise":
        self.table = self.table.to(device)
        return self


# -- counter noise ----------------------------------------------------------------------------------

COUNTER_VERSION = 1
"""Version of the counter generator (hash, key derivation, quantile table); a seed log names it."""
COUNTER_HASH = "mix2(mix1(i^k0)^k1) mod 2^32; mix1=xs16,*0x21f0aaad,xs15,*0x735a2d97,xs15; mix2=mix1 without the last xs15"
BULK_BITS, TAIL_BITS = 12, 8
"""The quantised Gaussian: the top 20 bits ``u`` of the hash pick ``Q20[u]`` in the outer 2 x 2^-12 of the
mass and ``Q12[u >> 8]`` in the bulk, ``Qk[j] = Phi^-1((j + 0.5) / 2^k)``: 4094 bulk levels of
probability 2^-12 and 2 x 256 tail levels of probability 2^-20, one 18 KB table (in a core's L1 cache)."""
BULK = 1 << BULK_BITS
TAIL = 1 << TAIL_BITS
COUNTER_TABLE_SHA256 = "a0676996e54e4b1f174c6fa1a6b5475a177ba7264102c24c057cda85f78caad5"
"""SHA-256 of the float32 quantile table, as this code computes it on every platform."""
COUNTER_QUANTILES = {"bulk_bits": BULK_BITS, "tail_bits": TAIL_BITS, "sha256": COUNTER_TABLE_SHA256}
"""How a seed-log header names the quantile table."""
COUNTER_UPDATE = "products-rounded-then-added"
"""The counter path's update arithmetic: ``acc += round(c_d * eps_d)``, then ``theta += round(scale * acc)``."""
MASK32 = 0xFFFFFFFF
MIX_MULTIPLIERS = (0x21F0AAAD, 0x735A2D97)
"""Both < 2^31: a 32-bit value times either stays below 2^63, so int64 torch ops never overflow."""


def _log(x: float) -> float:
    """Natural logarithm of ``x > 0`` in IEEE double + - * / only (no libm): ``x = m 2^e``,
    ``log m = 2 atanh((m - 1) / (m + 1))`` summed until it stops changing."""
    m, e = math.frexp(x)  # exact
    if m < 0.7071067811865476:
        m, e = m * 2.0, e - 1
    s = (m - 1.0) / (m + 1.0)
    s2, term, total, k = s * s, s, 0.0, 1
    while True:
        add = term / k
        if total + add == total:
            return 2.0 * total + e * 0.6931471805599453
        total, term, k = total + add, term * s2, k + 2


def inverse_normal_cdf(p: float) -> float:
    """``Phi^-1(p)`` for ``0 < p < 1``: Wichura (1988), AS241 (PPND16, relative error ~1e-16), with the
    logarithm of ``_log`` and a correctly rounded ``sqrt``, so every IEEE platform gets the same bits."""
    q = p - 0.5
    if abs(q) <= 0.425:
        r = 0.180625 - q * q
        num = (((((((2.5090809287301226727e+3 * r + 3.3430575583588128105e+4) * r + 6.7265770927008700853e+4) * r
                   + 4.5921953931549871457e+4) * r + 1.3731693765509461125e+4) * r + 1.9715909503065514427e+3) * r
                + 1.3314166789178437745e+2) * r + 3.3871328727963666080e+0) * q
        den = (((((((5.2264952788528545610e+3 * r + 2.8729085735721942674e+4) * r + 3.9307895800092710610e+4) * r
                   + 2.1213794301586595867e+4) * r + 5.3941960214247511077e+3) * r + 6.8718700749205790830e+2) * r
                + 4.2313330701600911252e+1) * r + 1.0)
        return num / den
    r = math.sqrt(-_log(p if q <= 0.0 else 1.0 - p))
    if r <= 5.0:
        r -= 1.6
        num = (((((((7.7454501427834140764e-4 * r + 2.27238449892691845833e-2) * r + 2.4178072517745061177e-1) * r
                   + 1.27045825245236838258e+0) * r + 3.64784832476320460504e+0) * r + 5.7694972214606914055e+0) * r
                + 4.6303378461565452959e+0) * r + 1.42343711074968357734e+0)
        den = (((((((1.05075007164441684324e-9 * r + 5.475938084995344946e-4) * r + 1.51986665636164571966e-2) * r
                   + 1.4810397642748007459e-1) * r + 6.8976733498510000455e-1) * r + 1.6763848301838038494e+0) * r
                + 2.05319162663775882187e+0) * r + 1.0)
    else:
        r -= 5.0
        num = (((((((2.01033439929228813265e-7 * r + 2.71155556874348757815e-5) * r + 1.2426609473880784386e-3) * r
                   + 2.6532189526576123093e-2) * r + 2.9656057182850489123e-1) * r + 1.7848265399172913358e+0) * r
                + 5.4637849111641143699e+0) * r + 6.6579046435011037772e+0)
        den = (((((((2.04426310338993978564e-15 * r + 1.4215117583164458887e-7) * r + 1.8463183175100546818e-5) * r
                   + 7.868691311456132591e-4) * r + 1.4875361290850614852e-2) * r + 1.3692988092273580531e-1) * r
                + 5.9983220655588793769e-1) * r + 1.0)
    x = num / den
    return -x if q < 0.0 else x


@lru_cache(maxsize=None)
def quantile_table() -> torch.Tensor:
    """The counter noise's lookup table (float32, CPU), computed once per process: entries
    ``0 .. BULK - 1`` are ``Q12[j]`` (entries 0 and BULK - 1 are never drawn: their cells are refined),
    then the lower tail ``Q20[s]`` and the upper tail ``Q20[2^20 - TAIL + s]`` for ``s < TAIL``.
    Exactly antisymmetric (each value's negation is drawn with the same probability)."""
    half = [inverse_normal_cdf((j + 0.5) / BULK) for j in range(BULK // 2, BULK)]
    bulk = np.asarray(half, dtype=np.float64).astype(np.float32)
    fine = BULK * TAIL
    lower = np.asarray([inverse_normal_cdf((s + 0.5) / fine) for s in range(TAIL)], dtype=np.float64).astype(np.float32)
    table = torch.from_numpy(np.concatenate([-bulk[::-1], bulk, lower, -lower[::-1]]))
    if table_sha256(table) != COUNTER_TABLE_SHA256:
        raise RuntimeError(f"the counter noise's quantile table came out differently on this platform (SHA-256 "
                           f"{table_sha256(table)}, expected {COUNTER_TABLE_SHA256}); its noise would not match other machines")
    return table


def counter_distribution() -> tuple[torch.Tensor, torch.Tensor]:
    """Every value counter noise can draw (float64) and its probability: the exact distribution."""
    table = quantile_table().double()
    bulk_p, tail_p = 1.0 / BULK, 1.0 / (BULK * TAIL)
    values = torch.cat([table[1:BULK - 1], table[BULK:]])
    probabilities = torch.cat([torch.full((BULK - 2,), bulk_p, dtype=torch.float64),
                               torch.full((2 * TAIL,), tail_p, dtype=torch.float64)])
    return values, probabilities


def table_sha256(table: torch.Tensor) -> str:
    return hashlib.sha256(table.cpu().contiguous().numpy().tobytes()).hexdigest()


def counter_keys(seed: int, iteration: int, direction: int, param_index: int) -> tuple[int, int]:
    """The two 32-bit key words of one (member, tensor): the low and high half of its 63-bit derived seed."""
    key = derive_seed(seed, "counter", iteration, direction, param_index)
    return key & MASK32, key >> 32


def counter_indices(keys: tuple[int, int], start: int, count: int, device="cpu", raw: bool = False) -> torch.Tensor:
    """Table indices (int64) of elements ``start .. start + count - 1`` of the tensor with ``keys``, in
    int64 torch ops on ``device``: ``h = mix2(mix1(i ^ k0) ^ k1)``, ``u = h >> 12`` (its top 20 bits),
    cell ``c = u >> 8``; index ``c`` in the bulk, ``BULK + (u & 255)`` or ``BULK + TAIL + (u & 255)`` in the
    two outer cells. The reference implementation: ``evolm.es.fused`` computes the same numbers in
    uint32. ``raw``: the 32-bit hashes themselves."""
    if start < 0 or start + count > 1 << 32:
        raise ValueError("counter noise addresses elements 0 .. 2^32 - 1 of a tensor; this tensor is larger")
    k0, k1 = (int(k) & MASK32 for k in keys)
    x = torch.arange(start, start + count, dtype=torch.int64, device=device)
    tmp = torch.empty_like(x)
    x.bitwise_xor_(k0)
    for key in (k1, None):  # mix1, ^ k1, then mix2 (mix1 without its last xorshift)
        for shift, multiplier in zip((16, 15), MIX_MULTIPLIERS):
            torch.bitwise_right_shift(x, shift, out=tmp)
            x.bitwise_xor_(tmp).mul_(multiplier).bitwise_and_(MASK32)
        if key is not None:
            torch.bitwise_right_shift(x, 15, out=tmp)
            x.bitwise_xor_(tmp).bitwise_xor_(key)
    if raw:
        return x
    u = x.bitwise_right_shift_(32 - BULK_BITS - TAIL_BITS)
    torch.bitwise_and(u, TAIL - 1, out=tmp)  # the position inside a tail cell
    cell = u.bitwise_right_shift_(TAIL_BITS)
    index = torch.where(cell == 0, tmp + BULK, cell)
    return torch.where(cell == BULK - 1, tmp + (BULK + TAIL), index)


class CounterNoise(NoiseSource):
    """Gaussian noise as a pure function of (seed, iteration, direction, tensor, element): a 32-bit
    hash indexes a table of normal quantiles (module docstring). ``values(keys, start, count)`` gives
    any stretch of a tensor's noise, so consumers compute it in chunks where the weights are;
    ``direction`` materialises a whole tensor's noise (for consumers that need it at once)."""

    kind = "counter"
    update_arithmetic = COUNTER_UPDATE
    kernels = True
    """Whether ParamSet may hand this source's keys to the compiled/Triton kernels, which address elements
    0 .. numel - 1 of the tensor; ``evolm.es.shard_noise.ShardNoise`` (a TP shard's elements sit elsewhere in the
    full tensor) says False and is read through ``values`` only."""

    def __init__(self, seed: int, device: str | torch.device = "cpu"):
        self.seed = int(seed)
        self.table = quantile_table()
        self.device = torch.device(device)
        if self.device.type != "cpu":
            self.table = self.table.to(self.device)
        self._max_abs = float(quantile_table()[-1])

    def keys(self, iteration: int, direction: int, param_index: int) -> tuple[int, int]:
        return counter_keys(self.seed, iteration, direction, param_index)

    def values(self, keys: tuple[int, int], start: int, count: int, out: torch.Tensor | None = None,
               kernel: bool = True) -> torch.Tensor:
        """Noise of elements ``start .. start + count - 1`` of the tensor with ``keys`` (float32, on the
        source's device; into ``out`` when given): the compiled kernel on the CPU when it is built, the
        Triton kernel on CUDA when Triton imports (``counter_triton``) (``kernel=False``: always the torch
        ops; the same bits every way)."""
        out = torch.empty(count, dtype=torch.float32, device=self.device) if out is None else out[:count]
        if start < 0 or start + count > 1 << 32:
            raise ValueError("counter noise addresses elements 0 .. 2^32 - 1 of a tensor; this tensor is larger")
        triton_kernels = counter_triton(out, self.table) if kernel else None
        if triton_kernels is not None:
            return triton_kernels.counter_fill_triton(out, self.table, keys[0], keys[1], start)
        kern = _counter_kernel() if kernel and self.device.type == "cpu" else None
        if kern is not None:
            kern.counter_fill(out, self.table, keys[0], keys[1], start)
            return out
        return torch.index_select(self.table, 0, counter_indices(keys, start, count, self.device), out=out)

    def direction(self, iteration: int, direction: int, param_index: int, numel: int) -> torch.Tensor:
        keys = self.keys(iteration, direction, param_index)
        out = torch.empty(numel, dtype=torch.float32, device=self.device)
        step = 1 << 20
        for a in range(0, numel, step):
            self.values(keys, a, min(step, numel - a), out=out[a:])
        return out

    def max_abs(self) -> float:
        return self._max_abs

    def describe(self) -> dict:
        return {"kind": self.kind, "seed": self.seed, "version": COUNTER_VERSION, "hash": COUNTER_HASH,
                "quantiles": dict(COUNTER_QUANTILES),
                "update": self.update_arithmetic}

    def to(self, device) -> "CounterNoise":
        self.device = torch.device(device)
        self.table = self.table.to(self.device)
        return self


def _counter_kernel():
    """The fused kernel module when it is built and usable (``evolm.es.fused``), else None."""
    from evolm.es import fused

    return fused.kernel()


def counter_triton(*tensors: torch.Tensor):
    """``evolm.es.noise_triton`` when these tensors (weights, masters, the table, an output buffer) can take
    its Triton kernels (CUDA and Triton importable, ``EVOLM_TRITON`` not 0), else None. CPU tensors never
    do (their paths are the compiled kernel and the torch ops, and triton is not even imported), except
    under the tests' ``EVOLM_TRITON=interpret`` with ``TRITON_INTERPRET=1``."""
    if tensors[0].device.type == "cpu" and os.environ.get("EVOLM_TRITON") != "interpret":
        return None
    if os.environ.get("EVOLM_TRITON") == "0":
        return None
    from evolm.es import noise_triton

    return noise_triton if noise_triton.usable(*tensors) else None


def counter_from_header(described: dict, device="cpu") -> CounterNoise:
    """The counter source a seed-log header describes; refuses (one line) one this evolm cannot reproduce."""
    version = int(described.get("version", 0))
    if version != COUNTER_VERSION or described.get("hash") != COUNTER_HASH:
        raise ValueError(f"the run drew counter noise version {version} ({described.get('hash')}); this evolm "
                         f"computes version {COUNTER_VERSION} only and cannot replay it")
    if described.get("quantiles") != COUNTER_QUANTILES:
        raise ValueError(f"the run's counter-noise quantile table ({described.get('quantiles')}) is not this evolm's; "
                         "it cannot be replayed here")
    return CounterNoise(int(described["seed"]), device)


def make_noise(kind: str, seed: int, layout: list[tuple[int, int]], table_size: int = 0, device="cpu") -> NoiseSource:
    """The noise source named in ``es.noise`` for tensors ``layout = [(param_index, numel), ...]`` (in
    the order of the flattened parameter vector)."""
    if kind == "counter":
        return CounterNoise(seed, device)
    if kind == "stream":
        return StreamNoise(seed, device)
    if kind == "table":
        starts, total = {}, 0
        for index, numel in layout:
            starts[int(index)] = total
            total += int(numel)
        return TableNoise(seed, table_size or TableNoise.default_size(total), device, layout=starts, total=total)
    raise ValueError(f"unknown noise kind '{kind}'")


def noise_from_header(described: dict, layout: list[tuple[int, int]], device="cpu") -> NoiseSource:
    """The noise source a run's seed-log header describes (``NoiseSource.describe()``), for replay and
    resume; a header without ``scheme`` predates the member scheme and gets the per-tensor table."""
    kind = described.get("kind")
    if kind == "counter":
        return counter_from_header(described, device)
    if kind == "stream":
        return StreamNoise(int(described["seed"]), device)
    if kind == "table":
        if described.get("scheme", "tensor") == "tensor":
            return TableNoise(int(described["seed"]), int(described["size"]), device, scheme="tensor")
        starts, total = {}, 0
        for index, numel in layout:
            starts[int(index)] = total
            total += int(numel)
        return TableNoise(int(described["seed"]), int(described["size"]), device, layout=starts, total=total)
    raise ValueError(f"unknown noise kind '{kind}' in the seed-log header")
