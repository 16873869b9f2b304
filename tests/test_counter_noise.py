"""Counter noise (es.noise = "counter"): a pure function of (seed, iteration, direction, tensor,
element), computed where the weights are. Identity across the torch ops, the fused kernel, thread
counts and chunk sizes; keys, moments; exact restore, update, resume and replay of a tiny ES run."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from conftest import Kill, kill_at, run_tiny_es, tiny_es_cfg

from evolm.es import fused, params as params_module
from evolm.es.noise import (BULK, COUNTER_TABLE_SHA256, COUNTER_VERSION, TAIL, CounterNoise, counter_distribution,
                            counter_indices, inverse_normal_cdf, make_noise, noise_from_header, quantile_table,
                            table_sha256)
from evolm.es.params import ParamSet


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(_bits(a), _bits(b))


@pytest.fixture
def kernel():
    if fused.kernel() is None:
        pytest.skip("no C++ toolchain for the fused kernel")
    return fused.kernel()


@pytest.fixture(params=["fused", "torch"])
def path(request, monkeypatch):
    """Run a test with the compiled kernel and with the torch ops only."""
    if request.param == "fused":
        if fused.kernel() is None:
            pytest.skip("no C++ toolchain for the fused kernel")
    else:
        monkeypatch.setattr(fused, "kernel", lambda: None)
    return request.param


# -- the generator ------------------------------------------------------------------------------------

def test_quantile_table_is_pinned_symmetric_and_the_normal_quantiles():
    table = quantile_table()
    assert table.dtype == torch.float32 and table.numel() == BULK + 2 * TAIL  # 18 KB, whatever the model's size
    assert table_sha256(table) == COUNTER_TABLE_SHA256  # the same bits on every platform
    bulk, lower, upper = table[:BULK], table[BULK:BULK + TAIL], table[BULK + TAIL:]
    assert torch.equal(bulk, -bulk.flip(0)) and torch.equal(upper, -lower.flip(0))  # antisymmetric
    assert bool((bulk[1:] > bulk[:-1]).all()) and bool((lower[1:] > lower[:-1]).all())
    assert float(lower[-1]) < float(bulk[1]) and float(upper[0]) > float(bulk[-2])  # the tails refine the outer cells
    fine = BULK * TAIL
    for p, value in [((0.5) / fine, lower[0]), ((TAIL - 0.5) / fine, lower[-1]), (1.5 / BULK, bulk[1]), (0.25, None)]:
        reference = float(torch.special.ndtri(torch.tensor(p, dtype=torch.float64)))  # an independent implementation
        assert inverse_normal_cdf(p) == pytest.approx(reference, abs=1e-12)
        if value is not None:
            assert float(value) == pytest.approx(reference, abs=1e-6)
    scipy = pytest.importorskip("scipy.special")
    ref = np.concatenate([scipy.ndtri((np.arange(BULK) + 0.5) / BULK), scipy.ndtri((np.arange(TAIL) + 0.5) / fine),
                          scipy.ndtri((np.arange(fine - TAIL, fine) + 0.5) / fine)]).astype(np.float32)
    assert np.array_equal(ref, table.numpy())  # every entry is Phi^-1 correctly rounded to float32


def test_distribution_mean_zero_unit_variance_and_where_the_tails_are_cut():
    values, probabilities = counter_distribution()  # the exact distribution of one draw
    assert float(probabilities.sum()) == 1.0
    assert float((values * probabilities).sum()) == 0.0
    assert abs(float((values ** 2 * probabilities).sum()) - 1.0) < 1e-4
    assert float((values ** 4 * probabilities).sum()) == pytest.approx(3.0, abs=0.01)
    cut = inverse_normal_cdf(1 - 0.5 / (BULK * TAIL))  # 4.90: the tails end at the 2^20-level quantile
    assert float(values.max()) == pytest.approx(cut, abs=1e-6) and float(values.min()) == pytest.approx(-cut, abs=1e-6)
    noise = CounterNoise(11)
    assert noise.max_abs() == pytest.approx(cut, abs=1e-6)
    # what the hash makes of it: a sample of 2^22 values
    x = noise.values(noise.keys(0, 0, 0), 0, 1 << 22, kernel=False).double()
    n = x.numel()
    assert abs(float(x.mean())) < 5 / math.sqrt(n)
    assert abs(float(x.var()) - 1.0) < 5 * math.sqrt(2 / n)
    assert 0 < float((x.abs() > 3.7).double().mean()) < 5e-4  # the refined tails are drawn (Phi: 2.2e-4)
    # the hashes' top 8 bits are uniform: chi-square over 256 equiprobable bins
    top = counter_indices(noise.keys(0, 0, 0), 0, n, raw=True) >> 24
    counts = torch.bincount(top, minlength=256).double()
    chi2 = float(((counts - n / 256) ** 2 / (n / 256)).sum())
    assert chi2 < 255 + 5 * math.sqrt(2 * 255)


def test_torch_ops_and_the_fused_kernel_compute_the_same_bits(kernel):
    noise = CounterNoise(3)
    for key, start, count in [((0, 0), 0, 1000), (noise.keys(5, 2, 17), 0, 100_003), (noise.keys(1, 0, 3), 777, 4097),
                              ((0xFFFFFFFF, 0x7FFFFFFF), (1 << 32) - 3000, 3000)]:
        assert _same(noise.values(key, start, count, kernel=True), noise.values(key, start, count, kernel=False))
    with pytest.raises(ValueError, match="2\\^32"):
        noise.values((1, 2), (1 << 32) - 10, 11)


def test_the_thread_count_does_not_change_the_values():
    noise, threads = CounterNoise(5), torch.get_num_threads()
    key = noise.keys(2, 1, 4)
    try:
        torch.set_num_threads(1)
        one = noise.values(key, 0, 600_000, kernel=False)
        torch.set_num_threads(2)
        two = noise.values(key, 0, 600_000, kernel=False)
    finally:
        torch.set_num_threads(threads)
    assert _same(one, two)


def test_chunking_does_not_change_the_values():
    noise = CounterNoise(8)
    key = noise.keys(0, 3, 1)
    whole = noise.values(key, 0, 10_000, kernel=False)
    for step in (1, 7, 1000, 4097):
        n = 300 if step == 1 else 10_000
        pieces = torch.cat([noise.values(key, a, min(step, n - a), kernel=False) for a in range(0, n, step)])
        assert _same(pieces, whole[:n])
    assert _same(noise.direction(0, 3, 1, 10_000), whole)


def test_distinct_keys_give_distinct_streams_and_tensors_of_a_member_share_no_noise(tiny_model):
    noise = CounterNoise(7)
    params = ParamSet(tiny_model, noise)
    keys = {noise.keys(it, d, i) for it in range(3) for d in range(4) for i in params.indices}
    assert len(keys) == 3 * 4 * len(params.indices)
    # within a tensor i -> hash is a bijection of 32-bit words: no two elements share a hash
    full = counter_indices(noise.keys(0, 0, 0), 0, 1 << 20, raw=True)
    assert torch.unique(full).numel() == full.numel()
    # one member: no tensor's noise is (a prefix of) another's, also for same-shaped tensors
    n = 4000
    member = [noise.direction(0, 0, i, numel) for i, numel in params.layout if numel >= n]
    assert len(member) >= 4
    for a in range(len(member)):
        for b in range(a + 1, len(member)):
            assert not torch.equal(member[a][:n], member[b][:n])
            assert abs(float(torch.corrcoef(torch.stack([member[a][:n], member[b][:n]]))[0, 1])) < 0.08
    # another member, another iteration, another seed: other noise for the same tensor
    base = noise.direction(0, 0, 0, n)
    for other in (noise.direction(0, 1, 0, n), noise.direction(1, 0, 0, n), CounterNoise(8).direction(0, 0, 0, n)):
        assert abs(float(torch.corrcoef(torch.stack([base, other]))[0, 1])) < 0.08
    # neighbouring elements are uncorrelated
    long = noise.direction(0, 0, 0, 1 << 20)
    for lag in (1, 2, 8, 1024):
        assert abs(float(torch.corrcoef(torch.stack([long[:-lag], long[lag:]]))[0, 1])) < 5 / math.sqrt(1 << 20)


def test_memory_does_not_grow_with_the_model():
    """A SmolLM2-135M-sized layout: the source holds its 18 KB table and nothing else."""
    layout = [(0, 28_311_552)] + [(i, 589_824) for i in range(1, 200)]
    noise = make_noise("counter", 7, layout)
    assert isinstance(noise, CounterNoise)
    assert [v.numel() for v in vars(noise).values() if isinstance(v, torch.Tensor)] == [BULK + 2 * TAIL]


# -- ParamSet with counter noise --------------------------------------------------------------------------

def test_many_perturb_restore_cycles_are_bit_exact(tiny_model, path):
    before = [p.detach().clone() for p in tiny_model.parameters()]
    params = ParamSet(tiny_model, CounterNoise(3))
    assert params.perturb_path == ("kernel" if path == "fused" else "torch")
    changed = 0
    for cycle in range(30 if path == "fused" else 8):  # the torch ops compute the hash in ~15 passes: slower
        params.perturb(cycle, cycle % 5, 1 if cycle % 2 else -1, [1e-3, 3e-2, 1e-5][cycle % 3])
        changed += sum(int((p != b).sum()) for p, b in zip(tiny_model.parameters(), before))
        params.restore()
    assert changed > 0
    assert all(_same(p.detach(), b) for p, b in zip(tiny_model.parameters(), before))


class _Odd(torch.nn.Module):
    """Tensors of awkward sizes (not multiples of a block, a chunk or a vector)."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.w = torch.nn.Parameter(torch.randn(301, 70, generator=g) * 0.05)
        self.v = torch.nn.Parameter(torch.randn(1025, generator=g))
        self.z = torch.nn.Parameter(torch.zeros(64))
        self.u = torch.nn.Parameter(torch.randn(33, 97, 3, generator=g))


