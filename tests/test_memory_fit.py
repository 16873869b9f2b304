"""One memory account (evolm.memory): every byte ES will hold, per device; a run whose state does not fit is
refused in one line before ES allocates or writes anything (es.engine.check_memory); docs/gpu.md's per-size
table is the account's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from evolm import config, memory
from evolm.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def _cfg(*sets):
    return config.from_dict(config.ESJob, {}, ["distributed.workers=0", "model.threads=1", *sets])


def _items(lines, device=None):
    return {ln.item: ln.bytes for ln in lines if device is None or ln.device == device}


def test_memory_need_counts_masters_the_table_the_kv_and_the_save(tiny_model):
    from evolm.es.engine import memory_need
    from evolm.es.noise import TableNoise

    numel = sum(p.numel() for p in tiny_model.parameters())
    largest = max(p.numel() for p in tiny_model.parameters())
    counter = memory_need(tiny_model, _cfg("es.noise='counter'"))
    assert "float32 masters" not in counter and "noise table" not in counter  # float32 in place, no table
    assert counter["save transient (one tensor, float32)"] == 4 * largest
    assert counter["KV cache and logits (estimate)"] > 0
    assert memory_need(tiny_model, _cfg("es.noise='table'"))["noise table"] == 4 * TableNoise.default_size(numel)
    bf16 = tiny_model.to(torch.bfloat16)
    assert memory_need(bf16, _cfg("es.noise='counter'", "model.dtype='bfloat16'"))["float32 masters"] == 4 * numel


def test_a_state_that_does_not_fit_is_refused_with_the_fix(tiny_model):
    from evolm.es.engine import check_memory

    with pytest.raises(ConfigError, match=r"ES needs .*GiB noise table.* on cpu, but 0\.0 GiB of RAM is free; "
                                          r"use es\.noise='counter' \(no table\)"):
        check_memory(tiny_model, _cfg("es.noise='table'"), free_bytes=1000)
    check_memory(tiny_model, _cfg("es.noise='table'"), free_bytes=2**40)


def test_vllm_lines_sit_on_the_engines_device_and_the_driver_copy_on_the_cpu():
    """A local vLLM engine on CUDA holds weights, masters, table and its KV share on the GPU; the driver's
    HF copy (weights only) is in RAM; the save transient is in RAM."""
    shape = memory.architecture_shape("Qwen2.5-1.5B")
    cfg = _cfg("generation.backend='vllm'", "model.dtype='bfloat16'", "model.device='cpu'", "es.noise='table'",
               "generation.vllm_kv_cache_gb=2")
    lines = memory.es_account(cfg, shape, cuda_here=True)
    gpu, ram = _items(lines, "cuda"), _items(lines, "cpu")
    assert set(gpu) == {"weights (engine)", "float32 masters", "noise table", "KV cache (vllm_kv_cache_gb)"}
    assert gpu["KV cache (vllm_kv_cache_gb)"] == 2 * 2**30
    assert ram["driver's HF copy (weights)"] == 2 * shape.params
    # Ray actors reserving GPUs: the engines are on CUDA even when the driver has none
    actors = _cfg("generation.backend='vllm'", "model.dtype='bfloat16'", "model.device='cpu'", "distributed.workers=2",
                  "distributed.gpus=1", "generation.eval_backend='hf'")
    assert {ln.device for ln in memory.es_account(actors, shape, cuda_here=False) if ln.item == "float32 masters"} == {"cuda"}


def test_a_vllm_lora_population_counts_its_adapters_and_slots():
    """Low-rank members as vLLM LoRA adapters: N registered adapters of rank r, plus on the CPU vLLM's N slots at
    its rank bucket (8 for rank 4), each r x (out + in) per attention/MLP matrix in the model's dtype; on CUDA
    the slots sit inside vLLM's own budget and only the adapters are added."""
    shape = memory.architecture_shape("Qwen2.5-1.5B")
    assert shape.projection_dims > 0
    sets = ["generation.backend='vllm'", "es.perturbation='lowrank'", "es.params=['attention','mlp']", "es.population=16",
            "es.rank=4", "generation.vllm_kv_cache_gb=2"]
    cpu = {ln.item: ln for ln in memory.es_account(_cfg(*sets), shape, cuda_here=False)}
    assert cpu["LoRA adapters (members, registered after vLLM's profile)"].bytes == 16 * 4 * shape.projection_dims * 4
    assert cpu["LoRA slots (vLLM, rank bucket)"].bytes == 16 * 8 * shape.projection_dims * 4
    gpu = _items(memory.es_account(_cfg(*sets, "es.member_batch=8"), shape, cuda_here=True), "cuda")
    assert gpu["LoRA adapters (members, registered after vLLM's profile)"] == 8 * 4 * shape.projection_dims * 4
    assert "LoRA slots (vLLM, rank bucket)" not in gpu


def test_the_account_sizes_7b_runs_per_card():
    """A 48 GB card (44.7 GiB) takes Qwen2.5-7B with counter noise and not with the table; an 80 GB card (79.2
    GiB usable as reported for an H100) takes both now that a save holds no float32 copy of the model."""
    assert memory.fits(44.7, "Qwen2.5-7B", "counter")
    assert not memory.fits(44.7, "Qwen2.5-7B", "table")
    assert memory.fits(79.2, "Qwen2.5-7B", "table")


def test_docs_gpu_table_is_the_accounts():
    text = (ROOT / "docs" / "gpu.md").read_text()
    table = memory.size_table()
    assert table in text, "docs/gpu.md's memory table differs from evolm.memory.size_table(); paste it again"


def test_run_es_refuses_before_the_run_directory_exists(tmp_path, tiny_dir, monkeypatch):
    from evolm import machine
    from evolm.jobs import run_es

    monkeypatch.setattr(machine, "available_ram_gb", lambda: 1e-6)
    cfg = _cfg(f"model.spec='{tiny_dir}'", f"run.out_dir='{tmp_path}'", "run.name='fit'", "es.noise='table'",
               "eval.before_after=false", "probe.every=0")
    with pytest.raises(ConfigError, match="use es.noise='counter'"):
        run_es(cfg, quiet=True)
    assert not (tmp_path / "fit").exists()


def test_the_accounts_table_size_is_the_noise_tables():
    from evolm.es.noise import TableNoise

    assert TableNoise.default_size(1000) == 1000 + memory.TABLE_SLACK
