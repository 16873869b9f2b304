"""Replica checksums (checksum.py) and the driver's deferred copy (ParamSet.defer_update / catch_up)."""

from __future__ import annotations

import pytest
import torch

from evolm import config
from evolm.checksum import CHUNK, reference_checksum, tensor_checksum


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_checksum_equals_the_pure_python_reference_across_chunks(dtype):
    x = torch.randn(2 * CHUNK + 17, generator=torch.Generator().manual_seed(0)).to(dtype)
    bits = x.view(torch.int32 if dtype == torch.float32 else torch.int16).tolist()
    assert tensor_checksum(x) == reference_checksum(bits)
    assert tensor_checksum(x[:2 * CHUNK].view(4, -1)) == tensor_checksum(x[:2 * CHUNK])  # shape does not matter, order does


def test_checksum_sees_one_changed_bit_and_two_swapped_values():
    x = torch.randn(CHUNK + 5, generator=torch.Generator().manual_seed(1))
    base = tensor_checksum(x)
    flipped = x.clone()
    flipped.view(torch.int32)[CHUNK + 3] ^= 1  # the last mantissa bit of one element in the second chunk
    swapped = x.clone()
    swapped[[10, 11]] = swapped[[11, 10]]
    moved = torch.cat([x[CHUNK:], x[:CHUNK]])  # the same values in another order across chunks
    assert len({base, tensor_checksum(flipped), tensor_checksum(swapped), tensor_checksum(moved)}) == 4


def test_checksum_does_not_depend_on_threads_or_layout():
    x = torch.randn(3 * CHUNK // 2, generator=torch.Generator().manual_seed(2))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = tensor_checksum(x)
        torch.set_num_threads(2)
        two = tensor_checksum(x)
    finally:
        torch.set_num_threads(before)
    assert one == two == tensor_checksum(x.view(-1, 2).t().contiguous().t())  # same values, row-major order


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_checksum_of_a_cast_is_computed_chunk_by_chunk_and_equals_the_cast_tensors(dtype):
    """``tensor_checksum(t, float32)`` (a bf16 model's weights cast up to its masters, without a float32
    copy) equals the checksum of ``t.float()``, across chunk boundaries and for a non-contiguous view."""
    t = torch.randn(3 * CHUNK + 17, generator=torch.Generator().manual_seed(1)).to(dtype)
    assert tensor_checksum(t, torch.float32) == tensor_checksum(t.float()) != tensor_checksum(t)
    view = t[: 2 * CHUNK].view(2, CHUNK)[:, 5:]
    assert tensor_checksum(view, torch.float32) == tensor_checksum(view.float())
    assert tensor_checksum(t, dtype) == tensor_checksum(t)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
def test_checksum_on_cuda_equals_cpu():
    x = torch.randn(2 * CHUNK + 3, generator=torch.Generator().manual_seed(3))
    assert tensor_checksum(x.cuda()) == tensor_checksum(x)
    assert tensor_checksum(x.bfloat16().cuda()) == tensor_checksum(x.bfloat16())


@pytest.mark.parametrize("noise", ["table", "counter"])
def test_deferred_updates_caught_up_equal_updates_applied_at_once(tokenizer, noise):
    from conftest import make_tiny_model

    from evolm.es.engine import build_paramset

    cfg = config.from_dict(config.ESJob, {}, [f"es.noise='{noise}'", "es.noise_table_size=4096"])
    now, later = make_tiny_model(tokenizer), make_tiny_model(tokenizer)
    a, b = build_paramset(now, cfg), build_paramset(later, cfg)
    updates = [(i, [0.5, -1.0, 0.25, 2.0], 1e-2) for i in range(3)]
    for u in updates:
        assert a.apply_update(*u)
        b.defer_update(*u)
    assert b.deferred == 3
    assert all(torch.equal(t, u) for t, u in zip(b.tensors, build_paramset(make_tiny_model(tokenizer), cfg).tensors))
    with pytest.raises(RuntimeError, match="deferred updates queued"):
        b.apply_update(3, [1.0], 1e-2)
    assert b.catch_up() == 3 and b.deferred == 0 and b.catch_up() == 0
    assert all(torch.equal(t, u) for t, u in zip(a.tensors, b.tensors))
    assert not all(torch.equal(t, u) for t, u in zip(a.tensors, build_paramset(make_tiny_model(tokenizer), cfg).tensors))


def test_a_deferred_update_the_driver_refuses_is_a_divergence(tokenizer):
    from conftest import make_tiny_model

    from evolm.es.engine import build_paramset

    params = build_paramset(make_tiny_model(tokenizer), config.from_dict(config.ESJob, {}, []))
    params.defer_update(0, [float("inf")], 1.0)  # the replicas took it, this copy cannot
    with pytest.raises(RuntimeError, match="driver's copy differs"):
        params.catch_up()


def test_a_paramset_whose_masters_live_elsewhere_keeps_none_and_refuses_arithmetic(tokenizer):
    """``masters_elsewhere`` (a vLLM engine's worker holds the float32 masters): a bf16 ParamSet keeps no
    float32 copy, still says it has masters (checkpoints must save them) and perturbs nowhere itself;
    its deferred updates are handed over, not applied; a float32 model ignores the flag."""
    from conftest import make_tiny_model

    from evolm.es.noise import make_noise
    from evolm.es.params import ParamSet

    bf16 = make_tiny_model(tokenizer).to(torch.bfloat16)
    params = ParamSet(bf16, None, masters_elsewhere=True)
    params.noise = make_noise("counter", 0, params.layout)
    assert params.masters is None and params.keeps_masters and params.perturb_path == "masters"
    before = [t.clone() for t in params.tensors]
    for call in (lambda: params.perturb(0, 0, 1, 1e-3), lambda: params.apply_update(0, [1.0], 1e-2)):
        with pytest.raises(RuntimeError, match="masters live in its replica"):
            call()
    params.defer_update(0, [1.0, -1.0], 1e-2)
    assert params.take_deferred() == [(0, [1.0, -1.0], 1e-2)] and params.deferred == 0
    assert all(torch.equal(t, b) for t, b in zip(params.tensors, before))
    kept = ParamSet(make_tiny_model(tokenizer).to(torch.bfloat16), None)
    assert kept.masters is not None and kept.keeps_masters
    f32 = ParamSet(make_tiny_model(tokenizer), None, masters_elsewhere=True)
    assert not f32.masters_elsewhere and f32.masters is None and not f32.keeps_masters
