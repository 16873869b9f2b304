"""Model weights written to disk tensor by tensor: no model-sized copy, on the device or in RAM.

A save of ES weights used to build a float32 copy of the whole model on its device (the masters of a
lower-precision run written into a deep copy) and, beside it, clone every master again for
``masters.safetensors``: 10-16 bytes per parameter at a save against ~6 in steady state, so a 7B model
that trained on an 80 GB card ran out of memory at its first checkpoint. Here every tensor is taken
where it already lives (a parameter, or the float32 master that replaces it), cast if its stored dtype
differs (after moving it to the CPU, so the device holds no cast), written, and dropped before the next:
the peak during a save is the steady state plus one tensor (``benchmarks/memory_per_param.py`` measures
it across a checkpoint and ``final/``).

Design decisions:

- The file format is safetensors, written here rather than by ``safetensors.torch.save_file``, which
  needs every tensor of a file at once (and moves all of them to the CPU together for a CUDA model).
  The format is a little-endian u64 header length, a JSON header (dtype, shape and byte offsets per
  tensor, ``__metadata__``) padded with spaces to 8 bytes, then the tensors' bytes back to back. Every
  file written here is read back by the safetensors library in the tests, and its tensors compared
  with a ``save_pretrained`` of the same weights, bit for bit and name for name.
- Names, config and sharding follow ``save_pretrained``: the tensors are the model's ``state_dict`` with
  tied aliases removed by transformers' own ``remove_tied_weights_from_state_dict`` (the LM head tied to
  the embedding is stored once, under the name transformers keeps), ``config.json`` and
  ``generation_config.json`` are transformers' own (written by ``save_pretrained`` with no tensors),
  with ``dtype`` set to the stored dtype, and files over ``SHARD_BYTES`` are split into
  ``model-0000k-of-0000n.safetensors`` with transformers' index file. A model whose classes rename or
  fuse tensors when saving (``revert_weight_conversion`` is not the identity: some MoE models) is saved
  by ``save_pretrained`` itself with the replacement tensors (its peak, not this module's).
- ``replace``: name -> tensor written instead of the model's (the float32 masters). Any tensor whose
  dtype is not the stored dtype is cast on the CPU, one at a time.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path

import torch

SHARD_BYTES = 5 * 2**30
"""Largest shard file written (transformers' convention for hub uploads: 5 GB)."""

_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
           torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
           torch.bool: "BOOL"}
