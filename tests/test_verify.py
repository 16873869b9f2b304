"""Exact verification of ES members against the centre (backends/hf_verify.py, generation.verify)."""

from __future__ import annotations

import pytest
import torch

from conftest import run_tiny_es, tiny_es_cfg
from evolm import config
from evolm.backends.base import SamplingParams
from evolm.backends.hf import HFGenerator
from evolm.backends.hf_verify import HFVerifier
from evolm.errors import ConfigError


def _prompts(tokenizer, count=10):
    from evolm.tasks import make_task

    task = make_task("arithmetic")  # a shared system prefix (prefix cache) and prompts of different lengths
    prompts = [task.render_prompt(e, tokenizer) for e in task.examples("train", count, seed=1)]
    return prompts + ["Write 5", "Hello there my friend, tell me"]  # no shared prefix with the rest: left padding


def _same(a, b):
    return [(c.text, c.num_tokens, c.finished) for x in a for c in x] == [(c.text, c.num_tokens, c.finished) for x in b for c in x]


def _perturb(model, sigma, seed):
    g = torch.Generator().manual_seed(seed)
    noise = [torch.randn(p.shape, generator=g) * sigma for p in model.parameters()]
    with torch.no_grad():
        for p, n in zip(model.parameters(), noise):
            p.add_(n)
    return noise


def _restore(model, noise):
    with torch.no_grad():
        for p, n in zip(model.parameters(), noise):
            p.sub_(n)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])  # bf16: what model.dtype = "auto" gives on CUDA and AMX CPUs
@pytest.mark.parametrize("prefix_cache", [True, False])
def test_verified_completions_are_the_plain_greedy_ones(tokenizer, tiny_model, prefix_cache, dtype):
    import copy

    tiny_model = copy.deepcopy(tiny_model).to(dtype)
    gen = HFGenerator(tiny_model, tokenizer, batch_size=5, prefix_cache=prefix_cache)  # 3 batches, the last of 2
    verifier = HFVerifier(gen)
    prompts = _prompts(tokenizer)
    sp = SamplingParams(max_new_tokens=12)
    centre = verifier.centre(prompts, sp)
    assert _same(centre.completions, gen.generate(prompts, sp))
    fractions = []
    for sigma in (0.0, 0.005, 0.02, 0.1):  # from all rows accepted to none
        noise = _perturb(tiny_model, sigma, seed=3)
        verified, stats = verifier.generate(centre, sp)
        assert _same(verified, gen.generate(prompts, sp)), sigma
        _restore(tiny_model, noise)
        fractions.append(stats.prefix_fraction)
        assert stats.rows == len(prompts) and len(stats.accepted) == len(prompts)
    assert fractions[0] == 1.0 and fractions[-1] < 0.5  # the sweep really exercised the continuation


def test_a_planted_divergence_is_found_at_its_token(tokenizer):
    # An untied llama: changing the input embedding of the token the centre's completion has at position
    # j - 1 (and nowhere earlier in that row) cannot change the row's logits before position j (causality),
    # and does change the argmax at j: the verifier must accept exactly j tokens there.
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                      bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                      pad_token_id=tokenizer.pad_token_id)
    model = LlamaForCausalLM(cfg).eval()
    gen = HFGenerator(model, tokenizer, batch_size=8)
    verifier = HFVerifier(gen)
    prompts = _prompts(tokenizer, 6)
    sp = SamplingParams(max_new_tokens=16)
    centre = verifier.centre(prompts, sp)
    row = 0
    tokens = centre.batches[0].tokens[row]
    prompt_ids = tokenizer(prompts[row], add_special_tokens=False)["input_ids"]
    j = next(t for t in range(3, len(tokens)) if tokens[t - 1] not in prompt_ids + tokens[:t - 1])
    embedding = model.get_input_embeddings().weight
    saved = embedding[tokens[j - 1]].detach().clone()
    with torch.no_grad():
        embedding[tokens[j - 1]] = torch.randn(saved.shape, generator=torch.Generator().manual_seed(1)) * 20
    plain = gen.generate(prompts, sp)
    planted = tokenizer(plain[row][0].text, add_special_tokens=False)["input_ids"]
    verified, stats = verifier.generate(centre, sp)
    assert stats.accepted[row] == j  # found at the planted token
    assert _same(verified, plain)
    assert verified[row][0].text != centre.completions[row][0].text and planted[:j] != tokens[:j + 1]
    with torch.no_grad():
        embedding[tokens[j - 1]] = saved
    again, stats = verifier.generate(centre, sp)
    assert stats.identical == len(prompts) and _same(again, centre.completions)


