"""benchmarks/gpu_check.py at its --tiny shape on the CPU, so the prepared GPU check cannot rot.

The CPU run takes the same code path as the H200 run with the CPU-vs-CUDA comparisons skipped (and
said so); what it can check on a CPU it checks: bit-exact restore, resume and replay, and that the ES
updates changed the weights.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny_check(tmp_path_factory, tokenizer):
    out = tmp_path_factory.mktemp("gpu_check") / "gpu_check.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--tiny", "--device", "cpu",
                           "--threads", "1", "--out", str(out), "--populations", "8", "--lowrank-prompts", "4",
                           "--prompts", "4", "--max-new-tokens", "8", "--timing-repeats", "1",
                           "--noise-population", "6", "--noise-members", "1"],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text()), done.stdout


def test_tiny_gpu_check_writes_every_section_and_says_what_it_skipped(tiny_check):
    result, stdout = tiny_check
    assert result["device"] == "cpu" and result["tiny"] and result["params"] > 0
    assert any("CUDA" in s for s in result["skipped"])
    for section in ("identity", "memory", "timing", "es", "noise", "save", "lowrank"):
        assert section in result, section
    assert "errors" not in result, result.get("errors")  # the guard records a failure; on a CPU none may fail
    assert result["device_name"] in stdout and "## GPU check" in stdout  # the markdown section names the device
    timing = result["timing"]
    assert timing["update_s_median"] > 0 and timing["checksum_s_median"] > 0
    assert timing["checksum_entries"] == 2 * result["identity"]["tensors"]  # bf16: a CRC per master and per weight
    assert result["memory"]["masters_bytes_per_param"] == pytest.approx(4.0, rel=0.01)  # bf16: float32 masters of every tensor
    assert result["memory"]["masters_rss_bytes_per_param"] >= 0  # RSS growth: 0 when the allocator reuses freed pages
    noise = result["noise"]["rows"]
    assert noise["counter_torch"]["member_s"] > 0 and noise["table_torch"]["update_s"] > 0
    assert "skipped" in noise["counter_triton"]  # no CUDA here
    save = result["save"]
    assert save["rss_peak_mb"] >= save["rss_steady_mb"] and save["largest_tensor_float32_mb"] > 0
    (row,) = result["lowrank"]["rows"]
    assert row["population"] == 8 and row["full"]["members_per_s"] > 0 and row["lowrank"]["members_per_s"] > 0
    assert row["full"]["gen_tokens"] > 0 and row["lowrank"]["gen_tokens"] > 0


def test_a_failing_section_is_recorded_and_the_next_one_still_runs(tmp_path, tokenizer):
    """One prepared call is all a lent GPU gets: a section that raises (here an invalid parameter regex in the
    identity check) is recorded under ``errors`` and named in the printed section, and the memory section after it
    still runs and is saved."""
    out = tmp_path / "gpu_check.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--tiny", "--device", "cpu",
                           "--threads", "1", "--out", str(out), "--identity-regex", "[", "--prompts", "4",
                           "--max-new-tokens", "8", "--timing-repeats", "1", "--skip", "es,noise,save,lowrank"],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert "identity" not in result and "error" in result["errors"]["identity"]
    assert "memory" in result and "timing" in result
    assert "Section identity failed" in done.stdout


def test_tiny_gpu_check_restores_resumes_and_replays_bit_exactly_on_the_cpu(tiny_check):
    result, _ = tiny_check
    ident = result["identity"]
    for key in ("counter_float32", "counter_bfloat16", "table_float32", "table_bfloat16"):
        row = ident[key]
        assert row["perturb_changed"] and row["update_changed"], key  # the checks look at moved weights
        assert row["restore_exact_cpu"] and row["update_applied_cpu"], key
        assert "perturb_identical" not in row and "restore_exact_cuda" not in row, key  # skipped without CUDA
        assert row["promised"]["update"] == key.startswith("counter"), key
    es = result["es"]
    assert es["masters"] and es["dtype"] == "bfloat16"
    assert "applied" in es["update_statuses"] and es["weights_changed"]  # training changed the weights
    assert es["killed_after_update"] == 1 < es["iterations"]
    assert es["resume_bit_exact"] and es["replay_bit_exact"]


@pytest.mark.slow  # four fresh child processes: ~45 s on the shared 2-core machine
def test_memory_per_param_runs_on_a_tiny_model_and_reports_against_the_formula(tmp_path, tiny_dir):
    """benchmarks/memory_per_param.py end to end on a tiny model directory (the benchmark itself runs
    SmolLM2-135M): float32 ES is in place, bf16 ES keeps float32 masters, every row has its figures."""
    out = tmp_path / "memory.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "memory_per_param.py"), "--model", str(tiny_dir),
                           "--noises", "counter", "--population", "2", "--prompts", "2", "--max-new-tokens", "2",
                           "--iterations", "1", "--json", str(out)], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(r["dtype"], r["mode"]) for r in rows] == [("float32", "inference"), ("float32", "es-counter"),
                                                       ("bfloat16", "inference"), ("bfloat16", "es-counter")]
    f32, bf16 = rows[1], rows[3]
    assert f32["masters"] is False and bf16["masters"] is True
    assert f32["dtype_bytes"] == 4 and bf16["dtype_bytes"] == 2
    for r in rows:
        assert r["params"] > 0 and r["peak_mb"] > r["rss_before_model_mb"] > 0 and r["run_bytes_per_param"] > 0
    for r in (f32, bf16):
        assert r["target_bytes_per_param"] > r["dtype_bytes"] and r["over_target"] > 0 and r["peak_over_inference"] > 0
    assert "| bfloat16 | ES, counter (masters) |" in done.stdout
