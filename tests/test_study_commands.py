"""The study's printed commands regenerate what the page reads, and write only under their own OUT (issue 40, item 6).

experiments/refnum/run.sh runs here with a stand-in interpreter that records each call and writes what the real one
would (a walk's metrics to its horizon, an analysis's JSON): the stages' order, horizons and output paths are tested
without training anything; the summarise step runs for real on an empty OUT.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUN_SH = ROOT / "experiments" / "refnum" / "run.sh"

FAKE_PY = r"""#!/usr/bin/env bash
echo "$*" >> "$FAKE_LOG"
case "$1" in
  experiments/refnum/null_walk.py)
    if [ "$2" = --resume ]; then dir=$3; it=$5; else it=$4; dir=$6/$(basename "$2" .toml)-null; fi
    mkdir -p "$dir/final"; touch "$dir/config.toml" "$dir/final/config.json"; echo "{\"step\": $it, \"kind\": \"train\"}" > "$dir/metrics.jsonl" ;;
  -m) out=${@: -1}; mkdir -p "$out"; touch "$out/$4.json" ;;
  experiments/refnum/summarise.py) mkdir -p "$4"; touch "$4/summary.json" ;;
  -) cat > /dev/null ;;
  *) exec "$REAL_PY" "$@" ;;
esac
"""


def _docs_state() -> dict[str, tuple[str, int]]:
    return {str(p.relative_to(ROOT)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted((ROOT / "docs").rglob("*")) if p.is_file()}


def _run_sh(stage: str, out: Path, py: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full = dict(os.environ, OUT=str(out), PY=py, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1", **(env or {}))
    full.pop("PUBLISH", None)
    full.pop("HORIZON", None)
    return subprocess.run(["bash", str(RUN_SH), stage], cwd=ROOT, env=full, capture_output=True, text=True, timeout=600)


def test_summarise_and_analyses_with_another_out_leave_docs_untouched(tmp_path):
    before = _docs_state()
    for stage in ("analyses", "summarise"):
        done = _run_sh(stage, tmp_path / "out", sys.executable)
        assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "out" / "summary" / "summary.json").exists()
    assert _docs_state() == before  # byte-identical and not rewritten


def test_null_runs_to_the_committed_horizons_and_keeps_the_first_analyses(tmp_path):
    fake = tmp_path / "py"
    fake.write_text(FAKE_PY)
    fake.chmod(0o755)
    log = tmp_path / "calls.log"
    before = _docs_state()
    done = _run_sh("null", tmp_path / "out", str(fake), {"FAKE_LOG": str(log), "REAL_PY": sys.executable})
    assert done.returncode == 0, done.stderr[-2000:]
    walks = [re.search(r"null_walk\.py (?:--resume \S*?/)?(?:experiments/refnum/)?([a-z0-9-]+?)(?:-null|\.toml)\b.*"
                       r"--iterations (\d+)", line) for line in log.read_text().splitlines() if "null_walk.py" in line]
    assert [(m.group(1), int(m.group(2))) for m in walks] == [
        ("smollm2-es-exact-f32", 120), ("smollm2-es-exact-bf16", 120), ("smollm2-es-reference-bf16", 120),
        ("gemma-es-exact-f32", 20), ("gemma-es-reference-bf16", 20), ("smollm2-es-exact-f32", 240), ("gemma-es-exact-f32", 60)]
    analyses = tmp_path / "out" / "analyses"
    assert (analyses / "smollm2-es-exact-f32-null-at-120" / "drift.json").exists()   # what the study's Q3 reads
    assert (analyses / "gemma-es-exact-f32-null-at-20" / "drift.json").exists()
    assert (analyses / "smollm2-es-exact-f32-null" / "updates").read_text().strip() == "240"
    assert (analyses / "smollm2-es-reference-bf16-null" / "updates").read_text().strip() == "120"
    assert (tmp_path / "out" / "summary" / "summary.json").exists()
    assert _docs_state() == before


def _stages(script: Path) -> set[str]:
    text = script.read_text()
    case = text[text.rindex("case \"${1"):]
    return {s for line in case.splitlines() if (m := re.match(r"\s+([a-z0-9|-]+)\)", line)) for s in m.group(1).split("|")}


def test_every_printed_command_names_a_stage_that_exists():
    claims = tomllib.loads((ROOT / "experiments" / "study" / "claims.toml").read_text())
    checked = 0
    for claim in claims["claim"]:
        for m in re.finditer(r"((?:[A-Z]+=\S+ )*)bash (experiments/\S+\.sh)(?: ([a-z0-9-]+))?", claim.get("command", "")):
            script = ROOT / m.group(2)
            assert script.exists(), f"{claim['id']}: {m.group(2)} does not exist"
            if m.group(3) and "case \"${1" in script.read_text():
                assert m.group(3) in _stages(script), f"{claim['id']}: {m.group(2)} has no stage {m.group(3)}"
            checked += 1
    assert checked >= 10


def test_refnum_commands_publish_what_the_claims_read_at_their_horizon():
    """The Q3 tests read docs/study/refnum: their commands publish there (PUBLISH), Q3d's at HORIZON=120."""
    claims = {c["id"]: c for c in tomllib.loads((ROOT / "experiments" / "study" / "claims.toml").read_text())["claim"]}
    for cid in ("Q3a", "Q3b", "Q3c", "Q3d"):
        if "refnum/" not in " ".join(t.get("file", "") for t in claims[cid].get("test", [])):
            continue
        assert "PUBLISH=docs/study/refnum" in claims[cid]["command"], cid
    assert "HORIZON=120" in claims["Q3d"]["command"]