def _perturbed_and_updated(chunk=None, threads=None, monkeypatch=None):
    if chunk is not None:
        monkeypatch.setattr(params_module, "CHUNK", chunk)
    saved = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        params = ParamSet(_Odd(), CounterNoise(5))
        params.perturb(2, 3, -1, 3e-3)
        perturbed = [t.clone() for t in params.tensors]
        params.restore()
        assert params.apply_update(2, [0.75, -1.5, 0.0, 2.0], 0.01)
        return perturbed + [t.clone() for t in params.tensors]
    finally:
        torch.set_num_threads(saved)


def test_kernel_torch_threads_and_chunks_give_bit_identical_members_and_updates(monkeypatch):
    reference = _perturbed_and_updated()  # the kernel where it is built
    assert all(_same(a, b) for a, b in zip(reference, _perturbed_and_updated(threads=2)))
    monkeypatch.setattr(fused, "kernel", lambda: None)  # the torch ops from here on
    for kw in ({}, {"threads": 2}, {"chunk": 1000}, {"chunk": 4097, "threads": 2}):
        other = _perturbed_and_updated(monkeypatch=monkeypatch, **kw)
        assert all(_same(a, b) for a, b in zip(reference, other)), kw


def test_update_is_the_rounded_sum_of_rounded_products(tiny_model):
    noise = CounterNoise(2)
    params = ParamSet(tiny_model, noise)
    before = [t.clone() for t in params.tensors]
    coefs, scale = [1.0, -0.5, 0.0, 3.0], 0.02
    assert params.apply_update(4, coefs, scale)
    for k, (b, after) in enumerate(zip(before, params.tensors)):
        acc = torch.zeros(b.numel())
        for d, c in enumerate(coefs):
            if c:
                acc = acc + torch.mul(noise.direction(4, d, params.indices[k], b.numel()), c)
        assert _same(after.view(-1), b.view(-1) + torch.mul(acc, scale))


