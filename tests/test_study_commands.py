"""The study's printed commands regenerate what the page reads, and write only under their own OUT (issue 40, item 6).

experiments/refnum/run.sh runs here with a stand-in interpreter that records each call and writes what the real one
would (a walk's metrics to its horizon, an analysis's JSON): the stages' order, horizons and output paths are tested
without training anything; the summarise step runs for real on an empty OUT. experiments/study/run.sh runs the same
way, every stage the claims' commands name, from a scratch copy, into a temporary OUT, and its `collect` into a
temporary PUBLISH must hold every file the claims read. The stand-ins write file names, not numbers: these tests check
that each printed command writes what the claims read, where they read it; the numbers are the runs' own.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REFNUM_SH = Path("experiments") / "refnum" / "run.sh"

FAKE_PY = r"""#!/usr/bin/env bash
echo "$*" >> "$FAKE_LOG"
case "$1" in
  experiments/refnum/null_walk.py)
    if [ "$2" = --resume ]; then dir=$3; it=$5; else it=$4; dir=$6/$(basename "$2" .toml)-null; fi
    mkdir -p "$dir/final"; touch "$dir/config.toml" "$dir/final/config.json"; echo "{\"step\": $it, \"kind\": \"train\"}" > "$dir/metrics.jsonl" ;;
  -m)
    if [ "$3" = analyze ]; then out=${@: -1}; mkdir -p "$out"; touch "$out/$4.json"
    elif [ "$4" = --config ]; then  # a task run: experiments/refnum/NAME.toml into run.out_dir, to its --set budget
      for a in "$@"; do case "$a" in run.out_dir=*) out=${a#run.out_dir=}; out=${out//\"/} ;; esac; done
      dir=$out/$(basename "$5" .toml); it=${@: -1}; it=${it#*=}
      mkdir -p "$dir/final"; touch "$dir/config.toml" "$dir/final/config.json" "$dir/run.json" "$dir/eval_before.json" "$dir/eval_after.json"
      echo "{\"step\": $it, \"kind\": \"train\"}" > "$dir/metrics.jsonl"
    elif [ "$4" = --resume ]; then dir=$5; it=${@: -1}; it=${it#*=}; echo "{\"step\": $it, \"kind\": \"train\"}" > "$dir/metrics.jsonl"
    else echo "fake: no stand-in for $*" >&2; exit 3; fi ;;
  experiments/refnum/summarise.py) mkdir -p "$4"; touch "$4/summary.json" "$4/real_arm.json" ;;
  -) cat > /dev/null ;;
  *) exec "$REAL_PY" "$@" ;;
