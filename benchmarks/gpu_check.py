"""The prepared GPU check: evolm's CUDA path on a random-initialised Qwen2.5-1.5B shape, in one invocation.

    PYTHONPATH=src python benchmarks/gpu_check.py                          # CUDA if present, else CPU
    PYTHONPATH=src python benchmarks/gpu_check.py --tiny                   # a 2-layer shape (CPU test, ~30 s)
    PYTHONPATH=src:.devcarry/site python3 benchmarks/gpu_check.py --tokenizer .devcarry/smollm2 --out $OUT/gpu_check.json

On the device machine (one H200; torch 2.11, transformers 5.17; no hub, no vLLM, no Ray) the whole
check took 289 s (2026-12-04, docs/benchmarks/gpu_check_h200.json); the JSON is rewritten after every
section, so a run cut off by its time limit keeps what it measured, and ``--skip`` reruns a part; a
section that raises is recorded under ``errors`` and the next one runs.
It imports only torch, transformers, numpy, safetensors
and evolm, and what evolm imports at module level: everything the device image has except ``tomli_w``
(``evolm.config`` writes each run's resolved config.toml with it). Carry it as a folder: ``mkdir -p
.devcarry/site && cp -r .venv/lib/python3.*/site-packages/tomli_w .devcarry/site/`` (pure Python), with
the tokenizer files of the embedded SmolLM2 in ``.devcarry/smollm2`` (the device cannot convert the
GGUF: no ``gguf`` package); docs/gpu.md gives the whole command. A missing package is one line, exit 2.

The model is built in code from ``transformers.Qwen2Config`` with Qwen2.5-1.5B's sizes (hidden 1536,
28 layers, 12 heads, 2 KV heads, intermediate 8960, vocab 151936, tied embeddings; seed 0), never from
a hub; prompts are tokenised with SmolLM2's tokenizer (its ids are valid in the larger vocabulary; a
random model's tokens beyond it decode to nothing). ``--tiny``: the same code with 2 layers of width 64.

What it measures, in this order (each a section of the JSON written to ``--out``):

1. ``identity``: CPU vs CUDA bit-identity of a member's weights (perturb), of the restore (both must
   give the original bits back) and of the update (``ParamSet.apply_update``), for ``es.noise =
   "counter"`` and ``"table"``, with float32 weights (in place) and bfloat16 weights (float32 masters).
   What the code promises (``es/noise.py``, ``es/params.py``): counter noise is identical on CPU and
   CUDA by construction (integer hash, table lookup, separately rounded IEEE ``*``/``+``), for
   perturb, restore and update; table noise is generated on the CPU and copied, and its perturbation
   is the same rounded ``mul`` then ``add``, so its members are identical too, but its update uses
   ``add(alpha=)`` (which a CPU or GPU kernel may fuse into a multiply-add), so it is promised
   bit-exact only on one software stack and device: reported, not promised (``promised`` in the JSON).
   On the 1.5B shape the check covers the tied embedding, the final norm and layers 0 and 27
   (``--identity-regex``; every tensor kind, 0.3B elements) so the CPU side stays short.
2. ``es``: ES end to end through ``jobs.run_es`` (run directory, seed log, checkpoints) on the device in
   ``--dtype`` (default bfloat16, float32 masters), counter noise: an uninterrupted run of
   ``--iterations`` updates; a second run killed after update 1 and resumed; ``engine.replay`` of the
   first run's seed log onto the base weights. Checked bit for bit (float32 ``final/`` weights of both
   runs and the replayed masters) and that the updates changed the weights. The reward is a vowel
   share of the completion (a random model's completions differ between members, so updates apply).
3. ``memory``: bytes per parameter of the ES state: on CUDA ``torch.cuda.max_memory_allocated`` of one
   ES iteration (model + masters + generation) against inference alone, and against the target
   "model-dtype bytes + 4 B (float32 masters) per parameter (+ KV)", the KV and activations taken from
   the inference-only peak. On CPU (no CUDA) the RSS growth of building the masters, per parameter.
4. ``timing``: seconds per update (``apply_update`` of N directions) and per replica checksum
   (``ray_population.weights_checksum``, what every Ray actor reports after every update).
5. ``noise``: counter noise (torch ops, and the Triton kernel of ``evolm.es.noise_triton`` when it runs
   on this device, compared bit for bit with the torch ops) against table noise: seconds per member
   (perturb + restore) and per update at N = 30 (``--noise-population``), on the device.
6. ``save``: peak memory while a checkpoint (with ``masters.safetensors``) and ``final/`` are written,
   above the steady state, in units of the largest tensor (device: ``max_memory_allocated``; host: RSS).
7. ``lowrank``: low-rank members (``es.perturbation = "lowrank"``, all N in batched generate calls)
   against full-rank members (perturb, generate, restore, one after another), members/s at N = 8, 16,
   32 on the same prompts (target >= 3x at N >= 16 on a GPU: reported, never asserted).

Without CUDA everything runs on the CPU and the CPU-vs-CUDA comparisons are skipped (``skipped`` in
the JSON says which); the CPU-only checks (restore bit-exact, resume and replay bit-exact, training
changed the weights) still run, which is what tests/test_gpu_check.py asserts. With CUDA present the
CPU reference side uses the torch ops (``--fused auto`` sets ``EVOLM_FUSED=0``): the compiled CPU
kernel is bit-identical to them (tested in the suite) and building it would cost a minute of device
time; on a CPU-only machine the kernel is used as in any CPU run. The script prints a
markdown section for docs/benchmarks.md naming the device. Nothing here is a pass/fail gate: a
``false`` is a finding to report.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lowrank import SHAPES  # noqa: E402  (stdlib only at import)

TINY = dict(kind="qwen2", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=0, tie_word_embeddings=True, rms_norm_eps=1e-6)  # vocab 0: the tokenizer's
FULL_IDENTITY_REGEX = r"^model\.(embed_tokens|norm)\.|^model\.layers\.(0|27)\."


def _fail(message: str) -> None:
    print(f"gpu_check: {message}", file=sys.stderr)
    raise SystemExit(2)


def _imports() -> None:
    """Everything the check imports, before anything runs (one line naming what is missing)."""
    try:
        import numpy  # noqa: F401
        import safetensors  # noqa: F401
        import torch  # noqa: F401
        import transformers  # noqa: F401

        import evolm.es.lowrank_population  # noqa: F401
        import evolm.es.ray_population  # noqa: F401
        import evolm.jobs  # noqa: F401
    except ImportError as e:
        _fail(f"cannot import {e.name!r} ({e}); on the device machine carry it (docs/gpu.md: "
              f"`cp -r .venv/lib/python3.*/site-packages/tomli_w .devcarry/site/`, PYTHONPATH=src:.devcarry/site)")


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def device_name(device: str) -> str:
    import torch

    if device.startswith("cuda"):
        return torch.cuda.get_device_name(device)
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip() + f" ({os.cpu_count()} logical CPUs)"
    return platform.processor() or platform.machine()


def load_tokenizer(path: str | None):
    from transformers import AutoTokenizer

    from evolm import models

    models.quiet_transformers()
    directory = path or str(models.local_dir(models.DEFAULT_MODEL))
    if not Path(directory).is_dir():
        _fail(f"--tokenizer {directory} is not a directory (give a folder with SmolLM2's tokenizer files)")
    tok = AutoTokenizer.from_pretrained(directory)
    tok.padding_side = "left"
    tok.pad_token = tok.pad_token or tok.eos_token
    return tok, directory


def build_model(shape: dict, tokenizer, device: str):
    """A random-initialised Qwen2 of ``shape`` on ``device``, float32 (seed 0; no hub). Two changes to
    the random init keep greedy completions varied text, so that ES members differ: the (tied) embedding
    rows of ids the tokenizer cannot decode are zero (their logits are 0, never the maximum of ~49k
    random logits), and the final norm's weights are random signs (with tied embeddings and unit norm
    weights the last token's own logit, ``|e_t|^2 / rms``, dominates every other by ~40 standard
    deviations at width 1536, so a random model repeats the prompt's last token for ever)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    shape = {k: v for k, v in shape.items() if k != "kind"}
    shape["vocab_size"] = shape["vocab_size"] or len(tokenizer)
    config = Qwen2Config(**shape, max_position_embeddings=4096, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        model.get_input_embeddings().weight[len(tokenizer):] = 0
        signs = torch.randint(0, 2, model.model.norm.weight.shape, generator=torch.Generator().manual_seed(1)) * 2 - 1
        model.model.norm.weight.copy_(signs.to(model.model.norm.weight))
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def vowel_task():
    """The check's task: reward = share of vowels among the completion's non-space characters."""
    import random

    from evolm.rewards import Verdict
    from evolm.tasks.base import Example, Task

    class Vowels(Task):
        name = "gpu-check-vowels"
        instruction = ""

        def examples(self, split, count, seed=0):
            rng = random.Random(f"{split}-{seed}")
            return [Example(f"{split}-{seed}-{i}", f"Write {rng.randint(0, 99)}", None) for i in range(count or 8)]

        def extract_answer(self, completion):
            return completion

        def check(self, completion, example):
            return Verdict(format_ok=bool(completion.strip()), correct=self.reward(completion, example) >= 0.5,
                           answer=completion)

        def reward(self, completion, example):
            s = completion.replace(" ", "")
            return sum(ch in "aeiou" for ch in s) / max(1, len(s))

    return Vowels()


def _bits(t):
    import torch

    t = t.detach().contiguous()
    return t.view(torch.int32 if t.element_size() == 4 else torch.int16)


def _same(a, b) -> bool:
    import torch

    return torch.equal(_bits(a.cpu()), _bits(b.cpu()))


# -- 1. CPU vs CUDA identity ------------------------------------------------------------------------

def check_identity(model, device: str, regex: str, seed: int, sigma: float) -> dict:
    """Perturb / restore / update on CPU and on ``device`` from the same weights: bit-identical?"""
    import torch

    from evolm.es.noise import make_noise
    from evolm.es.params import ParamSet, select_parameters

    chosen = select_parameters(model, ("all",), regex)
    indices, names = [i for i, _, _ in chosen], [n for _, n, _ in chosen]
    cuda = device.startswith("cuda")
    coefficients, scale = [0.75, -1.25, 0.5], 1e-3
    out = {"tensors": len(names), "elements": sum(p.numel() for _, _, p in chosen)}
    for kind in ("counter", "table"):
        for dtype in (torch.float32, torch.bfloat16):
            t0 = time.perf_counter()
            base = [p.detach().to("cpu", dtype).clone() for _, _, p in chosen]
            layout = [(i, t.numel()) for i, t in zip(indices, base)]
            sides = {"cpu": ParamSet.from_tensors(make_noise(kind, seed, layout, 0, "cpu"), indices, names,
                                                  [t.clone() for t in base])}
            if cuda:
                sides["cuda"] = ParamSet.from_tensors(make_noise(kind, seed, layout, 0, device), indices, names,
                                                      [t.to(device) for t in base])
            row: dict = {"promised": {"perturb": True, "restore": True, "update": kind == "counter"}}
            for side, ps in sides.items():
                ps.perturb(3, 1, -1, sigma)
            _sync(device)
            row["perturb_changed"] = not all(_same(a, b) for a, b in zip(sides["cpu"].tensors, base))
            if cuda:
                row["perturb_identical"] = all(_same(a, b) for a, b in zip(sides["cpu"].tensors, sides["cuda"].tensors))
            for side, ps in sides.items():
                ps.restore()
                row[f"restore_exact_{side}"] = all(_same(a, b) for a, b in zip(ps.tensors, base))
            for side, ps in sides.items():
                row[f"update_applied_{side}"] = bool(ps.apply_update(3, coefficients, scale))
            _sync(device)
            row["update_changed"] = not all(_same(a, b) for a, b in zip(sides["cpu"].tensors, base))
            if cuda:
                row["update_identical"] = all(_same(a, b) for a, b in zip(sides["cpu"].tensors, sides["cuda"].tensors))
                if sides["cpu"].masters is not None:
                    row["update_identical_masters"] = all(
                        _same(a, b) for a, b in zip(sides["cpu"].masters, sides["cuda"].masters))
            row["seconds"] = time.perf_counter() - t0
            out[f"{kind}_{str(dtype).removeprefix('torch.')}"] = row
            del sides, base
    return out


# -- 2. ES end to end: run, kill + resume, replay ----------------------------------------------------

def _es_cfg(args, out_dir: Path, name: str, device: str, **es):
    from evolm import config

    cfg = config.ESJob()
    cfg.model.spec, cfg.model.device, cfg.model.dtype = args.tokenizer_dir, device, args.dtype
    cfg.run.out_dir, cfg.run.name, cfg.run.progress, cfg.run.checkpoint_every = str(out_dir), name, False, 0
    cfg.eval.before_after = False
    cfg.generation.max_new_tokens, cfg.generation.batch_size = args.max_new_tokens, 64
    cfg.es.noise = "counter"
    cfg.es.population, cfg.es.prompts_per_iteration, cfg.es.iterations = args.es_population, args.prompts, args.iterations
    cfg.es.sigma, cfg.es.lr = args.sigma, args.lr
    for k, v in es.items():
        setattr(cfg.es, k, v)
    return cfg


def _final_weights(run) -> dict:
    from safetensors.torch import load_file

    state = {}
    for f in sorted((run.path / "final").glob("*.safetensors")):
        state.update(load_file(str(f)))
    return state


def check_es(args, model, tokenizer, base_state: dict, device: str, work: Path) -> dict:
    import torch

    from evolm.backends.hf import HFGenerator
    from evolm.es.engine import replay
    from evolm.jobs import run_es
    from evolm.runs import RunDir, read_jsonl

    task = vowel_task()

    def fresh():
        model.load_state_dict(base_state)
        return model

    def run(cfg, **kw):
        m = fresh()
        return run_es(cfg, model=m, tokenizer=tokenizer, task=task, generator=HFGenerator(m, tokenizer, 64), quiet=True, **kw)

    cuda = device.startswith("cuda")
    if cuda:  # the whole run's peak: generation, masters, and the float32 copy final/ and checkpoints are saved from
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    cfg_a = _es_cfg(args, work, "uninterrupted", device)
    run_a = run(cfg_a)
    seconds_a = time.perf_counter() - t0
    run_peak = torch.cuda.max_memory_allocated() if cuda else None
    final_a = _final_weights(run_a)
    records = [r for r in read_jsonl(run_a.path / "metrics.jsonl") if r.get("kind", "train") == "train" and "step" in r]
    statuses = [r["status"] for r in run_a.seed_log()[1:]]

    class Kill(Exception):
        pass

    def kill_after_1(step, record):
        if step == 1:
            raise Kill

    cfg_b = _es_cfg(args, work, "killed", device)
    cfg_b.run.checkpoint_every = 1
    t0 = time.perf_counter()
    with contextlib.suppress(Kill):
        run(cfg_b, callbacks=(kill_after_1,))
    run_b = RunDir.open(work / "killed")
    killed_at = len(run_b.seed_log()) - 1
    m = fresh()
    run_es(cfg_b, resume=run_b, model=m, tokenizer=tokenizer, task=task, generator=HFGenerator(m, tokenizer, 64), quiet=True)
    seconds_b = time.perf_counter() - t0
    final_b = _final_weights(run_b)

    t0 = time.perf_counter()
    params = replay(fresh(), run_a.seed_log(), cfg_a)
    _sync(device)
    seconds_replay = time.perf_counter() - t0
    replayed = params.state_dict()
    base32 = {n: base_state[n].to(torch.float32) for n in params.names}
    return {
        "dtype": args.dtype, "noise": "counter", "population": args.es_population, "prompts": args.prompts,
        "iterations": args.iterations, "max_new_tokens": args.max_new_tokens, "params": params.numel,
        "masters": params.masters is not None, "update_statuses": statuses,
        "fitness": [r.get("fitness") for r in records],
        "weights_changed": any(not _same(final_a[n], base32[n]) for n in params.names),
        "killed_after_update": killed_at,
        "resume_bit_exact": sorted(final_a) == sorted(final_b) and all(_same(final_a[n], final_b[n]) for n in final_a),
        "replay_bit_exact": all(_same(replayed[n], final_a[n]) for n in params.names),
        **({"run_peak_bytes_per_param": run_peak / params.numel, "run_peak_mb": run_peak / 2**20,
            "run_peak_measured_by": "torch.cuda.max_memory_allocated over the uninterrupted run (model, masters, "
                                    "generation, the float32 copy saved as final/)"} if cuda else {}),
        "seconds_run": seconds_a, "seconds_killed_and_resumed": seconds_b, "seconds_replay": seconds_replay,
        "seconds_per_update": [r.get("seconds") for r in records],
        "seconds_update_phase": [r.get("seconds_update") for r in records],
    }


# -- 3 + 4. memory per parameter, seconds per update and per checksum --------------------------------

def _rss_mb(field: str = "VmRSS") -> float:
    """A field of /proc/self/status in MiB: ``VmRSS`` (resident now) or ``VmHWM`` (its peak)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def check_memory_and_timing(args, model, tokenizer, device: str) -> tuple[dict, dict]:
    """One ES iteration's peak memory against inference alone; update and checksum seconds."""
    import torch

    from evolm import config
    from evolm.backends.base import SamplingParams
    from evolm.backends.hf import HFGenerator
    from evolm.es.engine import build_paramset, training_batch
    from evolm.es.population import LocalPopulation
    from evolm.es.ray_population import weights_checksum
    from evolm.es.update import compute_update, member_layout

    cuda = device.startswith("cuda")
    task = vowel_task()
    cfg = config.ESJob()
    cfg.model.device, cfg.model.dtype, cfg.es.noise, cfg.es.sigma = device, args.dtype, "counter", args.sigma
    cfg.es.population = args.es_population
    generator = HFGenerator(model, tokenizer, batch_size=64)
    examples, prompts = training_batch(task, tokenizer, 0, 0, args.prompts)
    sampling = SamplingParams(n=1, temperature=0.0, max_new_tokens=args.max_new_tokens)
    layout = member_layout("one_point", args.es_population)
    numel = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    dtype_bytes = next(model.parameters()).element_size()
    generator.generate(prompts, sampling)  # warm-up (kernels, allocator)
    mem: dict = {"params": numel, "model_dtype": args.dtype, "model_dtype_bytes": dtype_bytes,
                 "target": "model-dtype bytes + 4 B (float32 masters) per parameter (+ KV)"}
    if cuda:
        torch.cuda.empty_cache()
        model_bytes = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        generator.generate(prompts, sampling)
        _sync(device)
        inference_peak = torch.cuda.max_memory_allocated()
        torch.cuda.reset_peak_memory_stats()  # the ES peak includes building the masters
    rss0 = _rss_mb()
    params = build_paramset(model, cfg)
    _sync(device)
    rss1 = _rss_mb()
    population = LocalPopulation(params, generator, task)
    if cuda:
        masters_bytes = torch.cuda.memory_allocated() - model_bytes
    t0 = time.perf_counter()
    scores = population.score(0, layout, args.sigma, examples, prompts, sampling)
    update = compute_update([f + 1e-3 * i for i, f in enumerate(scores.fitness)], estimator="one_point", shaping="zscore",
                            lr=1e-4, sigma=args.sigma)  # a non-zero update
    population.apply_update(0, update)
    _sync(device)
    iteration_s = time.perf_counter() - t0
    if cuda:
        es_peak = torch.cuda.max_memory_allocated()
        kv_and_activations = inference_peak - model_bytes
        target = model_bytes + 4 * numel + kv_and_activations
        mem.update(model_bytes_per_param=model_bytes / numel, masters_bytes_per_param=masters_bytes / numel,
                   inference_peak_bytes_per_param=inference_peak / numel, es_peak_bytes_per_param=es_peak / numel,
                   kv_and_activations_bytes_per_param=kv_and_activations / numel, target_bytes_per_param=target / numel,
                   es_peak_over_target=es_peak / target, es_peak_over_inference=es_peak / inference_peak,
                   es_peak_mb=es_peak / 2**20, inference_peak_mb=inference_peak / 2**20, measured_by="torch.cuda.max_memory_allocated")
    else:
        held = sum(m.numel() * m.element_size() for m in (params.masters or []))
        mem.update(masters_bytes_per_param=held / numel,  # what the masters hold; the RSS growth below can be 0
                   masters_rss_bytes_per_param=(rss1 - rss0) * 2**20 / numel, rss_before_masters_mb=rss0,  # (freed pages reused)
                   rss_after_masters_mb=rss1, peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                   measured_by="RSS growth while building the float32 masters (/proc/self/status); "
                               "whole-run peaks: benchmarks/memory_per_param.py")
    updates, checksums = [], []
    for r in range(args.timing_repeats):
        coefficients = [((-1) ** d) * (1 + d) / len(layout) for d in range(len(layout))]
        _sync(device)
        t0 = time.perf_counter()
        params.apply_update(100 + r, coefficients, 1e-4)
        _sync(device)
        updates.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        crc = weights_checksum(params)
        checksums.append(time.perf_counter() - t0)
    timing = {"params": params.numel, "directions": len(layout), "es_iteration_s": iteration_s,
              "members": len(layout), "update_s": updates, "checksum_s": checksums, "checksum_entries": len(crc),
              "update_s_median": statistics.median(updates), "checksum_s_median": statistics.median(checksums)}
    del population, params
    return mem, timing


# -- 5 + 6. noise speed per member and per update; peak memory across a checkpoint and final/ -------------

def check_noise_speed(args, model, device: str) -> dict:
    """Seconds per member (perturb + restore) and per update at N = ``--noise-population`` for counter noise
    (torch ops; the Triton kernel when it runs here, checked bit for bit against the torch ops) and table noise,
    on the device, over the model's weights in ``--dtype`` (float32 masters unless float32)."""
    import torch

    from evolm import config
    from evolm.es.engine import build_paramset

    n = args.noise_population
    coefficients = [((-1) ** d) * (1 + d) / n for d in range(n)]
    rows = {}
    variants = [("counter", "torch", "0"), ("counter", "triton", "1"), ("table", "torch", "0")]  # EVOLM_TRITON per path
    triton_ok = _triton_here(device)
    for noise, path, triton in variants:
        if path == "triton" and not triton_ok:
            rows[f"{noise}_{path}"] = {"skipped": "Triton is not importable or there is no CUDA device"}
            continue
        os.environ["EVOLM_TRITON"] = triton
        cfg = config.ESJob()
        cfg.model.device, cfg.model.dtype, cfg.es.noise = device, args.dtype, noise
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        params = build_paramset(model, cfg)
        _sync(device)
        member = []
        for m in range(args.noise_members + 1):
            t0 = time.perf_counter()
            params.perturb(7, m, 1, args.sigma)
            params.restore()
            _sync(device)
            member.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        params.apply_update(7, coefficients, 1e-4)
        _sync(device)
        update = time.perf_counter() - t0
        digest = [_bits(t).sum().item() for t in (params.masters or params.tensors)[:4]]
        rows[f"{noise}_{path}"] = {"member_s": statistics.median(member[1:]), "update_s": update, "members_timed": len(member) - 1,
                                   "first_member_s": member[0], "digest": digest,
                                   "estimated_update_s": update + n * statistics.median(member[1:])}
        del params
        model.load_state_dict(state)
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    os.environ.pop("EVOLM_TRITON", None)
    if triton_ok:  # one 2^26-element tensor, Triton against torch ops bit for bit (noise, perturbed, updated)
        try:
            from evolm.es.noise_speed import benchmark_counter_noise

            rows["triton_benchmark"] = benchmark_counter_noise(numel=1 << 26, members=n, device=device, repeats=3)
        except Exception as e:  # a compile error of the inline PTX is a finding, not a crash of the whole check
            rows["triton_benchmark"] = {"error": f"{type(e).__name__}: {e}"[:2000]}
    if "digest" in rows.get("counter_triton", {}):
        rows["triton_equals_torch_ops"] = rows["counter_triton"]["digest"] == rows["counter_torch"]["digest"]
    return {"population": n, "dtype": args.dtype, "rows": rows}


def _triton_here(device: str) -> bool:
    if not device.startswith("cuda"):
        return False
    try:
        from evolm.es import noise_triton
    except ImportError:
        return False
    return bool(getattr(noise_triton, "triton_available", lambda: False)())


def check_save_peak(args, model, tokenizer, device: str) -> dict:
    """Peak memory while a checkpoint (with masters.safetensors) and final/ are written, above the steady
    state, against the largest tensor: on CUDA ``max_memory_allocated`` on the device and the RSS peak on the
    host; on the CPU the RSS peak (``VmHWM`` reset first). Target: at most one tensor above the steady state."""
    import torch

    from evolm import config
    from evolm.es.engine import build_paramset, float32_model, save_masters
    from evolm.runs import RunDir

    cfg = config.ESJob()
    cfg.model.device, cfg.model.dtype, cfg.es.noise = device, args.dtype, "counter"
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    params = build_paramset(model, cfg)
    params.apply_update(0, [1.0, -1.0], 1e-4)
    largest = max(p.numel() for p in model.parameters())
    cuda = device.startswith("cuda")
    with tempfile.TemporaryDirectory(prefix="evolm-save-peak-") as work:
        run = RunDir(Path(work))
        _sync(device)
        with contextlib.suppress(OSError):
            Path("/proc/self/clear_refs").write_text("5")
        rss_steady = _rss_mb()
        if cuda:
            torch.cuda.empty_cache()
            steady = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        run.save_checkpoint(float32_model(model, params), 1, {}, write_extra=lambda tmp: save_masters(params, tmp))
        run.save_final(float32_model(model, params), tokenizer)
        _sync(device)
        rss_peak = _rss_mb("VmHWM")
        out = {"largest_tensor_float32_mb": 4 * largest / 2**20, "rss_steady_mb": rss_steady, "rss_peak_mb": rss_peak,
               "rss_extra_over_largest": (rss_peak - rss_steady) * 2**20 / (4 * largest)}
        if cuda:
            peak = torch.cuda.max_memory_allocated()
            out.update(device_steady_mb=steady / 2**20, device_peak_mb=peak / 2**20,
                       device_extra_mb=(peak - steady) / 2**20, device_extra_over_largest=(peak - steady) / (4 * largest))
    del params
    model.load_state_dict(state)
    return out


# -- 7. low-rank vs full-rank members/s ---------------------------------------------------------------

def check_lowrank(args, model, tokenizer, base_state: dict, device: str) -> dict:
    from evolm import config
    from evolm.backends.base import SamplingParams
    from evolm.backends.hf import HFGenerator
    from evolm.es.engine import build_paramset, training_batch
    from evolm.es.lowrank_population import LowRankPopulation
    from evolm.es.population import LocalPopulation
    from evolm.es.update import member_layout

    task = vowel_task()
    examples, prompts = training_batch(task, tokenizer, 0, 0, args.lowrank_prompts)
    sampling = SamplingParams(n=1, temperature=0.0, max_new_tokens=args.max_new_tokens)
    generator = HFGenerator(model, tokenizer, batch_size=64)
    rows = []
    for n in [int(x) for x in args.populations.split(",")]:
        row: dict = {"population": n}
        for mode in ("full", "lowrank"):
            model.load_state_dict(base_state)
            cfg = config.ESJob()
            cfg.model.device, cfg.model.dtype, cfg.es.noise, cfg.es.sigma = device, args.dtype, "counter", args.sigma
            cfg.es.perturbation, cfg.es.rank, cfg.es.population = mode, args.rank, n
            params = build_paramset(model, cfg)
            population = (LowRankPopulation(params, generator, task, 0) if mode == "lowrank"
                          else LocalPopulation(params, generator, task))
            layout = member_layout("one_point", n)
            population.score(10_000, layout[:2], args.sigma, examples[:2], prompts[:2],
                             SamplingParams(n=1, max_new_tokens=2))  # warm-up
            _sync(device)
            t0 = time.perf_counter()
            scores = population.score(0, layout, args.sigma, examples, prompts, sampling)
            _sync(device)
            seconds = time.perf_counter() - t0
            row[mode] = {"seconds": seconds, "members_per_s": n / seconds, "gen_tokens": scores.gen_tokens,
                         "phases": dict(scores.seconds)}
            del population, params
        row["lowrank_over_full"] = row["lowrank"]["members_per_s"] / row["full"]["members_per_s"]
        rows.append(row)
    model.load_state_dict(base_state)
    return {"rank": args.rank, "prompts": args.lowrank_prompts, "max_new_tokens": args.max_new_tokens, "dtype": args.dtype,
            "target": ">= 3x members/s at N >= 16 on a GPU (reported, not asserted)", "rows": rows}


# -- report ------------------------------------------------------------------------------------------

def markdown(result: dict) -> str:
    def yes(v):
        return "—" if v is None else ("yes" if v else "**no**")

    lines = [f"## GPU check (`benchmarks/gpu_check.py`{' --tiny' if result['tiny'] else ''})", "",
             f"Device: **{result['device_name']}** ({result['device']}); torch {result['versions']['torch']}, "
             f"transformers {result['versions']['transformers']}; model: random-initialised {result['shape']} shape "
             f"({result['params']:,} parameters), {result['seconds_total']:.0f} s in all."]
    if result["skipped"]:
        lines += ["", "Skipped: " + "; ".join(result["skipped"]) + "."]
    for name, error in result.get("errors", {}).items():
        lines += ["", f"**Section {name} failed**: `{error.splitlines()[0]}` (traceback in the JSON)."]
    if result.get("ran_without_triton"):
        lines += ["", "Ran with `EVOLM_TRITON=0` after a failure with the Triton kernels: "
                      + ", ".join(result["ran_without_triton"]) + "."]
    ident = result.get("identity")
    if ident:
        lines += ["", f"Identity ({ident['tensors']} tensors, {ident['elements']:,} elements):", "",
                  "| noise, weights | perturb changed | CPU = CUDA member | restore exact CPU / CUDA | CPU = CUDA update (promised) |",
                  "|---|---|---|---|---|"]
        for key, row in ident.items():
            if not isinstance(row, dict):
                continue
            lines.append(f"| {key} | {yes(row['perturb_changed'])} | {yes(row.get('perturb_identical'))} | "
                         f"{yes(row['restore_exact_cpu'])} / {yes(row.get('restore_exact_cuda'))} | "
                         f"{yes(row.get('update_identical'))} ({'yes' if row['promised']['update'] else 'no'}) |")
    es = result.get("es")
    if es:
        lines += ["", f"ES end to end ({es['dtype']}{' + float32 masters' if es['masters'] else ''}, counter noise, "
                      f"N = {es['population']}, {es['prompts']} prompts, {es['iterations']} updates): weights changed "
                      f"{yes(es['weights_changed'])}, kill after update {es['killed_after_update']} + resume bit-exact "
                      f"{yes(es['resume_bit_exact'])}, replay bit-exact {yes(es['replay_bit_exact'])}; updates "
                      f"{', '.join(es['update_statuses'])}; seconds per update "
                      f"{', '.join(f'{s:.1f}' for s in es['seconds_per_update'] if s is not None)}"
                      + (f"; the run's GPU peak (with saving final/) {es['run_peak_bytes_per_param']:.2f} B/param"
                         if "run_peak_bytes_per_param" in es else "") + "."]
    mem = result.get("memory")
    if mem:
        if "es_peak_bytes_per_param" in mem:
            lines += ["", f"Memory ({mem['measured_by']}): model {mem['model_bytes_per_param']:.2f} B/param, masters "
                          f"{mem['masters_bytes_per_param']:.2f}, KV + activations {mem['kv_and_activations_bytes_per_param']:.2f}; "
                          f"ES peak {mem['es_peak_bytes_per_param']:.2f} B/param against the target "
                          f"{mem['target_bytes_per_param']:.2f} (= {mem['model_dtype_bytes']} + 4 + KV): "
                          f"**{mem['es_peak_over_target']:.3f}x**; {mem['es_peak_over_inference']:.2f}x inference alone."]
        else:
            lines += ["", f"Memory (CPU, {mem['measured_by']}): float32 masters hold {mem['masters_bytes_per_param']:.2f} "
                          f"B/param (target 4), {mem['masters_rss_bytes_per_param']:.2f} B/param of RSS growth."]
    tm = result.get("timing")
    if tm:
        lines += ["", f"Seconds per update ({tm['directions']} directions, {tm['params']:,} parameters): "
                      f"{tm['update_s_median']:.3f}; per replica checksum (`weights_checksum`, {tm['checksum_entries']} "
                      f"CRC-32s): {tm['checksum_s_median']:.3f}; one ES iteration of {tm['members']} members: "
                      f"{tm['es_iteration_s']:.2f}."]
    nz = result.get("noise")
    if nz:
        lines += ["", f"Noise speed ({nz['dtype']}, update over N = {nz['population']}): seconds per member "
                      "(perturb + restore) / per update / estimated update with its N members:", "",
                  "| noise, path | member s | update s | update + N members s |", "|---|---|---|---|"]
        for key, row in nz["rows"].items():
            if isinstance(row, dict) and "member_s" in row:
                lines.append(f"| {key} | {row['member_s']:.3f} | {row['update_s']:.3f} | {row['estimated_update_s']:.2f} |")
            elif isinstance(row, dict) and "speedup_member" in row:  # the Triton benchmark: its own line below
                continue
            elif isinstance(row, dict):
                lines.append(f"| {key} | {row.get('skipped', '')} | | |")
        tb = nz["rows"].get("triton_benchmark")
        if isinstance(tb, dict) and "speedup_member" in tb:
            lines.append(f"\nTriton kernels against the torch ops ({tb['numel']:,} {tb['dtype']} elements, N = {tb['members']}): "
                         f"member {tb['triton']['member_s'] * 1e3:.1f} ms against {tb['torch']['member_s'] * 1e3:.1f} ms "
                         f"(**{tb['speedup_member']:.1f}x**), update {tb['triton']['update_s'] * 1e3:.1f} ms against "
                         f"{tb['torch']['update_s'] * 1e3:.1f} ms (**{tb['speedup_update']:.0f}x**); noise, member and "
                         f"update bit-identical: {yes(all(tb['identical'].values()))}.")
        if "triton_equals_torch_ops" in nz["rows"]:
            lines.append(f"\nTriton kernel = torch ops after a member cycle and an update: {yes(nz['rows']['triton_equals_torch_ops'])}.")
    sv = result.get("save")
    if sv:
        lines += ["", f"Save (a checkpoint with masters, then final/): host RSS +{sv['rss_peak_mb'] - sv['rss_steady_mb']:.0f} MB "
                      f"= {sv['rss_extra_over_largest']:.2f} x the largest tensor in float32 ({sv['largest_tensor_float32_mb']:.0f} MB)"
                      + (f"; device +{sv['device_extra_mb']:.0f} MB = {sv['device_extra_over_largest']:.2f} x" if "device_extra_mb" in sv else "")
                      + " (target: at most 1 tensor above the steady state)."]
    lr = result.get("lowrank")
    if lr:
        lines += ["", f"Low-rank (rank {lr['rank']}) vs full-rank members/s, {lr['prompts']} prompts x "
                      f"{lr['max_new_tokens']} tokens, {lr['dtype']} (target >= 3x at N >= 16 on a GPU):", "",
                  "| N | full members/s | low-rank members/s | **low-rank / full** |", "|---|---|---|---|"]
        for row in lr["rows"]:
            lines.append(f"| {row['population']} | {row['full']['members_per_s']:.2f} | "
                         f"{row['lowrank']['members_per_s']:.2f} | **{row['lowrank_over_full']:.2f}** |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="2 layers of width 64 instead of the Qwen2.5-1.5B shape")
    p.add_argument("--device", default="", help="cuda or cpu (default: cuda when available)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"],
                   help="generation dtype of the ES and low-rank checks (float32 masters unless float32)")
    p.add_argument("--tokenizer", default="", help="folder with SmolLM2's tokenizer (default: the embedded model's cache)")
    p.add_argument("--identity-regex", default=None,
                   help=f"parameters of the identity check (default: all with --tiny, else {FULL_IDENTITY_REGEX!r})")
    p.add_argument("--es-population", type=int, default=4)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--iterations", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--sigma", type=float, default=1e-2, help="large for bf16 weights of a random model, so members differ")
    p.add_argument("--lr", type=float, default=5e-3)
    p.add_argument("--populations", default="8,16,32", help="N of the low-rank vs full comparison")
    p.add_argument("--lowrank-prompts", type=int, default=16)
    p.add_argument("--rank", type=int, default=4)
    p.add_argument("--timing-repeats", type=int, default=3)
    p.add_argument("--noise-population", type=int, default=30, help="N of the noise-speed section's update")
    p.add_argument("--noise-members", type=int, default=3, help="members timed per noise source (after one warm-up)")
    p.add_argument("--skip", default="", help="comma-separated sections to leave out: identity, es, memory, noise, save, lowrank")
    p.add_argument("--fused", default="auto", choices=["auto", "on", "off"],
                   help="CPU perturbs through the compiled kernel (evolm.es.fused, built on first use); auto: "
                        "off when CUDA is present (the CPU side is then only the identity reference), on otherwise")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--out", default="docs/benchmarks/gpu_check.json")
    args = p.parse_args()
    _imports()
    import torch
    import transformers

    if args.fused == "off" or (args.fused == "auto" and torch.cuda.is_available() and args.device != "cpu"):
        os.environ["EVOLM_FUSED"] = "0"

    if args.threads:
        torch.set_num_threads(args.threads)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        _fail("--device cuda but torch sees no CUDA device (leave --device out to run on the CPU)")
    t_start = time.perf_counter()
    tokenizer, args.tokenizer_dir = load_tokenizer(args.tokenizer or None)
    shape_name = "tiny qwen2" if args.tiny else "qwen2.5-1.5b"
    shape = TINY if args.tiny else SHAPES["qwen2.5-1.5b"]
    skip = {s for s in args.skip.split(",") if s}
    skipped = [] if device.startswith("cuda") else ["CPU vs CUDA comparisons (no CUDA device): identity ran on the CPU side only"]
    skipped += [f"section {s} (--skip)" for s in sorted(skip)]
    result: dict = {"device": device, "device_name": device_name(device), "tiny": args.tiny, "shape": shape_name,
                    "shape_config": shape, "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                                                        "python": platform.python_version()},
                    "settings": {k: v for k, v in vars(args).items() if k != "tokenizer_dir"}, "skipped": skipped}
    out = Path(args.out)

    def save():
        result["seconds_total"] = time.perf_counter() - t_start
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")

    def say(what):
        print(f"[gpu_check {time.perf_counter() - t_start:6.1f}s] {what}", file=sys.stderr, flush=True)

    model = build_model(shape, tokenizer, device)
    result["params"] = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    say(f"built {shape_name} ({result['params']:,} parameters) on {device}")

    def section(name: str, run, restore: bool = True):
        """One section, guarded: an exception is recorded (``errors``) and the next section runs, so one
        failure on a device cannot cost the rest of a single prepared call. A failure on CUDA with the
        Triton kernels on is retried once with ``EVOLM_TRITON=0`` (the torch ops, same bits) and both said."""
        if name in skip:
            return
        attempts = [None] + (["0"] if device.startswith("cuda") and os.environ.get("EVOLM_TRITON", "1") != "0" else [])
        for triton in attempts:
            saved = os.environ.get("EVOLM_TRITON")
            if triton is not None:
                os.environ["EVOLM_TRITON"] = triton
            try:
                run()
                if triton is not None:
                    result.setdefault("ran_without_triton", []).append(name)
                break
            except Exception as e:  # noqa: BLE001 -- a finding to report, not a reason to stop the check
                import traceback

                result.setdefault("errors", {})[name if triton is None else f"{name} (EVOLM_TRITON=0)"] = (
                    f"{type(e).__name__}: {e}\n" + "".join(traceback.format_exc().splitlines(True)[-12:]))
                say(f"{name} FAILED: {type(e).__name__}: {e}")
            finally:
                if triton is not None:
                    if saved is None:
                        os.environ.pop("EVOLM_TRITON", None)
                    else:
                        os.environ["EVOLM_TRITON"] = saved
                if restore and base_state:
                    model.load_state_dict(base_state)
                if device.startswith("cuda"):
                    torch.cuda.empty_cache()
        save()
        say(f"{name} done")

    base_state: dict = {}
    regex = args.identity_regex if args.identity_regex is not None else ("" if args.tiny else FULL_IDENTITY_REGEX)

    def identity():
        result["identity"] = check_identity(model, device, regex, seed=12345, sigma=1e-3)
        result["identity"]["regex"] = regex

    section("identity", identity)
    model = model.to(getattr(torch, args.dtype))
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    base_state.update({k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()})

    def memory():
        result["memory"], result["timing"] = check_memory_and_timing(args, model, tokenizer, device)

    def es():
        with tempfile.TemporaryDirectory(prefix="evolm-gpu-check-") as work:
            result["es"] = check_es(args, model, tokenizer, base_state, device, Path(work))

    section("memory", memory)
    section("es", es)
    section("noise", lambda: result.__setitem__("noise", check_noise_speed(args, model, device)))
    section("save", lambda: result.__setitem__("save", check_save_peak(args, model, tokenizer, device)))
    section("lowrank", lambda: result.__setitem__("lowrank", check_lowrank(args, model, tokenizer, base_state, device)))
    save()
    print(markdown(result))


if __name__ == "__main__":
    main()
