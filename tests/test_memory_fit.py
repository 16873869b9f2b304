"""A run whose ES state (float32 masters, noise table) does not fit beside the model is refused in one line
before anything is allocated or written (es.engine.check_memory)."""

from __future__ import annotations

import pytest
import torch

from evolm import config
from evolm.errors import ConfigError


def _cfg(*sets):
    return config.from_dict(config.ESJob, {}, ["distributed.workers=0", "model.threads=1", *sets])


def test_memory_need_counts_masters_and_the_table(tiny_model):
    from evolm.es.engine import memory_need
    from evolm.es.noise import TableNoise

    numel = sum(p.numel() for p in tiny_model.parameters())
    assert memory_need(tiny_model, _cfg("es.noise='counter'")) == {}  # float32 in place, no table
    assert memory_need(tiny_model, _cfg("es.noise='table'")) == {"noise table": 4 * TableNoise.default_size(numel)}
    bf16 = tiny_model.to(torch.bfloat16)
    assert memory_need(bf16, _cfg("es.noise='counter'", "model.dtype='bfloat16'")) == {"float32 masters": 4 * numel}


def test_a_state_that_does_not_fit_is_refused_with_the_fix(tiny_model):
    from evolm.es.engine import check_memory

    with pytest.raises(ConfigError, match=r"ES needs 0\.1 GiB noise table on cpu beside the model, but 0\.0 GiB of RAM is "
                                          r"free; use es\.noise='counter' \(no table\)"):
        check_memory(tiny_model, _cfg("es.noise='table'"), free_bytes=1000)
    check_memory(tiny_model, _cfg("es.noise='table'"), free_bytes=2**40)
    check_memory(tiny_model, _cfg("es.noise='counter'"), free_bytes=0)  # nothing to allocate: nothing to refuse


def test_run_es_refuses_before_the_run_directory_exists(tmp_path, tiny_dir, monkeypatch):
    from evolm import machine
    from evolm.jobs import run_es

    monkeypatch.setattr(machine, "available_ram_gb", lambda: 1e-6)
    cfg = _cfg(f"model.spec='{tiny_dir}'", f"run.out_dir='{tmp_path}'", "run.name='fit'", "es.noise='table'",
               "eval.before_after=false", "probe.every=0")
    with pytest.raises(ConfigError, match="use es.noise='counter'"):
        run_es(cfg, quiet=True)
    assert not (tmp_path / "fit").exists()
