"""ES engine: noise keys, exact restore, estimators, shaping, degenerate fitness, learning, resume, replay."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import Kill, kill_at, run_tiny_es, tiny_es_cfg

from evolm import config
from evolm.es import shaping
from evolm.es.noise import StreamNoise, TableNoise
from evolm.seeding import derive_seed
from evolm.es.params import ParamSet, select_parameters
from evolm.es.update import compute_update, member_layout, step_scale


# -- noise ------------------------------------------------------------------------------------------

def test_derive_seed_is_deterministic_and_distinct():
    a = derive_seed(7, "noise", 3, 1, 2)
    assert a == derive_seed(7, "noise", 3, 1, 2)
    keys = {derive_seed(7, "noise", it, m, p) for it in range(4) for m in range(4) for p in range(4)}
    assert len(keys) == 64
    assert derive_seed(7, "noise", 0, 0, 1) != derive_seed(8, "noise", 0, 0, 1)
    code = "from evolm.seeding import derive_seed; print(derive_seed(7, 'noise', 3, 1, 2))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert int(out) == a  # same value in a fresh process


@pytest.mark.parametrize("source", [StreamNoise(11), TableNoise(11, size=1 << 16)])
def test_noise_is_standard_normal_and_independent_across_keys(source):
    n = 4000
    base = source.direction(0, 0, 0, n)
    assert torch.equal(base, source.direction(0, 0, 0, n))  # regenerable
    assert abs(float(base.mean())) < 0.1 and abs(float(base.std()) - 1) < 0.1
    others = [source.direction(0, 0, 1, n),  # another tensor, same member (same shape!)
              source.direction(0, 1, 0, n),  # another member
              source.direction(1, 0, 0, n)]  # another iteration
    for other in others:
        assert not torch.equal(base, other)
        corr = float(torch.corrcoef(torch.stack([base, other]))[0, 1])
        assert abs(corr) < 0.08  # ~5 standard errors at n=4000


def test_table_noise_rejects_tensors_larger_than_the_table():
    with pytest.raises(ValueError, match="noise_table_size"):
        TableNoise(0, size=100).direction(0, 0, 0, 101)  # the per-tensor scheme of earlier runs


def _smollm2_layout():
    """(noise index, numel) of every SmolLM2-135M parameter, from its config (no weights are loaded)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from evolm import models

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(models.local_dir(models.DEFAULT_MODEL)))
    return ParamSet(model, None).layout


def test_member_noise_never_reuses_a_table_value_in_the_real_regime():
    """SmolLM2-135M, all parameters, the default table: each member's noise is one stretch of distinct
    table entries, the tensors' windows tile it in order, and nothing wraps."""
    from evolm.es.noise import make_noise

    layout = _smollm2_layout()
    total = sum(n for _, n in layout)
    assert total == 134_515_008
    noise = make_noise("table", 7, layout)
    assert noise.size >= total and not noise.reuses_within_member
    for iteration, direction in [(0, 0), (3, 5), (199, 31)]:
        o = noise.member_offset(iteration, direction)
        starts = [noise.offset(iteration, direction, i, n) for i, n in layout]
        ends = [s + n for s, (_, n) in zip(starts, layout)]
        assert starts[0] == o and all(b == a for a, b in zip(ends, starts[1:]))  # contiguous, disjoint, in order
        assert ends[-1] - o == total and ends[-1] <= noise.size  # inside the table: no wrap
    assert noise.member_offset(0, 0) != noise.member_offset(0, 1) != noise.member_offset(1, 0)
    emb, other = layout[0], layout[5]
    a, b = noise.direction(0, 0, *emb), noise.direction(0, 0, *other)
    assert not torch.equal(a[:b.numel()], b)  # no tensor's noise is a copy of another's


def test_a_smaller_table_wraps_and_says_so():
    from evolm.es.noise import make_noise

    layout = [(0, 600), (3, 500)]
    noise = make_noise("table", 1, layout, table_size=1000)
    assert noise.reuses_within_member
    whole = torch.cat([noise.direction(2, 1, i, n) for i, n in layout])
    assert whole.numel() == 1100 and torch.equal(whole[1000:], whole[:100])  # the stretch wrapped once


# -- exact restore ------------------------------------------------------------------------------------

