"""One memory account: every byte an ES run will hold, per device, added up before the run allocates.

``es_account(cfg, shape)`` lists, for the device each thing lives on, the weights, the float32 masters of a
lower-precision run, the noise table, the KV cache (the HF backend's estimate, or a vLLM engine's own
budget) and the transient of a save; ``check(cfg, shape)`` refuses a run whose lines do not fit what is
free, in one line naming the fix. docs/gpu.md's per-size table is ``size_table()`` (a test keeps them equal).

Design decisions:

- The shape is read from the model's config on the meta device (``ModelShape.of_config``: exact
  parameter count and largest tensor, no weights touched), or from a loaded model (``of_model``).
- Where things live. HF backend: everything on ``model.device``. vLLM: the engine's weights, masters
  and noise table on the engine's device (CUDA when vLLM runs there, whatever ``model.device`` says),
  its KV cache inside the engine's budget (``vllm_kv_cache_gb``; on CUDA vLLM's start-up check also
  wants ``vllm_gpu_memory_utilization`` of the GPU free); the driver's HF copy (weights only: the masters
  are the engine's) on ``model.device``. The masters and the table are allocated after vLLM profiled
  its memory, so they come on top of its budget: this account is the only place they are counted.
- A save is written tensor by tensor (``evolm.streamsave``): its transient is one tensor, cast to float32
  on the CPU, counted in RAM whatever the device.
- The KV estimate of the HF backend is ``2 x layers x KV heads x head dim x dtype bytes`` per token for
  ``members x prompts`` rows of ``prompt + new`` tokens, plus one step's float32 logits. Activations,
  the allocator's slack and the interpreter are not modelled; benchmarks/save_memory.py compares every
  line with what it measures on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

GiB = 2**30
TABLE_SLACK = 2**25
"""Entries of the default noise table beyond P (``evolm.es.noise.TableNoise.SLACK``; this module sits below ``es``)."""
_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}


@dataclass(frozen=True)
class ModelShape:
    """What the account needs of a model: distinct parameters, its largest tensor and its KV geometry."""

    params: int
    largest: int
    layers: int
    kv_heads: int
    head_dim: int
    vocab: int
    projection_dims: int = 0
    """Sum of (out + in) over the attention and MLP weight matrices: a LoRA adapter of rank r holds r times
    this many values (vLLM LoRA populations)."""

    @classmethod
    def of_model(cls, model) -> "ModelShape":
        from evolm.categories import param_category

        cfg = getattr(model, "config", None)
        sizes = [p.numel() for p in model.parameters()]
        dims = sum(p.shape[0] + p.shape[1] for n, p in model.named_parameters()
                   if p.ndim == 2 and param_category(n) in ("attention", "mlp"))
        return cls(sum(sizes), max(sizes), *_kv_geometry(cfg), projection_dims=dims)

    @classmethod
    def of_config(cls, config) -> "ModelShape":
        """From a transformers config, by building the model on the meta device (no memory, no weights)."""
        import torch
        from transformers import AutoModelForCausalLM

        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        return cls.of_model(model)


def _kv_geometry(cfg) -> tuple[int, int, int, int]:
    text = getattr(cfg, "text_config", None) or cfg
    if text is None:
        return 0, 0, 0, 0
    heads = getattr(text, "num_attention_heads", 1) or 1
    head_dim = getattr(text, "head_dim", None) or (getattr(text, "hidden_size", 0) // heads)
    return (getattr(text, "num_hidden_layers", 0), getattr(text, "num_key_value_heads", None) or heads,
            head_dim, getattr(text, "vocab_size", 0))


@dataclass(frozen=True)
class Line:
    device: str
    item: str
    bytes: int


def kv_bytes(shape: ModelShape, rows: int, tokens: int, dtype_bytes: int) -> int:
    """KV cache of ``rows`` sequences of ``tokens`` tokens, plus one decoding step's float32 logits."""
    return rows * tokens * 2 * shape.layers * shape.kv_heads * shape.head_dim * dtype_bytes + rows * shape.vocab * 4


def engine_on_cuda(cfg, cuda_here: bool | None = None) -> bool:
    """Whether a vLLM engine of this run runs on CUDA: vLLM's GPU build uses the GPU whatever
    ``model.device`` says (the driver's copy stays on the CPU); Ray actors that reserve GPUs get one."""
    if cfg.generation.backend != "vllm":
        return str(cfg.model.device).startswith("cuda")
    d = cfg.distributed
    if isinstance(d.workers, int) and d.workers >= 2:
        return d.gpus > 0
    if cuda_here is None:
        from evolm import machine

        cuda_here = machine.cuda_available()
    return cuda_here