esac
"""


def _scratch(tmp_path: Path, *paths: str) -> Path:
    """A scratch repository holding copies of ``paths`` (relative to the checkout), committed: a driver run from it
    can only write into the copy or its OUT, never into this checkout."""
    repo = tmp_path / "repo"
    for rel in paths:
        shutil.copytree(ROOT / rel, repo / rel)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    for cmd in (["init", "-q"], ["add", "."], ["commit", "-qm", "scratch"]):
        subprocess.run(git + cmd, cwd=repo, check=True, capture_output=True)
    return repo


def _state(root: Path) -> dict[str, tuple[str, int]]:
    """Every file under ``root`` (but .git) with its hash and mtime: a rewrite shows even when the bytes are equal."""
    return {str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file() and ".git" not in p.relative_to(root).parts}


def _run_sh(repo: Path, stage: str, out: Path, py: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full = dict(os.environ, OUT=str(out), PY=py, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1", **(env or {}))
    for name in ("PUBLISH", "HORIZON"):
        if name not in (env or {}):
            full.pop(name, None)
    args = [stage] if stage else []
    return subprocess.run(["bash", str(repo / REFNUM_SH), *args], cwd=repo, env=full, capture_output=True, text=True,
                          timeout=600)


def _fake(tmp_path: Path) -> Path:
    fake = tmp_path / "py"
    fake.write_text(FAKE_PY)
    fake.chmod(0o755)
    return fake


REFNUM_TREES = ("experiments/refnum", "docs/study/refnum")
"""What the refnum driver reads: its configs and scripts, and the committed files it restores runs from (KEEP)."""


def test_summarise_and_analyses_with_another_out_leave_docs_untouched(tmp_path):
    repo = _scratch(tmp_path, *REFNUM_TREES)
    before = _state(repo)
    for stage in ("analyses", "summarise"):
        done = _run_sh(repo, stage, tmp_path / "out", sys.executable)
        assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "out" / "summary" / "summary.json").exists()
    assert _state(repo) == before  # the copy's docs/ byte-identical and not rewritten, nothing new beside it


def test_null_runs_to_the_committed_horizons_and_keeps_the_first_analyses(tmp_path):
    repo = _scratch(tmp_path, *REFNUM_TREES)
    log = tmp_path / "calls.log"
    before = _state(repo)
    done = _run_sh(repo, "null", tmp_path / "out", str(_fake(tmp_path)), {"FAKE_LOG": str(log), "REAL_PY": sys.executable})
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
    # every file Q3a-c read (docs/study/refnum/...) is written under OUT, where summarise.py copies it from
    for cid, files in _claims_files(r"Q3[abc]").items():
        assert all(_written(tmp_path / "out", f) for f in files), (cid, [f for f in files if not _written(tmp_path / "out", f)])
    assert _state(repo) == before


def _written(out: Path, claimed: str) -> bool:
    """Whether the refnum driver wrote under ``out`` the file a claim reads as ``claimed`` (relative to docs/study):
    refnum/analyses/X and refnum/runs/X are OUT/analyses/X and OUT/X (summarise.py copies them to PUBLISH), the
    summary and real_arm.json are summarise.py's own (OUT/summary without PUBLISH)."""
    rel = Path(claimed).relative_to("refnum")
    if rel.parts[0] == "analyses":
        return (out / rel).exists()
    if rel.parts[0] == "runs":
        return (out / Path(*rel.parts[1:])).exists()
    return (out / "summary" / rel).exists()


def test_q3d_command_writes_what_q3d_reads_at_its_horizon(tmp_path):
    """Q3d's command, HORIZON=120 ... run.sh (every task run to update 120, then the analyses and the summary): each run
    stops at 120, and every file Q3d reads is written under OUT; PUBLISH sends the summary there, not to docs/."""
    repo = _scratch(tmp_path, *REFNUM_TREES)
    shutil.rmtree(repo / "docs" / "study" / "refnum" / "runs")  # a fresh start: nothing to restore from KEEP
    log, out, publish = tmp_path / "calls.log", tmp_path / "out", tmp_path / "published"
    before = _state(repo)
    done = _run_sh(repo, "", out, str(_fake(tmp_path)), {"FAKE_LOG": str(log), "REAL_PY": sys.executable,
                                                          "HORIZON": "120", "PUBLISH": str(publish)})
    assert done.returncode == 0, done.stderr[-2000:]
    runs = [re.search(r"evolm (es|grpo) --config experiments/refnum/([a-z0-9-]+)\.toml .*--set \S+=(\d+)$", line)
            for line in log.read_text().splitlines() if "--config experiments/refnum/" in line]
    assert [(m.group(2), int(m.group(3))) for m in runs] == [
        ("smollm2-es-exact-f32", 120), ("smollm2-es-reference-bf16", 120), ("smollm2-es-exact-bf16", 120),
        ("smollm2-grpo-bf16", 120), ("gemma-es-exact-f32", 120), ("gemma-es-reference-bf16", 120)]
    (files,) = _claims_files("Q3d").values()
    shown = [f for f in files if f != "refnum/real_arm.json"]
    assert all(_written(out, f) for f in shown), [f for f in shown if not _written(out, f)]
    assert (publish / "summary.json").exists() and (publish / "real_arm.json").exists()
    assert _state(repo) == before


