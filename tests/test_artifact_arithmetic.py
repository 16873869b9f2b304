"""es.arithmetic = "artifact": the published code of arXiv 2608.27351 (evolm/es/artifact.py).

The transcription below is its worker's arithmetic (github.com/yunpengba7/understanding-es at 240d878,
src/es_reproduction/worker.py ``_apply_seeded_noise`` and ``_apply_population_update``; the loop of
train.py ``EngineEvaluator.evaluate_perturbations``), written in plain torch for one engine, with one
change: the noise of (member, tensor) is evolm's float32 noise instead of ``torch.randn`` from
``seed XOR blake2b(name)`` on a CUDA generator.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import Kill, kill_at, make_tiny_model, run_tiny_es, tiny_es_cfg
from test_reference_arithmetic import UNTESTED_WITH_IN_PLACE_ARITHMETIC, refused_in_one_line

from evolm import config
from evolm.errors import ConfigError
from evolm.es.artifact import ArtifactParamSet, member_engines
from evolm.es.noise import CounterNoise, NoiseSource, TableNoise
from evolm.es.reference import ReferenceParamSet

SIGMA, LR = 0.001, 0.0005


def _bits(t):
    return t.detach().view(torch.int16 if t.dtype in (torch.bfloat16, torch.float16) else torch.int32)


def _same(a, b) -> bool:
    return all(torch.equal(_bits(p), _bits(q)) for p, q in zip(a.parameters(), b.parameters()))


def _zscore(rewards):  # the artifact's normalize_population_rewards (ddof 0, + 1e-8), as evolm's coefficients
    r = np.asarray(rewards, dtype=np.float64)
    return ((r - r.mean()) / (r.std() + 1e-8)).tolist()


def _rewards(iterations=3, population=6, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.random(population).tolist() for _ in range(iterations)]


# -- the member split ----------------------------------------------------------------------------------

def test_members_are_split_in_contiguous_blocks_as_the_artifact_shards_its_seeds():
    assert member_engines(32, 8) == [m // 4 for m in range(32)]  # train.py shard_seeds: ceil(32 / 8) = 4 each
    assert member_engines(5, 4) == [0, 0, 1, 1, 2]  # ceil(5 / 4) = 2: engine 3 gets none
    assert member_engines(6, 1) == [0] * 6


# -- a hand-computed cycle -------------------------------------------------------------------------------

class FixedNoise(NoiseSource):
    """The same given float32 values for every (iteration, member, tensor)."""

    kind = "fixed"

    def __init__(self, values):
        self.values = torch.tensor(values, dtype=torch.float32)

    def direction(self, iteration, direction, param_index, numel):
        return self.values.clone()

    def max_abs(self):
        return float(self.values.abs().max())


class OneTensor(torch.nn.Module):
    def __init__(self, values, dtype=torch.bfloat16):
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor(values, dtype=dtype), requires_grad=False)


def test_a_perturb_revert_cycle_in_bf16_loses_exactly_what_the_rounding_predicts():
    """sigma = 0.003: fp32(0.003) = 0.0030000000261 rounds to bf16 1.5390625 * 2^-9 = 0.0030059814453125 =: d
    (0.003 / 2^-9 = 1.536, x 128 = 196.608 -> 197). bf16 spacing is 2^-7 on [1, 2), 2^-8 on [0.5, 1).

    w = 1, eps = +1:  1 + d = 1 + 0.385 ulp -> 1 (the member is the centre); revert 1 - d = 1 - 0.770 ulp(2^-8)
                      -> 1 - 2^-8 = 0.99609375: one step down, though the member never moved.
    w = 1, eps = -1:  1 - d -> 0.99609375; revert 0.99609375 + d = 0.99609375 + 0.770 ulp -> 1: exact.
    w = 1, eps = +2:  fp32(0.006) -> bf16 1.5390625 * 2^-8 = 0.006011962890625; 1 + 0.770 ulp -> 1.0078125;
                      revert 1.0078125 - 0.00601 = 1 + 0.230 ulp -> 1: exact.
    w = 0, eps = +1:  0 + d = d exactly, d - d = 0: exact.
    w = -1, eps = -1: the first case mirrored: -0.99609375.
    w = 1.0078125, eps = +1: 1 + 1.385 ulp -> 1.0078125 (unmoved); revert 1 + 0.615 ulp -> 1.0078125: exact."""
    w = [1.0, 1.0, 1.0, 0.0, -1.0, 1.0078125]
    eps = [1.0, -1.0, 2.0, 1.0, -1.0, 1.0]
    model = OneTensor(w)
    params = ArtifactParamSet(model, FixedNoise(eps), lr=LR, population=1)
    params.perturb(0, 0, +1, 0.003)
    assert model.w.tolist() == [1.0, 0.99609375, 1.0078125, 0.0030059814453125, -1.0, 1.0078125]
    params.restore()
    assert model.w.tolist() == [0.99609375, 1.0, 1.0, 0.0, -0.99609375, 1.0078125]
    # the same by numpy's float32 and an explicit round-to-nearest-even onto bf16's 8 significant bits
    d = _to_bf16(np.float32(eps) * np.float32(0.003))
    up = _to_bf16(np.float32(w) + d)
    assert (_to_bf16(up - d) == model.w.float().numpy()).all()


def _to_bf16(x) -> np.ndarray:
    """float32 -> nearest bfloat16 (ties to even), returned as float32 (finite values)."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
    return rounded.astype(np.uint32).view(np.float32)


