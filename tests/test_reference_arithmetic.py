"""es.arithmetic = "reference": Qiu et al.'s in-place arithmetic in the model's dtype (evolm/es/reference.py).

The transcription below is their loop (github.com/VsonicV/es-fine-tuning-paper,
countdown/es_fine-tuning_countdown.py lines 136-147 perturb, 161-172 restore, 336-354 update), torch
only, with one change: the noise of (member, tensor) is evolm's (float32, rounded to the model dtype)
instead of ``torch.randn(..., dtype=param.dtype)`` from a per-member seed.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import Kill, kill_at, run_tiny_es, tiny_es_cfg

from evolm import config
from evolm.errors import ConfigError
from evolm.es.noise import CounterNoise, StreamNoise, TableNoise
from evolm.es.reference import ReferenceParamSet

SIGMA, ALPHA = 0.001, 0.0005


def _noise_fn(noise, model):
    index = {id(p): i for i, (_, p) in reversed(list(enumerate(model.named_parameters(remove_duplicate=False))))}

    def noise_of(param, iteration, member):
        eps = noise.direction(iteration, member, index[id(param)], param.numel())
        return eps.to(param.dtype, copy=True).view_as(param)  # a fresh tensor, as torch.randn(param.shape, generator=gen, dtype=param.dtype)

    return noise_of


@torch.no_grad()
def transcription(model, noise, rewards_per_iteration):
    """Qiu et al.'s ES loop with a given reward vector per iteration (no generation)."""
    noise_of = _noise_fn(noise, model)
    for iteration, rewards in enumerate(rewards_per_iteration):
        population = len(rewards)
        for seed_idx in range(population):
            for name, param in model.named_parameters():  # perturb
                noise = noise_of(param, iteration, seed_idx)
                param.data.add_(SIGMA * noise)
            for name, param in model.named_parameters():  # restore
                noise = noise_of(param, iteration, seed_idx)
                param.data.add_(-SIGMA * noise)
        rewards_tensor = np.array(rewards, dtype=np.float32)
        rewards_normalized = (rewards_tensor - rewards_tensor.mean()) / (rewards_tensor.std() + 1e-8)
        for name, param in model.named_parameters():  # update
            update = torch.zeros_like(param)
            for seed_idx in range(population):
                r_norm = rewards_normalized[seed_idx]
                noise = noise_of(param, iteration, seed_idx)
                noise.mul_(float(r_norm))
                update.add_(noise)
                del noise
            update.div_(population)
            param.data.add_(ALPHA * update)
    return model


def _evolm_loop(model, noise, rewards_per_iteration, error_sample=0):
    params = ReferenceParamSet(model, noise, lr=ALPHA, error_sample=error_sample)
    metrics = []
    for iteration, rewards in enumerate(rewards_per_iteration):
        for member in range(len(rewards)):
            params.perturb(iteration, member, +1, SIGMA)
            params.restore()
        r = np.array(rewards, dtype=np.float32)
        coefficients = ((r - r.mean()) / (r.std() + 1e-8)).tolist()  # Qiu et al.'s z-score, as float
        assert params.apply_update(iteration, coefficients, ALPHA / len(rewards))
        metrics.append(params.error_metrics())
    return params, metrics