ARTIFACT_FAKE_PY = r"""#!{python}
import json, os, re, sys
from pathlib import Path

args = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(" ".join(args) + "\n")
if args[0] == "experiments/refnum/null_walk.py":  # a walk not published yet: started, not finished (no weights)
    if args[1] == "--resume":
        sys.exit(0)
    name = next(a.split("=", 1)[1].strip('"') for a in args if a.startswith("run.name="))
    d = Path(args[args.index("--out-dir") + 1]) / f"{{name}}-null"
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.toml").write_text(Path(args[1]).read_text())
    (d / "run.json").write_text(json.dumps({{"status": "stopped"}}))
elif args[:3] == ["-m", "evolm", "analyze"]:
    sys.exit("fake: a walk without weights is never analysed")
else:
    os.execv(os.environ["REAL_PY"], [os.environ["REAL_PY"], *args])
"""


def test_q4_command_regenerates_the_committed_numbers_from_the_published_walks(tmp_path):
    """Q4's command, PUBLISH=docs/study/artifact bash experiments/refnum/artifact_walks.sh, with PUBLISH a copy of the
    committed docs/study/artifact: the published walks are restored and count as done, the others start (a stand-in
    that never finishes them), and the real artifact_summary.py rewrites PUBLISH's summary.json with the numbers the
    committed one holds for every finished seed (the numbers the Q4 tests read)."""
    repo = _scratch(tmp_path, "experiments/refnum")
    publish, out, log = tmp_path / "published", tmp_path / "out", tmp_path / "calls.log"
    shutil.copytree(ROOT / "docs" / "study" / "artifact", publish)
    fake = tmp_path / "py"
    fake.write_text(ARTIFACT_FAKE_PY.format(python=sys.executable))
    fake.chmod(0o755)
    env = dict(os.environ, OUT=str(out), PY=str(fake), PUBLISH=str(publish), FAKE_LOG=str(log), REAL_PY=sys.executable,
               PYTHONPATH=str(ROOT / "src"))
    for name in ("ITERATIONS", "POPULATION", "MODELS", "SEEDS"):
        env.pop(name, None)
    before = _state(repo)
    done = subprocess.run(["bash", str(repo / "experiments" / "refnum" / "artifact_walks.sh")], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    committed = json.loads((ROOT / "docs" / "study" / "artifact" / "summary.json").read_text())
    rebuilt = json.loads((publish / "summary.json").read_text())
    finished = {name for name, row in committed["runs"].items() if row.get("finished")}
    assert finished and {name: rebuilt["runs"][name] for name in finished} == {name: committed["runs"][name] for name in finished}
    for model, c in committed["contrasts"].items():
        assert {k: v for k, v in rebuilt["contrasts"][model].items() if k != "incomplete"} == \
            {k: v for k, v in c.items() if k != "incomplete"}, model
    (files,) = _claims_files("Q4").values()  # the walks' tests; the task-reward arm's read refnum/ (run.sh's summarise)
    assert {f for f in files if not f.startswith("refnum/")} == {"artifact/summary.json"}
    started = [line for line in log.read_text().splitlines() if line.startswith("experiments/refnum/null_walk.py")]
    assert not any(re.search(rf'run.name="{n[:-len("-null")]}"', line) for n in finished for line in started)
    assert _state(repo) == before


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
    for cid in ("Q3a", "Q3b", "Q3c", "Q3d", "Q4"):
        if "refnum/" not in " ".join(t.get("file", "") for t in claims[cid].get("test", [])):
            continue
        assert "PUBLISH=docs/study/refnum" in claims[cid]["command"], cid
    assert "HORIZON=120" in claims["Q3d"]["command"]


# -- experiments/study/run.sh: every stage a claim's command names, into a temporary OUT (issue 40, item 6) ----------

STUDY_SH = ROOT / "experiments" / "study" / "run.sh"
STAGE_ORDER = ("c1c2", "n30", "c1seeds", "cd", "seeds", "q1", "c8", "c9", "c7", "c7x", "c2long", "c2xl", "c3", "c5",
               "q2", "k32", "c4")
"""The order the driver's stages depend on one another in (c2xl continues c2long, c3 reads both, q2 reads c1seeds, ...)."""

STUDY_FAKE_PY = r'''#!{python}
"""A stand-in for the study's interpreter: records each call and writes the files the real call writes (names only;
the numbers are not computed), so the driver's stages, output paths and order are tested without training."""
import json, os, re, shutil, subprocess, sys, tomllib
from pathlib import Path

args = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(" ".join(args) + "\n")


def opt(name, default=None):
    return args[args.index(name) + 1] if name in args else default


def sets():
    return dict(a.split("=", 1) for a in (args[i + 1] for i, x in enumerate(args) if x == "--set"))


def touch(path, text="{{}}"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def run_dir(d, config_text):
    for name in ("run.json", "metrics.jsonl", "seed_log.jsonl", "eval_before.json", "eval_after.json", "final/config.json"):
        touch(d / name)
    touch(d / "config.toml", config_text)


if args[:2] == ["-m", "evolm"]:
    verb = args[2]
    if verb in ("es", "grpo", "pipeline") and "--config" in args:
        text = Path(opt("--config")).read_text()
        cfg, over = tomllib.loads(text), sets()
        name = over.get("run.name", json.dumps(cfg["run"]["name"])).strip('"')
        out = over.get("run.out_dir", json.dumps(cfg["run"]["out_dir"])).strip('"')
        run_dir(Path(out) / name, text)
        if verb == "pipeline":
            touch(Path(out) / name / "stages" / "01-grpo" / "config.toml", text)
    elif verb in ("es", "grpo", "pipeline") and "--resume" in args:
        d = Path(opt("--resume"))
        assert (d / "config.toml").exists(), f"resume of {{d}}: no run there"
        run_dir(d, (d / "config.toml").read_text())
    elif verb == "eval":
        touch(Path(opt("--out")) / "eval.json")
    elif verb == "replay":
        touch(Path(opt("--out")) / "config.json")
    elif verb == "sweep":
        out, (field, values) = Path(opt("--out")), opt("--grid").split("=")
        text = Path(opt("--config")).read_text()
        for v in values.split(","):
            run_dir(out / f"{{field}}={{v}}", text)
        touch(out / "sweep.json")
    elif verb == "analyze":
        kind, out = args[3], Path(opt("--out"))
        touch(out / f"{{kind}}.json")
        labels = [t.split("=")[0] for i, t in enumerate(args) if i and args[i - 1] == "--trained"]
        if kind == "sparsity":
            for label in labels:
                for m in ["base", "trained"] + ["x" + f"{{float(m):g}}" for m in opt("--multipliers", "0.25,0.5,1,2,4,8").split(",")]:
                    touch(out / "sparsity" / f"{{label}}_{{m}}.json")
        if kind == "compression":
            for label in ["base"] + labels:
                for method in opt("--methods").split(","):
                    touch(out / "compression" / f"{{label}}_{{method.replace(':', '-')}}.json")
    else:
        sys.exit(f"fake: no stand-in for evolm {{verb}}")
elif args[0] == "experiments/study/matched.py":
    touch(Path(opt("--out")) / "es-at-grpo-sequences" / "eval.json")
elif args[0] == "experiments/study/at_step.py":
    touch(Path(args[3]) / "eval.json")
elif args[0] == "experiments/study/null_model.py":
    touch(Path(args[2]) / "null.json")
    touch(Path(args[2]) / "model.safetensors", "weights")
elif args[0] == "experiments/study/collect.py":
    sys.exit(subprocess.run([os.environ["REAL_PY"], *args]).returncode)
else:
    sys.exit(f"fake: no stand-in for {{args}}")
'''


def _claims_files(ids: str) -> dict[str, set[str]]:
    """claim id -> the files (relative to the study's data directory) its tests and premises read, for the claims
    whose id matches the regular expression ``ids``; the run premises' files under "premises" when it matches that."""
    from evolm.report.study.claims import load_claims
    from evolm.report.study.measure import files_of

    claims = load_claims(ROOT / "experiments" / "study" / "claims.toml")
    data = ROOT / claims.study.data
    out = {c.id: {str(f.relative_to(data)) for t in c.test + c.premise for f in files_of(t, data)}
           for c in claims.claim if re.fullmatch(ids, c.id)}
    if re.fullmatch(ids, "premises"):
        out["premises"] = {str(f.relative_to(data)) for p in claims.premise for f in files_of(p, data)}
    return out


def test_every_study_stage_the_claims_name_writes_what_they_read_under_its_own_out(tmp_path):
    """Each stage the claims' commands name runs (in the order the stages depend on one another) into a temporary
    OUT with a stand-in interpreter; `collect` then copies OUT into a temporary PUBLISH, and every file a claim of
    experiments/study/run.sh reads is there, at the path the claims read it from. The driver runs from a copy of
    experiments/study/ in a scratch repository, so a stage that ignored OUT would write into that copy (and fail
    here), never into this checkout's docs/ or runs/. (The refnum and artifact commands, Q3 and Q4: the tests above.)"""
    claims = tomllib.loads((ROOT / "experiments" / "study" / "claims.toml").read_text())["claim"]
    named = {s for c in claims for s in re.findall(r"[a-z0-9]+", c.get("command", "")) if s in STAGE_ORDER}
    assert named >= {"c1c2", "c1seeds", "cd", "seeds", "q1", "c8", "c9", "c7", "c7x", "c2long", "c2xl", "c3", "c5",
                     "q2", "k32", "c4"}, named
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "experiments" / "study", repo / "experiments" / "study")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    for cmd in (["init", "-q"], ["add", "."], ["commit", "-qm", "declared"]):
        subprocess.run(git + cmd, cwd=repo, check=True, capture_output=True)
    fake = tmp_path / "py"
    fake.write_text(STUDY_FAKE_PY.format(python=sys.executable))
    fake.chmod(0o755)
    out, publish, log = tmp_path / "out", tmp_path / "published", tmp_path / "calls.log"
    env = dict(os.environ, OUT=str(out), PY=str(fake), PUBLISH=str(publish), FAKE_LOG=str(log),
               REAL_PY=sys.executable, PYTHONPATH=str(ROOT / "src"))
    script = repo / "experiments" / "study" / "run.sh"
    for stage in [s for s in STAGE_ORDER if s in named | {"n30"}] + ["collect"]:
        done = subprocess.run(["bash", str(script), stage], cwd=repo, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, (stage, done.stderr[-2000:], log.read_text()[-2000:] if log.exists() else "")
    missing = {cid: sorted(f for f in files if not (publish / f).exists())
               for cid, files in _claims_files(r"C\d|Q1|Q2|premises").items()}
    assert not any(missing.values()), {cid: fs for cid, fs in missing.items() if fs}
    assert not list(publish.rglob("*.safetensors"))  # collect never publishes weights
    status = subprocess.run(["git", "status", "--porcelain", "--ignored"], cwd=repo, capture_output=True, text=True)
    assert status.stdout == "" and sorted(p.name for p in repo.iterdir()) == [".git", "experiments"], status.stdout
    assert "runs/study" not in log.read_text()  # every run, evaluation and analysis was told OUT
    # n30 refuses to start runs while the declaration they read is not committed
    (repo / "experiments" / "study" / "claims.toml").write_text("# changed\n", encoding="utf-8")
    done = subprocess.run(["bash", str(script), "n30"], cwd=repo, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "uncommitted changes" in done.stderr
