"""Low-rank ES members as LoRA adapters of a real vLLM-CPU engine (``es/lora_population.py``), against the
HF low-rank path (``es/lowrank.py``) on the embedded SmolLM2-135M in float32.

Marked ``vllm``; skipped where vLLM is not importable, run with ``make test-vllm``. One engine with LoRA
enabled (4 slots, rank 4 in rank-8 slots, eager) is shared by the module. ``es.params`` is attention and
MLP: the projection matrices a LoRA adapter can carry; the HF low-rank ParamSet of the same config draws
the same members. Weight identity is checked with SHA-256 of every tensor's bytes, computed inside the
worker for the engine's side.
"""

from __future__ import annotations

import copy

import pytest
import torch

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")

from conftest import make_vowel_task  # noqa: E402
from evolm import config, models  # noqa: E402
from evolm.backends import SamplingParams  # noqa: E402
from evolm.backends.vllm import VLLMGenerator, digest  # noqa: E402
from evolm.es.engine import build_paramset, make_population  # noqa: E402
from evolm.es.lowrank import LowRankParamSet, adapter_factors  # noqa: E402
from evolm.es.update import member_layout  # noqa: E402

RANK = 4
POPULATION = 4
SIGMA = 0.02  # members' greedy completions differ at 0.02 (tests/test_vllm_ray.py)


def _sets(backend: str) -> list[str]:
    return ["es.perturbation='lowrank'", f"es.rank={RANK}", "es.params=['attention','mlp']", f"es.population={POPULATION}",
            "es.estimator='antithetic'", f"es.sigma={SIGMA}", f"generation.backend='{backend}'", "model.threads=1"]


def _cfg(backend: str):
    return config.from_dict(config.ESJob, {}, _sets(backend))


@pytest.fixture(scope="module")
def setup():
    """``(generator, engine ParamSet, HF low-rank ParamSet, driver model, reference model, tokenizer, prompts)``."""
    torch.set_num_threads(1)
    model, tok = models.load(models.DEFAULT_MODEL, threads=1)
    reference = copy.deepcopy(model)  # the HF low-rank path's copy
    generator = VLLMGenerator(model, tok, threads=1, enforce_eager=True, kv_cache_gb=0.5, max_model_len=512,
                              lora_slots=POPULATION, lora_rank=RANK)
    engine = build_paramset(model, _cfg("vllm"), generator=generator)
    hf = build_paramset(reference, _cfg("hf"))
    assert isinstance(hf, LowRankParamSet) and isinstance(engine.local, LowRankParamSet)
    task = make_vowel_task()
    prompts = [f"Write one word about {w}:" for w in ("cats", "rivers", "stars", "bread", "songs", "trains")]
    yield generator, engine, hf, model, reference, tok, prompts, task
    generator.close()


def _engine_digests(generator, names=None) -> dict[str, str]:
    return generator.rpc("es_digests", names)[0]


def _model_digests(model, names) -> dict[str, str]:
    params = dict(model.named_parameters(remove_duplicate=False))
    return {n: digest(params[n].detach()) for n in names}


def test_selection_is_the_projections_and_every_one_has_an_adapter(setup):
    generator, engine, hf, *_ = setup
    assert engine.names == hf.names and engine.indices == hf.indices and len(hf.names) == 30 * 7
    assert all(n.endswith("_proj.weight") for n in hf.names)
    targets = generator.rpc("es_lora_targets")[0]
    assert all(targets[n] is not None for n in hf.names)
    assert targets["model.layers.0.self_attn.k_proj.weight"] == ["model.layers.0.self_attn.k_proj",
                                                                 "model.layers.0.self_attn.qkv_proj", 1]