def es_account(cfg, shape: ModelShape, *, prompt_tokens: int = 128, cuda_here: bool | None = None,
               gpu_total_bytes: int | None = None) -> list[Line]:
    """Every allocation of an ES run that scales with the model, per device (``"cuda"``/``"cpu"``), in
    bytes. ``prompt_tokens``: the longest prompt (a bound); ``gpu_total_bytes``: the GPU's size, for a vLLM
    engine's budget on CUDA (None: the budget is left out)."""
    es, gen, model = cfg.es, cfg.generation, cfg.model
    dtype = model.dtype if model.dtype in _BYTES else "float32"
    db = _BYTES[dtype]
    P = shape.params
    vllm = gen.backend == "vllm"
    engine = ("cuda" if engine_on_cuda(cfg, cuda_here) else "cpu") if vllm else \
        ("cuda" if str(model.device).startswith("cuda") else "cpu")
    lines = [Line(engine, "weights" + (" (engine)" if vllm else ""), P * db)]
    if db != 4 and getattr(es, "arithmetic", "exact") == "exact":
        lines.append(Line(engine, "float32 masters", 4 * P))
    if getattr(es, "arithmetic", "exact") == "artifact" and getattr(es, "engines", 1) > 1:
        lines.append(Line(engine, "engine replicas (es.engines - 1 copies)", (es.engines - 1) * P * db))
    if es.noise == "table":  # TableNoise.default_size(P): every parameter plus 2^25 member offsets (a test keeps them equal)
        lines.append(Line(engine, "noise table", 4 * (es.noise_table_size or P + TABLE_SLACK)))
    tokens = prompt_tokens + gen.max_new_tokens
    members = es.population if es.perturbation == "lowrank" else 1
    if es.perturbation == "lowrank" and getattr(es, "member_batch", 0):
        members = min(members, es.member_batch)
    if vllm:
        if engine == "cpu" or gen.vllm_kv_cache_gb not in (None, "auto", 0):
            kv = gen.vllm_kv_cache_gb if isinstance(gen.vllm_kv_cache_gb, (int, float)) else 0
            lines.append(Line(engine, "KV cache (vllm_kv_cache_gb)", int(kv * GiB)))
        elif gpu_total_bytes:
            util = gen.vllm_gpu_memory_utilization if isinstance(gen.vllm_gpu_memory_utilization, float) else 0.9
            lines.append(Line(engine, "KV cache (the rest of vllm_gpu_memory_utilization)",
                              max(0, int(util * gpu_total_bytes) - P * db)))
        if es.perturbation == "lowrank" and shape.projection_dims:  # members as LoRA adapters (es/lora_population.py)
            from evolm.backends.vllm import lora_rank_bucket

            slots = es.member_batch or es.population
            lines.append(Line(engine, "LoRA adapters (members, registered after vLLM's profile)",
                              slots * es.rank * shape.projection_dims * db))
            if engine == "cpu":  # on CUDA vLLM's slots sit inside its vllm_gpu_memory_utilization (the KV line's rest)
                lines.append(Line(engine, "LoRA slots (vLLM, rank bucket)",
                                  slots * lora_rank_bucket(es.rank) * shape.projection_dims * db))
        driver = "cuda" if str(model.device).startswith("cuda") else "cpu"
        lines.append(Line(driver, "driver's HF copy (weights)", P * db))
    else:
        lines.append(Line(engine, "KV cache and logits (estimate)",
                          kv_bytes(shape, members * es.prompts_per_iteration, tokens, db)))
    lines.append(Line("cpu", "save transient (one tensor, float32)", 4 * shape.largest))
    return lines


def totals(lines: list[Line]) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in lines:
        out[line.device] = out.get(line.device, 0) + line.bytes
    return out


def fixes(cfg, lines: list[Line], device: str) -> list[str]:
    """What a user can change to need less on ``device``, largest first."""
    items = {ln.item for ln in lines if ln.device == device}
    out = []
    if "noise table" in items:
        out.append("es.noise='counter' (no table)")
    if any(i.startswith("engine replicas") for i in items):
        out.append("fewer es.engines (each holds a copy of the weights)")
    if "float32 masters" in items and device == "cpu":
        out.append("model.dtype='float32' on the CPU (no masters)")
    if any(i.startswith("KV cache (vllm") for i in items):
        out.append("a smaller generation.vllm_kv_cache_gb or generation.vllm_gpu_memory_utilization")
    if any(i.startswith("KV cache and logits") for i in items):
        out.append("fewer es.prompts_per_iteration or generation.max_new_tokens")
    if any(i.startswith("LoRA ") for i in items):
        out.append("a smaller es.member_batch (fewer LoRA adapters per engine call) or es.rank")
    if any(i.startswith("driver's HF copy") for i in items) and device == "cuda":
        out.append("model.device='cpu' (the driver's copy only evaluates and saves)")
    return out + ["a smaller model or a device with more free memory"]


