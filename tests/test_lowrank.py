"""Low-rank ES (es.perturbation = "lowrank"): keyed factors, the batched member forward against members
materialised as full weights, the GEMM update, and the engine's resume / replay / analyses on a low-rank run."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from conftest import Kill, kill_at, make_tiny_model, run_tiny_es, tiny_es_cfg
from evolm import config
from evolm.backends.base import SamplingParams
from evolm.backends.hf import HFGenerator
from evolm.backends.hf_members import HFMemberGenerator
from evolm.errors import ConfigError
from evolm.es.lowrank import LowRankNoise, LowRankParamSet, dense_direction
from evolm.es.member_forward import MemberForward
from evolm.es.noise import StreamNoise, TableNoise
from evolm.es.update import member_layout

LOGIT_TOLERANCE = 1e-4
"""Max |logit difference| allowed between a member in the batched forward and the same member
materialised as full weights (float32). Measured on the tiny model: ~6e-6 with logits up to ~10."""


def _lowrank_cfg(*overrides):
    return config.from_dict(config.ESJob, {}, ["es.perturbation='lowrank'", *overrides])


def _params(model, rank=2, **kw):
    from evolm.es.engine import build_paramset

    return build_paramset(model, _lowrank_cfg(f"es.rank={rank}", *[f"es.{k}={v!r}" for k, v in kw.items()]))


def _prompts(tokenizer, count=8):
    words = ["cats", "rivers", "numbers", "stars", "bread", "songs", "trains", "clouds", "maps", "tea"]
    return [tokenizer.apply_chat_template([{"role": "user", "content": f"Tell me about {words[i % 10]} {i}."}],
                                          tokenize=False, add_generation_prompt=True) for i in range(count)]


def _snapshot(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


# -- keyed factors ----------------------------------------------------------------------------------

@pytest.mark.parametrize("base", [TableNoise(4, size=1 << 20), StreamNoise(4)])
def test_factors_are_keyed_and_the_dense_direction_has_unit_variance(base):
    noise = LowRankNoise(base, {0: (300, 200), 1: (200,)}, rank=4)
    a, b = noise.factors(2, 1, 0)
    assert a.shape == (300, 4) and b.shape == (200, 4)
    again = noise.factors(2, 1, 0)
    assert torch.equal(a, again[0]) and torch.equal(b, again[1])  # a pure function of the key
    assert not torch.equal(a, noise.factors(2, 2, 0)[0]) and not torch.equal(a, noise.factors(3, 1, 0)[0])
    dense = noise.direction(2, 1, 0, 300 * 200).view(300, 200)
    assert torch.allclose(dense, a @ b.t() / 2.0, atol=1e-6)
    assert abs(float(dense.var()) - 1.0) < 0.15 and torch.linalg.matrix_rank(dense) == 4
    assert torch.equal(noise.direction(2, 1, 1, 200), base.direction(2, 1, 1, 200))  # vectors: full-rank noise
    assert noise.describe()["rank"] == 4 and noise.describe()["base"]["kind"] == base.kind


def test_lowrank_perturb_restore_is_bit_exact(tiny_model):
    before = _snapshot(tiny_model)
    params = _params(tiny_model)
    for cycle in range(6):
        params.perturb(cycle, cycle % 3, 1 if cycle % 2 else -1, 3e-2)
        assert any(not torch.equal(p, before[n]) for n, p in tiny_model.named_parameters())
        params.restore()
    for n, p in tiny_model.named_parameters():
        assert torch.equal(p, before[n]), n


def test_lowrank_rejects_parameters_it_cannot_batch(tokenizer):
    class WithConv(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(4, 4)
            self.mix = torch.nn.Parameter(torch.zeros(3, 4, 4))

    with pytest.raises(ConfigError, match=r"mix has shape \[3, 4, 4\].*es.params"):
        LowRankParamSet(WithConv(), None)
    params = LowRankParamSet(WithConv(), None, regex=r"^proj\.")  # excluding it is the fix
    assert params.names == ["proj.weight", "proj.bias"]

    class Conv(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv1d(2, 3, 1)

    with pytest.raises(ConfigError, match="conv.weight"):
        LowRankParamSet(Conv(), None)


# -- the batched forward against materialised members ----------------------------------------------

def _materialised(params, model, generator, prompts, sampling, layout, iteration, sigma):
    """Each member on its own: weights W + s sigma A B^T / sqrt(r) written in place, generated alone."""
    out, logits = [], []
    members = HFMemberGenerator(generator)
    enc = generator.tokenizer(prompts, return_tensors="pt", padding=True)
    for direction, sign in layout:
        params.perturb(iteration, direction, sign, sigma)
        if sampling.greedy:  # the full-rank engine's own generation call
            out.append([c[0].text for c in generator.generate(prompts, sampling)])
        else:  # the same keyed sampler, one member
            out.append([c[0].text for c in members.generate(prompts, sampling, 1)[0]])
        with torch.no_grad():
            logits.append(model(**enc).logits)
        params.restore()
    return out, torch.cat(logits)


SAMPLED_AGREEMENT = 0.9
"""Share of sampled completions that must be identical between the batched and the materialised member.
Greedy text must be identical. A sampled token flips only when the shared uniform falls within the
logits' rounding difference of a CDF boundary; with several thousand nearly-flat candidates (a random
tiny model) that happens about once in a hundred completions here, and on the real model not at all."""


def _assert_same_completions(got, expected, sampling):
    if sampling.greedy:
        assert got == expected
        return
    pairs = [(g, e) for gm, em in zip(got, expected) for g, e in zip(gm, em)]
    assert sum(g == e for g, e in pairs) >= SAMPLED_AGREEMENT * len(pairs), [p for p in pairs if p[0] != p[1]]


@pytest.mark.parametrize("estimator, prefix_cache, temperature", [
    ("one_point", True, 0.0), ("antithetic", False, 0.0), ("antithetic", True, 0.2), ("one_point", False, 0.2)])
def test_batched_members_match_members_materialised_as_full_weights(tokenizer, estimator, prefix_cache, temperature):
    model = make_tiny_model(tokenizer)
    before = _snapshot(model)
    params = _params(model, rank=2)
    generator = HFGenerator(model, tokenizer, batch_size=16, prefix_cache=prefix_cache)
    prompts = _prompts(tokenizer)
    sampling = SamplingParams(max_new_tokens=10, temperature=temperature, seed=5)
    layout = member_layout(estimator, 4)
    sigma, iteration = 0.05, 3
    expected, expected_logits = _materialised(params, model, generator, prompts, sampling, layout, iteration, sigma)

    forward = MemberForward(model, params)
    batched = HFMemberGenerator(generator)
    with forward.members(iteration, layout, sigma):
        got = [[c[0].text for c in member] for member in batched.generate(prompts, sampling, len(layout))]
        enc = tokenizer(prompts, return_tensors="pt", padding=True)
        with torch.no_grad():
            logits = model(**{k: v.repeat(len(layout), 1) for k, v in enc.items()}).logits
    _assert_same_completions(got, expected, sampling)
    assert len({tuple(texts) for texts in got}) > 1  # the members really differ
    assert float((logits - expected_logits).abs().max()) < LOGIT_TOLERANCE
    # each member alone in its own block gives the same text as among all of them
    for m, member in enumerate(layout):
        with forward.members(iteration, [member], sigma):
            assert [c[0].text for c in batched.generate(prompts, sampling, 1)[0]] == got[m]
    # nothing left behind: no hooks, weights bit-identical
    assert all(not mod._forward_hooks for mod in model.modules())
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]), n


def test_shared_uniform_sampler_gives_common_random_numbers(tokenizer):
    from evolm.backends.hf_members import SharedUniformSampler

    u = torch.tensor([[0.1, 0.9], [0.5, 0.5]])
    sampler = SharedUniformSampler(u, input_len=3)
    scores = torch.tensor([[0.0, 0.0, 0.0, 0.0], [5.0, 0.0, 0.0, 0.0]]).repeat(2, 1)  # 2 members x 2 prompts
    scores[2] = scores[0]
    picked = sampler(torch.zeros(4, 3, dtype=torch.long), scores).argmax(dim=1).tolist()
    assert picked[0] == picked[2] == 0  # same distribution, same uniform: same token (u=0.1 of uniform over 4)
    assert picked[1] == picked[3] == 0  # u=0.5, p(0) ~ 0.98
    picked = sampler(torch.zeros(4, 4, dtype=torch.long), scores).argmax(dim=1).tolist()  # step 1: u = 0.9 / 0.5
    assert picked[0] == 3 and picked[1] == 0
    top_p = torch.full((1, 4), float("-inf"))
    top_p[0, 2] = 1.0
    assert SharedUniformSampler(torch.tensor([[0.0]]), 0)(torch.zeros(1, 0, dtype=torch.long), top_p).argmax().item() == 2


def test_embedding_rows_and_the_tied_head_see_the_same_perturbation(tiny_model):
    params = _params(tiny_model, rank=3)
    k = params.names.index("model.embed_tokens.weight")
    assert tiny_model.lm_head.weight is tiny_model.model.embed_tokens.weight
    a, b = params.factors(k, 1, 0)
    sigma, sign = 0.1, -1
    perturbed = tiny_model.model.embed_tokens.weight + sign * sigma * dense_direction(a, b)
    ids = torch.tensor([[5, 17, 900], [3, 3, 44]])
    hidden = torch.randn(2, 3, tiny_model.config.hidden_size)
    with MemberForward(tiny_model, params).members(1, [(0, sign), (0, sign)], sigma), torch.no_grad():
        rows = tiny_model.model.embed_tokens(ids)
        logits = tiny_model.lm_head(hidden)
    assert torch.allclose(rows, perturbed[ids], atol=1e-6)
    assert torch.allclose(logits, hidden @ perturbed.t(), atol=1e-5)


def test_population_block_size_does_not_change_the_scores(tokenizer, vowel_task):
    from evolm.es.lowrank_population import LowRankPopulation

    model = make_tiny_model(tokenizer)
    params = _params(model, rank=1)
    generator = HFGenerator(model, tokenizer, batch_size=16)
    examples = vowel_task.examples("train", 6, seed=1)
    prompts = [vowel_task.render_prompt(ex, tokenizer) for ex in examples]
    layout = member_layout("antithetic", 6)
    sampling = SamplingParams(max_new_tokens=6, temperature=0.0)
    scores = [LowRankPopulation(params, generator, vowel_task, block).score(0, layout, 0.05, examples, prompts, sampling)
              for block in (0, 4, 1)]
    assert scores[0].fitness == scores[1].fitness == scores[2].fitness
    assert len(set(scores[0].fitness)) > 1 and scores[0].gen_sequences == 36


# -- the update ---------------------------------------------------------------------------------------

def test_lowrank_update_is_the_sum_of_rank_r_products(tiny_model):
    params = _params(tiny_model, rank=2)
    before = _snapshot(tiny_model)
    coefficients, scale = [1.5, 0.0, -0.5], 1e-3
    params.apply_update(7, coefficients, scale)
    names = dict(tiny_model.named_parameters())
    for k, name in enumerate(params.names):
        delta = names[name].detach() - before[name]
        if params.is_matrix(k):
            expected = sum(c * dense_direction(*params.factors(k, 7, d)) for d, c in enumerate(coefficients)) * scale
            assert torch.linalg.matrix_rank(delta.double(), rtol=1e-4) <= 4  # two nonzero directions x rank 2
        else:
            expected = sum(c * params.vector(k, 7, d) for d, c in enumerate(coefficients)).view_as(delta) * scale
        assert torch.allclose(delta, expected, atol=2e-7), name


def test_lowrank_update_that_would_overflow_is_refused_and_changes_nothing(tiny_model):
    """As for full-rank ES (docs/reliability.md): an update that would write inf or NaN returns False and
    leaves every weight as it was; the seed log then says skipped, so replay stays in step."""
    params = _params(tiny_model, rank=2)
    before = _snapshot(tiny_model)
    assert params.apply_update(3, [1.0, -1.0], 1e38) is False
    assert params.apply_update(3, [float("nan"), 1.0], 1e-3) is False
    for name, p in tiny_model.named_parameters():
        assert torch.equal(p.detach(), before[name]), name
    assert params.apply_update(3, [1.0, -1.0], 1e-3) is True


# -- the engine on a low-rank run ---------------------------------------------------------------------

def _tiny_cfg(tmp_path, **es):
    return tiny_es_cfg(tmp_path, **{"perturbation": "lowrank", "rank": 2, **es})


def test_lowrank_es_raises_reward_of_a_tiny_model(tmp_path, tokenizer, vowel_task):
    # The centre (the unperturbed weights) is scored every update: the population mean mixes progress
    # with how far rank-r members sit from the centre, which at equal sigma is farther than full-rank
    # members (their output changes are coherent across positions).
    run, _ = run_tiny_es(_tiny_cfg(tmp_path, iterations=15, rank=4, sigma=0.01, eval_center_every=1), tokenizer, vowel_task)
    center = [r["center_reward"] for r in run.metrics() if r.get("kind") == "train"]
    assert np.mean(center[-3:]) > np.mean(center[:3]) + 0.05
    header = run.seed_log()[0]
    assert header["perturbation"] == "lowrank" and header["rank"] == 4 and header["noise"]["kind"] == "lowrank"
    assert header["noise"]["base"]["scheme"] == "member"


def test_lowrank_resume_after_a_kill_is_bit_identical_and_replay_matches(tmp_path, tokenizer, vowel_task):
    from evolm.es.engine import replay
    from evolm.jobs import run_es
    from evolm.runs import RunDir

    cfg = _tiny_cfg(tmp_path / "a", iterations=4, estimator="antithetic")
    _, uninterrupted = run_tiny_es(cfg, tokenizer, vowel_task)

    cfg_b = _tiny_cfg(tmp_path / "b", iterations=4, estimator="antithetic")
    cfg_b.run.checkpoint_every = 2
    with pytest.raises(Kill):
        run_tiny_es(cfg_b, tokenizer, vowel_task, callbacks=(kill_at(3),))
    run_b = RunDir.open(tmp_path / "b" / "run")
    assert run_b.latest_checkpoint()[1]["step"] == 2
    fresh = make_tiny_model(tokenizer)
    run_es(cfg_b, resume=run_b, model=fresh, tokenizer=tokenizer, task=vowel_task,
           generator=HFGenerator(fresh, tokenizer, 16), quiet=True)
    base = make_tiny_model(tokenizer)
    moved = 0
    for (n, p), (_, q), (_, b) in zip(uninterrupted.named_parameters(), fresh.named_parameters(), base.named_parameters()):
        assert torch.equal(p, q), n
        moved += int(not torch.equal(p, b))
    assert moved > 0
    assert [r["status"] for r in run_b.seed_log()[1:]].count("applied") >= 3

    replayed = make_tiny_model(tokenizer)
    replay(replayed, run_b.seed_log(), cfg_b)
    for (n, p), (_, q) in zip(uninterrupted.named_parameters(), replayed.named_parameters()):
        assert torch.equal(p, q), n

    # a config that is not the run's is refused, never replayed with other noise
    for change, message in ((dict(perturbation="full"), "es.perturbation is 'full'"), (dict(rank=3), "es.rank is 3")):
        other = _tiny_cfg(tmp_path / "b", iterations=4, estimator="antithetic", **change)
        with pytest.raises(ConfigError, match=message):
            replay(make_tiny_model(tokenizer), run_b.seed_log(), other)


def test_analyses_work_on_a_lowrank_run(tmp_path, tokenizer, vowel_task):
    """Drift and the sparsity τ scale read a low-rank run like any other: the seed log's
    ``scale * sqrt(sum c^2)`` is the RMS of one low-rank update (each entry of A B^T / sqrt(r) has unit variance)."""
    from evolm.analysis.sparsity import single_update_rms
    from evolm.commands import main

    model = make_tiny_model(tokenizer)
    model.save_pretrained(tmp_path / "base")
    before = _snapshot(model)
    run, model = run_tiny_es(_tiny_cfg(tmp_path, iterations=1, rank=4), tokenizer, vowel_task, model=model)
    records = run.seed_log()
    assert records[1]["status"] == "applied"
    delta = torch.cat([(p.detach() - before[n]).flatten() for n, p in model.named_parameters()
                       if n != "lm_head.weight"])
    assert float(delta.pow(2).mean().sqrt()) == pytest.approx(single_update_rms(records), rel=0.1)

    out = tmp_path / "analysis"
    assert main(["analyze", "drift", "--base", str(tmp_path / "base"), "--trained", f"lowrank={run.path}", "--out", str(out)]) == 0
    drift = json.loads((out / "drift.json").read_text())["models"]["lowrank"]
    base_norm = math.sqrt(sum(float(v.pow(2).sum()) for n, v in before.items() if n != "lm_head.weight"))
    assert drift["relative_distance"] == pytest.approx(float(delta.norm()) / base_norm, rel=1e-4)
    assert main(["analyze", "sparsity", "--base", str(tmp_path / "base"), "--trained", str(run.path), "--no-eval",
                 "--out", str(out)]) == 0
    sparsity = json.loads((out / "sparsity.json").read_text())
    assert sparsity["tau_scale"] == pytest.approx(single_update_rms(records)) and "seed_log" in sparsity["tau_scale_source"]


def test_lowrank_in_bfloat16_keeps_float32_masters(tmp_path, tokenizer, vowel_task):
    model = make_tiny_model(tokenizer).to(torch.bfloat16)
    before = _snapshot(model)
    run, model = run_tiny_es(_tiny_cfg(tmp_path, iterations=2, sigma=0.05), tokenizer, vowel_task, model=model)
    assert all(r["update_status"] == "applied" for r in run.metrics() if r.get("kind") == "train")
    assert any(not torch.equal(p, before[n]) for n, p in model.named_parameters())
    assert (run.path / "final" / "model.safetensors").exists()


@pytest.mark.parametrize("override, message", [
    ("es.rank=0", "es.rank must be >= 1"),
    ("es.member_batch=-1", "es.member_batch must be >= 0"),
    ("es.perturbation='sparse'", "es.perturbation must be one of"),
])
def test_config_validation_of_lowrank_fields(override, message):
    with pytest.raises(ConfigError, match=message):
        config.from_dict(config.ESJob, {}, [override])
    cfg = config.from_dict(config.ESJob, {}, ["es.perturbation='lowrank'", "es.rank=1", "es.member_batch=4"])
    assert (cfg.es.perturbation, cfg.es.rank, cfg.es.member_batch) == ("lowrank", 1, 4)
    cfg.generation.backend = "vllm"  # members become LoRA adapters: projection matrices only (es/lora_population.py)
    with pytest.raises(ConfigError, match=r"LoRA adapters, which cover attention and MLP projections only .*es.params=\['attention','mlp'\]"):
        config.validate(cfg)
    cfg.es.params = ["attention", "mlp"]
    config.validate(cfg)
    cfg.es.rank = 600
    with pytest.raises(ConfigError, match="above vLLM's largest LoRA rank"):
        config.validate(cfg)
    cfg.es.rank, cfg.es.params = 1, ["all"]
    cfg.generation.verify = "on"  # verification is of full-rank hf members
    with pytest.raises(ConfigError, match="generation.verify"):
        config.validate(cfg)
    cfg.generation.verify = "off"
    cfg.generation.backend = "hf"
    cfg.distributed.workers = 2  # Ray actors score blocks of es.member_batch members (tests/test_ray_population.py)
    config.validate(cfg)


# -- the real default model ----------------------------------------------------------------------------

@pytest.mark.slow  # `make test-all`; the tiny-model twin runs in `make test`
def test_batched_members_match_materialised_members_on_smollm2():
    """SmolLM2-135M on the training task's prompts: identical greedy text for every member, sampled text
    within SAMPLED_AGREEMENT, logits within 1e-3 of the member materialised as full weights (measured:
    1.2e-4 on logits up to 43.5 at sigma 1e-3). Two prompts keep it short (each member is a full
    135M forward per prompt); the four members still answer them differently."""
    from evolm.es.engine import build_paramset, training_batch
    from evolm.models import load
    from evolm.tasks import make_task

    model, tokenizer = load("smollm2-135m", threads=1)
    task = make_task("arithmetic", "qiu", None, digits=2, operators="+", terms=2)
    _, prompts = training_batch(task, tokenizer, 0, 0, 2)
    params = build_paramset(model, _lowrank_cfg("es.rank=4"))
    generator = HFGenerator(model, tokenizer, batch_size=64)
    layout = member_layout("antithetic", 4)
    sigma, iteration = 0.01, 0  # larger than the shipped 1e-3 so that members answer differently
    forward, batched = MemberForward(model, params), HFMemberGenerator(generator)
    for sampling in (SamplingParams(max_new_tokens=10), SamplingParams(max_new_tokens=10, temperature=1.0, seed=3)):
        expected, expected_logits = _materialised(params, model, generator, prompts, sampling, layout, iteration, sigma)
        with forward.members(iteration, layout, sigma):
            got = [[c[0].text for c in member] for member in batched.generate(prompts, sampling, len(layout))]
            enc = tokenizer(prompts, return_tensors="pt", padding=True)
            with torch.no_grad():
                logits = model(**{k: v.repeat(len(layout), 1) for k, v in enc.items()}).logits
        _assert_same_completions(got, expected, sampling)
        assert len({tuple(texts) for texts in got}) > 1
        assert float((logits - expected_logits).abs().max()) < LOGIT_TOLERANCE * 10  # logits here reach ~40


@pytest.mark.slow
@pytest.mark.ci
def test_readme_lowrank_command_runs_on_the_default_model(tmp_path):
    from evolm.commands import main
    from evolm.runs import RunDir

    from pathlib import Path

    shipped = Path(__file__).resolve().parents[1] / "configs" / "es-arithmetic.toml"
    code = main(["es", "--config", str(shipped), "--set", "es.perturbation=lowrank",
                 "--set", f"run.out_dir='{tmp_path}'", "--set", "run.name='lowrank'", "--set", "run.progress=false",
                 "--set", "es.iterations=1", "--set", "es.population=2", "--set", "es.prompts_per_iteration=4",
                 "--set", "eval.before_after=false", "--set", "probe.every=0"])
    assert code == 0
    run = RunDir.open(tmp_path / "lowrank")
    assert run.info()["status"] == "finished"
    header, update = run.seed_log()
    assert header["perturbation"] == "lowrank" and header["rank"] == 4 and update["step"] == 1
    assert (run.path / "final" / "model.safetensors").exists()


def test_every_population_offers_the_calls_the_engine_makes():
    """engine.train calls score, apply_update, checkpointed and close on whatever population it is given."""
    from evolm.es.lowrank_population import LowRankPopulation
    from evolm.es.population import LocalPopulation
    from evolm.es.ray_population import RayPopulation

    for cls in (LocalPopulation, LowRankPopulation, RayPopulation):
        missing = [m for m in ("score", "apply_update", "checkpointed", "close") if not callable(getattr(cls, m, None))]
        assert not missing, f"{cls.__name__} lacks {missing}"
