"""``evolm analyze KIND``: drift, sparsity, localisation, magnitude, compression, diversity and update-variance,
each writing ``<out>/<kind>.json`` and ``<out>/<kind>.png``.

Design decisions:

- ``--trained`` is repeatable and takes an optional label (``--trained es=runs/es --trained
  grpo=runs/grpo``), so ES and GRPO are analysed side by side. Without a label the directory or spec
  name is used.
- Each trained model is compared with the weights its run started from: ``--base``, else the run's
  own (``analysis.weights.run_base_spec``: a lower-precision run's saved ``base/``, a pipeline
  stage's predecessor, else its ``[model] spec``), and that base's fingerprint must equal the one in
  the run's ``run.json`` (``check_base``; ``--allow-base-mismatch`` overrides, with a warning). Each
  distinct base is loaded once; models with different bases are each compared with their own.
- When a trained model is an evolm run directory, its ``config.toml`` supplies the other defaults:
  the target task (``[task]``) and the generation length; its ``seed_log.jsonl`` supplies the
  single-ES-update scale of the sparsity thresholds and the tensors it trained (the null's
  population in drift and localisation).
- Weights are read as float32 safetensors without building a model; a model is loaded only for
  the analyses that re-evaluate (sparsity curve, compression), once, and every variant is copied
  into it.
- ``diversity --model`` and ``update-variance`` measure an ES population around a model (a run
  directory's final weights or any spec) with the engine's own perturb/restore
  (``evolm.es.measure``). Their ES settings (σ, N, estimator, shaping, noise, parameter
  categories, seed) and task come from the run directory's ``config.toml`` when there is one,
  then from the command line; the resolved settings are written into the JSON.
- This module is the orchestration only (arguments, loading models, building the evaluator and the
  ES population, printing, writing); the analyses are pure functions in ``evolm.analysis``.
- torch, the ES engine (which imports torch) and tqdm are imported inside the commands that need
  them, so ``evolm --help``, which imports this module, stays fast.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from evolm import config, models
from evolm.analysis import plots
from evolm.analysis.compression import compression_table, parse_method, problems_file_name
from evolm.analysis.diversity import diversity_report
from evolm.analysis.drift import drift
from evolm.analysis.evaluator import TaskEvaluator
from evolm.analysis.localisation import top_k_localisations
from evolm.analysis.sparsity import single_update_rms, sparsity_curve, tau_grid, update_sparsity
from evolm.analysis.update_variance import update_spread
from evolm.analysis.enrichment import format_p
from evolm.analysis.weights import StateInfo, check_base, load_state_info, run_base_spec, trained_scope
from evolm.backends import engine_options, make_generator
from evolm.backends.base import SamplingParams
from evolm.categories import CATEGORIES
from evolm.errors import UserError
from evolm.markdown import fmt
from evolm.runs import atomic_write_json, read_jsonl
from evolm.seeding import seed31
from evolm.state import state_fingerprint
from evolm.tasks import make_task, task_from_config

KINDS = ("drift", "sparsity", "localisation", "magnitude", "compression", "diversity", "update_variance")


# -- argument helpers ---------------------------------------------------------------------------------

def _split_label(text: str) -> tuple[str, str]:
    m = re.match(r"^([A-Za-z0-9_.\-]+)=(.+)$", text)
    if m and "/" not in m.group(1):
        return m.group(1), m.group(2)
    name = Path(text.rstrip("/")).name or text
    return name, text


def _trained(args) -> dict[str, str]:
    if not args.trained:
        raise UserError(f"evolm analyze {args.kind} needs --trained RUN_OR_SPEC (repeatable, optionally LABEL=RUN_OR_SPEC)")
    out: dict[str, str] = {}
    for text in args.trained:
        label, spec = _split_label(text)
        if label in out:
            raise UserError(f"two --trained models are labelled '{label}'; give them labels, e.g. --trained es={spec}")
        out[label] = spec
    return out


def _run_config(spec: str) -> dict:
    path = Path(spec) / "config.toml"
    if not path.exists():
        return {}
    return config.read_toml(path)


def _base_specs(args, trained: dict[str, str]) -> dict[str, str]:
    """The base of every trained model: ``--base``, else its run's own starting weights (``run_base_spec``); a
    trained model that is not a run directory takes the run directories' base when they agree on one."""
    if args.base:
        return {label: args.base for label in trained}
    own = {label: run_base_spec(spec) for label, spec in trained.items()}
    found = sorted({b for b in own.values() if b})
    out = {}
    for label, spec in trained.items():
        if own[label]:
            out[label] = own[label]
        elif len(found) == 1:
            out[label] = found[0]
        else:
            raise UserError(f"pass --base SPEC, the model '{label}' ({spec}) started from; it is only inferred from run "
                            "directories")
    return out


def _floats(text: str, what: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"{what} must be comma-separated numbers (got '{text}')") from None