def test_the_artifact_rounds_the_product_once_where_reference_rounds_the_noise_first():
    """eps = 1 + 2^-8 (exact in float32, a tie in bf16 -> 1), sigma = 0.75: the artifact's delta is
    bf16(fp32(0.75 * 1.00390625) = 0.7529296875) = 0.75390625 (0.75 + 0.75 ulp of 2^-8); Qiu et al.'s
    (reference) rounds eps to bf16 first, 1.0, so its delta is 0.75. On w = 0 the member shows it."""
    eps = [1.00390625]
    art, ref = OneTensor([0.0]), OneTensor([0.0])
    ArtifactParamSet(art, FixedNoise(eps), lr=LR, population=1).perturb(0, 0, +1, 0.75)
    ReferenceParamSet(ref, FixedNoise(eps), lr=LR).perturb(0, 0, +1, 0.75)
    assert (art.w.item(), ref.w.item()) == (0.75390625, 0.75)


def test_the_update_is_summed_in_float32_and_rounded_once():
    """Four members whose steps (lr / N) * c * eps = 2^-10 each: summed in float32, 2^-8, then added to
    w = 1 once: 1 + 0.5 ulp, a tie -> 1 (even). Reference (bf16 sum of noise * c, / N, * lr) gives the
    same sum here; what differs is every intermediate rounding, tested on a model below."""
    model = OneTensor([1.0, 0.5])
    params = ArtifactParamSet(model, FixedNoise([1.0, 1.0]), lr=4 * 2 ** -10, population=4)
    assert params.apply_update(0, [1.0, 1.0, 1.0, 1.0], 2 ** -10)
    assert model.w.tolist() == [1.0, 0.50390625]  # 0.5 + 2^-8 = one ulp on [0.5, 1): representable


# -- K = 1 is the artifact's single-engine loop ------------------------------------------------------------

def _noise_fn(noise, model):
    index = {id(p): i for i, (_, p) in reversed(list(enumerate(model.named_parameters(remove_duplicate=False))))}
    return lambda param, iteration, member: noise.direction(iteration, member, index[id(param)], param.numel()).view_as(param)