def test_verification_refuses_sampling_and_entropy(tokenizer, tiny_model):
    verifier = HFVerifier(HFGenerator(tiny_model, tokenizer))
    with pytest.raises(ValueError, match="greedy"):
        verifier.centre(["Write 5"], SamplingParams(temperature=1.0))
    with pytest.raises(ValueError, match="entropy"):
        verifier.centre(["Write 5"], SamplingParams(return_entropy=True))


@pytest.mark.parametrize("override, message", [
    ({"generation.backend": "vllm"}, "hf backend"),
    ({"generation.temperature": 0.7}, "greedy"),
    ({"es.perturbation": "lowrank"}, "lowrank"),
    ({"distributed.workers": 2}, "Ray"),
])
def test_config_refuses_untested_combinations(override, message, monkeypatch):
    monkeypatch.setattr(config, "_importable", lambda name: True)
    cfg = config.ESJob()
    cfg.generation.verify = "on"
    for key, value in override.items():
        section, name = key.split(".")
        setattr(getattr(cfg, section), name, value)
    with pytest.raises(ConfigError, match=message):
        config.resolve_auto(cfg)
        cfg.validate_job()


@pytest.mark.parametrize("job", ["grpo", "pipeline"])
def test_grpo_and_pipelines_refuse_verify(job):
    from evolm.grpo import GRPOJob
    from evolm.pipeline import PipelineJob

    cfg = GRPOJob() if job == "grpo" else PipelineJob()
    cfg.generation.verify = "on"
    with pytest.raises(ConfigError, match="generation.verify"):
        config.resolve_auto(cfg)
        cfg.validate_job()
    cfg.generation.verify = "off"
    cfg.validate_job()


# -- the ES loop ------------------------------------------------------------------------------------

def _cfg(tmp_path, verify, **es):
    cfg = tiny_es_cfg(tmp_path, **{"population": 4, "prompts": 6, "iterations": 3, "max_new_tokens": 10, **es})
    cfg.generation.verify = verify
    return cfg


def _run(cfg, tokenizer, task, **kw):
    return run_tiny_es(cfg, tokenizer, task, batch_size=4, **kw)


def _train(run):
    return [r for r in run.metrics() if r.get("kind") == "train"]


def test_es_updates_are_identical_with_and_without_verification(tmp_path, tokenizer, vowel_task):
    run_off, off = _run(_cfg(tmp_path / "off", "off"), tokenizer, vowel_task)
    run_on, on = _run(_cfg(tmp_path / "on", "on"), tokenizer, vowel_task)
    assert [r["fitness"] for r in _train(run_on)] == [r["fitness"] for r in _train(run_off)]
    assert [r.get("coefficients") for r in run_on.seed_log()] == [r.get("coefficients") for r in run_off.seed_log()]
    assert "applied" in [r.get("status") for r in run_on.seed_log()[1:]]
    assert [r["gen_tokens"] for r in _train(run_on)] == [r["gen_tokens"] for r in _train(run_off)]
    for (n, p), (_, q) in zip(off.named_parameters(), on.named_parameters()):
        assert torch.equal(p, q), n
    from conftest import make_tiny_model

    base = make_tiny_model(tokenizer)
    assert any(not torch.equal(p, q) for p, q in zip(base.parameters(), on.parameters()))  # training moved the weights
    for record in _train(run_on):
        assert 0 <= record["verify_identical"] <= 1 and 0 <= record["verify_prefix"] <= 1 and record["verify_decode_steps"] > 0
    assert all("verify_prefix" not in r for r in _train(run_off))  # off: no acceptance profile (it needs the centre)
    assert any(r["verify_prefix"] < 1 for r in _train(run_on))  # some members diverged and were decoded further


