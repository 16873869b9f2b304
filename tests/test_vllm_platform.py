"""The ES worker extension must not bring vLLM's CPU platform into a CUDA worker (issue 39).

vLLM imports ``worker_extension_cls`` in every worker, CUDA included, before it builds the model runner.
vLLM's CPU worker module (shipped in the CUDA wheel too) imports ``vllm.v1.worker.cpu.shm`` first, which
replaces ``torch.cuda.Stream``/``current_stream``, ``torch.accelerator.get_memory_info`` and
``Tensor.pin_memory`` process-wide. Each check runs in a fresh interpreter, so nothing imported by other
tests hides or causes a patch. The second test is the calibration: importing the CPU worker class does
patch torch, so the first test would see it if the extension pulled it in.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")

SRC = str(Path(__file__).resolve().parents[1] / "src")

PROBE = r"""
import importlib, json, sys, torch
watched = lambda: {"torch.cuda.Stream": torch.cuda.Stream, "torch.cuda.Event": torch.cuda.Event,
                   "torch.cuda.current_stream": torch.cuda.current_stream,
                   "torch.accelerator.get_memory_info": getattr(torch.accelerator, "get_memory_info", None),
                   "torch.accelerator.synchronize": getattr(torch.accelerator, "synchronize", None),
                   "torch.Tensor.pin_memory": torch.Tensor.pin_memory}
before = watched()
for name in sys.argv[1:]:
    module, _, attr = name.partition(":")
    obj = importlib.import_module(module)
    if attr:
        getattr(obj, attr)
after = watched()
print(json.dumps({"replaced": sorted(k for k in before if before[k] is not after[k]),
                  "cpu_modules": sorted(m for m in sys.modules if m.startswith("vllm.v1.worker.cpu")),
                  "evolm_modules": sorted(m for m in sys.modules if m.startswith("evolm"))}))
"""


def _probe(*names: str) -> dict:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), "VLLM_LOGGING_LEVEL": "ERROR"}
    done = subprocess.run([sys.executable, "-c", PROBE, *names], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_cuda_worker_imports_leave_torch_cuda_alone():
    """Everything a CUDA worker imports of evolm: the extension vLLM resolves by name, and what vLLM's own
    GPU worker start-up imports beside it (resolved the way vLLM resolves qualified names)."""
    from evolm.backends.vllm import WORKER

    seen = _probe("vllm.v1.worker.gpu_worker", f"{WORKER}:ESWorkerExtension", "evolm.backends.vllm", "evolm.es.params",
                  "evolm.es.noise", "evolm.checksum")
    assert seen["replaced"] == [], f"importing the CUDA worker's modules replaced {seen['replaced']}"
    assert seen["cpu_modules"] == [], f"vLLM's CPU worker modules were imported: {seen['cpu_modules']}"
    assert WORKER in seen["evolm_modules"]


def test_the_cpu_worker_class_does_patch_torch_so_the_check_can_fail():
    from evolm.backends.vllm import CPU_WORKER, WORKER

    module, _, cls = CPU_WORKER.rpartition(".")
    assert module != WORKER, "the CPU worker class must live outside the extension's module"
    seen = _probe(f"{module}:{cls}")
    assert "torch.cuda.Stream" in seen["replaced"] and "torch.Tensor.pin_memory" in seen["replaced"]
    assert "vllm.v1.worker.cpu_worker" in seen["cpu_modules"]