@torch.no_grad()
def transcription(model, noise, rewards_per_iteration, members=None):
    """The artifact's worker on one engine: ``members(iteration)`` the members it scores (default all)."""
    noise_of = _noise_fn(noise, model)
    params = [p for _, p in model.named_parameters()]  # named_parameters() drops tied duplicates, as _named_parameters
    for iteration, rewards in enumerate(rewards_per_iteration):
        population = len(rewards)
        for member in (members or range(population)):
            for sigma in (SIGMA, -SIGMA):  # apply_perturbation, then revert_perturbation
                for p in params:
                    delta = noise_of(p, iteration, member).clone()
                    delta.mul_(float(sigma))
                    p.add_(delta.to(dtype=p.dtype))
        weights = _zscore(rewards)
        scale = float(LR) / population
        for p in params:  # _apply_population_update
            total = torch.zeros(p.shape, dtype=torch.float32)
            for member, weight in enumerate(weights):
                total.add_(noise_of(p, iteration, member), alpha=float(scale * weight))
            p.add_(total.to(dtype=p.dtype))
    return model


def _evolm_loop(model, noise, rewards_per_iteration, engines=1, sync_every=0):
    params = ArtifactParamSet(model, noise, lr=LR, population=len(rewards_per_iteration[0]), engines=engines,
                              sync_every=sync_every)
    for iteration, rewards in enumerate(rewards_per_iteration):
        for member in range(len(rewards)):
            params.perturb(iteration, member, +1, SIGMA)
            params.restore()
        assert params.apply_update(iteration, _zscore(rewards), LR / len(rewards))
        params.end_step(iteration + 1)
    return params


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("kind", ["table", "counter"])
def test_one_engine_is_bit_identical_to_the_transcribed_single_engine_loop(tokenizer, dtype, kind):
    noise = {"table": lambda: TableNoise(5, size=1 << 22), "counter": lambda: CounterNoise(5)}[kind]()
    rewards = _rewards()
    base = make_tiny_model(tokenizer, hidden=32, layers=1).to(dtype)
    ref = transcription(make_tiny_model(tokenizer, hidden=32, layers=1).to(dtype), noise, rewards)
    for sync_every in (0, 1):  # one engine: a sync has nothing to copy
        ours = make_tiny_model(tokenizer, hidden=32, layers=1).to(dtype)
        _evolm_loop(ours, noise, rewards, engines=1, sync_every=sync_every)
        assert _same(ref, ours)
        assert not _same(ours, base)


def test_the_chunked_arithmetic_is_the_whole_tensor_loop_at_any_chunk_size(tokenizer, monkeypatch):
    """perturb, revert and the update run CHUNK values at a time; at 4096 values per chunk (the embedding: 384
    chunks, the last partial) one engine is still the transcribed whole-tensor worker bit for bit, and two
    engines (swaps, two replicas updated chunk by chunk) the same as at the default chunk size."""
    import evolm.es.reference as reference

    noise = TableNoise(5, size=1 << 22)
    rewards = _rewards()
    ref = transcription(make_tiny_model(tokenizer, hidden=32, layers=1).to(torch.bfloat16), noise, rewards)
    two = make_tiny_model(tokenizer, hidden=32, layers=1).to(torch.bfloat16)
    default_two = _evolm_loop(two, noise, rewards, engines=2)
    monkeypatch.setattr(reference, "CHUNK", 4096)
    monkeypatch.setattr("evolm.es.artifact.CHUNK", 4096)
    ours = make_tiny_model(tokenizer, hidden=32, layers=1).to(torch.bfloat16)
    _evolm_loop(ours, noise, rewards, engines=1)
    assert _same(ref, ours)
    small_two = make_tiny_model(tokenizer, hidden=32, layers=1).to(torch.bfloat16)
    params = _evolm_loop(small_two, noise, rewards, engines=2)
    assert _same(small_two, two) and not params.replicas_equal()
    assert all(torch.equal(_bits(a), _bits(b)) for a, b in zip(params.replica(1), default_two.replica(1)))


