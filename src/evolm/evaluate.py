"""Evaluation: sample n completions per held-out problem, score them, and report pass@k, maj@k, entropy.

The one function everything calls is ``evaluate_task(generator, task, tokenizer, examples, sampling,
ks)``: the CLI (``evolm eval``), the ES engine and the GRPO trainer (before/after evaluations and
held-out probes) all measure the same way. ``evaluate_model`` loads a model spec and writes the
outputs (the ``eval`` verb in ``evolm/commands/eval.py`` calls it).

Design decisions:

- Tasks are used only through the ``Task`` interface (``render_prompt``, ``check`` and
  ``canonical_answer``), so any registered task works, code tasks included. A completion's vote for
  maj@k and its entry in the distinct-correct count is the canonical form of its extracted answer
  (``task.canonical_answer(verdict.answer)``: "3+5" and "3 + 5" are one equation, "132.0" and "132"
  one number); ``eval.json`` keeps both, ``answers`` (raw) and ``votes`` (canonical).
- Every completion is sampled with entropy recording on (it comes from the logits the sampler already
  has; no second forward pass). Greedy accuracy (temperature 0, one completion) is a separate, cheap,
  optional pass reported beside pass@k.
- Problems are sent to the generator in calls of ``max(1, batch_size // n)`` prompts (one generator
  batch each), so progress, ETA and the cache advance per batch. Each call's sampling seed is derived
  from the root seed and the ids of the problems in it, so a problem's samples do not depend on how
  many problems were already cached, and problems do not share a random stream. A generator with
  ``generate_many(calls, done)`` (the Ray population's actors, ``es/ray_population.py``) receives all
  of a pass's calls at once and runs them side by side: the same calls, prompts and seeds, so the
  same completions as one generator making them one after another (bit for bit on HF replicas).
- Generations are cached on disk (``GenerationCache``) under
  ``<cache dir>/<model fingerprint>/<task>/<sampling settings>.jsonl``, one line per problem holding
  the example id, a hash of the exact prompt text, and its completions (text, tokens, entropy,
  finished). A line is appended and fsynced as soon as its batch is done, so a kill loses at most one
  batch; a torn last line is ignored. The key is (model fingerprint, task name, example id, prompt
  hash, n, temperature, top-p, max new tokens, seed): rerunning an eval resumes it, and evaluating a
  trained model beside its base reuses the base model's samples. The fingerprint hashes every
  parameter (``evolm.models.fingerprint``); callers that change weights in place must recompute it.
- The per-call overhead beyond generation is scoring and one JSON line per problem; target: eval
  throughput >= 0.9 x raw generation throughput (``benchmarks/eval_throughput.py``).
- Outputs of ``evaluate_model``: ``eval.json`` (settings, per-task summary, per-problem n, c,
  answers, correctness, entropy, tokens), ``eval.md`` (a Markdown table) and ``passk.png`` (pass@k
  against k, matplotlib Agg). Problem texts are never written (GPQA must not be redistributed).
  Each invocation writes a new directory (``default_out_dir``: ``RUN_DIR/eval/<time>-<tasks>/`` for a
  run directory); an existing ``eval.json`` is never overwritten.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Sequence

from evolm.backends.base import Completion, Generator, SamplingParams
from evolm import metrics, models
from evolm.console import progress_bar
from evolm.errors import UserError
from evolm.markdown import table
from evolm.runs import atomic_write_json, atomic_write_text, to_json
from evolm.seeding import ids_seed
from evolm.tasks import make_task
from evolm.tasks.canonical import canonical_text

# -- results ---------------------------------------------------------------------------------------


@dataclass
class ProblemResult:
    """Everything measured on one problem (no problem text)."""

    id: str
    answers: list[str | None]
    """Each sample's extracted final answer (None: none found)."""
    correct: list[bool]
    format_ok: list[bool]
    entropy: list[float | None]
    """Each sample's mean token entropy (nats)."""
    num_tokens: list[int]
    finished: list[bool]
    """Each sample ended with an end-of-sequence token (False: cut at max_new_tokens)."""
    greedy_answer: str | None = None
    greedy_correct: bool | None = None
    chance: float | None = None
    """Accuracy of a uniform random guess, for tasks that define one (multiple choice)."""
    votes: list[str | None] = field(default_factory=list)
    """Each sample's canonical answer, the key maj@k and distinct-correct use (empty: vote with ``answers``)."""

    @property
    def n(self) -> int:
        return len(self.correct)

    @property
    def c(self) -> int:
        return int(sum(self.correct))

    def to_dict(self) -> dict:
        d = {"id": self.id, "n": self.n, "c": self.c}
        d.update(asdict(self))
        d["entropy"] = [None if e is None else round(e, 5) for e in self.entropy]
        return d


