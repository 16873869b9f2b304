"""Generation backends behind one interface (``evolm.backends.base.Generator``)."""

from __future__ import annotations

from evolm.backends.base import Completion, Generator, SamplingParams
from evolm.errors import ConfigError


def make_generator(backend: str, model, tokenizer, batch_size: int = 32, prefix_cache: bool = True,
                   cpu_matmul: str = "auto", **engine) -> Generator:
    """Build the backend named in ``generation.backend`` around a loaded model (``prefix_cache``, ``cpu_matmul``:
    the hf backend's ``generation.*`` knobs; ``engine``: the vLLM engine's options, ``engine_options(cfg)``)."""
    if backend == "hf":
        from evolm.backends.hf import HFGenerator  # torch + transformers: not for code that only reads results

        return HFGenerator(model, tokenizer, batch_size=batch_size, prefix_cache=prefix_cache, cpu_matmul=cpu_matmul)
    if backend == "vllm":
        from evolm.backends.vllm import VLLMGenerator

        return VLLMGenerator(model, tokenizer, **engine)
    raise ConfigError(f"generation.backend must be 'hf' or 'vllm' (got '{backend}')")


def engine_options(cfg) -> dict:
    """The vLLM engine's options from a job config (``[model]`` threads, ``[generation]`` vllm_*, the run seed)."""
    g = cfg.generation
    es = getattr(cfg, "es", None)
    lora = es is not None and getattr(es, "perturbation", "full") == "lowrank" and g.backend == "vllm"
    return {"threads": cfg.model.threads, "kv_cache_gb": g.vllm_kv_cache_gb, "max_model_len": g.vllm_max_model_len,
            "enforce_eager": g.vllm_enforce_eager, "gpu_memory_utilization": g.vllm_gpu_memory_utilization,
            "tensor_parallel_size": g.vllm_tensor_parallel_size,
            "seed": cfg.run.seed,  # low-rank ES members are LoRA adapters: as many slots as members per engine call
            "lora_slots": (es.member_batch or es.population) if lora else 0, "lora_rank": es.rank if lora else 0}


def actors_generate(cfg) -> bool:
    """Whether a Ray population of vLLM actors scores the members (``generation.backend = "vllm"`` with
    ``distributed.workers >= 2``): each actor perturbs inside its own engine, and the driver, which only
    mirrors the updates and measures, holds no engine (``make_generators``)."""
    return cfg.generation.backend == "vllm" and cfg.distributed.workers >= 2


def heldout_backend(cfg) -> str:
    """The backend held-out measurements use: HF (the entropy reference) unless ``generation.eval_backend = "same"``."""
    g = cfg.generation
    return g.backend if g.backend == "hf" or g.eval_backend == "same" else "hf"


def make_generators(cfg, model, tokenizer) -> tuple[Generator, Generator]:
    """``(training generator, held-out generator)`` for a job config (the same object when both use one backend).

    With vLLM actors (``actors_generate``) both are the HF backend: the members are scored in the actors'
    engines, so the driver starts no engine of its own; with ``eval_backend = "hf"`` its HF copy takes the
    updates, held-out evaluation, probes and the centre's score, with ``"same"`` the actors evaluate
    (``ray_population.ActorsOrDriver``) and the driver drops its copy once they are up."""
    g = cfg.generation
    if actors_generate(cfg):
        driver = make_generator("hf", model, tokenizer, g.batch_size, g.prefix_cache, cpu_matmul=g.cpu_matmul)
        return driver, driver
    train = make_generator(g.backend, model, tokenizer, g.batch_size, g.prefix_cache, cpu_matmul=g.cpu_matmul, **engine_options(cfg))
    if heldout_backend(cfg) == g.backend:
        return train, train
    return train, make_heldout_generator(cfg, model, tokenizer)


def make_heldout_generator(cfg, model, tokenizer) -> Generator:
    """Only the held-out generator of a job config (``evolm eval --like`` measures as the run did)."""
    g = cfg.generation
    return make_generator(heldout_backend(cfg), model, tokenizer, g.batch_size, g.prefix_cache, cpu_matmul=g.cpu_matmul,
                          **engine_options(cfg))


__all__ = ["Completion", "Generator", "SamplingParams", "actors_generate", "engine_options", "heldout_backend", "make_generator",
           "make_generators", "make_heldout_generator"]
