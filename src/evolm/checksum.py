"""Replica checksums computed where the tensor lives: an integer reduction of its bit patterns.

A Ray population's replicas (and a vLLM engine's workers) must hold bit-identical weights; they prove it
by reporting one number per selected tensor after every update (``ray_population.weights_checksum``).

Design decisions:

- **On the tensor's device, no host copy.** The tensor's bits are read as integers of the same width
  (``view(int32)`` for float32, ``view(int16)`` for bf16/fp16) and reduced on the device in chunks of
  ``CHUNK`` elements; only the final int64 crosses to the host. (CRC-32, used before, copied every CUDA
  tensor to the host first: 14 GB per update at 7B in bf16 plus masters.)
- **Position-weighted, so order matters.** A plain sum of bit patterns cannot see two values swapped.
  The tensor is cut into chunks of ``CHUNK`` elements; element j of chunk k contributes
  ``int32(bits * w(j))`` (the product wrapped to 32 bits, as the device's int32 multiply does) with
  ``w(j) = (j * MULTIPLIER + 1) mod 2^32``, and chunk k's int64 sum is multiplied by ``2k + 1``. The
  weights are odd, so a single changed element always changes the result; unrelated compensating
  changes collide with probability ~2^-32 or less. It is a divergence detector, not a cryptographic hash
  (``backends.vllm.digest`` is SHA-256 where tests need more).
- **Cheap.** One int32 multiply and one int64-accumulating sum per element, weights cached per device:
  0.10 s per 134M float32 parameters at one CPU thread, against 0.12 s for zlib's CRC-32 (measured here,
  machine loaded), and no host copy on CUDA.
- **Exact and order-free.** Integer arithmetic wraps and is associative, so the result does not depend on
  how the device splits the reduction, on the thread count, or on CPU vs CUDA: the same tensor gives
  the same number everywhere (tested against a pure-Python reference).
"""

from __future__ import annotations

import torch

CHUNK = 1 << 20
"""Elements per chunk: the cached weights are 4 MB per device, the temporaries 4 MB + 8 MB."""
MULTIPLIER = 0x9E3779B1
"""Odd 32-bit multiplier of the position weights (the golden-ratio constant)."""
_MASK32, _MASK64 = (1 << 32) - 1, (1 << 64) - 1
_INT_VIEW = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.int32: torch.int32}
_WEIGHTS: dict[str, torch.Tensor] = {}


def _weights(device: torch.device) -> torch.Tensor:
    key = str(device)
    if key not in _WEIGHTS:
        w = torch.arange(CHUNK, dtype=torch.int64).mul_(MULTIPLIER).add_(1).bitwise_and_(_MASK32)
        _WEIGHTS[key] = w.sub_(w.ge(1 << 31).long() << 32).to(torch.int32).to(device)  # the same bits, signed
    return _WEIGHTS[key]


def tensor_checksum(tensor: torch.Tensor, dtype: torch.dtype | None = None) -> int:
    """The checksum of the module docstring over ``tensor``'s elements in row-major order, computed on its
    device; a Python int in [0, 2^64). ``dtype``: the checksum of ``tensor.to(dtype)``, converted one
    chunk at a time (a bf16 model's weights cast up to the float32 masters they start, without a
    float32 copy of the tensor)."""
    t = tensor.detach()
    flat = t.contiguous().view(-1)
    cast = dtype is not None and dtype != flat.dtype
    view = _INT_VIEW[dtype if cast else flat.dtype]
    flat = flat if cast else flat.view(view)
    weights = _weights(flat.device)
    total = torch.zeros((), dtype=torch.int64, device=flat.device)
    for k, start in enumerate(range(0, flat.numel(), CHUNK)):
        part = flat[start:start + CHUNK]
        part = part.to(dtype).view(view) if cast else part
        part = part.to(torch.int32) if part.dtype != torch.int32 else part
        total += torch.mul(part, weights[:part.numel()]).sum(dtype=torch.int64) * (2 * k + 1)
    return int(total) & _MASK64


def _int32(v: int) -> int:
    v &= _MASK32
    return v - (1 << 32) if v >= 1 << 31 else v


def reference_checksum(values: list[int]) -> int:
    """The same checksum in plain Python over a tensor's bit patterns (signed ints): the tests' reference."""
    total = 0
    for k in range(0, len(values), CHUNK):
        chunk = sum(_int32(v * ((j * MULTIPLIER + 1) & _MASK32)) for j, v in enumerate(values[k:k + CHUNK]))
        total += chunk * (2 * (k // CHUNK) + 1)
    return total & _MASK64