def check(cfg, lines: list[Line], free: dict[str, int]) -> None:
    """Refuse (ConfigError, one line) when a device's lines exceed what is free on it (``free``: bytes per
    device; a device missing there is not checked, e.g. the GPUs of Ray actors on other machines)."""
    from evolm.errors import ConfigError

    for device, need in totals(lines).items():
        if device in free and need > free[device]:
            parts = " + ".join(f"{ln.bytes / GiB:.1f} GiB {ln.item}" for ln in lines if ln.device == device and ln.bytes)
            where = "GPU memory" if device == "cuda" else "RAM"
            raise ConfigError(f"ES needs {parts} = {need / GiB:.1f} GiB on {device}, but {free[device] / GiB:.1f} GiB of "
                              f"{where} is free; use {', or '.join(fixes(cfg, lines, device))}")


def free_here(devices) -> dict[str, int]:
    """Free bytes on this machine's devices among ``devices``: CUDA's ``mem_get_info``, the RAM available."""
    from evolm import machine

    out = {}
    if "cpu" in devices:
        out["cpu"] = int(machine.available_ram_gb() * GiB)
    if "cuda" in devices and machine.cuda_available():
        out["cuda"] = int(machine.cuda_free_fraction("cuda")[0] * GiB)
    return out


# -- docs/gpu.md's table ----------------------------------------------------------------------------

ARCHITECTURES = {
    # name: (transformers config class, its sizes); from the models' published config.json files
    "Qwen2.5-0.5B": ("Qwen2Config", dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                         num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                                         tie_word_embeddings=True)),
    "Qwen2.5-1.5B": ("Qwen2Config", dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                         num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
                                         tie_word_embeddings=True)),
    "Qwen2.5-7B": ("Qwen2Config", dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                                       num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                                       tie_word_embeddings=False)),
    "Llama-3.1-8B": ("LlamaConfig", dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                         num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                                         tie_word_embeddings=False)),
}
TABLE_SETTINGS = ["model.dtype='bfloat16'", "model.device='cuda'", "es.noise='counter'", "es.prompts_per_iteration=32",
                  "generation.max_new_tokens=256"]
"""The run the table sizes: bf16 generation with float32 masters, counter noise, 32 prompts of 128 tokens
and 256 new tokens, one member at a time, on one GPU (HF backend)."""


def architecture_shape(name: str) -> ModelShape:
    import transformers

    cls_name, sizes = ARCHITECTURES[name]
    return ModelShape.of_config(getattr(transformers, cls_name)(**sizes))


def size_table() -> str:
    """The markdown table of docs/gpu.md ("Memory per model size"), computed by ``es_account``."""
    from evolm import config

    rows = ["| model | parameters | weights (bf16) | float32 masters | KV + logits, one member | save transient (RAM) "
            "| **on the GPU, counter noise** | + table noise | with vLLM: + driver copy (RAM) |",
            "|---|---|---|---|---|---|---|---|---|"]
    for name in ARCHITECTURES:
        shape = architecture_shape(name)
        cfg = config.from_dict(config.ESJob, {}, TABLE_SETTINGS)
        lines = es_account(cfg, shape, prompt_tokens=128, cuda_here=True)
        by = {ln.item: ln.bytes for ln in lines}
        table = config.from_dict(config.ESJob, {}, TABLE_SETTINGS + ["es.noise='table'"])
        extra = {ln.item: ln.bytes for ln in es_account(table, shape, prompt_tokens=128, cuda_here=True)}["noise table"]
        g = lambda b: f"{b / GiB:.1f} GiB" if b >= GiB / 10 else f"{b / GiB:.2f} GiB"  # noqa: E731
        rows.append(f"| {name} | {shape.params / 1e9:.3f} B | {g(by['weights'])} | {g(by['float32 masters'])} | "
                    f"{g(by['KV cache and logits (estimate)'])} | {g(by['save transient (one tensor, float32)'])} | "
                    f"**{g(totals(lines)['cuda'])}** | +{g(extra)} | {g(shape.params * 2)} |")
    return "\n".join(rows) + "\n"


def fits(gpu_gib: float, name: str, noise: str = "counter") -> bool:
    """Whether ``name`` trains with ES on one GPU of ``gpu_gib`` GiB at the table's settings."""
    from evolm import config

    cfg = config.from_dict(config.ESJob, {}, TABLE_SETTINGS + [f"es.noise='{noise}'"])
    return totals(es_account(cfg, architecture_shape(name), cuda_here=True))["cuda"] <= gpu_gib * GiB