@pytest.mark.parametrize("sync_every", [0, 1, 2])
def test_given_the_coefficients_replica_0_is_the_loop_over_engine_0s_members(tokenizer, sync_every):
    """A sync copies replica 0 into the others, never the other way, so replica 0 (the saved model) only
    ever went through its own members' perturb/revert cycles: given the coefficients, it is one engine
    scoring members 0..N/K-1 (with every member's coefficient in the update), whatever the sync schedule.
    The other replicas act on it only through the fitness of their members."""
    noise = CounterNoise(7)
    rewards = _rewards(population=6)
    ref = transcription(make_tiny_model(tokenizer, hidden=32, layers=1).to(torch.bfloat16), noise, rewards, members=range(3))
    ours = make_tiny_model(tokenizer, hidden=32, layers=1).to(torch.bfloat16)
    params = _evolm_loop(ours, noise, rewards, engines=2, sync_every=sync_every)
    assert _same(ref, ours)
    assert params.replicas_equal() == (sync_every == 1)  # 3 updates: synced after the last only when 1 divides 3
    one = make_tiny_model(tokenizer, hidden=32, layers=1).to(torch.bfloat16)  # all members on one engine: other bits
    _evolm_loop(one, noise, rewards, engines=1)
    assert not _same(one, ours)


def test_the_artifact_and_reference_arithmetic_differ_on_a_model(tokenizer):
    noise, rewards = CounterNoise(5), _rewards()
    art = make_tiny_model(tokenizer, hidden=32, layers=1).to(torch.bfloat16)
    _evolm_loop(art, noise, rewards)
    ref = make_tiny_model(tokenizer, hidden=32, layers=1).to(torch.bfloat16)
    params = ReferenceParamSet(ref, noise, lr=LR)
    for iteration, r in enumerate(rewards):
        for member in range(len(r)):
            params.perturb(iteration, member, +1, SIGMA)
            params.restore()
        assert params.apply_update(iteration, _zscore(r), LR / len(r))
    assert not _same(art, ref)


# -- replicas ---------------------------------------------------------------------------------------------

def test_replicas_diverge_between_syncs_and_are_equal_right_after_one(tokenizer):
    model = make_tiny_model(tokenizer, hidden=32, layers=1).to(torch.bfloat16)
    params = ArtifactParamSet(model, CounterNoise(3), lr=LR, population=4, engines=2, sync_every=2)
    for iteration in range(4):
        for member in range(4):
            params.perturb(iteration, member, +1, SIGMA)
            assert params.active == member // 2  # members 0, 1 on replica 0; 2, 3 on replica 1
            params.restore()
        assert params.apply_update(iteration, [1.0, -0.5, 0.2, -0.7], LR / 4)
        synced = params.end_step(iteration + 1)
        assert params.active == 0
        assert synced == (iteration % 2 == 1)
        assert params.replicas_equal() == synced  # between syncs each replica carries its own reverts


def test_divergence_before_a_sync_is_each_replicas_distance_and_differing_share_from_replica_0(tokenizer):
    model = make_tiny_model(tokenizer, hidden=32, layers=1).to(torch.bfloat16)
    params = ArtifactParamSet(model, CounterNoise(3), lr=LR, population=6, engines=3, sync_every=2)
    for member in range(6):  # two members per replica, one lossy cycle each
        params.perturb(0, member, +1, SIGMA)
        params.restore()
    assert params.apply_update(0, [1.0, -0.5, 0.2, -0.7, 0.3, 0.1], LR / 6)
    assert params.end_step(1) is False and params.last_sync_divergence is None
    zero, expected = [t.float() for t in params.replica(0)], []
    for r in (1, 2):  # computed here directly, over every coordinate at once
        other = [t.float() for t in params.replica(r)]
        dist = torch.sqrt(sum(((b - a).double() ** 2).sum() for a, b in zip(zero, other))) / \
            torch.sqrt(sum((a.double() ** 2).sum() for a in zero))
        differ = sum(int((_bits(a.bfloat16()) != _bits(b.bfloat16())).sum()) for a, b in zip(zero, other))
        expected.append((float(dist), differ / sum(a.numel() for a in zero)))
    assert params.end_step(2) is True and params.replicas_equal()
    d = params.last_sync_divergence
    assert d["relative_distance"] == pytest.approx([e[0] for e in expected], rel=1e-9)
    assert d["differing"] == [e[1] for e in expected] and 0 < d["differing_max"] < 1
    assert d["relative_distance_max"] == max(d["relative_distance"]) > 0