def _write(out_dir: str, kind: str, result: dict) -> tuple[Path, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / f"{kind}.json"
    atomic_write_json(json_path, result)
    png = getattr(plots, f"plot_{kind}")(result, out / f"{kind}.png")
    return json_path, png


@dataclass
class _Base:
    """A base model as loaded once: its spec, float32 state, how it was read and its content fingerprint."""

    spec: str
    state: dict
    info: StateInfo
    fingerprint: str


@dataclass
class _Trained:
    """A trained model, the key of its base in ``_Models.bases``, its base check and its trained tensors."""

    spec: str
    state: dict
    info: StateInfo
    base: str
    check: dict
    scope: list[str] | None


@dataclass
class _Models:
    bases: dict[str, _Base]
    trained: dict[str, _Trained]

    def base_of(self, label: str) -> _Base:
        return self.bases[self.trained[label].base]

    @property
    def single_base(self) -> _Base:
        """The one base every trained model shares (by content); a one-line error when they differ."""
        prints = {self.base_of(label).fingerprint for label in self.trained}
        if len(prints) > 1:
            found = ", ".join(f"{label}: {t.base}" for label, t in self.trained.items())
            raise UserError(f"the trained models started from different weights ({found}); this analysis compares them "
                            "with one base: analyse them separately, or pass --base")
        return self.base_of(next(iter(self.trained)))


def _load_models(args) -> _Models:
    """Every ``--trained`` model (float32, tied weights once) and its base: ``--base``, else the weights its run
    started from, checked against the fingerprint in the run's ``run.json`` (``--allow-base-mismatch``)."""
    import torch  # local: torch is slow to import, and `evolm --help` imports this module

    torch.set_num_threads(max(1, args.threads))
    bases: dict[str, _Base] = {}
    trained: dict[str, _Trained] = {}
    given = _trained(args)
    base_specs = _base_specs(args, given)
    for label, spec in given.items():
        base_spec = base_specs[label]
        if base_spec not in bases:
            state, info = load_state_info(base_spec)
            bases[base_spec] = _Base(base_spec, state, info, state_fingerprint(state))
        base = bases[base_spec]
        check = check_base(label, spec, base_spec, base.fingerprint, allow_mismatch=args.allow_base_mismatch)
        if check["check"] == "unrecorded" and run_base_spec(spec):
            print(f"evolm: warning: {spec} has no recorded base fingerprint (a run from before evolm recorded one); "
                  f"cannot check that {base_spec} is the weights it started from", file=sys.stderr)
        elif check["check"] == "mismatch allowed":
            print(f"evolm: warning: {base_spec} is not the weights '{label}' started from (--allow-base-mismatch): Δ "
                  "includes the difference between the two bases", file=sys.stderr)
        state, info = load_state_info(spec)
        if info.tied_embeddings != base.info.tied_embeddings:
            raise UserError(f"'{label}' and its base disagree on tied embeddings; compare checkpoints of the same architecture")
        trained[label] = _Trained(spec, state, info, base_spec, check, trained_scope(spec))
    return _Models(bases, trained)


def _header(kind: str, loaded: _Models) -> dict:
    # a base stored in bfloat16 is exact (a run's saved rounded base); a trained checkpoint stored so has lost updates
    low = sorted({d for t in loaded.trained.values() for d in t.info.stored_dtypes if d in ("bfloat16", "float16")})
    if low:
        print(f"evolm: warning: some weights are stored in {'/'.join(low)}; updates below half their spacing were "
              "rounded away before this analysis saw them (save float32 checkpoints)", file=sys.stderr)
    first = loaded.base_of(next(iter(loaded.trained)))
    tied = first.info.tied_embeddings
    return {"kind": kind, "base": first.info.to_dict(),
            "bases": {label: {**t.check, "info": loaded.bases[t.base].info.to_dict()} for label, t in loaded.trained.items()},
            "trained": {label: t.info.to_dict() for label, t in loaded.trained.items()},
            "tied_embeddings": tied,
            "low_precision_storage": low,
            "note": ("tied embeddings: the LM head is the embedding matrix and is counted once, as 'embedding'"
                     if tied else "untied embeddings: 'embedding' and 'lm_head' are separate tensors")}


# -- kinds ------------------------------------------------------------------------------------------

def _cmd_drift(args) -> int:
    loaded = _load_models(args)
    result = _header("drift", loaded)
    result["models"] = {}
    for label, t in loaded.trained.items():
        d = drift(loaded.base_of(label).state, t.state, scope=t.scope)
        if not args.per_tensor:
            d.pop("by_tensor")
        result["models"][label] = d
        shares = ", ".join(f"{c} {v['share']:.2%} of ||Δ||² ({v['enrichment']:.3g}x its parameter share)"
                           for c, v in d["enrichment"]["by_category"].items() if v["enrichment"] is not None)
        print(f"{label}: relative distance {d['relative_distance']:.4g} ({shares})")
    _report(*_write(args.out, "drift", result))
    return 0


def _cmd_localisation(args) -> int:
    ks = args.k or [100]
    loaded = _load_models(args)
    result = _header("localisation", loaded)
    result["models"] = {}
    for label, t in loaded.trained.items():
        result["models"][label] = {}
        for k, loc in top_k_localisations(loaded.base_of(label).state, t.state, ks, scope=t.scope).items():
            result["models"][label][str(k)] = loc
            counts = ", ".join(f"{c} {e['observed']} (expected {e['expected']:.3g}, {e['enrichment']:.3g}x, "
                               f"p {format_p(e['p_enriched'] if e['observed'] >= e['expected'] else e['p_depleted'])})"
                               for c, e in loc["enrichment"]["by_category"].items() if e["observed"] or e["expected"] >= 1)
            print(f"{label} top-{k}: {counts} (max |Δ| {loc['max_abs_delta']:.3g})")
            if loc.get("tied"):  # the k-th value is shared: the top k is a tie-break, the set at or above it is the finding
                tie = loc["at_least_kth"]
                shares = ", ".join(f"{c} {e['observed']} ({e['enrichment']:.3g}x)" for c, e in tie["enrichment"].items() if e["observed"])
                print(f"{label} top-{k} is cut inside a tie: {tie['num_coordinates']:,} coordinates have |Δ| >= the "
                      f"{k}-th value {tie['threshold']:.3g}: {shares}")
    _report(*_write(args.out, "localisation", result))
    return 0


def _run_dtype(spec: str) -> str:
    """The dtype a run's weights moved in: model.dtype for an es.arithmetic = "reference" or "artifact" run and for a
    GRPO run (its optimiser updates the model's own weights), else float32 (exact ES keeps float32
    masters; a model that is not a run directory)."""
    cfg = _run_config(spec) if Path(spec).is_dir() else {}
    if (cfg.get("es") or {}).get("arithmetic") in ("reference", "artifact") or "grpo" in cfg:
        return (cfg.get("model") or {}).get("dtype", "float32")
    return "float32"


def _cmd_magnitude(args) -> int:
    from evolm.analysis.magnitude import MIN_PERMUTATIONS, magnitude_analysis

    if args.permutations < MIN_PERMUTATIONS:
        raise UserError(f"--permutations must be >= {MIN_PERMUTATIONS} (got {args.permutations}): with R permutations "
                        "the smallest p the null can give is 1 / (R + 1)")
    loaded = _load_models(args)
    result = _header("magnitude", loaded)
    result.update({"k": args.k, "permutations": args.permutations, "models": {}})
    for label, t in loaded.trained.items():
        dtype = args.dtype or _run_dtype(t.spec)
        m = magnitude_analysis(loaded.base_of(label).state, t.state, dtype, k=args.k, scope=t.scope,
                               permutations=args.permutations, seed=args.seed)
        result["models"][label] = m
        parts = []
        # absolute and relative: the set the cut selects (the top k, or all tied at its k-th value too)
        absolute = m["absolute"]["at_least_kth"].get("enrichment") if m["absolute"]["tied"] else m["absolute"]["enrichment"]
        for c, e in (absolute or {}).items():
            rel = m["relative"]["enrichment"].get(c) or {}
            null = m["dtype_null"]["by_category"].get(c) or {}
            if e["observed"] or e["expected"] >= 1:
                ratio = lambda v: "n/a" if v is None else f"{fmt(v)}x"  # noqa: E731 (None: the null expects none there)
                parts.append(f"{c} {fmt(null.get('observed', e['observed']))} (abs {ratio(e['enrichment'])}, "
                             f"rel {ratio(rel.get('enrichment'))}, vs {dtype} null {ratio(null.get('enrichment'))} "
                             f"of {fmt(null.get('null_mean'))}, p {format_p(null.get('p_enriched'))})")
        print(f"{label} top-{args.k}: " + ", ".join(parts))
        held = m["dtype_null"]["held_out"]
        if held["num"]:  # θ0 = 0 or θ far from θ0: no step count to shuffle (evolm.analysis.magnitude)
            print(f"  {held['num']:,} coordinates held at their observed Δ in the null (θ0 = 0, or θ outside "
                  f"[θ0/2, 2θ0]); {fmt(sum(held['in_observed_top_k'].values()))} of them in the observed top {args.k}")
        null_set = m["dtype_null"]["at_least_kth"]
        if null_set["size"] > args.k:  # counts above split the tie at the k-th |Δ| evenly (the null's too)
            print(f"  the {args.k}th |Δ| ({fmt(null_set['kth'])}) is shared by {null_set['tied']:,} coordinates: "
                  f"{null_set['size']:,} at or above it; the counts split that tie evenly, on the null's side too")
    _report(*_write(args.out, "magnitude", result))
    return 0


def _tau_scale(args, loaded) -> tuple[float, str]:
    if args.tau_scale is not None:
        return float(args.tau_scale), "--tau-scale"
    for label, t in loaded.trained.items():
        log = Path(t.spec) / "seed_log.jsonl"
        if log.exists():
            return single_update_rms(read_jsonl(log)), f"median single-update RMS from {log}"
    raise UserError("no ES seed log found among --trained run directories; pass --tau-scale (e.g. an ES run's single-update RMS)")


def _build_evaluator(args, base_spec: str, loaded: _Models):
    """A ``TaskEvaluator`` for the target task: ``--task`` or the first trained run's ``[task]``; the model
    (its architecture: every evaluated state is copied into it) is loaded from ``base_spec``."""
    run_cfg = next((c for c in (_run_config(t.spec) for t in loaded.trained.values()) if c), {})
    task_cfg = dict(run_cfg.get("task", {}))
    if args.task and args.task != task_cfg.get("name"):
        task_cfg = {"name": args.task}  # a different task than the run's: none of its task settings apply
    if not task_cfg.get("name"):
        raise UserError("pass --task NAME for re-evaluation (or --no-eval); it is only inferred from run directories")
    params = dict(task_cfg.get("params", {}))
    for assignment in args.task_param:
        if "=" not in assignment:
            raise UserError(f"--task-param expects KEY=VALUE (got '{assignment}')")
        key, value = assignment.split("=", 1)
        params[key.strip()] = config.parse_value(value.strip())
    from evolm.heldout import heldout_examples, heldout_task, like_config  # local: imports torch (slow to import)

    # default: the run's own held-out problems (what its eval_before/after.json measured; `evolm eval --like`)
    like = (run_cfg and args.task in (None, run_cfg.get("task", {}).get("name")) and not args.task_param
            and args.seed is None and args.limit is None and args.split is None)
    if like:
        held = like_config(run_cfg)
        task = heldout_task(held)
        examples = heldout_examples(task, held.run.seed, held.eval.count)
        split, seed = "test", seed31(held.run.seed, "heldout-sampling")
        max_new = args.max_new_tokens or held.eval.max_new_tokens or held.generation.max_new_tokens
    else:
        task = make_task(task_cfg["name"], reward=task_cfg.get("reward", "format_answer"),
                         system_prompt=task_cfg.get("system_prompt"), reward_weights=task_cfg.get("reward_weights", ()),
                         correct=task_cfg.get("correct", ""), correct_threshold=task_cfg.get("correct_threshold", 1.0),
                         **params)
        split, seed = args.split or "test", 0 if args.seed is None else args.seed
        examples = task.examples(split, 64 if args.limit is None else args.limit, seed)
        max_new = args.max_new_tokens or run_cfg.get("generation", {}).get("max_new_tokens") or 32
    if not examples:
        raise UserError(f"task '{task.name}' has no '{split}' examples")
    run_model = run_cfg.get("model", {})  # the run's revision belongs to its model.spec only
    model, tokenizer = models.load(base_spec, dtype="float32", threads=args.threads,
                                   revision=run_model.get("revision", "") if base_spec == run_model.get("spec") else "",
                                   trust_remote_code=bool(run_model.get("trust_remote_code", False)))
    ks = args.pass_k or ([1] if args.n else [])
    evaluator = TaskEvaluator(model, tokenizer, task, examples, n=args.n, ks=ks, temperature=args.temperature,
                              max_new_tokens=int(max_new), batch_size=args.batch_size, seed=seed)
    known = ["greedy_pass@1"] + [f"pass@{k}" for k in ks]
    if args.metric not in known:
        raise UserError(f"--metric {args.metric} is not measured; choose one of {known} (pass@k needs --n >= k and --pass-k k)")
    setup = {"task": task.name, "task_params": dict(getattr(task, "params", {}) or {}) if like else params, "split": split,
             "num_examples": len(examples), "max_new_tokens": int(max_new), "n": args.n, "pass_k": ks,
             "temperature": args.temperature, "seed": seed}
    if like:
        setup["problems_from"] = ("the run's held-out evaluation: eval.count test problems drawn with the seed derived "
                                  "from run.seed, as in eval_before/after.json (pass --seed, --limit or --split for others)")
        setup["problem_ids"] = [str(e.id) for e in examples]
    return _Progress(evaluator, args.metric), setup


class _Progress:
    """Prints one line per evaluation (each is a full generation pass over the examples)."""

    def __init__(self, evaluate, metric: str):
        self.evaluate, self.metric, self.count = evaluate, metric, 0

    def __call__(self, state: dict) -> dict:
        start = time.perf_counter()
        metrics = self.evaluate(state)
        self.count += 1
        print(f"  evaluation {self.count}: {self.metric} {metrics.get(self.metric)} ({time.perf_counter() - start:.0f} s)", flush=True)
        return metrics


def _cmd_sparsity(args) -> int:
    loaded = _load_models(args)
    scale, source = _tau_scale(args, loaded)
    multipliers = _floats(args.multipliers, "--multipliers")
    taus = tau_grid(scale, multipliers)
    result = _header("sparsity", loaded)
    result.update({"tau_scale": scale, "tau_scale_source": source, "multipliers": multipliers, "metric": args.metric, "models": {}})
    evaluator = None
    base_metrics: dict[str, dict] = {}
    if not args.no_eval:
        evaluator, result["evaluation"] = _build_evaluator(args, next(iter(loaded.bases)), loaded)
    for label, t in loaded.trained.items():
        base = loaded.base_of(label)
        if evaluator is None:
            r = update_sparsity(base.state, t.state, taus)
        else:
            if base.fingerprint not in base_metrics:  # each distinct base is evaluated once
                base_metrics[base.fingerprint] = evaluator(base.state)
            r = sparsity_curve(base.state, t.state, taus, evaluator, multipliers=multipliers,
                               base_metrics=base_metrics[base.fingerprint])
        result["models"][label] = r
        line = ", ".join(f"τ={t_:.2g}: {f:.1%} below" for t_, f in zip(r["taus"], r["fraction_below"]))
        print(f"{label}: {line}")
        for p in r.get("points", []):
            print(f"  τ={p['tau']:.3g} keeps {p['kept_fraction']:.2%} of coordinates: {args.metric} {p['metrics'].get(args.metric)}")
    if evaluator is not None:
        _write_curve_problems(Path(args.out), result, result["evaluation"])
    _report(*_write(args.out, "sparsity", result))
    return 0


def _cmd_compression(args) -> int:
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    for m in methods:
        parse_method(m)
    categories = [c.strip() for c in args.params.split(",") if c.strip()]
    bad = [c for c in categories if c not in CATEGORIES]
    if bad or not categories:
        raise UserError(f"--params must be a comma-separated subset of {', '.join(CATEGORIES)} (got '{args.params}')")
    loaded = _load_models(args)
    if "base" in loaded.trained:
        raise UserError("the label 'base' is reserved for --base in the compression table; label the trained model differently")
    base = loaded.single_base
    result = _header("compression", loaded)
    evaluator, result["evaluation"] = _build_evaluator(args, base.spec, loaded)
    states = {"base": base.state, **{label: t.state for label, t in loaded.trained.items()}}
    table = compression_table(states, methods, evaluator, base=base.state, categories=categories,
                              matrices_only=not args.include_vectors)
    result.update(table)
    result["metric"] = args.metric
    _write_row_problems(Path(args.out), result, setup=result["evaluation"])
    for row in table["rows"]:
        extra = f", error/update {row['error_to_update']:.3g}" if row.get("error_to_update") is not None else ""
        print(f"{row['model']:>10} {row['method']:>14}: {args.metric} {row['metrics'].get(args.metric)} "
              f"(weight error {row['relative_error']:.3g}{extra})")
    _report(*_write(args.out, "compression", result))
    return 0


def _write_problems(out: Path, relative: str, label: str, problems: list, summary: dict, setup: dict) -> str:
    """Write one re-evaluation's per-problem results to ``OUT/<relative>``: an evaluation file (task, split,
    sampling, problems, in ``evolm eval``'s per-problem format) that ``evolm report --study`` compares over
    problems. Returns ``relative``, which the analysis JSON records in place of the list."""
    atomic_write_json(out / relative, {
        "task": setup.get("task"), "split": setup.get("split"), "params": setup.get("task_params"), "label": label,
        "sampling": {"n": setup.get("n"), "temperature": setup.get("temperature"),
                     "max_new_tokens": setup.get("max_new_tokens"), "seed": setup.get("seed")},
        "ks": setup.get("pass_k"), "summary": summary, "problems": problems})
    return relative


def _write_row_problems(out: Path, result: dict, setup: dict) -> None:
    """Each compression row's per-problem results to ``OUT/compression/<model>_<method>.json`` (``problems_file``)."""
    for row in result["rows"]:
        problems = row.pop("problems", None)
        if problems is not None:
            row["problems_file"] = _write_problems(out, f"compression/{problems_file_name(row['model'], row['method'])}",
                                                   f"{row['model']} {row['method']}", problems, row["metrics"], setup)


def _write_curve_problems(out: Path, result: dict, setup: dict) -> None:
    """Each sparsity evaluation's per-problem results to ``OUT/sparsity/<model>_<point>.json`` (``problems_file``
    beside its metrics): the thresholded models by multiplier (``es_x1.json``; by index without multipliers)
    and the two end points (``es_base.json``, ``es_trained.json``)."""
    written: dict[int, str] = {}  # one base's metrics are shared by every model compared with it
    for label, m in result["models"].items():
        named = [(f"x{p['multiplier']:g}" if p.get("multiplier") is not None else f"tau{i}", p)
                 for i, p in enumerate(m.get("points") or [])]
        ends = {end: {"metrics": metrics} for end, metrics in (m.get("reference") or {}).items()}
        for name, holder in named + list(ends.items()):
            metrics = holder["metrics"]
            problems = metrics.pop("problems", None)
            if problems is not None:
                written[id(metrics)] = _write_problems(out, f"sparsity/{label}_{name}.json", f"{label} {name}",
                                                       problems, metrics, setup)
            if id(metrics) in written:
                holder["problems_file"] = written[id(metrics)]
        if ends:
            m["reference_files"] = {end: h["problems_file"] for end, h in ends.items() if "problems_file" in h}


def _cmd_diversity(args) -> int:
    if args.from_file and args.model:
        raise UserError("evolm analyze diversity takes --from FILE (measured before) or --model SPEC (measure now), not both")
    if not args.from_file:
        return _measure_diversity(args)
    path = Path(args.from_file)
    if not path.exists():
        raise UserError(f"{path} does not exist")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise UserError(f"{path} is not valid JSON: {e}") from None
    result = {"kind": "diversity", "source": str(path), **diversity_report(data)}
    _print_diversity(result)
    _report(*_write(args.out, "diversity", result))
    return 0


def _print_diversity(result: dict) -> None:
    null = result.get("js_divergence_null")
    print(f"coverage: population {result['population']:.3f} vs centre {result['center']:.3f} "
          f"(gap {result['gap']:+.3f}); verifier-projected JSD {result['js_divergence']:.4f} nats"
          + (f" (sampling-noise baseline {null:.4f})" if null is not None else ""))


# -- measurements on an ES population (evolm.es.measure) ---------------------------------------------

def _es_setup(args, split: str):
    """``(cfg, spec, model, tokenizer, task, params, generator)`` for a population around ``--model``.

    The ES job config starts from the run directory's config.toml (when ``--model`` is one), then the
    command-line flags override it; it is validated like any ES config.
    """
    from evolm.es.engine import build_paramset  # local: the ES engine imports torch (slow to import)

    spec = args.model or config.ModelConfig().spec
    raw = _run_config(spec) if Path(spec).is_dir() else {}
    data = {k: dict(raw[k]) for k in ("model", "task", "generation", "es") if isinstance(raw.get(k), dict)}
    if "seed" in raw.get("run", {}):
        data["run"] = {"seed": raw["run"]["seed"]}  # only the seed: names and directories are the run's own
    task = data.setdefault("task", {})
    if args.task and args.task != task.get("name"):
        data["task"] = task = {"name": args.task}  # another task than the run's: none of its task settings apply
    if not task.get("name"):
        raise UserError("pass --task NAME (it is only inferred from an ES run directory's config)")
    for assignment in args.task_param:
        if "=" not in assignment:
            raise UserError(f"--task-param expects KEY=VALUE (got '{assignment}')")
        key, value = assignment.split("=", 1)
        task.setdefault("params", {})[key.strip()] = config.parse_value(value.strip())
    es = data.setdefault("es", {})
    es.pop("arithmetic", None)  # measurements perturb and restore the weights exactly, whatever the run's arithmetic
    for flag, key in (("population", "population"), ("sigma", "sigma"), ("lr", "lr"), ("shaping", "shaping"),
                      ("noise", "noise")):
        if getattr(args, flag, None) is not None:
            es[key] = getattr(args, flag)
    if getattr(args, "params", None):
        es["params"] = [c.strip() for c in args.params.split(",") if c.strip()]
    if getattr(args, "estimator_single", None):
        es["estimator"] = args.estimator_single
    if args.seed is not None:
        data["run"] = {"seed": args.seed}
    gen = data.setdefault("generation", {})
    if args.max_new_tokens:
        gen["max_new_tokens"] = args.max_new_tokens
    if args.batch_size:
        gen["batch_size"] = args.batch_size
    data["model"] = {**data.get("model", {}), "spec": spec, "threads": args.threads, "device": args.device}
    if args.dtype:
        data["model"]["dtype"] = args.dtype
    cfg = config.from_dict(config.ESJob, data)
    t = cfg.task
    task_obj = task_from_config(t)
    if not task_obj.examples(split, 1, cfg.run.seed):
        raise UserError(f"task '{t.name}' has no '{split}' examples")
    model, tokenizer = models.load(spec, dtype=cfg.model.dtype, threads=cfg.model.threads, device=cfg.model.device,
                                   revision=cfg.model.revision, trust_remote_code=cfg.model.trust_remote_code)
    generator = make_generator(cfg.generation.backend, model, tokenizer, cfg.generation.batch_size,
                               cfg.generation.prefix_cache, **engine_options(cfg))
    params = build_paramset(model, cfg, generator=generator)  # a vLLM generator perturbs its own weights
    return cfg, spec, model, tokenizer, task_obj, params, generator


def _es_summary(cfg, spec: str, params, task) -> dict:
    es = cfg.es
    return {"model": spec, "task": task.name, "task_params": cfg.task.params, "seed": cfg.run.seed,
            "sigma": es.sigma, "population": es.population, "noise": params.noise.describe(), "params": es.params,
            "param_regex": es.param_regex, "num_parameters": params.numel}


def _progress(total: int, desc: str):
    from tqdm.auto import tqdm  # local: tqdm.auto imports asyncio (about 0.25 s), only measurements draw bars

    return tqdm(total=total, desc=desc, unit="member", dynamic_ncols=True, file=sys.stdout)


def _measure_diversity(args) -> int:
    from evolm.es.measure import population_correctness  # local: imports torch (slow to import)

    if args.temperature <= 0 and (args.samples_per_member > 1 or (args.center_samples or 0) > 1):
        raise UserError("several samples per prompt at temperature 0 are all the same completion; use --temperature > 0")
    if args.samples_per_member < 1 or args.count < 1:
        raise UserError("--samples-per-member and --count must be >= 1")
    cfg, spec, model, tokenizer, task, params, generator = _es_setup(args, args.split)
    examples = task.examples(args.split, args.count, cfg.run.seed)
    es = cfg.es
    center_n = args.center_samples or (es.population * args.samples_per_member if args.temperature > 0 else 1)
    print(f"diversity of {es.population} members (σ={es.sigma}, {es.estimator}, noise key {args.iteration}) around {spec} "
          f"on {len(examples)} {task.name} {args.split} problems: {args.samples_per_member} sample(s) per member, "
          f"{center_n} from the centre, T={args.temperature}", flush=True)
    bar = _progress(es.population, "members")
    try:
        measured = population_correctness(
            params, generator, task, tokenizer, examples, sigma=es.sigma, estimator=es.estimator,
            population=es.population, iteration=args.iteration, samples_per_member=args.samples_per_member,
            center_samples=center_n, temperature=args.temperature, top_p=args.top_p,
            max_new_tokens=cfg.generation.max_new_tokens, seed=cfg.run.seed,
            common_random_numbers=args.common_random_numbers, on_member=lambda: bar.update(1))
    finally:
        bar.close()
    setup = {**_es_summary(cfg, spec, params, task), "estimator": es.estimator, "iteration": args.iteration,
             "split": args.split, "num_examples": len(examples), "temperature": args.temperature, "top_p": args.top_p,
             "max_new_tokens": cfg.generation.max_new_tokens}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    samples_path = out / "diversity_samples.json"
    atomic_write_json(samples_path, {**setup, **measured})  # the --from format: re-analysable later
    skip = {"member_correct", "center_correct", "center_samples", "layout"}
    result = {"kind": "diversity", "source": str(samples_path), "setup": setup,
              **{k: v for k, v in measured.items() if k not in skip}, **diversity_report(measured)}
    result.pop("input", None)
    _print_diversity(result)
    _report(*_write(args.out, "diversity", result))
    return 0


def _cmd_update_variance(args) -> int:
    from evolm.es.engine import training_batch  # local: the ES engine imports torch (slow to import)
    from evolm.es.measure import coordinate_subset, update_samples  # local: imports torch (slow to import)

    estimators = [e.strip() for e in args.estimator.split(",") if e.strip()]
    bad = [e for e in estimators if e not in ("one_point", "antithetic")]
    if bad or not estimators:
        raise UserError(f"--estimator takes one_point and/or antithetic, comma-separated (got '{args.estimator}')")
    if args.repeats < 2:
        raise UserError("--repeats must be >= 2 (the spread of one update sample is undefined)")
    args.estimator_single = estimators[0]
    cfg, spec, model, tokenizer, task, params, generator = _es_setup(args, "train")
    es, gen = cfg.es, cfg.generation
    if "antithetic" in estimators and es.population % 2:
        raise UserError(f"the antithetic estimator needs an even --population (got {es.population})")
    count = args.count or es.prompts_per_iteration
    examples, _ = training_batch(task, tokenizer, cfg.run.seed, 0, count)
    sampling = SamplingParams(n=1, temperature=gen.temperature, top_p=gen.top_p, max_new_tokens=gen.max_new_tokens,
                              seed=seed31(cfg.run.seed, "sampling", 0))
    subset = coordinate_subset(params, args.coords, cfg.run.seed)
    result = {"kind": "update_variance", "setup": {**_es_summary(cfg, spec, params, task), "lr": es.lr,
              "shaping": es.shaping, "divide_by_sigma": es.divide_by_sigma, "repeats": args.repeats,
              "prompts": len(examples), "temperature": gen.temperature, "max_new_tokens": gen.max_new_tokens,
              "coordinates": subset.size, "of_coordinates": subset.total,
              "note": "repeat r uses noise key r; weights, prompts and sampling seed are the same for every repeat"},
              "estimators": {}}
    print(f"update variance around {spec}: N={es.population}, σ={es.sigma}, {args.repeats} repeats x "
          f"{', '.join(estimators)} on {len(examples)} {task.name} training prompts; {subset.size:,} of "
          f"{subset.total:,} coordinates", flush=True)
    for est in estimators:
        bar = _progress(args.repeats * es.population, est)
        try:
            samples = update_samples(params, generator, task, tokenizer, examples, estimator=est, population=es.population,
                                     sigma=es.sigma, lr=es.lr, shaping=es.shaping, divide_by_sigma=es.divide_by_sigma,
                                     repeats=args.repeats, sampling=sampling, subset=subset, seed=cfg.run.seed,
                                     on_member=lambda: bar.update(1))
        finally:
            bar.close()
        spread = update_spread(samples.pop("vectors"))
        result["estimators"][est] = {**spread, "evaluations_per_update": es.population,
                                     "directions_per_update": es.population // 2 if est == "antithetic" else es.population,
                                     **{k: samples[k] for k in ("status", "fitness", "scale", "seconds", "gen_tokens", "keys",
                                                                "weights_unchanged")}}
        cos = spread["mean_pairwise_cosine"]
        print(f"{est}: mean pairwise cosine {'n/a' if cos is None else f'{cos:.4f}'}, relative variance "
              f"{spread['relative_variance'] if spread['relative_variance'] is None else round(spread['relative_variance'], 4)}, "
              f"mean |update| {spread['mean_update_norm']:.3g} ({samples['status'].count('applied')}/{args.repeats} applied)")
    _report(*_write(args.out, "update_variance", result))
    return 0


def _report(json_path: Path, png: Path) -> None:
    print(f"wrote {json_path} and {png}")


# -- parser -----------------------------------------------------------------------------------------

def _add_models(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base", metavar="SPEC", help="the starting model: embedded name, model dir, run dir or .gguf "
                   "(default: each --trained run's own starting weights: its saved base/ when it trained in a lower "
                   "precision, else its [model] spec); checked against the fingerprint in the run's run.json")
    p.add_argument("--allow-base-mismatch", action="store_true",
                   help="compare with --base even when it is not the weights a run started from (its fingerprint "
                        "differs from the run's record); Δ then includes the difference between the two bases")
    p.add_argument("--trained", action="append", default=[], metavar="[LABEL=]RUN_OR_SPEC",
                   help="a trained model (run directory or any model spec); repeat for side by side, e.g. "
                        "--trained es=runs/es --trained grpo=runs/grpo")
    p.add_argument("--out", default="analysis", metavar="DIR", help="output directory for <kind>.json and <kind>.png (default: analysis)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: 1)")


def _add_eval(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("re-evaluation (target task)")
    g.add_argument("--task", help="task name (default: the [task] of the first --trained run directory)")
    g.add_argument("--task-param", action="append", default=[], metavar="KEY=VALUE", help="task parameter (repeatable)")
    g.add_argument("--split", default=None, help="example split (default: test)")
    g.add_argument("--limit", type=int, default=None,
                   help="number of examples (default: a run's held-out problems, eval.count of them; else 64)")
    g.add_argument("--n", type=int, default=0, help="samples per example for pass@k (default: 0 = greedy pass@1 only)")
    g.add_argument("--pass-k", type=int, action="append", default=[], metavar="K", help="k of pass@k, repeatable (default: 1 when --n > 0)")
    g.add_argument("--temperature", type=float, default=1.0, help="sampling temperature for pass@k (default: 1.0)")
    g.add_argument("--max-new-tokens", type=int, default=0, help="generation length (default: the run's, else 32)")
    g.add_argument("--batch-size", type=int, default=32, help="generation batch size (default: 32)")
    g.add_argument("--seed", type=int, default=None,
                   help="seed for the example draw and for sampling (default: the --trained run's held-out problems "
                        "and seeds, exactly the problems of its eval_before/after.json; else 0)")
    g.add_argument("--metric", default="greedy_pass@1", help="metric shown in the summary and plot (default: greedy_pass@1; e.g. pass@4)")


def register(subparsers) -> None:
    """Add the ``analyze`` verb and its kinds; each kind's ``func(args)`` returns the exit code."""
    p = subparsers.add_parser(
        "analyze", help="what training did to a model: drift, sparsity, localisation, compression; ES population diversity and update variance",
        description="Analyses of what training did to a model. Each writes <out>/<kind>.json and <out>/<kind>.png. "
                    "Weights are read in float32 (tied embeddings counted once).")
    kinds = p.add_subparsers(dest="kind", metavar="KIND")
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])

    k = kinds.add_parser("drift", help="relative distance ||θ − θ0|| / ||θ0||, whole model and per category/module",
                         description="Relative whole-model distance ||θ − θ0|| / ||θ0|| and its breakdown by category "
                                     "(norm, attention, mlp, embedding, lm_head), subcategory (attention.q.bias, ...) and layer.")
    _add_models(k)
    k.add_argument("--per-tensor", action="store_true", help="also write the per-tensor breakdown to the JSON")
    k.set_defaults(func=_cmd_drift)

    k = kinds.add_parser("localisation", aliases=["localization"], help="top-k largest |Δ| coordinates counted by parameter category",
                         description="The k largest-magnitude coordinates of Δ = θ − θ0, counted by category and subcategory, "
                                     "for each --trained model side by side.")
    _add_models(k)
    k.add_argument("--k", type=int, action="append", metavar="K", help="how many coordinates, repeatable (default: 100; arXiv 2608.27351 also uses 144)")
    k.set_defaults(func=_cmd_localisation, kind="localisation")

    k = kinds.add_parser("magnitude", help="top-k |Δ| by category in absolute and relative terms and against a dtype-matched null",
                         description="Tells a localisation driven by weight magnitude x dtype spacing from one driven by "
                                     "training: the top-k |Δ| per category against the exchangeable null, the top-k "
                                     "|Δ|/|θ0|, and the top-k |Δ| against a null that permutes |Δ| only among coordinates "
                                     "of equal dtype spacing (evolm.analysis.magnitude); plus step counts and relative sparsity.")
    _add_models(k)
    k.add_argument("--k", type=int, default=100, help="how many coordinates (default: 100)")
    k.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default=None,
                   help="the spacing steps are counted in (default: model.dtype of an es.arithmetic='reference' run, else float32)")
    k.add_argument("--permutations", type=int, default=10_000,
                   help="permutations of the within-spacing null, >= 1000 (default: 10000)")
    k.add_argument("--seed", type=int, default=0, help="seed of the shuffles (default: 0)")
    k.set_defaults(func=_cmd_magnitude, kind="magnitude")

    k = kinds.add_parser("sparsity", help="fraction of updates below τ and pass@1 of θ0 + Δ·1[|Δ| ≥ τ]",
                         description="Thresholds τ = m × s, where s is the RMS of a single ES update (median over the run's "
                                     "seed_log.jsonl: scale · sqrt(Σ c_i²)) or --tau-scale. For each τ: the fraction of nonzero "
                                     "|Δ| below τ, and (unless --no-eval) the target-task metrics of θ0 + Δ·1[|Δ| ≥ τ], each "
                                     "with its per-problem results in sparsity/<model>_x<m>.json (and _base, _trained for the "
                                     "end points).")
    _add_models(k)
    k.add_argument("--tau-scale", type=float, help="threshold scale s (default: from the first --trained run's seed log)")
    k.add_argument("--multipliers", default="0.25,0.5,1,2,4,8", help="τ = m × s for these m (default: 0.25,0.5,1,2,4,8)")
    k.add_argument("--no-eval", action="store_true", help="only count coordinates; do not re-evaluate")
    _add_eval(k)
    k.set_defaults(func=_cmd_sparsity)

    k = kinds.add_parser("compression", help="int8/int4 fake-quantisation and magnitude pruning, re-evaluated",
                         description="Apply each compression method to the base and every --trained model and re-evaluate on the "
                                     "target task. Methods: none, int<bits> (per-output-channel symmetric round-to-nearest), "
                                     "int<bits>g<size> (one scale per <size> consecutive inputs of a row, e.g. int4g128), "
                                     "prune:<fraction> (global magnitude pruning), prune-tensor:<fraction> (per tensor). Writes "
                                     "compression.json, compression.png and each row's per-problem results as an evaluation "
                                     "file, compression/<model>_<method>.json (':' written '-').")
    _add_models(k)
    k.add_argument("--methods", default="none,int8,int4,prune:0.25,prune:0.5", help="comma-separated methods (default: none,int8,int4,prune:0.25,prune:0.5)")
    k.add_argument("--params", default="attention,mlp", help="categories to compress (default: attention,mlp; also norm, embedding, lm_head, other)")
    k.add_argument("--include-vectors", action="store_true", help="also compress 1-D tensors (norm weights, biases) of those categories")
    _add_eval(k)
    k.set_defaults(func=_cmd_compression)

    k = kinds.add_parser("diversity", help="Lemma 2 (arXiv 2608.27351): population coverage vs centre, and verifier-projected JS divergence",
                         formatter_class=argparse.RawDescriptionHelpFormatter,
                         description="Coverage of one sample per ES population member versus N samples from the centre "
                                     "(N = number of members), and the verifier-projected Jensen-Shannon divergence among "
                                     "the members' correctness distributions.\n\n"
                                     "--model SPEC_OR_RUN measures it now: each member θ + σ·ε_i (the ES engine's own noise "
                                     "and exact perturb/restore) and the centre θ answer the same --count problems; "
                                     "p_ij is estimated from --samples-per-member samples. Writes diversity.json, "
                                     "diversity.png and diversity_samples.json (the --from format).\n\n"
                                     "--from FILE re-analyses measured correctness (JSON): {\"member_correct\": "
                                     "[member][prompt][sample] 0/1, \"center_correct\": [prompt][sample] 0/1, "
                                     "\"center_samples\": N (optional, default: number of members)} "
                                     "or {\"p_members\": [member][prompt] probabilities, \"q_center\": [prompt] probabilities}.",
                         epilog="example: evolm analyze diversity --model runs/es-demo --population 8 --sigma 0.001 "
                                "--count 32 --samples-per-member 4 --out runs/es-demo/analysis")
    k.add_argument("--from", dest="from_file", metavar="FILE", help="measured correctness file (JSON) to re-analyse")
    _add_population(k, split="test")
    g = k.add_argument_group("diversity measurement")
    g.add_argument("--count", type=int, default=32, help="problems every member and the centre answer (default: 32)")
    g.add_argument("--samples-per-member", type=int, default=1,
                   help="samples per member and problem; their mean estimates p_ij (default: 1)")
    g.add_argument("--center-samples", type=int, default=0,
                   help="samples per problem from the centre (default: population x samples-per-member, which gives "
                        "the unbiased pass@N estimate and the sampling-noise JSD baseline)")
    g.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default: 1.0, as in evaluation)")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (default: 1.0)")
    g.add_argument("--estimator", dest="estimator_single", choices=["one_point", "antithetic"],
                   help="member layout: one_point = N directions; antithetic = N/2 directions at ±σε (default: the run's, else one_point)")
    g.add_argument("--iteration", type=int, default=0, help="noise key of the population (ES iteration index; default: 0)")
    g.add_argument("--common-random-numbers", action="store_true",
                   help="one sampling seed for every member and the centre, as while training (default: independent "
                        "seeds, which keep the population-coverage estimate unbiased)")
    k.set_defaults(func=_cmd_diversity)

    k = kinds.add_parser("update-variance", aliases=["update_variance"],
                         help="spread of R independent ES update estimates at fixed weights (estimator ablation)",
                         description="At fixed weights and one fixed batch of training prompts (ES iteration 0's), draw R "
                                     "independent ES updates (noise keys 0..R-1) per estimator with the engine's own scoring "
                                     "and update rule, evaluate each on a random subset of coordinates, and report the mean "
                                     "pairwise cosine similarity and the per-coordinate variance. One-point and antithetic "
                                     "are compared at equal evaluation budget (the same population N). Writes "
                                     "update_variance.json and update_variance.png.",
                         epilog="example: evolm analyze update-variance --model smollm2-135m --task arithmetic "
                                "--estimator one_point,antithetic --population 8 --repeats 4 --count 16")
    _add_population(k, split="train")
    g = k.add_argument_group("update estimate")
    g.add_argument("--estimator", default="one_point,antithetic", help="comma-separated estimators (default: one_point,antithetic)")
    g.add_argument("--repeats", type=int, default=4, help="independent update samples R per estimator (default: 4)")
    g.add_argument("--lr", type=float, help="step size α (default: the run's es.lr, else 5e-4)")
    g.add_argument("--shaping", choices=["zscore", "centered_rank", "none"], help="fitness shaping (default: the run's, else zscore)")
    g.add_argument("--count", type=int, default=0, help="training prompts in the fixed batch (default: es.prompts_per_iteration)")
    g.add_argument("--coords", type=int, default=100_000, help="coordinates the update is evaluated on (default: 100000)")
    k.set_defaults(func=_cmd_update_variance, kind="update_variance")