def _snapshot(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.fixture(params=["fused", "torch"])
def restore_path(request, monkeypatch):
    """Run a test with the compiled one-pass kernel (evolm.es.fused) and with the torch ops."""
    from evolm.es import fused

    if request.param == "fused":
        if fused.kernel() is None:
            pytest.skip("no C++ toolchain for the fused kernel")
    else:
        monkeypatch.setattr(fused, "kernel", lambda: None)
    return request.param


@pytest.mark.parametrize("kind", ["table", "stream"])
def test_many_perturb_restore_cycles_are_bit_exact(tiny_model, kind, restore_path):
    before = _snapshot(tiny_model)
    noise = TableNoise(3, size=1 << 22) if kind == "table" else StreamNoise(3)
    params = ParamSet(tiny_model, noise)
    changed = 0
    for cycle in range(60):
        sigma = [1e-3, 3e-2, 1e-5][cycle % 3]
        params.perturb(cycle, cycle % 5, 1 if cycle % 2 else -1, sigma)
        changed += sum(int((p != before[n]).sum()) for n, p in tiny_model.named_parameters())
        params.restore()
    assert changed > 0
    for n, p in tiny_model.named_parameters():
        assert torch.equal(p, before[n]), n


def test_fused_kernel_perturbs_like_the_torch_path_and_restores_exactly():
    from evolm.es import fused

    kern = fused.kernel()
    if kern is None:
        pytest.skip("no C++ toolchain for the fused kernel")
    g = torch.Generator().manual_seed(0)
    theta = torch.randn(300_000, generator=g) * 0.05
    theta[:1000] = 0.0  # zeros and sign changes are the awkward cases
    eps = torch.randn(300_000, generator=g)
    for factor in (1e-3, -3e-2, 1e-5):
        live = theta.clone()
        where, values = kern.perturb(live, eps, factor)
        # the perturbed weights are theta + (factor * eps rounded), bit for bit as the torch ops compute them
        assert torch.equal(live.view(torch.int32), torch.add(theta, torch.mul(eps, factor)).view(torch.int32))
        assert 0 < where.numel() < theta.numel() // 2 and torch.equal(values, theta[where])
        kern.restore(live, eps, factor)
        live[where] = values
        assert torch.equal(live.view(torch.int32), theta.view(torch.int32))


def test_restore_is_exact_for_bfloat16_models_via_float32_masters(tokenizer):
    from conftest import make_tiny_model

    model = make_tiny_model(tokenizer).to(torch.bfloat16)
    before = _snapshot(model)
    params = ParamSet(model, StreamNoise(0))
    assert params.masters is not None and params.masters[0].dtype == torch.float32
    for cycle in range(10):
        params.perturb(cycle, 0, 1, 1e-2)
        params.restore()
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n])


def test_tied_weights_are_perturbed_once(tiny_model):
    names = [n for _, n, _ in select_parameters(tiny_model)]
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names


def test_selection_by_category_and_regex(tiny_model):
    norms = [n for _, n, _ in select_parameters(tiny_model, ("norm",))]
    assert norms and all("norm" in n for n in norms)
    attn_q = [n for _, n, _ in select_parameters(tiny_model, ("attention",), r"q_proj")]
    assert attn_q == ["model.layers.0.self_attn.q_proj.weight", "model.layers.1.self_attn.q_proj.weight"]
    # a tensor's noise index does not depend on the selection
    full = {n: i for i, n, _ in select_parameters(tiny_model)}
    assert all(full[n] == i for i, n, _ in select_parameters(tiny_model, ("norm",)))


# -- estimators and update ---------------------------------------------------------------------------