def test_members_score_on_their_replicas_weights(tokenizer):
    model = make_tiny_model(tokenizer, hidden=32, layers=1).to(torch.bfloat16)
    params = ArtifactParamSet(model, CounterNoise(3), lr=LR, population=2, engines=2)
    params.perturb(0, 1, +1, SIGMA)  # replica 1 in the model, perturbed
    params.restore()
    moved_1 = [t.clone() for t in params.tensors]
    params.activate(0)
    assert [torch.equal(a, b) for a, b in zip(params.replica(1), moved_1)] == [True] * len(moved_1)
    assert not all(torch.equal(a, b) for a, b in zip(params.tensors, moved_1))  # replica 0 did not see member 1


# -- the engine: training, seed log, replay and resume bit for bit ---------------------------------------------

def _cfg(tmp_path, iterations=3, checkpoint_every=0, engines=2, sync_every=2):
    cfg = tiny_es_cfg(tmp_path, population=4, prompts=4, iterations=iterations, max_new_tokens=6, model_dtype="bfloat16",
                      arithmetic="artifact", engines=engines, engine_sync_every=sync_every, reference_error_sample=4096)
    cfg.run.checkpoint_every = checkpoint_every
    config.validate(cfg)
    return cfg


def test_an_artifact_run_trains_logs_its_syncs_and_replays_bit_for_bit(tmp_path, tokenizer, vowel_task):
    from evolm.es.engine import replay

    run, trained = run_tiny_es(_cfg(tmp_path, iterations=3), tokenizer, vowel_task)
    assert not _same(trained, make_tiny_model(tokenizer).to(torch.bfloat16))  # training moved the weights
    log = run.seed_log()
    assert log[0]["perturb"] == {"arithmetic": "artifact-float32-noise-cast-in-place", "path": "artifact",
                                 "engines": 2, "engine_sync_every": 2}
    assert [bool(r.get("engine_sync")) for r in log[1:]] == [False, True, True]  # step 2 (period), step 3 (the end)
    records = run.train_records()
    assert all(r["ref_sample"] == 4096 and r["ref_error_rel"] > 0 for r in records)
    # the divergence is logged at the syncs only (steps 2 and 3), measured just before them
    assert ["replica_divergence" in r for r in records] == [False, True, True]
    assert records[1]["replica_divergence"]["differing_max"] > 0
    replayed = make_tiny_model(tokenizer).to(torch.bfloat16)
    params = replay(replayed, log, _cfg(tmp_path, iterations=3))
    assert _same(trained, replayed) and params.replicas_equal()
    before_sync = make_tiny_model(tokenizer).to(torch.bfloat16)  # update 1 only: the replicas differ there
    params = replay(before_sync, log[:2], _cfg(tmp_path, iterations=3))
    assert not params.replicas_equal()
    with pytest.raises(ConfigError, match="es.engines is 4 but the run had 2"):
        replay(make_tiny_model(tokenizer).to(torch.bfloat16), log, _cfg(tmp_path, iterations=3, engines=4))
    exact = _cfg(tmp_path, iterations=3)
    exact.es.arithmetic, exact.es.engines, exact.es.engine_sync_every = "exact", 1, 0
    with pytest.raises(ConfigError, match="es.arithmetic='exact'"):
        replay(make_tiny_model(tokenizer).to(torch.bfloat16), log, exact)