def test_an_overflowing_update_is_refused_and_changes_nothing(tiny_model, path):
    params = ParamSet(tiny_model, CounterNoise(1))
    with torch.no_grad():
        params.tensors[0][0, 0] = 3e38
    before = [t.clone() for t in params.tensors]
    assert not params.apply_update(0, [1e6, 1e6], 1e35)
    assert all(_same(a, b) for a, b in zip(before, params.tensors))


def test_bfloat16_models_perturb_through_float32_masters(tokenizer):
    from conftest import make_tiny_model

    model = make_tiny_model(tokenizer).to(torch.bfloat16)
    before = [p.detach().clone() for p in model.parameters()]
    params = ParamSet(model, CounterNoise(4))
    assert params.perturb_path == "masters"
    noise = params.noise.direction(1, 2, params.indices[0], params.tensors[0].numel())
    params.perturb(1, 2, 1, 1e-2)
    expected = (params.masters[0].view(-1) + torch.mul(noise, 1e-2)).to(torch.bfloat16)
    assert torch.equal(params.tensors[0].view(-1), expected)
    params.restore()
    assert all(torch.equal(p.detach(), b) for p, b in zip(model.parameters(), before))
    assert params.apply_update(1, [1.0, -1.0], 0.5) and not torch.equal(params.tensors[0], before[0])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_computes_the_cpus_bits(tokenizer):
    from conftest import make_tiny_model

    noise_cpu, noise_gpu = CounterNoise(6), CounterNoise(6, "cuda")
    key = noise_cpu.keys(3, 1, 2)
    assert _same(noise_gpu.values(key, 5, 200_001).cpu(), noise_cpu.values(key, 5, 200_001))
    results = []
    for device in ("cpu", "cuda"):
        model = make_tiny_model(tokenizer).to(device)
        params = ParamSet(model, CounterNoise(6, device))
        params.perturb(1, 1, 1, 1e-3)
        perturbed = [t.cpu().clone() for t in params.tensors]
        params.restore()
        params.apply_update(1, [1.0, -2.0, 0.5], 0.01)
        results.append(perturbed + [t.cpu().clone() for t in params.tensors])
    assert all(_same(a, b) for a, b in zip(*results))


