"""float32 linear layers on the CPU through oneDNN rather than torch's BLAS, during generation.

``with cpu_matmul(model, "auto"):`` runs every float32 ``nn.Linear`` of ``model`` on the CPU through oneDNN's
matmul (``torch._C._nn.mkldnn_linear``, in every x86 torch wheel) for the duration of the block.

Design decisions:

- Why: torch's CPU wheels run a float32 ``F.linear`` through MKL's sgemm, which on AMD CPUs takes its AVX2
  kernels; oneDNN runs AVX-512 there. On the 2-core AMD EPYC (Zen 5) this repository is developed on, at one
  thread, oneDNN ran SmolLM2-135M's prefill GEMMs 1.9-2.0x and its decode GEMMs 1.1-2.3x faster, and an ES
  iteration on Qiu et al.'s Countdown prompts 1.51x (``benchmarks/shared_prefix.py --knob cpu_matmul``,
  docs/benchmarks.md); the issue that asked for a faster peer figure had read MKL's rate as the core's peak. On a CPU where MKL is the faster one, ``generation.cpu_matmul = "torch"`` keeps torch's path.
- Only with autograd off (generation, evaluation, ES members); with gradients on (GRPO's loss) a layer runs
  ``F.linear`` as before. Only float32 weights on the CPU: bfloat16 already goes through oneDNN, CUDA
  through cuBLAS, quantised weights through their own kernels.
- The weight is read where it lies on every call (dense, never prepacked or copied), so ES's in-place
  perturbations and restores are seen at once and no second copy of the model is held.
- Numerics: not bit-identical to MKL's (relative difference ~1e-6 at SmolLM2's shapes), so greedy tokens
  may differ at near-ties between the two settings; each setting is deterministic, and invariant to the
  thread count at these shapes (tested), which keeps Ray actors bit-identical to one process.
- Applied as a context manager that sets an instance ``forward`` on each eligible ``nn.Linear`` and deletes
  it on exit: outside generation the model is plain (``deepcopy``, ``save_pretrained``, TRL see nothing).
  Entered again inside itself (a generator wrapping another), it leaves the outer block in charge.
"""

from __future__ import annotations

from contextlib import contextmanager
from functools import partial
from typing import Iterator, Literal

import torch
import torch.nn.functional as F

from evolm.machine import onednn_available

CpuMatmul = Literal["auto", "onednn", "torch"]
CHOICES: tuple[str, ...] = ("auto", "onednn", "torch")
_PATCHED = "_evolm_onednn"


def resolve(choice: str) -> bool:
    """Whether ``generation.cpu_matmul = choice`` runs float32 CPU linears through oneDNN here. auto: where
    torch has oneDNN. onednn where torch has none is refused (a silent fallback would mislabel a benchmark)."""
    if choice not in CHOICES:
        raise ValueError(f"generation.cpu_matmul must be one of {CHOICES} (got '{choice}')")
    if choice == "onednn" and not onednn_available():
        raise ValueError("generation.cpu_matmul = 'onednn': this torch build has no oneDNN; use 'auto' or 'torch'")
    return choice != "torch" and onednn_available()


def _forward(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    weight, bias = module.weight, module.bias
    if torch.is_grad_enabled() or x.dtype != torch.float32 or x.device.type != "cpu" or x.numel() == 0:
        return F.linear(x, weight, bias)
    rows = x.reshape(-1, x.shape[-1]).to_mkldnn()
    return torch._C._nn.mkldnn_linear(rows, weight, bias).to_dense().view(*x.shape[:-1], weight.shape[0])


def eligible(module: torch.nn.Module) -> bool:
    """A plain float32 CPU linear layer (its weight a dense float32 CPU tensor, its bias absent or the same)."""
    if not isinstance(module, torch.nn.Linear) or "forward" in module.__dict__:
        return False
    w, b = module.weight, module.bias
    dense = all(t.layout == torch.strided and t.dtype == torch.float32 and t.device.type == "cpu" for t in [w] + ([b] if b is not None else []))
    return dense and not w.is_meta


@contextmanager
def cpu_matmul(model: torch.nn.Module, choice: str = "auto") -> Iterator[int]:
    """Run ``model``'s eligible linear layers through oneDNN inside the block (see the module docstring);
    yields how many layers were switched (0 when ``choice`` resolves to torch's path or none is eligible)."""
    if not resolve(choice) or getattr(model, _PATCHED, False):
        yield 0
        return
    layers = [m for m in model.modules() if eligible(m)]
    for m in layers:
        m.forward = partial(_forward, m)
    object.__setattr__(model, _PATCHED, True)
    try:
        yield len(layers)
    finally:
        for m in layers:
            m.__dict__.pop("forward", None)
        object.__setattr__(model, _PATCHED, False)