@dataclass
class TaskEval:
    """One task's evaluation: settings, per-problem results and the summary metrics."""

    task: str
    split: str
    sampling: dict
    ks: list[int]
    problems: list[ProblemResult]
    summary: dict = field(default_factory=dict)
    params: dict = field(default_factory=dict)
    generated: int = 0
    """Completions generated by this call (the rest came from the cache)."""
    seconds: float = 0.0
    reward: str | None = None
    """The task's reward convention (for countdown it also decides what the checker accepts)."""

    def to_dict(self, problems: bool = True) -> dict:
        d = {"task": self.task, "split": self.split, "params": self.params, "reward": self.reward, "sampling": self.sampling,
             "ks": self.ks, "summary": self.summary, "generated": self.generated, "seconds": round(self.seconds, 2)}
        if problems:
            d["problems"] = [p.to_dict() for p in self.problems]
        return d


def summarize(problems: Sequence[ProblemResult], ks: Iterable[int]) -> dict[str, Any]:
    """The summary metrics of a task from its per-problem results (pure; formulas in ``evolm.metrics``)."""
    if not problems:
        return {"problems": 0}
    ns = [p.n for p in problems]
    cs = [p.c for p in problems]
    out: dict[str, Any] = {"problems": len(problems), "n": min(ns)}
    for k in ks:
        out[f"pass@{k}"] = metrics.pass_at_k(ns, cs, k)
    votes = [p.votes or p.answers for p in problems]
    for k in ks:
        out[f"maj@{k}"] = metrics.maj_at_k(votes, [p.correct for p in problems], k)
    out["mean_correct"] = sum(c / n for c, n in zip(cs, ns)) / len(problems)
    out["solved"] = sum(c > 0 for c in cs) / len(problems)
    greedy = [p.greedy_correct for p in problems if p.greedy_correct is not None]
    if greedy:
        out["greedy"] = sum(greedy) / len(greedy)
        out["greedy_correct"] = sum(greedy)  # a count, as arXiv 2608.27351's artifact reports it (988 of 1319)
    out["format_rate"] = sum(sum(p.format_ok) for p in problems) / sum(ns)
    out["entropy"] = metrics.token_weighted_entropy((e for p in problems for e in p.entropy), (t for p in problems for t in p.num_tokens))
    out["mean_tokens"] = sum(sum(p.num_tokens) for p in problems) / sum(ns)
    out["truncated"] = 1.0 - sum(sum(p.finished) for p in problems) / sum(ns)
    out["distinct_correct"] = sum(metrics.distinct_correct(v, p.correct) for v, p in zip(votes, problems)) / len(problems)
    chance = [p.chance for p in problems if p.chance is not None]
    if len(chance) == len(problems):  # multiple choice: what uniform guessing would score
        for k in ks:
            out[f"chance_pass@{k}"] = sum(1 - (1 - q) ** k for q in chance) / len(chance)
    return out


# -- generation cache ------------------------------------------------------------------------------


def _sha(text: str, length: int = 16) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def sampling_key(sampling: SamplingParams) -> str:
    """A file-name-safe key of the settings that change what is sampled (greedy ignores the seed)."""
    if sampling.greedy:
        return f"greedy-m{sampling.max_new_tokens}"
    return f"n{sampling.n}-t{sampling.temperature:g}-p{sampling.top_p:g}-m{sampling.max_new_tokens}-s{sampling.seed}"