def _rewards(iterations=3, population=6, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.random(population).tolist() for _ in range(iterations)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("kind", ["table", "counter", "stream"])
def test_reference_paramset_is_bit_identical_to_the_transcribed_loop(tokenizer, dtype, kind):
    from conftest import make_tiny_model

    base = make_tiny_model(tokenizer, hidden=32, layers=1).to(dtype)
    noise = {"table": lambda: TableNoise(5, size=1 << 22), "counter": lambda: CounterNoise(5),
             "stream": lambda: StreamNoise(5)}[kind]()
    rewards = _rewards()
    ref = transcription(make_tiny_model(tokenizer, hidden=32, layers=1).to(dtype), noise, rewards)
    ours = make_tiny_model(tokenizer, hidden=32, layers=1).to(dtype)
    _evolm_loop(ours, noise, rewards)
    moved = 0
    for (n, p), (_, q), (_, b) in zip(ref.named_parameters(), ours.named_parameters(), base.named_parameters()):
        bits = torch.int32 if dtype == torch.float32 else torch.int16
        assert p.dtype == q.dtype == dtype and torch.equal(p.detach().view(bits), q.detach().view(bits)), n  # bit for bit
        moved += int((q != b).sum())
    assert moved > 0  # the updates changed the weights


@pytest.mark.parametrize("kind", ["table", "counter"])
def test_the_chunked_arithmetic_is_the_whole_tensor_loop_at_any_chunk_size(tokenizer, monkeypatch, kind):
    """perturb, restore and the update run CHUNK values at a time (no temporaries the size of a tensor); with
    chunks of 4096 values every tensor but the smallest spans several, the embedding 384 with a partial last
    one: still the transcribed whole-tensor loop bit for bit, and the shadow's error metrics the same."""
    from conftest import make_tiny_model

    import evolm.es.reference as reference

    noise = {"table": lambda: TableNoise(5, size=1 << 22), "counter": lambda: CounterNoise(5)}[kind]()
    rewards = _rewards()
    ref = transcription(make_tiny_model(tokenizer, hidden=32, layers=1).to(torch.bfloat16), noise, rewards)
    whole, whole_metrics = _evolm_loop(make_tiny_model(tokenizer, hidden=32, layers=1).to(torch.bfloat16), noise,
                                       rewards, error_sample=3000)
    monkeypatch.setattr(reference, "CHUNK", 4096)
    ours = make_tiny_model(tokenizer, hidden=32, layers=1).to(torch.bfloat16)
    params, metrics = _evolm_loop(ours, noise, rewards, error_sample=3000)
    assert max(t.numel() for t in params.tensors) > 300 * 4096
    for (n, p), (_, q) in zip(ref.named_parameters(), ours.named_parameters()):
        assert torch.equal(p.detach().view(torch.int16), q.detach().view(torch.int16)), n
    assert metrics == whole_metrics


def test_bf16_restore_is_not_exact_and_the_shadow_measures_it(tokenizer):
    from conftest import make_tiny_model

    model = make_tiny_model(tokenizer, hidden=32, layers=1).to(torch.bfloat16)
    base = {n: p.detach().clone() for n, p in model.named_parameters()}
    params = ReferenceParamSet(model, CounterNoise(3), lr=ALPHA, error_sample=1 << 30)  # every coordinate
    for member in range(4):
        params.perturb(0, member, +1, SIGMA)
        params.restore()
    changed = sum(int((p != base[n]).sum()) for n, p in model.named_parameters())
    total = sum(p.numel() for p in model.parameters())
    assert 0.01 < changed / total < 0.9  # perturb + restore alone moved weights (bf16 rounding)
    assert params.error_metrics()["ref_error_frac"] == pytest.approx(changed / total)  # the shadow has not moved
    assert params.apply_update(0, [1.0, -0.5, 0.2, -0.7], ALPHA / 4)
    m = params.error_metrics()
    assert m["ref_sample"] == total and m["ref_error_rel"] > 0 and m["ref_moved_rel"] > 0 and m["ref_moved_exact_rel"] > 0


def test_float32_shadow_is_the_exact_update(tokenizer):
    # the shadow follows exact float32 ES: compare with ParamSet on float32 weights (masters of the bf16 model)
    from conftest import make_tiny_model

    from evolm.es.params import ParamSet

    noise = TableNoise(9, size=1 << 22)
    model = make_tiny_model(tokenizer, hidden=32, layers=1).to(torch.bfloat16)
    exact = make_tiny_model(tokenizer, hidden=32, layers=1).to(torch.bfloat16).to(torch.float32)
    params = ReferenceParamSet(model, noise, lr=ALPHA, error_sample=5000)
    plain = ParamSet(exact, noise)
    coefs = [[0.3, -1.2, 0.9], [1.0, 0.0, -1.0]]
    for it, c in enumerate(coefs):
        params.perturb(it, 0, +1, SIGMA)
        params.restore()
        assert params.apply_update(it, c, ALPHA / 3) and plain.apply_update(it, c, ALPHA / 3)
    want = torch.cat([t.view(-1)[i] for t, i in zip(plain.tensors, params.subset.per_tensor)])
    torch.testing.assert_close(torch.cat(params.shadow), want, rtol=1e-6, atol=1e-9)
    rebuilt = ReferenceParamSet(make_tiny_model(tokenizer, hidden=32, layers=1).to(torch.bfloat16), noise, lr=ALPHA, error_sample=5000)
    rebuilt.replay_shadow([{"iteration": it, "status": "applied", "coefficients": c, "scale": ALPHA / 3} for it, c in enumerate(coefs)])
    assert all(torch.equal(a, b) for a, b in zip(rebuilt.shadow, params.shadow))


def test_reference_refuses_a_scale_that_is_not_lr_over_n(tiny_model):
    params = ReferenceParamSet(tiny_model.to(torch.bfloat16), CounterNoise(1), lr=ALPHA)
    with pytest.raises(ValueError, match="lr / N"):
        params.apply_update(0, [1.0, -1.0], ALPHA / 3)


UNTESTED_WITH_IN_PLACE_ARITHMETIC = [
    (["es.estimator='antithetic'"], "es.estimator='one_point'"),
    (["es.divide_by_sigma=true"], "es.divide_by_sigma=false"),
    (["es.perturbation='lowrank'"], "es.perturbation='full'"),
    (["generation.backend='vllm'"], "generation.backend='hf'"),
    (["distributed.workers=2"], "distributed.workers=0"),
    (["model.device='cuda'"], "model.device='cpu'"),
]
"""What Qiu et al.'s loop (reference) and the paper's artifact share as untested: each refused in one line
(tests/test_artifact_arithmetic.py adds the artifact's own)."""


def refused_in_one_line(arithmetic: str, overrides: list[str], fix: str) -> None:
    with pytest.raises(ConfigError, match=fix.replace("(", r"\(")) as e:
        config.from_dict(config.ESJob, {}, [f"es.arithmetic='{arithmetic}'", "es.population=8", *overrides])
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("overrides, fix", UNTESTED_WITH_IN_PLACE_ARITHMETIC)
def test_unsupported_combinations_are_refused_in_one_line(overrides, fix):
    refused_in_one_line("reference", overrides, fix)


def test_pipeline_and_ask_tell_refuse_reference(tiny_model):
    from evolm.errors import UserError
    from evolm.es.ask_tell import AskTell
    from evolm.pipeline import PipelineJob

    with pytest.raises(ConfigError, match="es.arithmetic must be exact in a pipeline"):
        config.from_dict(PipelineJob, {}, ["es.arithmetic='reference'"])
    with pytest.raises(UserError, match="es.arithmetic='exact'"):
        AskTell(tiny_model, overrides=["es.arithmetic='reference'"])


# -- the engine: metrics, resume and replay bit for bit ------------------------------------------------

def _cfg(tmp_path, iterations=4, checkpoint_every=0):
    cfg = tiny_es_cfg(tmp_path, population=4, prompts=4, iterations=iterations, max_new_tokens=6, model_dtype="bfloat16",
                      arithmetic="reference", reference_error_sample=4096)
    cfg.run.checkpoint_every = checkpoint_every
    config.validate(cfg)
    return cfg


def test_reference_run_logs_its_error_and_resumes_and_replays_bit_for_bit(tmp_path, tokenizer, vowel_task):
    from conftest import make_tiny_model

    from evolm.backends.hf import HFGenerator
    from evolm.es.engine import replay
    from evolm.es.noise import noise_from_header
    from evolm.jobs import run_es
    from evolm.runs import RunDir

    run_a, straight = run_tiny_es(_cfg(tmp_path / "a"), tokenizer, vowel_task)
    base = make_tiny_model(tokenizer).to(torch.bfloat16)
    assert any(not torch.equal(p, q) for p, q in zip(straight.parameters(), base.parameters()))  # training moved weights
    header = run_a.seed_log()[0]
    assert header["perturb"] == {"arithmetic": "reference-in-place-model-dtype", "path": "reference"}
    records = [r for r in run_a.metrics() if r.get("kind") == "train"]
    assert len(records) == 4 and all(r["ref_sample"] == 4096 and r["ref_error_rel"] > 0 for r in records)
    assert records[-1]["ref_error_frac"] > 0 and records[-1]["ref_moved_ratio"] > 0

    cfg_b = _cfg(tmp_path / "b", checkpoint_every=2)
    with pytest.raises(Kill):
        run_tiny_es(cfg_b, tokenizer, vowel_task, callbacks=(kill_at(3),))
    run_b = RunDir.open(tmp_path / "b" / "run")
    assert run_b.latest_checkpoint()[1]["step"] == 2
    fresh = make_tiny_model(tokenizer).to(torch.bfloat16)
    run_es(cfg_b, resume=run_b, model=fresh, tokenizer=tokenizer, task=vowel_task,
           generator=HFGenerator(fresh, tokenizer, 16), quiet=True)
    for (n, p), (_, q) in zip(straight.named_parameters(), fresh.named_parameters()):
        assert p.dtype == torch.bfloat16 and torch.equal(p.view(torch.int16), q.view(torch.int16)), n
    resumed = [r for r in run_b.metrics() if r.get("kind") == "train"]
    assert [r["ref_error_rel"] for r in resumed] == [r["ref_error_rel"] for r in records]  # the shadow was rebuilt

    replayed = make_tiny_model(tokenizer).to(torch.bfloat16)
    replay(replayed, run_a.seed_log(), _cfg(tmp_path / "a"))
    for (n, p), (_, q) in zip(straight.named_parameters(), replayed.named_parameters()):
        assert torch.equal(p.view(torch.int16), q.view(torch.int16)), n
    updates_only = make_tiny_model(tokenizer).to(torch.bfloat16)  # without the members' perturb/restore: not the run
    params = ReferenceParamSet(updates_only, None, lr=0.01)
    params.noise = noise_from_header(header["noise"], params.layout)
    for r in run_a.seed_log()[1:]:
        assert params.apply_update(r["iteration"], r["coefficients"], r["scale"])
    assert any(not torch.equal(p, q) for p, q in zip(straight.parameters(), updates_only.parameters()))


def test_exact_and_reference_runs_refuse_each_others_seed_logs(tmp_path, tokenizer, vowel_task):
    from evolm.es.engine import replay

    run, _ = run_tiny_es(_cfg(tmp_path, iterations=1), tokenizer, vowel_task)
    exact = _cfg(tmp_path, iterations=1)
    exact.es.arithmetic = "exact"
    from conftest import make_tiny_model

    with pytest.raises(ConfigError, match="es.arithmetic='exact'"):
        replay(make_tiny_model(tokenizer).to(torch.bfloat16), run.seed_log(), exact)


def test_a_reference_run_without_weights_resumes_by_replay_with_its_rounding(tmp_path, tokenizer, vowel_task):
    """Replay-resume of a reference run redoes every member's perturb/restore (its rounding) and builds the
    exact shadow once: weights, and the logged restore error, equal the uninterrupted run's."""
    import shutil

    from conftest import make_tiny_model

    from evolm.backends.hf import HFGenerator
    from evolm.jobs import run_es
    from evolm.runs import RunDir

    run_a, straight = run_tiny_es(_cfg(tmp_path / "a"), tokenizer, vowel_task)

    cfg_b = _cfg(tmp_path / "b", checkpoint_every=2)
    with pytest.raises(Kill):
        run_tiny_es(cfg_b, tokenizer, vowel_task, callbacks=(kill_at(3),))
    run_b = RunDir.open(tmp_path / "b" / "run")
    shutil.rmtree(run_b.checkpoint_dir)
    shutil.rmtree(run_b.path / "base")  # a copy without weights has no base/ either
    fresh = make_tiny_model(tokenizer).to(torch.bfloat16)
    run_es(cfg_b, resume=run_b, model=fresh, tokenizer=tokenizer, task=vowel_task,
           generator=HFGenerator(fresh, tokenizer, 16), quiet=True)
    for (n, p), (_, q) in zip(straight.named_parameters(), fresh.named_parameters()):
        assert torch.equal(p.view(torch.int16), q.view(torch.int16)), n
    from transformers import AutoModelForCausalLM  # the analyses' base: rebuilt, with the recorded fingerprint

    from evolm.state import model_fingerprint

    rebuilt = AutoModelForCausalLM.from_pretrained(run_b.path / "base", dtype=torch.bfloat16)
    assert model_fingerprint(rebuilt) == run_b.info()["base"]["fingerprint"]
    first = [r["ref_error_rel"] for r in run_a.train_records()]
    assert [r["ref_error_rel"] for r in run_b.train_records()] == first  # step 4's shadow was not doubled


def test_the_null_walk_trains_without_generating_and_replays_bit_for_bit(tmp_path, tokenizer, vowel_task):
    """experiments/refnum/null_walk.py: seeded random fitness through run_es's population_factory; the
    members are still perturbed and restored (reference arithmetic), nothing is generated, the weights
    move, and `replay` (which knows nothing of the fitness) rebuilds them from the seed log."""
    import importlib.util
    from pathlib import Path

    from conftest import make_tiny_model

    from evolm.backends.hf import HFGenerator
    from evolm.es.engine import replay
    from evolm.jobs import run_es

    path = Path(__file__).resolve().parents[1] / "experiments" / "refnum" / "null_walk.py"
    spec = importlib.util.spec_from_file_location("null_walk", path)
    null_walk = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(null_walk)
    cfg = _cfg(tmp_path, iterations=3)
    model = make_tiny_model(tokenizer).to(torch.bfloat16)
    before = [p.detach().clone() for p in model.parameters()]

    def factory(cfg, params, generator, task):
        return null_walk.NullFitnessPopulation(params, generator, task, cfg.run.seed, reference=True)

    run = run_es(cfg, model=model, tokenizer=tokenizer, task=vowel_task, generator=HFGenerator(model, tokenizer, 16),
                 quiet=True, population_factory=factory)
    train = run.train_records()
    assert [r["gen_tokens"] for r in train] == [0, 0, 0] and all(r["seconds_restore"] > 0 for r in train)
    assert all(r["update_status"] == "applied" and r["ref_error_rel"] > 0 for r in train)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    again = make_tiny_model(tokenizer).to(torch.bfloat16)
    replay(again, run.seed_log(), cfg)
    for p, q in zip(model.parameters(), again.parameters()):
        assert torch.equal(p.view(torch.int16), q.view(torch.int16))
