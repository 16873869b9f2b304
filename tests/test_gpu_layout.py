"""Auto values and refusals for GPU layouts (issue 39), tested on the CPU by standing in for the machine
(``evolm.machine``): where the driver's copy goes with a local vLLM engine, the engines' dtype and KV size
from their own device, and the combinations that would run silently wrong, each refused in one line."""

from __future__ import annotations

import pytest

from evolm import config, machine
from evolm.errors import ConfigError


@pytest.fixture
def gpu_here(monkeypatch):
    monkeypatch.setattr(machine, "cuda_available", lambda: True)
    monkeypatch.setattr(machine, "cuda_free_fraction", lambda device="cuda": (75.0, 79.2))
    monkeypatch.setattr(machine, "cpu_bf16_native", lambda: (False, "no AMX (stand-in)"))


@pytest.fixture
def no_gpu_here(monkeypatch):
    monkeypatch.setattr(machine, "cuda_available", lambda: False)
    monkeypatch.setattr(machine, "cpu_bf16_native", lambda: (False, "no AMX (stand-in)"))


def _cfg(*sets):
    return config.from_dict(config.ESJob, {}, ["model.threads=1", *sets])


def test_a_local_vllm_engine_keeps_the_drivers_copy_on_the_cpu_and_runs_bf16(gpu_here):
    cfg = _cfg("generation.backend='vllm'", "distributed.workers=0")
    assert cfg.model.device == "cpu"
    assert cfg.model.dtype == "bfloat16"  # the engine's device (CUDA), not the driver CPU's AMX flag


def test_vllm_actors_with_gpus_take_bf16_and_vllms_own_kv_sizing_when_the_driver_has_no_gpu(no_gpu_here):
    cfg = _cfg("generation.backend='vllm'", "distributed.workers=2", "distributed.gpus=1",
               "generation.eval_backend='hf'")
    assert cfg.model.dtype == "bfloat16"
    assert cfg.generation.vllm_kv_cache_gb == 0  # vLLM sizes it inside vllm_gpu_memory_utilization, not the CPU rule
    cpu_actors = _cfg("generation.backend='vllm'", "distributed.workers=2", "generation.eval_backend='hf'")
    assert cpu_actors.model.dtype == "float32" and 0 < cpu_actors.generation.vllm_kv_cache_gb <= 4


def test_completions_that_can_exceed_vllm_max_model_len_are_refused():
    with pytest.raises(ConfigError, match=r"generation.max_new_tokens=4096 .* generation.vllm_max_model_len=2048"):
        _cfg("generation.backend='vllm'", "distributed.workers=0", "generation.max_new_tokens=4096")


def test_a_prompt_that_leaves_too_little_room_is_one_line_at_generate(tokenizer):
    """vLLM would truncate the completion where HF does not: the rewards would depend on the backend."""
    from evolm.backends.base import SamplingParams
    from evolm.backends.vllm import VLLMGenerator
    from evolm.errors import UserError

    gen = object.__new__(VLLMGenerator)
    gen.tokenizer, gen.max_model_len = tokenizer, 40
    with pytest.raises(UserError, match=r"prompt of \d+ tokens \+ generation.max_new_tokens=32 > generation.vllm_max_model_len=40"):
        gen.check_lengths(["one two three four five six seven eight nine ten eleven twelve"],
                          SamplingParams(max_new_tokens=32))
    gen.check_lengths(["hi"], SamplingParams(max_new_tokens=32))


def test_hf_actors_holding_gpus_on_the_cpu_are_refused():
    with pytest.raises(ConfigError, match=r"distributed.gpus=1 .* HF actors run on the CPU"):
        _cfg("distributed.workers=2", "distributed.gpus=1", "model.device='cpu'")


def test_stream_noise_on_a_gpu_is_refused(gpu_here):
    with pytest.raises(ConfigError, match=r"es.noise='stream' .* use es.noise='counter'"):
        _cfg("es.noise='stream'", "model.device='cuda'", "distributed.workers=0")
    with pytest.raises(ConfigError, match=r"es.noise='stream'"):
        _cfg("es.noise='stream'", "generation.backend='vllm'", "distributed.workers=0")
    _cfg("es.noise='stream'", "model.device='cpu'", "distributed.workers=0")


def test_a_failed_prefix_cache_reset_stops_the_run():
    from evolm.backends.vllm import VLLMGenerator

    class Engine:
        def reset_prefix_cache(self):
            return False

    gen = object.__new__(VLLMGenerator)
    gen.llm = Engine()
    with pytest.raises(RuntimeError, match="could not reset its prefix cache"):
        gen.reset_prefix_cache()