def test_adapter_factors_are_the_hf_members_factors_bit_for_bit(setup):
    """Every member's adapter holds B^T and A s sigma / sqrt(r) of the HF low-rank path's factors, bit for bit,
    for every selected matrix; the member materialised in the engine equals the HF member bit for bit; and the
    adapter's dense delta lora_b @ lora_a is the HF member's delta (sign sigma A B^T / sqrt(r), as the HF path
    forms it) up to float32 rounding."""
    generator, engine, hf, model, reference, *_ = setup
    iteration, members = 3, [(0, 1), (0, -1), (1, 1), (5, -1)]
    adapters = generator.register_members(iteration, members, SIGMA)
    assert [i for _, i in adapters] == [1, 2, 3, 4]
    for (name, lora_id), (direction, sign) in zip(adapters, members):
        held = generator.rpc("es_lora_digests", lora_id, hf.names)[0]
        for k, n in enumerate(hf.names):
            lora_a, lora_b = adapter_factors(*hf.factors(k, iteration, direction), sign, SIGMA)
            assert held[n] == [digest(lora_a), digest(lora_b)], (n, direction, sign)
    before = _engine_digests(generator, hf.names)
    few = ["model.layers.0.self_attn.q_proj.weight", "model.layers.7.self_attn.v_proj.weight",
           "model.layers.29.mlp.down_proj.weight"]
    for direction, sign in members[1:3]:
        engine.perturb(iteration, direction, sign, SIGMA)
        hf.perturb(iteration, direction, sign, SIGMA)
        assert _engine_digests(generator, hf.names) == _model_digests(reference, hf.names)
        engine.restore()
        hf.restore()
        for n in few:  # the dense delta as the HF path forms it, against the adapter's product
            k = hf.names.index(n)
            dense = hf.noise.direction(iteration, direction, hf.indices[k], hf.tensors[k].numel()).view(hf.shapes[k])
            expected = dense.mul(float(sign) * SIGMA)
            lora_a, lora_b = adapter_factors(*hf.factors(k, iteration, direction), sign, SIGMA)
            # float32 rounding of two different orders of the same products (measured: <= 2.3e-8 on deltas up
            # to 0.15, ~1 ulp of the largest entry): within 1e-6 of the largest entry
            assert float((lora_b @ lora_a - expected).abs().max()) <= 1e-6 * float(expected.abs().max()), n
    assert _engine_digests(generator, hf.names) == before == _model_digests(reference, hf.names)


def test_members_are_applied_per_request(setup):
    """The regression test for adapters silently not applied: in one engine call the N members' completions
    differ from the base model's and from each other, their fitnesses differ, and each member's completions
    are (up to near-ties) what the member gives when scored alone."""
    generator, engine, hf, model, reference, tok, prompts, task = setup
    sampling = SamplingParams(max_new_tokens=12)
    layout = member_layout("antithetic", POPULATION)
    base = [[c.text for c in o] for o in generator.generate(prompts, sampling)]
    together = generator.generate_members(prompts, sampling, generator.register_members(0, layout, SIGMA))
    texts = [[[c.text for c in o] for o in member] for member in together]
    assert all(t != base for t in texts)
    assert len({str(t) for t in texts}) == POPULATION
    alone = []
    for member in layout:
        out = generator.generate_members(prompts, sampling, generator.register_members(0, [member], SIGMA))
        alone.append([[c.text for c in o] for o in out[0]])
    same = sum(a == b for t, s in zip(texts, alone) for a, b in zip(t, s))
    assert same >= POPULATION * len(prompts) - 1, (texts, alone)  # batch composition may flip one near-tie
    examples = task.examples("train", len(prompts), seed=0)
    population = make_population(_cfg("vllm"), engine, generator, task)
    scores = population.score(0, layout, SIGMA, examples, prompts, sampling)
    assert len(set(scores.fitness)) > 1, scores.fitness


def test_updates_equal_the_hf_lowrank_run_and_the_adapter_cache_does_not_grow(setup):
    """Two ES updates from the LoRA population's fitnesses: after each, the engine's selected weights equal
    the HF low-rank ParamSet's after the same update, bit for bit (SHA-256 of all 210 tensors), the driver's
    copy catches up to them, and vLLM's LoRA cache holds N adapters, never more (none after close)."""
    import numpy as np

    from evolm.es.shaping import centered_rank
    from evolm.es.update import antithetic

    generator, engine, hf, model, reference, tok, prompts, task = setup
    cfg = _cfg("vllm")
    population = make_population(cfg, engine, generator, task)
    sampling = SamplingParams(max_new_tokens=8)
    layout = member_layout("antithetic", POPULATION)
    examples = task.examples("train", len(prompts), seed=1)
    moved = _engine_digests(generator, hf.names)
    for iteration in (10, 11):
        scores = population.score(iteration, layout, SIGMA, examples, prompts, sampling)
        assert generator.lora_count() == POPULATION == len(generator.llm.llm_engine.list_loras())
        coefficients = [float(c) for c in antithetic(centered_rank(np.asarray(scores.fitness)))]
        assert any(c != 0.0 for c in coefficients), scores.fitness
        assert engine.apply_update(iteration, coefficients, 1e-3)
        hf.apply_update(iteration, coefficients, 1e-3)
        after = _engine_digests(generator, hf.names)
        assert after == _model_digests(reference, hf.names) and after != moved
        moved = after
    assert engine.catch_up() == 2  # raises if the driver's replay differs from the engine's checksum
    assert _model_digests(model, hf.names) == moved
    population.close()
    assert generator.lora_count() == 0