class CacheTable:
    """The cached completions of one (model, task, sampling settings): a JSONL file, appended per batch."""

    def __init__(self, path: Path):
        self.path = path
        self.entries: dict[tuple[str, str], list[Completion]] = {}
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    rec = json.loads(line)
                    comps = [Completion(text=c["text"], num_tokens=c["num_tokens"], entropy=c.get("entropy"),
                                        finished=c.get("finished", True)) for c in rec["completions"]]
                    self.entries[(rec["id"], rec["prompt"])] = comps
                except (json.JSONDecodeError, KeyError, TypeError):
                    continue  # a torn last line from a kill

    def get(self, example_id: str, prompt: str) -> list[Completion] | None:
        return self.entries.get((str(example_id), _sha(prompt)))

    def put_many(self, items: list[tuple[str, str, list[Completion]]]) -> None:
        """Append ``(example id, prompt, completions)`` records and fsync (one call per batch)."""
        lines = []
        for example_id, prompt, comps in items:
            key = (str(example_id), _sha(prompt))
            self.entries[key] = comps
            lines.append(to_json({"id": key[0], "prompt": key[1], "completions": [
                {"text": c.text, "num_tokens": c.num_tokens, "entropy": c.entropy, "finished": c.finished} for c in comps]}))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a+b") as f:
            f.seek(0, os.SEEK_END)
            if f.tell() > 0:  # do not glue a record onto a torn last line
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    f.write(b"\n")
            f.write(("\n".join(lines) + "\n").encode())
            f.flush()
            os.fsync(f.fileno())

    def __len__(self) -> int:
        return len(self.entries)


class GenerationCache:
    """Cached generations of one model (by parameter fingerprint) under ``root``."""

    def __init__(self, root: str | Path, model_fingerprint: str):
        self.root = Path(root).expanduser()
        self.fingerprint = model_fingerprint
        self._tables: dict[tuple[str, str], CacheTable] = {}

    def table(self, task_name: str, sampling: SamplingParams) -> CacheTable:
        key = (task_name, sampling_key(sampling))
        if key not in self._tables:
            self._tables[key] = CacheTable(self.root / self.fingerprint / task_name / f"{key[1]}.jsonl")
        return self._tables[key]


def default_cache_dir() -> Path:
    return models.cache_dir() / "generations"


# -- evaluation ------------------------------------------------------------------------------------


def _generate_all(generator: Generator, examples, prompts: list[str], sampling: SamplingParams, table: CacheTable | None,
                  per_call: int, bar) -> tuple[list[list[Completion]], int]:
    """Completions for every prompt, from the cache where possible; returns them and how many were generated."""
    out: list[list[Completion] | None] = [None] * len(prompts)
    if table is not None:
        for i, (ex, prompt) in enumerate(zip(examples, prompts)):
            hit = table.get(ex.id, prompt)
            if hit is not None and len(hit) == sampling.n:
                out[i] = hit
    todo = [i for i, o in enumerate(out) if o is None]
    if bar is not None:
        bar.update((len(prompts) - len(todo)) * sampling.n)
    generated = 0
    chunks = [todo[start:start + per_call] for start in range(0, len(todo), per_call)]
    calls = [([prompts[i] for i in chunk],
              sampling if sampling.greedy else replace(sampling, seed=ids_seed(sampling.seed, [examples[i].id for i in chunk])))
             for chunk in chunks]

    def done(index: int, results: list[list[Completion]]) -> None:
        nonlocal generated
        chunk = chunks[index]
        for i, comps in zip(chunk, results):
            out[i] = comps
        if table is not None:
            table.put_many([(examples[i].id, prompts[i], out[i]) for i in chunk])
        generated += len(chunk) * sampling.n
        if bar is not None:
            bar.update(len(chunk) * sampling.n)

    many = getattr(generator, "generate_many", None)  # several generators (Ray actors): the calls run side by side
    if many is not None and len(calls) > 1:
        many(calls, done)
    else:
        for index, (chunk_prompts, params) in enumerate(calls):
            done(index, generator.generate(chunk_prompts, params))
    return out, generated  # type: ignore[return-value]


def check_ks(ks: Iterable[int], n: int) -> list[int]:
    ks = sorted({int(k) for k in ks})
    bad = [k for k in ks if not 1 <= k <= n]
    if bad:
        raise UserError(f"k values {bad} need 1 <= k <= n = {n} samples per problem; raise --n or drop them")
    return ks