def test_an_artifact_run_resumes_from_a_checkpoint_bit_for_bit(tmp_path, tokenizer, vowel_task):
    """Checkpoints follow a sync (as the artifact's), so replicas restart from the checkpoint's weights."""
    from evolm.runs import RunDir

    _, straight = run_tiny_es(_cfg(tmp_path / "a", iterations=4, sync_every=3), tokenizer, vowel_task)
    cfg_b = _cfg(tmp_path / "b", iterations=4, checkpoint_every=2, sync_every=3)
    with pytest.raises(Kill):
        run_tiny_es(cfg_b, tokenizer, vowel_task, callbacks=(kill_at(3),))
    run_b = RunDir.open(tmp_path / "b" / "run")
    assert run_b.latest_checkpoint()[1]["step"] == 2
    assert [bool(r.get("engine_sync")) for r in run_b.seed_log()[1:]] == [False, True, True]  # 2: checkpoint, 3: period
    _, resumed = run_tiny_es(cfg_b, tokenizer, vowel_task, resume=run_b)
    assert _same(straight, resumed)


# -- what is refused ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("overrides, fix", UNTESTED_WITH_IN_PLACE_ARITHMETIC + [(["es.engines=9"], "lower es.engines")])
def test_untested_combinations_are_refused_in_one_line(overrides, fix):
    refused_in_one_line("artifact", overrides, fix)


@pytest.mark.parametrize("field", ["es.engines=2", "es.engine_sync_every=3"])
def test_engines_without_the_artifact_arithmetic_are_refused(field):
    with pytest.raises(ConfigError, match="set es.arithmetic='artifact'"):
        config.from_dict(config.ESJob, {}, [field])


def test_the_memory_account_has_the_replicas():
    from evolm.memory import ModelShape, es_account

    cfg = config.from_dict(config.ESJob, {}, ["es.arithmetic='artifact'", "es.engines=8", "model.dtype='bfloat16'"])
    shape = ModelShape(params=134_515_008, largest=28_311_552, layers=30, kv_heads=3, head_dim=64, vocab=49152)
    lines = {ln.item: ln.bytes for ln in es_account(cfg, shape, cuda_here=False)}
    assert lines["engine replicas (es.engines - 1 copies)"] == 7 * 134_515_008 * 2  # 1.9 GB for SmolLM2-135M
    assert "float32 masters" not in lines


def test_the_null_walk_takes_the_artifact_arithmetic_and_replays_bit_for_bit(tmp_path, tokenizer, vowel_task):
    """experiments/refnum/null_walk.py with es.arithmetic = "artifact": every member perturbed and reverted on its
    replica, nothing generated, the syncs logged, and `replay` rebuilds the weights from the seed log."""
    import importlib.util
    from pathlib import Path

    from evolm.backends.hf import HFGenerator
    from evolm.es.engine import replay
    from evolm.jobs import run_es

    path = Path(__file__).resolve().parents[1] / "experiments" / "refnum" / "null_walk.py"
    spec = importlib.util.spec_from_file_location("null_walk", path)
    null_walk = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(null_walk)
    cfg = _cfg(tmp_path, iterations=3)
    model = make_tiny_model(tokenizer).to(torch.bfloat16)

    def factory(cfg, params, generator, task):
        return null_walk.NullFitnessPopulation(params, generator, task, cfg.run.seed, reference=cfg.es.arithmetic != "exact")

    run = run_es(cfg, model=model, tokenizer=tokenizer, task=vowel_task, generator=HFGenerator(model, tokenizer, 16),
                 quiet=True, population_factory=factory)
    train = run.train_records()
    assert [r["gen_tokens"] for r in train] == [0, 0, 0] and all(r["seconds_restore"] > 0 for r in train)
    assert [bool(r.get("engine_sync")) for r in run.seed_log()[1:]] == [False, True, True]
    assert not _same(model, make_tiny_model(tokenizer).to(torch.bfloat16))
    again = make_tiny_model(tokenizer).to(torch.bfloat16)
    replay(again, run.seed_log(), cfg)
    assert _same(model, again)