class _Two(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Parameter(torch.tensor([1.0, -2.0, 0.5]))
        self.b = torch.nn.Parameter(torch.tensor([[0.25, 4.0], [3.0, -1.0]]))


def test_one_point_update_matches_hand_computation():
    module, noise = _Two(), StreamNoise(5)
    params = ParamSet(module, noise)
    fitness = [1.0, 0.0, 0.0, 1.0]
    upd = compute_update(fitness, estimator="one_point", shaping="zscore", lr=0.1, sigma=0.01)
    assert upd.coefficients == [1.0, -1.0, -1.0, 1.0] and upd.scale == pytest.approx(0.1 / 4)
    a0, b0 = module.a.detach().clone(), module.b.detach().clone()
    params.apply_update(0, upd.coefficients, upd.scale)
    eps_a = [noise.direction(0, d, 0, 3) for d in range(4)]
    eps_b = [noise.direction(0, d, 1, 4).view(2, 2) for d in range(4)]
    expected_a = a0 + 0.025 * (eps_a[0] - eps_a[1] - eps_a[2] + eps_a[3])
    expected_b = b0 + 0.025 * (eps_b[0] - eps_b[1] - eps_b[2] + eps_b[3])
    assert torch.allclose(module.a, expected_a, atol=1e-7)
    assert torch.allclose(module.b, expected_b, atol=1e-7)


def test_antithetic_coefficients_and_layout():
    assert member_layout("antithetic", 4) == [(0, 1), (0, -1), (1, 1), (1, -1)]
    assert member_layout("one_point", 3) == [(0, 1), (1, 1), (2, 1)]
    upd = compute_update([3.0, 1.0, 0.0, 0.0], estimator="antithetic", shaping="none", lr=1.0, sigma=0.1)
    assert upd.coefficients == [2.0, 0.0]
    assert upd.scale == pytest.approx(1.0 / 4)
    # antithetic == one-point over members with directions (eps, -eps)
    module, noise = _Two(), StreamNoise(1)
    params = ParamSet(module, noise)
    a0 = module.a.detach().clone()
    params.apply_update(0, upd.coefficients, upd.scale)
    eps0 = noise.direction(0, 0, 0, 3)
    assert torch.allclose(module.a, a0 + 0.25 * (3.0 * eps0 + 1.0 * (-eps0)), atol=1e-7)


def test_divide_by_sigma_changes_the_scale():
    assert step_scale(0.1, 4, 0.01, False) == pytest.approx(0.025)
    assert step_scale(0.1, 4, 0.01, True) == pytest.approx(2.5)


def test_degenerate_fitness_never_reaches_the_weights():
    skipped = compute_update([1.0, float("nan"), 0.0], estimator="one_point", shaping="zscore", lr=1, sigma=1)
    assert skipped.status == "skipped" and not skipped.applies and "member 1" in skipped.message
    raised = compute_update([1.0, 0.5], estimator="one_point", shaping="zscore", lr=1, sigma=1, errors={0: "ValueError: boom"})
    assert raised.status == "skipped" and "boom" in raised.message
    equal = compute_update([0.3] * 4, estimator="one_point", shaping="zscore", lr=1, sigma=1)
    assert equal.status == "zero" and equal.coefficients == [0.0] * 4 and "0.3" in equal.message


# -- shaping -----------------------------------------------------------------------------------------

def test_zscore_uses_population_std():
    out = shaping.zscore(np.array([1.0, 2.0, 3.0, 4.0]))
    f = np.array([1.0, 2.0, 3.0, 4.0])
    assert np.allclose(out, (f - 2.5) / np.sqrt(1.25))
    assert np.allclose(shaping.zscore(np.array([2.0, 2.0, 2.0])), 0)


def test_centered_rank_maps_to_half_interval_with_tied_averages():
    assert np.allclose(shaping.centered_rank(np.array([10.0, 30.0, 20.0])), [-0.5, 0.5, 0.0])
    assert np.allclose(shaping.centered_rank(np.array([1.0, 1.0, 5.0, 0.0])), [0.0, 0.0, 0.5, -0.5])
    assert np.allclose(shaping.centered_rank(np.array([4.0, 4.0])), [0.0, 0.0])


def test_none_is_identity_and_all_shapings_share_one_signature():
    f = np.array([0.1, 0.7, 0.2])
    assert np.array_equal(shaping.none(f), f)
    for fn in shaping.SHAPINGS.values():
        out = fn(f)
        assert out.shape == f.shape and np.all(np.isfinite(out))


# -- the loop on a tiny model ------------------------------------------------------------------------

def test_es_raises_reward_of_a_tiny_model(tmp_path, tokenizer, vowel_task):
    # 4 members: the mean of the last 3 updates beats the first 3 by ~0.21 (8 members: ~0.24), at half the cost
    run, _ = run_tiny_es(tiny_es_cfg(tmp_path, population=4), tokenizer, vowel_task)
    rewards = [r["reward_mean"] for r in run.metrics() if r.get("kind") == "train"]
    assert len(rewards) == 15
    assert np.mean(rewards[-3:]) > np.mean(rewards[:3]) + 0.05
    assert (run.path / "final" / "config.json").exists() and (run.path / "plots" / "reward.png").exists()
    rec = run.metrics()[-1]
    for key in ("reward_std", "reward_min", "reward_max", "seconds_generate", "seconds_perturb", "seconds_restore",
                "seconds_update", "peak_rss_mb", "gen_tokens", "gen_sequences"):
        assert key in rec


def test_sparsity_scale_from_a_real_seed_log_matches_the_weight_change(tmp_path, tokenizer, vowel_task):
    # The seed log the engine writes (header record first) gives the sparsity analysis its τ scale:
    # the per-coordinate RMS of one update, which must match the change ES actually made.
    from conftest import make_tiny_model

    from evolm.analysis.sparsity import single_update_rms
    from evolm.runs import read_jsonl

    model = make_tiny_model(tokenizer)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    run, model = run_tiny_es(tiny_es_cfg(tmp_path, iterations=1), tokenizer, vowel_task, model=model)
    records = read_jsonl(run.path / "seed_log.jsonl")
    assert records[0].get("kind") == "header" and records[1]["status"] == "applied"
    delta = torch.cat([(p.detach() - before[n]).flatten() for n, p in model.named_parameters()])
    assert float(delta.pow(2).mean().sqrt()) == pytest.approx(single_update_rms(records), rel=0.05)


def test_resume_after_a_kill_is_bit_identical_and_replay_matches(tmp_path, tokenizer, vowel_task):
    from evolm.es.engine import replay
    from evolm.jobs import run_es
    from evolm.runs import RunDir

    cfg = tiny_es_cfg(tmp_path / "a", iterations=4)
    cfg.run.checkpoint_every = 1
    _, uninterrupted = run_tiny_es(cfg, tokenizer, vowel_task)

    cfg_b = tiny_es_cfg(tmp_path / "b", iterations=4)
    cfg_b.run.checkpoint_every = 2
    with pytest.raises(Kill):
        run_tiny_es(cfg_b, tokenizer, vowel_task, callbacks=(kill_at(3),))
    run_b = RunDir.open(tmp_path / "b" / "run")
    assert run_b.latest_checkpoint()[1]["step"] == 2
    from conftest import make_tiny_model
    from evolm.backends.hf import HFGenerator

    fresh = make_tiny_model(tokenizer)
    run_es(cfg_b, resume=run_b, model=fresh, tokenizer=tokenizer, task=vowel_task,
           generator=HFGenerator(fresh, tokenizer, 16), quiet=True)
    for (n, p), (_, q) in zip(uninterrupted.named_parameters(), fresh.named_parameters()):
        assert torch.equal(p, q), n
    steps = [r["step"] for r in run_b.metrics() if r.get("kind") == "train"]
    assert steps == [1, 2, 3, 4]  # the killed step 3 was dropped and redone, not duplicated
    assert [r["status"] for r in run_b.seed_log()[1:]] == ["applied"] * 4  # the weights really moved at every update

    replayed = make_tiny_model(tokenizer)
    replay(replayed, run_b.seed_log(), cfg_b)
    for (n, p), (_, q) in zip(uninterrupted.named_parameters(), replayed.named_parameters()):
        assert torch.equal(p, q), n


def test_resume_and_replay_refuse_a_config_that_is_not_the_runs(tmp_path, tokenizer, vowel_task):
    from conftest import make_tiny_model

    from evolm.errors import ConfigError, UserError
    from evolm.es.engine import replay
    from evolm.jobs import run_es
    from evolm.runs import RunDir

    cfg = tiny_es_cfg(tmp_path, iterations=1, noise_table_size=1 << 22)
    run = run_tiny_es(cfg, tokenizer, vowel_task)[0]
    header = run.seed_log()[0]
    assert header["perturb"]["arithmetic"] == "product-rounded-then-add" and header["noise"]["scheme"] == "member"
    for change in ({"run": ("seed", 1)}, {"es": ("noise", "stream")}, {"es": ("params", ["norm"])},
                   {"es": ("noise_table_size", 1 << 21)}):
        (section, (field, value)), = change.items()
        other = tiny_es_cfg(tmp_path, iterations=2, noise_table_size=1 << 22)
        setattr(getattr(other, section), field, value)
        model = make_tiny_model(tokenizer)
        with pytest.raises(ConfigError, match="does not describe the run"):
            replay(model, run.seed_log(), other)
        with pytest.raises(UserError, match=f"may change only the budget.*{field}"):  # refused before the header check
            run_es(other, resume=RunDir.open(run.path), model=model, tokenizer=tokenizer, task=vowel_task, quiet=True)
    assert len(run.seed_log()) == 2 and RunDir.open(run.path).info()["status"] == "finished", "a refused resume changes nothing"


def test_legacy_seed_logs_replay_with_the_per_tensor_table(tiny_model):
    from evolm.es.engine import build_paramset

    cfg = tiny_es_cfg(".", noise_table_size=1 << 22)
    header = {"kind": "header", "noise": {"kind": "table", "seed": build_paramset(tiny_model, cfg).noise.seed, "size": 1 << 22}}
    params = build_paramset(tiny_model, cfg, header)
    assert params.noise.scheme == "tensor" and params.noise.describe()["size"] == 1 << 22


def test_kernel_and_torch_paths_perturb_bit_identically(tokenizer, monkeypatch):
    from conftest import make_tiny_model

    from evolm.es import fused
    from evolm.es.noise import make_noise

    if fused.kernel() is None:
        pytest.skip("no C++ toolchain for the fused kernel")
    perturbed = {}
    for path in ("kernel", "torch"):
        if path == "torch":
            monkeypatch.setattr(fused, "kernel", lambda: None)
        model = make_tiny_model(tokenizer)
        params = ParamSet(model, None)
        params.noise = make_noise("table", 5, params.layout, 1 << 22)
        assert params.perturb_path == path
        params.perturb(2, 3, -1, 3e-3)
        perturbed[path] = [t.clone() for t in params.tensors]
        params.restore()
    for a, b in zip(perturbed["kernel"], perturbed["torch"]):
        assert torch.equal(a.view(torch.int32), b.view(torch.int32))


def test_a_reward_that_raises_skips_the_update_and_keeps_weights(tmp_path, tokenizer, vowel_task):
    from conftest import make_tiny_model

    class Broken(type(vowel_task)):
        def reward(self, completion, example):
            raise ValueError("checker crashed")

    model = make_tiny_model(tokenizer)
    before = _snapshot(model)
    run, _ = run_tiny_es(tiny_es_cfg(tmp_path, iterations=2, population=2), tokenizer, Broken(), model=model)
    assert [r["update_status"] for r in run.metrics() if r.get("kind") == "train"] == ["skipped", "skipped"]
    assert "checker crashed" in run.metrics()[-1]["message"]
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n])