# -- the seed log: header, replay, resume --------------------------------------------------------------

def test_the_header_names_the_generator_and_rebuilds_it():
    noise = CounterNoise(42)
    described = noise.describe()
    assert described["kind"] == "counter" and described["version"] == COUNTER_VERSION
    assert described["quantiles"] == {"bulk_bits": 12, "tail_bits": 8, "sha256": COUNTER_TABLE_SHA256}
    again = noise_from_header(described, [(0, 10)])
    assert isinstance(again, CounterNoise) and _same(again.direction(1, 2, 3, 5000), noise.direction(1, 2, 3, 5000))
    with pytest.raises(ValueError, match="version 2"):
        noise_from_header({**described, "version": 2}, [(0, 10)])
    with pytest.raises(ValueError, match="quantile table"):
        noise_from_header({**described, "quantiles": {**described["quantiles"], "sha256": "0" * 64}}, [(0, 10)])


def _cfg(tmp_path, **es):
    return tiny_es_cfg(tmp_path, **{"iterations": 3, "noise": "counter", **es})


def test_a_counter_run_trains_resumes_bit_identically_and_replays(tmp_path, tokenizer, vowel_task):
    from conftest import make_tiny_model

    from evolm.es.engine import replay
    from evolm.jobs import run_es
    from evolm.runs import RunDir
    from evolm.backends.hf import HFGenerator

    cfg = _cfg(tmp_path / "a")
    base = make_tiny_model(tokenizer)
    run, uninterrupted = run_tiny_es(cfg, tokenizer, vowel_task)
    header = run.seed_log()[0]
    assert header["noise"]["kind"] == "counter" and header["noise"]["version"] == COUNTER_VERSION
    statuses = [r["status"] for r in run.seed_log()[1:]]
    assert "applied" in statuses  # an update applied, and it moved the weights
    assert any(not torch.equal(p, q) for p, q in zip(base.parameters(), uninterrupted.parameters()))

    cfg_b = _cfg(tmp_path / "b")
    cfg_b.run.checkpoint_every = 1
    with pytest.raises(Kill):
        run_tiny_es(cfg_b, tokenizer, vowel_task, callbacks=(kill_at(2),))
    run_b = RunDir.open(tmp_path / "b" / "run")
    fresh = make_tiny_model(tokenizer)
    run_es(cfg_b, resume=run_b, model=fresh, tokenizer=tokenizer, task=vowel_task,
           generator=HFGenerator(fresh, tokenizer, 16), quiet=True)
    for (n, p), q in zip(uninterrupted.named_parameters(), fresh.parameters()):
        assert torch.equal(p, q), n

    replayed = make_tiny_model(tokenizer)
    replay(replayed, run.seed_log(), cfg)
    for (n, p), q in zip(uninterrupted.named_parameters(), replayed.parameters()):
        assert torch.equal(p, q), n

    from evolm.errors import ConfigError

    table = _cfg(tmp_path / "c", noise="table", noise_table_size=1 << 22)
    with pytest.raises(ConfigError, match="es.noise is 'table' but the run drew 'counter' noise"):
        replay(make_tiny_model(tokenizer), run.seed_log(), table)


def test_lowrank_factors_draw_from_counter_noise(tiny_model):
    from evolm.es.lowrank import LowRankNoise

    noise = LowRankNoise(CounterNoise(3), {0: (300, 200), 1: (200,)}, rank=4)
    a, b = noise.factors(2, 1, 0)
    assert a.shape == (300, 4) and b.shape == (200, 4)
    assert torch.equal(a, noise.factors(2, 1, 0)[0]) and not torch.equal(a, noise.factors(2, 2, 0)[0])
    assert noise.describe()["base"]["kind"] == "counter"


def test_a_lowrank_run_on_counter_noise_trains_and_replays(tmp_path, tokenizer, vowel_task):
    from conftest import make_tiny_model

    from evolm.es.engine import replay

    cfg = _cfg(tmp_path, iterations=2, perturbation="lowrank", rank=2, estimator="antithetic")
    run, trained = run_tiny_es(cfg, tokenizer, vowel_task)
    header = run.seed_log()[0]
    assert header["noise"]["kind"] == "lowrank" and header["noise"]["base"]["kind"] == "counter"
    assert "applied" in [r["status"] for r in run.seed_log()[1:]]
    base = make_tiny_model(tokenizer)
    assert any(not torch.equal(p, q) for p, q in zip(base.parameters(), trained.parameters()))
    replayed = make_tiny_model(tokenizer)
    replay(replayed, run.seed_log(), cfg)
    for (n, p), q in zip(trained.named_parameters(), replayed.parameters()):
        assert torch.equal(p, q), n