if hasattr(torch, "float8_e4m3fn"):
    _DTYPES.update({torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2"})


def saved_tensors(model, replace: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor] | None:
    """The tensors ``save_pretrained`` would write, by name (views of the model's own, or ``replace``'s),
    or None when the model's classes convert tensors on saving (then ``save_pretrained`` must write)."""
    from transformers.modeling_utils import remove_tied_weights_from_state_dict

    state = model.state_dict(keep_vars=False)
    for key in list(getattr(model, "_keys_to_ignore_on_save", None) or []):
        state.pop(key, None)
    state = remove_tied_weights_from_state_dict(state, model)
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # transformers < 5 has no conversions
        revert_weight_conversion = None
    if revert_weight_conversion is not None:
        reverted = revert_weight_conversion(model, dict(state))
        if set(reverted) != set(state) or any(reverted[k] is not state[k] for k in state):
            return None
    replace = replace or {}
    named = dict(model.named_parameters(remove_duplicate=False))
    for name, tensor in replace.items():
        if name in state:
            state[name] = tensor.detach().view(state[name].shape)
        elif name in named:  # a tied alias of a stored tensor: store the replacement under the kept name
            kept = next(k for k, v in state.items() if v.data_ptr() == named[name].data_ptr())
            state[kept] = tensor.detach().view(state[kept].shape)
    return state


def write_safetensors(path: Path, tensors: dict[str, torch.Tensor], dtype: torch.dtype | None = None,
                      metadata: dict[str, str] | None = None, fetch=None) -> None:
    """Write ``tensors`` to ``path`` one at a time (each floating tensor cast to ``dtype`` when given, on
    the CPU). The header is built from shapes alone, so no tensor is read before its turn. ``fetch(name,
    tensor)``: the tensor's values, when ``tensors`` holds only shapes (``meta`` tensors of a driver whose
    weights live in Ray actors, ``es/ray_population.py``); called once per tensor, in the writing order."""
    names = sorted(tensors)
    header, offset, stored = {}, 0, {}
    for name in names:
        t = tensors[name]
        out = dtype if (dtype is not None and t.is_floating_point()) else t.dtype
        if out not in _DTYPES:
            raise ValueError(f"safetensors cannot store {name} of dtype {out}")
        size = t.numel() * torch.empty((), dtype=out).element_size()
        header[name] = {"dtype": _DTYPES[out], "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        stored[name], offset = out, offset + size
    if metadata:
        header["__metadata__"] = dict(metadata)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for name in names:
            t = tensors[name].detach() if fetch is None else fetch(name, tensors[name])
            if t.device.type != "cpu":
                t = t.to("cpu")
            if t.dtype != stored[name]:
                t = t.to(stored[name])
            t = t.contiguous()
            if t.numel():
                f.write(memoryview(t.view(-1).view(torch.uint8).numpy()))
            del t


def write_weights(directory: Path, model, replace: dict[str, torch.Tensor] | None = None,
                  dtype: torch.dtype | None = None, shard_bytes: int = SHARD_BYTES, fetch=None,
                  layout: dict[str, torch.Tensor] | None = None) -> list[str]:
    """Write ``model``'s weights (``replace`` substituted) and its config into ``directory`` as
    ``save_pretrained`` lays them out, tensor by tensor; return the weight files' names. ``dtype``: the
    floating-point dtype stored (None: each tensor's own). ``fetch``: as in ``write_safetensors``, with ``layout``: the
    tensors' names, shapes and dtypes (``saved_tensors`` of the model taken while it had its weights: a
    ``meta`` model cannot tell tied tensors apart)."""
    from evolm.models import quiet_transformers

    quiet_transformers()
    directory = Path(directory)
    tensors = dict(layout) if layout is not None else saved_tensors(model, replace)
    if tensors is None and fetch is not None:
        raise ValueError("a model that converts tensors on saving cannot be written from fetched tensors")
    if tensors is None:  # a model that converts tensors on saving: transformers writes it
        state = model.state_dict()
        state.update({k: v.detach() for k, v in (replace or {}).items() if k in state})
        if dtype is not None:
            state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
        model.save_pretrained(directory, safe_serialization=True, state_dict=state)
        return sorted(p.name for p in directory.glob("*.safetensors"))
    model.save_pretrained(directory, safe_serialization=True, state_dict={})  # config and generation config only
    for stray in list(directory.glob("*.safetensors")) + list(directory.glob("*.safetensors.index.json")):
        stray.unlink()
    stored = dtype or next((t.dtype for t in tensors.values() if t.is_floating_point()), None)
    config = directory / "config.json"
    if stored is not None and config.exists():
        cfg = json.loads(config.read_text())
        cfg["dtype"] = str(stored).removeprefix("torch.")
        config.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")

    def nbytes(t):
        out = dtype if (dtype is not None and t.is_floating_point()) else t.dtype
        return t.numel() * torch.empty((), dtype=out).element_size()

    shards, current, size = [], {}, 0
    for name in sorted(tensors):
        n = nbytes(tensors[name])
        if current and size + n > shard_bytes:
            shards.append(current)
            current, size = {}, 0
        current[name], size = tensors[name], size + n
    shards.append(current)
    meta = {"format": "pt"}
    if len(shards) == 1:
        write_safetensors(directory / "model.safetensors", shards[0], dtype, meta, fetch)
        return ["model.safetensors"]
    files, weight_map = [], {}
    for k, shard in enumerate(shards, 1):
        fname = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        write_safetensors(directory / fname, shard, dtype, meta, fetch)
        files.append(fname)
        weight_map.update({name: fname for name in shard})
    total = sum(nbytes(t) for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return files


def write_named(path: Path, named: dict[str, torch.Tensor], dtype: torch.dtype | None = torch.float32,
                fetch=None) -> None:
    """A plain safetensors file of ``named`` tensors (``masters.safetensors``), one tensor at a time."""
    write_safetensors(Path(path), named, dtype, {"format": "pt"}, fetch)


@dataclass
class ModelWeights:
    """A model to save with some of its tensors replaced (``replace``: the float32 masters of a
    lower-precision run, by HF name) and the floating dtype to store (None: each tensor's own).
    What ``runs.save_model_dir`` streams; it holds references, never copies."""

    model: object
    replace: dict[str, torch.Tensor] = field(default_factory=dict)
    dtype: torch.dtype | None = None
    fetch: object = None
    """``fetch(name, tensor)``: the stored tensor's values when the model holds only shapes (``meta``; the
    weights live in Ray actors, ``es/ray_population.py``); each is checked finite as it arrives."""
    layout: dict | None = None
    """With ``fetch``: the stored tensors' names, shapes and dtypes (``meta`` tensors), taken before the
    weights left."""

    def named_tensors(self):
        """``(name, tensor)`` of every parameter as it will be stored (replacements included)."""
        for name, p in self.model.named_parameters():
            yield name, self.replace.get(name, p)