def evaluate_task(generator: Generator, task, tokenizer, examples: Sequence, sampling: SamplingParams,
                  ks: Iterable[int] = (1,), cache: GenerationCache | None = None, progress: bool = True,
                  greedy: bool = False, split: str = "test", per_call: int | None = None) -> TaskEval:
    """Sample ``sampling.n`` completions for each example, score them with ``task.check`` and summarise.

    ``sampling.seed`` is the root seed (each generator call derives its own from it and the problem
    ids). ``ks`` must lie in ``[1, sampling.n]``. With ``greedy=True`` a temperature-0 pass (one
    completion per problem, same ``max_new_tokens``) adds ``greedy`` accuracy to the summary.
    ``cache``: a ``GenerationCache`` for the generator's current weights, or None. ``per_call``:
    prompts per generator call (default ``max(1, generator.batch_size // n)``).
    """
    t0 = time.perf_counter()
    ks = check_ks(ks, sampling.n)
    sampling = replace(sampling, return_entropy=True)
    examples = list(examples)
    prompts = [task.render_prompt(ex, tokenizer) for ex in examples]
    batch = int(getattr(generator, "batch_size", 32) or 32)
    per_call = per_call or max(1, batch // sampling.n)

    bar = progress_bar(len(examples) * sampling.n, f"{task.name} n={sampling.n}", unit="sample", enabled=progress)
    try:
        samples, generated = _generate_all(generator, examples, prompts, sampling,
                                           cache.table(task.name, sampling) if cache else None, per_call, bar)
    finally:
        if bar is not None:
            bar.close()
    greedy_out = None
    if greedy:
        g = SamplingParams(n=1, temperature=0.0, max_new_tokens=sampling.max_new_tokens, return_entropy=False)
        bar = progress_bar(len(examples), f"{task.name} greedy", unit="sample", enabled=progress)
        try:
            greedy_out, extra = _generate_all(generator, examples, prompts, g, cache.table(task.name, g) if cache else None,
                                              max(1, batch), bar)
        finally:
            if bar is not None:
                bar.close()
        generated += extra

    problems = []
    chance_of = getattr(task, "chance_accuracy", None)
    canonical = getattr(task, "canonical_answer", None) or canonical_text
    judged = _judge_all(task, examples, samples, prompts)
    greedy_judged = _judge_all(task, examples, greedy_out, prompts) if greedy_out is not None else None
    for i, (ex, comps) in enumerate(zip(examples, samples)):
        verdicts = judged[i]
        result = ProblemResult(id=str(ex.id), answers=[v.answer for v in verdicts], correct=[bool(v.correct) for v in verdicts],
                               format_ok=[bool(v.format_ok) for v in verdicts], entropy=[c.entropy for c in comps],
                               num_tokens=[c.num_tokens for c in comps], finished=[c.finished for c in comps],
                               votes=[canonical(v.answer) for v in verdicts])
        if chance_of is not None:
            result.chance = float(chance_of(ex))
        if greedy_out is not None:
            gv = greedy_judged[i][0]
            result.greedy_answer, result.greedy_correct = gv.answer, bool(gv.correct)
        problems.append(result)
    sampling_info = {k: v for k, v in asdict(sampling).items() if k != "return_entropy"}
    return TaskEval(task=task.name, split=split, sampling=sampling_info, ks=ks, problems=problems,
                    summary=summarize(problems, ks), params=dict(getattr(task, "params", {}) or {}),
                    reward=getattr(task, "reward_name", None),
                    generated=generated, seconds=time.perf_counter() - t0)


# -- whole-model evaluation (the CLI) ----------------------------------------------------------------


def _judge_all(task, examples, outputs, prompts) -> list[list]:
    """The verdicts of every completion, per example (``task.judge``: one batched call of a correctness function)."""
    rows = [(ex, c.text, p) for ex, comps, p in zip(examples, outputs, prompts) for c in comps]
    judge = getattr(task, "judge", None)
    flat = (judge([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]) if judge is not None
            else [task.check(r[1], r[0]) for r in rows])
    it = iter(flat)
    return [[next(it) for _ in comps] for comps in outputs]


FALLBACK_MAX_NEW_TOKENS = 256
"""The completion length of a task that declares no ``default_max_new_tokens``."""


def default_max_new_tokens(task) -> int:
    """Completion budget when none is given: the task's ``default_max_new_tokens``, else ``FALLBACK_MAX_NEW_TOKENS``."""
    return int(getattr(task, "default_max_new_tokens", None) or FALLBACK_MAX_NEW_TOKENS)


def _model_name(spec: str) -> str:
    path = Path(spec).expanduser()
    name = path.name if path.exists() else spec
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name) or "model"


def _run_dir(spec: str | None) -> Path | None:
    """``spec`` as an evolm run directory (``run.json`` + ``config.toml``, or ``final/``), or None."""
    path = Path(spec).expanduser() if spec else None
    if path is None or not path.is_dir():
        return None
    return path if (path / "run.json").exists() and (path / "config.toml").exists() or (path / "final").is_dir() else None