def test_resume_with_verification_is_bit_identical_and_replays(tmp_path, tokenizer, vowel_task):
    from conftest import make_tiny_model

    from evolm.es.engine import replay
    from evolm.jobs import run_es
    from evolm.runs import RunDir

    _, uninterrupted = _run(_cfg(tmp_path / "a", "on", iterations=4), tokenizer, vowel_task)

    class Kill(Exception):
        pass

    def kill_at_3(step, record):
        if step == 3:
            raise Kill

    cfg = _cfg(tmp_path / "b", "on", iterations=4)
    cfg.run.checkpoint_every = 2
    with pytest.raises(Kill):
        _run(cfg, tokenizer, vowel_task, callbacks=(kill_at_3,))
    run_b = RunDir.open(tmp_path / "b" / "run")
    fresh = make_tiny_model(tokenizer)
    run_es(cfg, resume=run_b, model=fresh, tokenizer=tokenizer, task=vowel_task,
           generator=HFGenerator(fresh, tokenizer, 4), quiet=True)
    for (n, p), (_, q) in zip(uninterrupted.named_parameters(), fresh.named_parameters()):
        assert torch.equal(p, q), n
    replayed = make_tiny_model(tokenizer)
    replay(replayed, run_b.seed_log(), cfg)
    for (n, p), (_, q) in zip(uninterrupted.named_parameters(), replayed.named_parameters()):
        assert torch.equal(p, q), n


def test_auto_turns_itself_off_when_acceptance_is_low_and_stays_off_on_resume(tmp_path, tokenizer, vowel_task):
    from conftest import make_tiny_model

    from evolm.es.population import AUTO_MIN_PREFIX, LocalPopulation

    run, _ = _run(_cfg(tmp_path, "auto", sigma=0.2), tokenizer, vowel_task)  # sigma 0.2: members diverge at once
    records = _train(run)
    assert records[0]["verify_prefix"] < AUTO_MIN_PREFIX and records[0]["verify_auto_off"] is True
    assert all("verify_prefix" not in r for r in records[1:])
    pop = LocalPopulation(None, HFGenerator(make_tiny_model(tokenizer), tokenizer), None, verify="auto")
    pop.resume_from(run.metrics())
    assert pop.verify == "off"


# -- the real default model, shipped configs (slow) ---------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("path, overrides", [
    ("configs/es-arithmetic.toml", []),
    ("configs/es-countdown-qiu.toml", ["task.params={}", "generation.max_new_tokens=64"]),  # generated problems
])
def test_shipped_configs_give_the_same_members_with_and_without_verification(path, overrides):
    # Iteration 0 of the shipped config (its sigma, reward, greedy decoding), 4 members x 8 prompts: every
    # member's completions and fitness are the same with verification on as off.
    from pathlib import Path

    from evolm import models
    from evolm.es.engine import build_paramset, training_batch
    from evolm.es.population import LocalPopulation
    from evolm.es.update import member_layout
    from evolm.seeding import seed31
    from evolm.tasks import make_task

    root = Path(__file__).resolve().parents[1]
    cfg = config.load(config.ESJob, root / path, overrides + ["es.population=4", "es.prompts_per_iteration=8",
                                                              "generation.batch_size=8"])
    model, tokenizer = models.load(cfg.model.spec, threads=1)
    task = make_task(cfg.task.name, cfg.task.reward, None, **cfg.task.params)
    generator = HFGenerator(model, tokenizer, batch_size=cfg.generation.batch_size)
    params = build_paramset(model, cfg)
    layout = member_layout(cfg.es.estimator, cfg.es.population)
    examples, prompts = training_batch(task, tokenizer, cfg.run.seed, 0, cfg.es.prompts_per_iteration)
    sampling = SamplingParams(max_new_tokens=cfg.generation.max_new_tokens, seed=seed31(cfg.run.seed, "sampling", 0))
    off, on = LocalPopulation(params, generator, task), LocalPopulation(params, generator, task, verify="on")
    seen = {"off": [], "on": []}
    plain, verified = generator.generate, on.verifier.generate
    generator.generate = lambda *a, **k: seen["off"].append(plain(*a, **k)) or seen["off"][-1]
    on.verifier.generate = lambda *a, **k: seen["on"].append(verified(*a, **k)) or seen["on"][-1]
    scores_off = off.score(0, layout, cfg.es.sigma, examples, prompts, sampling)
    scores_on = on.score(0, layout, cfg.es.sigma, examples, prompts, sampling)
    assert len(seen["off"]) == len(seen["on"]) == len(layout)
    for member, (a, (b, _)) in enumerate(zip(seen["off"], seen["on"])):
        assert _same(a, b), member
    assert scores_on.fitness == scores_off.fitness
    assert 0 < scores_on.extra["verify_prefix"] <= 1