def test_es_restricted_to_norms_moves_only_norms(tmp_path, tokenizer, vowel_task):
    from conftest import make_tiny_model

    model = make_tiny_model(tokenizer)
    before = _snapshot(model)
    run_tiny_es(tiny_es_cfg(tmp_path, iterations=2, params=["norm"], sigma=1.0), tokenizer, vowel_task, model=model)
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert moved and all("norm" in n for n in moved)


# -- config validation -------------------------------------------------------------------------------

@pytest.mark.parametrize("override, message", [
    ("es.sigma=0", "es.sigma must be > 0"),
    ("es.population=1", "es.population must be >= 2"),
    ("es.estimator='antithetic'", None),
    ("es.sigmaa=0.1", "did you mean 'sigma'"),
    ("es.population='many'", "es.population must be an integer"),
    ("es.shaping='softmax'", "es.shaping must be one of"),
    ("es.params=['norm','bogus']", "es.params must be"),
    ("es.param_regex='('", "es.param_regex is not a valid regular expression"),
    ("model.dtype='int8'", "model.dtype must be one of"),
])
def test_config_validation_names_the_field(override, message):
    from evolm.errors import ConfigError

    if message is None:
        config.from_dict(config.ESJob, {}, [override])  # N=8 is even: fine
        with pytest.raises(ConfigError, match="even for the antithetic"):
            config.from_dict(config.ESJob, {}, [override, "es.population=5"])
        return
    with pytest.raises(ConfigError, match=message):
        config.from_dict(config.ESJob, {}, [override])