def default_out_dir(spec: str | None, tasks: Sequence[str] = (), like: str | None = None) -> Path:
    """A new directory for one ``evolm eval`` invocation, never an existing one: under ``RUN_DIR/eval/``
    when the model (or ``like``) is an evolm run directory, else under ``runs/``; named by time and
    what was measured (``20261130-120000-csqa+gsm8k``, ``...-like``), with ``-2``, ``-3`` ... on a clash."""
    run = _run_dir(like) or _run_dir(spec)
    what = "like" + (f"-{_model_name(spec)}" if like and spec else "") if like else "+".join(tasks) or "eval"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    parent, name = (run / "eval", f"{stamp}-{what}") if run else (Path("runs"), f"eval-{_model_name(spec or 'model')}-{stamp}")
    out, i = parent / name, 2
    while out.exists():
        out, i = parent / f"{name}-{i}", i + 1
    return out


def check_out_dir(out: str | Path) -> Path:
    """An ``--out`` directory that holds no evaluation yet (an evaluation is never overwritten)."""
    out = Path(out)
    if (out / "eval.json").exists():
        raise UserError(f"{out} already holds an evaluation (eval.json); choose another --out, or leave --out out "
                        "for a new directory per invocation")
    return out


def evaluate_model(spec_or_model: Any, tasks: Sequence[Any], *, tokenizer=None, n: int = 32, ks: Sequence[int] = (1, 16, 32),
                   temperature: float = 1.0, top_p: float = 1.0, max_new_tokens: int = 0, limit: int | None = None,
                   split: str = "test", seed: int = 0, greedy: bool = True, task_params: dict[str, dict] | None = None,
                   out_dir: str | Path | None = None, cache_dir: str | Path | None = None, use_cache: bool = True,
                   batch_size: int = 32, dtype: str = "float32", device: str = "cpu", threads: int | None = 1,
                   progress: bool = True) -> dict:
    """Evaluate a model (a spec string, or a loaded model with ``tokenizer``) on several tasks.

    ``tasks``: names (built with ``task_params[name]``) or ``Task`` objects. ``limit``: problems per
    task (a seeded subset; None = the whole split). ``max_new_tokens=0`` uses each task's default.
    Writes eval.json, eval.md and passk.png into ``out_dir`` when it is given; returns the eval.json
    content.
    """
    from evolm.backends.hf import HFGenerator  # torch and transformers: not needed to read or score results

    if temperature <= 0 and n > 1:
        raise UserError(f"n={n} samples at temperature 0 are all the same completion; use --temperature > 0 or --n 1")
    ks = check_ks(ks, n)
    spec = spec_or_model if isinstance(spec_or_model, str) else None
    if spec is None and tokenizer is None:
        raise UserError("evaluate_model needs the tokenizer when given a loaded model")
    task_params = task_params or {}
    built = [make_task(t, **task_params.get(t, {})) if isinstance(t, str) else t for t in tasks]
    unknown = set(task_params) - {t.name for t in built}
    if unknown:
        raise UserError(f"task params given for {sorted(unknown)}, which are not among the evaluated tasks {[t.name for t in built]}")
    # draw every task's examples before loading the model, so a missing data file fails at once
    drawn = [(task, task.examples(split, limit, seed)) for task in built]

    if spec is not None:
        model, tokenizer = models.load(spec, dtype=dtype, threads=threads, device=device)
    else:
        model = spec_or_model
        if threads:
            import torch

            torch.set_num_threads(int(threads))
    fp = models.fingerprint(model)
    cache = GenerationCache(cache_dir or default_cache_dir(), fp) if use_cache else None
    generator = HFGenerator(model, tokenizer, batch_size=batch_size)
    results = []
    for task, examples in drawn:
        if not max_new_tokens and not getattr(task, "default_max_new_tokens", None):
            print(f"evolm: note: task '{task.name}' declares no default_max_new_tokens: completions of up to "
                  f"{FALLBACK_MAX_NEW_TOKENS} tokens (give --max-new-tokens N, or set default_max_new_tokens on the "
                  "task class)", file=sys.stderr)
        sampling = SamplingParams(n=n, temperature=temperature, top_p=top_p, seed=seed,
                                  max_new_tokens=max_new_tokens or default_max_new_tokens(task))
        results.append(evaluate_task(generator, task, tokenizer, examples, sampling, ks, cache=cache,
                                     progress=progress, greedy=greedy, split=split))
    report = {
        "model": {"spec": spec or getattr(getattr(model, "config", None), "_name_or_path", "model"), "fingerprint": fp,
                  "dtype": dtype, "device": device},
        "settings": {"n": n, "ks": ks, "temperature": temperature, "top_p": top_p, "max_new_tokens": max_new_tokens,
                     "limit": limit, "split": split, "seed": seed, "greedy": greedy},
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "tasks": {r.task: r.to_dict() for r in results},
    }
    if out_dir is not None:
        write_outputs(report, out_dir)
    return report