def _add_population(p: argparse.ArgumentParser, split: str) -> None:
    g = p.add_argument_group("ES population (defaults: the run directory's config.toml, else the ES defaults)")
    g.add_argument("--model", metavar="SPEC_OR_RUN", help="the centre: an ES run directory (its final weights and "
                   "settings) or any model spec (default: smollm2-135m)")
    g.add_argument("--task", help="task (default: the run's [task])")
    g.add_argument("--task-param", action="append", default=[], metavar="KEY=VALUE", help="task parameter (repeatable)")
    if split == "test":
        g.add_argument("--split", default="test", help="problem split (default: test)")
    g.add_argument("--population", type=int, help="members N (default: the run's es.population, else 8)")
    g.add_argument("--sigma", type=float, help="perturbation scale σ (default: the run's es.sigma, else 1e-3)")
    g.add_argument("--params", help="comma-separated parameter categories to perturb (default: the run's es.params, else all)")
    g.add_argument("--noise", choices=["table", "stream"], help="noise source (default: the run's, else table)")
    g.add_argument("--seed", type=int, help="root seed of noise, problems and sampling (default: the run's run.seed, else 0)")
    g.add_argument("--max-new-tokens", type=int, default=0, help="completion length (default: the run's generation.max_new_tokens)")
    g.add_argument("--batch-size", type=int, default=0, help="generation batch size (default: the run's, else 32)")
    g.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help="model dtype (default: the run's, else float32)")
    g.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    g.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: 1)")
    p.add_argument("--out", default="analysis", metavar="DIR", help="output directory (default: analysis)")
