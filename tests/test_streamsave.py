"""Saves stream tensor by tensor (evolm.streamsave): the files equal save_pretrained's, name for name and bit
for bit, and a lower-precision run's save holds references to its masters instead of a float32 copy of the
model (the copy that doubled memory at every checkpoint; benchmarks/save_memory.py measures the peak)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from evolm.streamsave import ModelWeights, write_weights


def _files(directory):
    state = {}
    for f in sorted(directory.glob("*.safetensors")):
        state.update(load_file(str(f)))
    return state


@pytest.mark.parametrize("dtype", [None, torch.float32, torch.bfloat16])
def test_streamed_weights_equal_save_pretrained(tmp_path, tiny_model, dtype):
    model = tiny_model.to(torch.bfloat16)
    reference = model if dtype is None else __import__("copy").deepcopy(model).to(dtype)
    reference.save_pretrained(tmp_path / "hf")
    write_weights(tmp_path / "streamed", model, dtype=dtype)
    a, b = _files(tmp_path / "hf"), _files(tmp_path / "streamed")
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), name
    ca, cb = (json.loads((tmp_path / d / "config.json").read_text()) for d in ("hf", "streamed"))
    assert ca == cb
    assert (tmp_path / "streamed" / "generation_config.json").exists()


def test_shards_and_index_load_with_transformers(tmp_path, tiny_model):
    from transformers import AutoModelForCausalLM

    write_weights(tmp_path / "m", tiny_model, shard_bytes=20_000)
    shards = sorted((tmp_path / "m").glob("model-*-of-*.safetensors"))
    assert len(shards) > 2 and (tmp_path / "m" / "model.safetensors.index.json").exists()
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "m")
    for (n, p), (m, q) in zip(tiny_model.named_parameters(), loaded.named_parameters()):
        assert n == m and torch.equal(p, q), n


def test_a_bf16_run_saves_its_masters_by_reference_and_writes_them_in_float32(tmp_path, tiny_model):
    """``engine.float32_model`` made a deep float32 copy of the model (4 B/param more at every save); now it
    hands the save the masters themselves and the file holds exactly their bits."""
    from evolm import config
    from evolm.es.engine import build_paramset, float32_model
    from evolm.runs import save_model_dir

    model = tiny_model.to(torch.bfloat16)
    cfg = config.from_dict(config.ESJob, {}, ["model.dtype='bfloat16'", "es.noise='counter'", "distributed.workers=0",
                                             "model.threads=1"])
    params = build_paramset(model, cfg)
    params.perturb(0, 0, 1, 0.01)
    params.restore()
    params.apply_update(0, [1.0, -0.5], 1e-3)
    saved = float32_model(model, params)
    assert isinstance(saved, ModelWeights)
    named = dict(model.named_parameters())
    assert all(saved.replace[n].data_ptr() == m.data_ptr() for n, m in zip(params.names, params.masters))
    assert all(named[n].dtype == torch.bfloat16 for n in params.names)  # the model itself is untouched
    save_model_dir(tmp_path / "ckpt", saved, None, extra={"state.json": {}})
    state = _files(tmp_path / "ckpt")
    for name, master in zip(params.names, params.masters):
        if name in state:
            assert state[name].dtype == torch.float32 and torch.equal(state[name], master.view_as(state[name])), name
    assert json.loads((tmp_path / "ckpt" / "config.json").read_text())["dtype"] == "float32"