# -- outputs ---------------------------------------------------------------------------------------


def markdown_table(report: dict) -> str:
    """The summary of an eval.json as a Markdown table (one row per task)."""
    ks = report["settings"]["ks"]
    cols = ["task", "problems", "n"] + (["greedy"] if report["settings"].get("greedy") else []) + [f"pass@{k}" for k in ks] \
        + [f"maj@{k}" for k in ks if k > 1] + [f"chance pass@{ks[-1]}", "entropy", "distinct correct", "format", "tokens",
                                                 "truncated"]
    rows = []
    for name, t in report["tasks"].items():
        s = t["summary"]
        row = [name, str(s.get("problems", 0)), str(s.get("n", ""))]
        if report["settings"].get("greedy"):
            row.append(f"{s['greedy']:.3f}" if "greedy" in s else "")
        row += [f"{s[f'pass@{k}']:.3f}" for k in ks] + [f"{s[f'maj@{k}']:.3f}" for k in ks if k > 1]
        chance = s.get(f"chance_pass@{ks[-1]}")
        row += ["" if chance is None else f"{chance:.3f}"]
        row += [f"{s['entropy']:.3f}", f"{s['distinct_correct']:.2f}", f"{s['format_rate']:.2f}", f"{s['mean_tokens']:.1f}",
                f"{s['truncated']:.2f}"]
        rows.append(row)
    m = report["model"]
    st = report["settings"]
    seed = f"seed {st['seed']}"
    if st.get("like"):  # eval --like: the seeds the run derived from its run.seed, not an eval seed
        derivation = str(st.get("seed_derivation", "")).split(": ", 1)[-1]
        seed = f"run.seed {st['seed']} of {st['like']}" + (f" ({derivation})" if derivation else "")
    head = (f"# Evaluation of `{m['spec']}` (fingerprint {m['fingerprint']})\n\n"
            f"split {st['split']}, n={st['n']} samples per problem at temperature {st['temperature']:g} (top-p {st['top_p']:g}), "
            f"{seed}; greedy = temperature-0 accuracy; entropy = token-weighted mean next-token entropy (nats); "
            f"distinct correct = distinct correct final answers per problem; chance = pass@k of uniform guessing "
            f"(multiple-choice tasks).\n\n")
    return head + table(cols, rows)


def plot_pass_at_k(report: dict, path: str | Path) -> None:
    """pass@k against k (1..n, log scale) for every task, requested k values marked, chance dashed."""
    import matplotlib  # plotting only: matplotlib is heavy to import

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    for name, t in report["tasks"].items():
        ns = [p["n"] for p in t["problems"]]
        cs = [p["c"] for p in t["problems"]]
        if not ns:
            continue
        curve = metrics.pass_at_k_curve(ns, cs)
        k_all = list(range(1, len(curve) + 1))
        line, = ax.plot(k_all, curve, label=name)
        marks = [k for k in t["ks"] if k <= len(curve)]
        ax.plot(marks, [curve[k - 1] for k in marks], "o", color=line.get_color())
        chance = [p.get("chance") for p in t["problems"]]
        if all(q is not None for q in chance):  # multiple choice: uniform guessing, dashed
            ax.plot(k_all, [sum(1 - (1 - q) ** k for q in chance) / len(chance) for k in k_all], "--", lw=0.8,
                    color=line.get_color(), label=f"{name} (chance)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k (samples)")
    ax.set_ylabel("pass@k")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.set_title(f"pass@k of {_model_name(str(report['model']['spec']))} (T={report['settings']['temperature']:g})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_outputs(report: dict, out_dir: str | Path) -> Path:
    """Write eval.json, eval.md and passk.png into ``out_dir`` (atomically for the text files)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "eval.json", report)
    atomic_write_text(out / "eval.md", markdown_table(report))
    plot_pass_at_k(report, out / "passk.png")
    return out