def test_cli_reports_user_errors_in_one_line(tmp_path, capsys):
    from evolm.commands import main

    bad = tmp_path / "bad.toml"
    bad.write_text("[es]\nsigma = -1\n")
    assert main(["es", "--config", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "evolm: error: es.sigma must be > 0 and <= 10 (got -1.0)"
    assert main(["es", "--config", str(tmp_path / "missing.toml")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_resolved_config_round_trips_through_toml(tmp_path):
    cfg = config.from_dict(config.ESJob, {"es": {"sigma": 0.002}}, ["task.params.digits=3"])
    path = tmp_path / "c.toml"
    path.write_text(config.to_toml(cfg))
    again = config.load(config.ESJob, path)
    assert again == cfg and again.task.params == {"digits": 3}


def test_a_run_without_weights_resumes_by_replaying_its_seed_log(tmp_path, tokenizer, vowel_task):
    """A run directory copied without checkpoints/ and final/ (committed under docs/, carried to another
    session) continues after its last logged update, bit-identical to the run that was never stopped."""
    import shutil

    from conftest import make_tiny_model

    from evolm.backends.hf import HFGenerator
    from evolm.errors import UserError
    from evolm.jobs import run_es
    from evolm.runs import RunDir, atomic_write_jsonl

    _, uninterrupted = run_tiny_es(tiny_es_cfg(tmp_path / "a", iterations=4), tokenizer, vowel_task)

    cfg_b = tiny_es_cfg(tmp_path / "b", iterations=4)
    cfg_b.run.checkpoint_every = 1
    with pytest.raises(Kill):
        run_tiny_es(cfg_b, tokenizer, vowel_task, callbacks=(kill_at(3),))
    run_b = RunDir.open(tmp_path / "b" / "run")
    shutil.rmtree(run_b.checkpoint_dir)  # the weights stayed behind: only the logs travel
    seconds_3 = [r for r in run_b.train_records() if r["step"] == 3][0]["seconds_total"]

    torn = run_b.seed_log()
    atomic_write_jsonl(run_b.seed_log_path, [torn[0], torn[1], torn[3]])  # update 2 missing
    with pytest.raises(UserError, match="does not hold updates 1..3 in order"):
        run_es(cfg_b, resume=run_b, model=make_tiny_model(tokenizer), tokenizer=tokenizer, task=vowel_task, quiet=True)
    atomic_write_jsonl(run_b.seed_log_path, torn)
    ray = tiny_es_cfg(tmp_path / "b", iterations=4)
    ray.distributed.workers = 2
    with pytest.raises(UserError, match="resume with --set distributed.workers=0"):
        run_es(ray, resume=run_b, model=make_tiny_model(tokenizer), tokenizer=tokenizer, task=vowel_task, quiet=True)

    fresh = make_tiny_model(tokenizer)
    run_es(cfg_b, resume=run_b, model=fresh, tokenizer=tokenizer, task=vowel_task,
           generator=HFGenerator(fresh, tokenizer, 16), quiet=True)
    for (n, p), (_, q) in zip(uninterrupted.named_parameters(), fresh.named_parameters()):
        assert torch.equal(p, q), n
    train = run_b.train_records()
    assert [r["step"] for r in train] == [1, 2, 3, 4]  # 1-3 kept (replayed, not redone), 4 trained
    assert train[-1]["seconds_total"] > seconds_3  # the totals continue from update 3's
    assert [r["status"] for r in run_b.seed_log()[1:]] == ["applied"] * 4
    assert run_b.config_history()[-1]["resumed_from"] == "update 3 (its seed log replayed: no checkpoint)"


def test_replay_says_what_it_rebuilds_at_step_zero():
    """issue 44.5: replay --step 0 printed 'updates 1..0'."""
    from evolm.jobs import replay_line

    assert replay_line("runs/a", "m", 0, "out") == "[evolm] replaying runs/a: m with no update (step 0, the base model) -> out"
    assert replay_line("runs/a", "m", 1, "out") == "[evolm] replaying runs/a: m + update 1 of the seed log -> out"
    assert replay_line("runs/a", "m", 3, "out") == "[evolm] replaying runs/a: m + updates 1..3 of the seed log -> out"
