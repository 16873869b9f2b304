"""generation.cpu_matmul: float32 CPU linears through oneDNN while generating (evolm.backends.cpu_matmul)."""

from __future__ import annotations

import copy

import pytest
import torch

from evolm.backends.base import SamplingParams
from evolm.backends.cpu_matmul import cpu_matmul, onednn_available, resolve
from evolm.backends.hf import HFGenerator
from evolm.config import RESUME_MAY_CHANGE, ESJob

pytestmark = pytest.mark.skipif(not onednn_available(), reason="this torch build has no oneDNN")


def _mlp(bias: bool = True) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 96, bias=bias), torch.nn.GELU(), torch.nn.Linear(96, 32, bias=bias)).eval()


def test_linears_run_through_onednn_inside_the_block_and_are_plain_after():
    model = _mlp()
    x = torch.randn(3, 5, 64)
    with torch.no_grad():
        ref = model(x)
        with cpu_matmul(model, "onednn") as switched:
            assert switched == 2
            calls = []
            real = torch._C._nn.mkldnn_linear
            torch._C._nn.mkldnn_linear = lambda *a: calls.append(1) or real(*a)
            try:
                out = model(x)
            finally:
                torch._C._nn.mkldnn_linear = real
            assert len(calls) == 2
        assert all("forward" not in m.__dict__ for m in model.modules())
        copy.deepcopy(model)  # plain again: nothing bound to the old module
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_in_place_weight_changes_are_seen_and_gradients_use_torchs_path():
    model = _mlp()
    x = torch.randn(4, 64)
    with cpu_matmul(model, "onednn"):
        with torch.no_grad():
            before = model(x)
            model[0].weight.add_(0.5)  # an ES perturbation, in place
            after = model(x)
            model[0].weight.sub_(0.5)
        assert not torch.allclose(before, after)
        y = model(x).sum()  # autograd on: F.linear, gradients flow
        y.backward()
    assert model[0].weight.grad is not None and model[0].weight.grad.abs().sum() > 0


def test_results_do_not_depend_on_the_thread_count():
    model = _mlp(bias=False)
    x = torch.randn(32, 40, 64)
    threads = torch.get_num_threads()
    outs = []
    try:
        with torch.no_grad(), cpu_matmul(model, "onednn"):
            for n in (1, 2):
                torch.set_num_threads(n)
                outs.append(model(x))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(outs[0], outs[1])


def test_torch_choice_switches_nothing_and_non_float32_layers_are_left_alone():
    model = _mlp()
    with cpu_matmul(model, "torch") as switched:
        assert switched == 0
    half = _mlp().to(torch.bfloat16)
    with cpu_matmul(half, "auto") as switched:
        assert switched == 0
    with pytest.raises(ValueError, match="cpu_matmul must be one of"):
        resolve("mkl")


def test_nested_blocks_leave_the_outer_one_in_charge():
    model = _mlp()
    with cpu_matmul(model, "onednn") as outer:
        with cpu_matmul(model, "onednn") as inner:
            assert (outer, inner) == (2, 0)
        assert "forward" in model[0].__dict__
    assert "forward" not in model[0].__dict__


def test_the_hf_generator_runs_its_forward_passes_in_the_block(tiny_model, tokenizer):
    model = tiny_model
    seen = []
    real = torch._C._nn.mkldnn_linear
    torch._C._nn.mkldnn_linear = lambda *a: seen.append(1) or real(*a)
    try:
        out = {c: HFGenerator(model, tokenizer, cpu_matmul=c).generate(["1 + 2 =", "3 + 4 ="], SamplingParams(max_new_tokens=4))
               for c in ("torch", "onednn")}
        n_onednn = len(seen)
    finally:
        torch._C._nn.mkldnn_linear = real
    assert n_onednn > 0
    assert [c[0].num_tokens for c in out["torch"]] == [c[0].num_tokens for c in out["onednn"]]
    assert all("forward" not in m.__dict__ for m in model.modules())


def test_the_config_field_is_validated_documented_and_may_change_on_resume():
    cfg = ESJob()
    assert cfg.generation.cpu_matmul == "auto"  # resolved at validation (next test)
    assert "generation.cpu_matmul" in RESUME_MAY_CHANGE
    with pytest.raises(ValueError, match="cpu_matmul"):
        HFGenerator(_mlp(), None, cpu_matmul="fast")


def test_auto_is_resolved_and_recorded_and_an_older_runs_config_measures_with_torchs_linears():
    from evolm import config
    from evolm.heldout import like_config

    cfg = config.load(ESJob, None, ["model.device='cpu'", "model.dtype='float32'"])
    assert cfg.generation.cpu_matmul == "onednn"
    assert any(n.startswith("generation.cpu_matmul = onednn") for n in cfg.auto_notes)
    old = config.to_dict(cfg)
    del old["generation"]["cpu_matmul"]  # a config.toml written before the field
    assert like_config(old).generation.cpu_matmul == "torch"
    assert config.config_changes(old, cfg)["generation.cpu_matmul"] == {"old": "torch", "new": "onednn"}