def _es_cli(out, name: str, *extra: str):
    """``evolm es`` on configs/es-arithmetic.toml in a subprocess: low-rank members on attention and MLP, 2 updates of
    N = 4 x 8 prompts at sigma 0.02, no held-out evaluation, plus ``extra`` overrides; returns the run's seed log,
    final weights and metrics records."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from safetensors.torch import load_file

    root = Path(__file__).resolve().parents[1]
    cmd = [sys.executable, "-m", "evolm", "es", "--config", str(root / "configs" / "es-arithmetic.toml"),
           "--set", 'es.perturbation="lowrank"', "--set", "es.params=['attention','mlp']", "--set", "es.iterations=2",
           "--set", "es.population=4", "--set", "es.prompts_per_iteration=8", "--set", "es.sigma=0.02",
           "--set", "eval.before_after=false", "--set", "probe.every=0", "--set", f'run.out_dir="{out}"',
           "--set", f'run.name="{name}"', "--set", "run.progress=false", *extra]
    env = {**os.environ, "RAY_memory_monitor_refresh_ms": "0"}  # a shared machine's memory is not the test's
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = [json.loads(x) for x in (out / name / "seed_log.jsonl").read_text().splitlines()]
    metrics = [json.loads(x) for x in (out / name / "metrics.jsonl").read_text().splitlines()]
    return log, load_file(str(out / name / "final" / "model.safetensors")), metrics


def test_es_cli_lora_run_equals_the_hf_lowrank_run(tmp_path):
    """``evolm es`` with ``es.perturbation="lowrank"`` on vLLM (a second engine, started by the CLI) against the
    HF low-rank run of the same config: its seed log replays its final weights bit for bit on the HF side,
    final/ is in HF names, and the two runs' members score alike (measured: identical fitnesses in both
    updates and bit-identical final weights; a greedy near-tie between vLLM's and HF's kernels may flip one
    member's completion, so the first update allows one member to differ and the weights are compared
    only when every fitness agrees)."""
    from evolm.es.engine import replay

    out = tmp_path / "runs"

    def es(name, *extra):
        log, final, _ = _es_cli(out, name, *extra)
        return log, final

    lora_log, lora_final = es("lora", "--set", 'generation.backend="vllm"', "--set", "generation.vllm_enforce_eager=true",
                              "--set", "generation.vllm_kv_cache_gb=0.5", "--set", "generation.vllm_max_model_len=512")
    assert lora_log[0]["noise"]["kind"] == "lowrank" and [r.get("status") for r in lora_log[1:]] == ["applied", "applied"]
    assert not any("qkv_proj" in n or "gate_up_proj" in n for n in lora_final)
    cfg = config.load(config.ESJob, out / "lora" / "config.toml")
    base, _ = models.load(models.DEFAULT_MODEL, threads=1)
    replay(base, lora_log, cfg)
    replayed = dict(base.named_parameters())
    assert all(torch.equal(replayed[n], t) for n, t in lora_final.items() if n in replayed)

    hf_log, hf_final = es("hf", "--set", 'generation.backend="hf"')
    fitness = [(a["fitness"], b["fitness"]) for a, b in zip(lora_log[1:], hf_log[1:])]
    assert sum(x == y for x, y in zip(*fitness[0])) >= 3, fitness
    if all(a == b for a, b in fitness):
        assert [r["coefficients"] for r in lora_log[1:]] == [r["coefficients"] for r in hf_log[1:]]
        assert lora_final.keys() == hf_final.keys() and all(torch.equal(lora_final[n], hf_final[n]) for n in hf_final)


def test_an_architecture_without_vllm_lora_is_refused_before_the_engine_starts():
    from evolm.backends.vllm import lora_supported
    from evolm.errors import UserError

    assert lora_supported(["LlamaForCausalLM"]) is True
    assert lora_supported(["GPT2LMHeadModel"]) is False  # vLLM 0.32's GPT-2 has no LoRA support
    assert lora_supported(["NoSuchArchitecture"]) is None  # unknown: vLLM refuses the model itself
    model, tok = models.load(models.DEFAULT_MODEL, threads=1)
    model.config.architectures = ["GPT2LMHeadModel"]
    with pytest.raises(UserError, match="cannot serve LoRA adapters for GPT2LMHeadModel"):
        VLLMGenerator(model, tok, threads=1, lora_slots=2, lora_rank=RANK)


def test_bf16_engine_updates_float32_masters_like_the_hf_lowrank_path():
    """bfloat16 generation (a second engine): adapters are the factors cast to bf16, members are scored, and
    updates go to the worker's float32 masters: after two updates the masters equal the HF low-rank ParamSet's
    (bf16 model, float32 masters) bit for bit, and so do the live bf16 weights and the driver's copy."""
    model, tok = models.load(models.DEFAULT_MODEL, threads=1, dtype="bfloat16")
    reference = copy.deepcopy(model)
    generator = VLLMGenerator(model, tok, threads=1, enforce_eager=True, kv_cache_gb=0.25, max_model_len=512,
                              lora_slots=2, lora_rank=RANK)
    try:
        dtype = ["model.dtype='bfloat16'"]
        engine = build_paramset(model, config.from_dict(config.ESJob, {}, [*_sets("vllm"), *dtype]), generator=generator)
        hf = build_paramset(reference, config.from_dict(config.ESJob, {}, [*_sets("hf"), *dtype]))
        assert engine.masters_in_engine and engine.local.masters is None and hf.masters is not None
        adapters = generator.register_members(0, [(0, 1), (1, -1)], SIGMA)
        held = generator.rpc("es_lora_digests", 2, hf.names[:7])[0]
        for k, n in enumerate(hf.names[:7]):
            lora_a, lora_b = adapter_factors(*hf.factors(k, 0, 1), -1, SIGMA)
            assert held[n] == [digest(lora_a.to(torch.bfloat16)), digest(lora_b.to(torch.bfloat16))], n
        out = generator.generate_members(["Write one word about cats:", "Name a river:"], SamplingParams(max_new_tokens=8),
                                         adapters)
        assert [len(m) for m in out] == [2, 2] and all(c.num_tokens > 0 for m in out for o in m for c in o)
        for iteration, coefficients in ((0, [1.0, -0.5]), (1, [0.25, 0.75])):
            assert engine.apply_update(iteration, coefficients, 1e-3)
            hf.apply_update(iteration, coefficients, 1e-3)
        masters = engine.masters  # written by the worker (the driver's copy catches up first, checked)
        assert all(m.dtype == torch.float32 and torch.equal(m, h) for m, h in zip(masters, hf.masters))
        assert _engine_digests(generator, hf.names) == _model_digests(reference, hf.names) == _model_digests(model, hf.names)
    finally:
        generator.close()


