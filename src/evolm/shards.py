"""Tensor-parallel shards of Hugging Face tensors: which elements of the full HF-named tensor one vLLM
TP rank holds (their ES noise, keyed by the element's index in the full tensor, is ``evolm.es.shard_noise``).

Design decisions:

- One description per HF tensor (``ShardSpec``: how vLLM splits it), computed once from the HF name and
  shape; ``local_indices(spec, rank, size)`` gives, for every element of rank ``rank``'s slice in row-major
  order, its flat index in the full HF tensor. The noise of that element is the counter noise of the
  full tensor at that index (``evolm.es.shard_noise.counter_noise_at``), so a shard perturbed on its own holds exactly the
  bits of the same elements of the unsharded tensor perturbed whole: ES arithmetic is element-wise
  (``theta + round(sigma * eps)``), and only the noise's address could differ.
- vLLM's splits (its ``linear.py`` / ``vocab_parallel_embedding.py``, mirrored, not imported, so this
  module and its tests need no vLLM): column-parallel layers (``q/k/v_proj`` inside ``qkv_proj``,
  ``gate/up_proj`` inside ``gate_up_proj``) split the output rows into equal contiguous blocks per rank;
  key/value heads fewer than the ranks are replicated (rank r holds kv head ``r * heads // size``);
  row-parallel layers (``o_proj``, ``down_proj``) split the input columns; the embedding (and a tied LM
  head) splits the vocabulary padded to a multiple of 64 into equal row blocks, padding rows being no
  HF element; norms and biases of row-parallel layers are replicated.
- Inside a rank, a fused parameter is ``[q; k; v]`` or ``[gate; up]`` of that rank's blocks: the offsets
  within the fused local tensor are ``fused_offsets``.
- Used by ``evolm.es.vllm_worker.tp_views`` (each rank's views and indices) and ``evolm.es.shard_noise.ShardNoise`` (the noise
  a rank's ``ParamSet`` reads), and by the driver to compare each rank's checksums with its own slices.
  Tested: tests/test_tensor_parallel.py (plain tensors: the shards reassemble the full tensor, shard-wise
  perturb/restore/update equals ``ParamSet`` on the full model bit for bit) and tests/test_vllm_tp.py
  (a TP = 2 vLLM-CPU engine equals TP = 1 bit for bit).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

VOCAB_PADDING = 64
"""vLLM pads the embedding's vocabulary to a multiple of this (``DEFAULT_VOCAB_PADDING_SIZE``)."""

COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
ROW = ("o_proj", "down_proj")
VOCAB = ("embed_tokens", "lm_head")


@dataclass(frozen=True)
class ShardSpec:
    """How vLLM splits one HF tensor over TP ranks: ``kind`` is ``rows`` (column-parallel output rows),
    ``heads`` (rows in blocks of ``head_dim``, possibly replicated: k/v), ``columns`` (row-parallel
    input columns), ``vocab`` (padded vocabulary rows) or ``replicated``."""

    name: str
    shape: tuple[int, ...]
    kind: str
    head_dim: int = 0


def shard_spec(name: str, shape: tuple[int, ...], head_dim: int = 0) -> ShardSpec:
    """The split of HF tensor ``name`` (Llama-family names); ``head_dim`` for k/v projections."""
    parts = name.split(".")
    module, leaf = (parts[-2], parts[-1]) if len(parts) >= 2 else ("", parts[-1])
    if len(shape) == 2 and module in VOCAB:
        return ShardSpec(name, tuple(shape), "vocab")
    if module in ("k_proj", "v_proj") and head_dim:
        return ShardSpec(name, tuple(shape), "heads", head_dim)
    if module in COLUMN:  # weight rows and bias entries alike
        return ShardSpec(name, tuple(shape), "rows")
    if module in ROW and leaf == "weight":
        return ShardSpec(name, tuple(shape), "columns")
    return ShardSpec(name, tuple(shape), "replicated")


def local_rows(spec: ShardSpec, rank: int, size: int) -> tuple[int, int]:
    """``(first row, rows)`` of the full tensor rank ``rank`` holds (row-wise kinds), padding left out."""
    n = spec.shape[0]
    if spec.kind == "rows":
        if n % size:
            raise ValueError(f"{spec.name}: {n} rows do not split over {size} ranks")
        return rank * (n // size), n // size
    if spec.kind == "heads":
        heads = n // spec.head_dim
        if heads >= size:
            if heads % size:
                raise ValueError(f"{spec.name}: {heads} heads do not split over {size} ranks")
            per = heads // size
            return rank * per * spec.head_dim, per * spec.head_dim
        if size % heads:
            raise ValueError(f"{spec.name}: {size} ranks cannot replicate {heads} heads evenly")
        return (rank * heads // size) * spec.head_dim, spec.head_dim
    if spec.kind == "vocab":
        padded = -(-n // VOCAB_PADDING) * VOCAB_PADDING
        per = -(-padded // size)
        first = min(rank * per, n)
        return first, max(0, min(first + per, n) - first)
    return 0, n


def local_indices(spec: ShardSpec, rank: int, size: int) -> torch.Tensor:
    """Flat indices into the full HF tensor of every element rank ``rank`` holds, in its row-major order."""
    numel = 1
    for s in spec.shape:
        numel *= s
    if size == 1 or spec.kind == "replicated":
        return torch.arange(numel, dtype=torch.int64)
    if spec.kind == "columns":
        rows, cols = spec.shape
        if cols % size:
            raise ValueError(f"{spec.name}: {cols} columns do not split over {size} ranks")
        per = cols // size
        return (torch.arange(rows, dtype=torch.int64)[:, None] * cols
                + torch.arange(rank * per, (rank + 1) * per, dtype=torch.int64)[None, :]).reshape(-1)
    first, count = local_rows(spec, rank, size)
    row = numel // spec.shape[0]
    return torch.arange(first * row, (first + count) * row, dtype=torch.int64)


def local_shape(spec: ShardSpec, rank: int, size: int) -> tuple[int, ...]:
    """Shape of rank ``rank``'s slice of the HF tensor (padding rows excluded)."""
    if size == 1 or spec.kind == "replicated":
        return spec.shape
    if spec.kind == "columns":
        return (spec.shape[0], spec.shape[1] // size)
    return (local_rows(spec, rank, size)[1],) + spec.shape[1:]


def local_slice(full: torch.Tensor, spec: ShardSpec, rank: int, size: int) -> torch.Tensor:
    """Rank ``rank``'s slice of the full tensor, as vLLM's weight loader would copy it (a copy)."""
    return full.reshape(-1)[local_indices(spec, rank, size)].reshape(local_shape(spec, rank, size)).clone()


def fused_offsets(specs: list[ShardSpec], rank: int, size: int) -> list[tuple[int, int]]:
    """``(first row, rows)`` of each HF tensor inside one rank's fused parameter ``[q; k; v]`` / ``[gate; up]``."""
    out, at = [], 0
    for spec in specs:
        rows = local_shape(spec, rank, size)[0]
        out.append((at, rows))
        at += rows
    return out