@pytest.mark.ray
def test_two_ray_actors_with_lora_populations_equal_one_engine_with_the_same_blocks(tmp_path):
    """The LoRA population on 2 Ray actors (one vLLM engine each, a block of N / K members per actor call, each
    block one engine call): es.member_batch = 0 resolves to 2 (recorded), and the run equals one engine scoring
    the same blocks (es.member_batch = 2) bit for bit: fitnesses, seed log and final weights, with members that
    differ and every update applied (a run that scored the base weights would have equal fitnesses)."""
    pytest.importorskip("ray")
    out = tmp_path / "runs"

    def es(name, *extra):
        return _es_cli(out, name, "--set", "model.threads=1", "--set", 'generation.backend="vllm"',
                       "--set", "generation.vllm_enforce_eager=true", "--set", "generation.vllm_kv_cache_gb=0.25",
                       "--set", "generation.vllm_max_model_len=512", *extra)

    one_log, one_final, _ = es("one", "--set", "es.member_batch=2")
    ray_log, ray_final, metrics = es("ray", "--set", "distributed.workers=2", "--set", "distributed.threads=1")
    assert "member_batch = 2" in (out / "ray" / "config.toml").read_text()
    assert [r.get("status") for r in ray_log[1:]] == ["applied", "applied"]
    assert all(len(set(r["fitness"])) > 1 for r in ray_log[1:]), [r["fitness"] for r in ray_log[1:]]
    assert ray_log == one_log
    assert ray_final.keys() == one_final.keys() and all(torch.equal(ray_final[n], one_final[n]) for n in one_final)
    train = [r for r in metrics if r.get("kind") == "train"]
    assert all(r["ray_actors"] == 2 and sum(r["ray_members"].values()) == 4 for r in train)
