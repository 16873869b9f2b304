"""``task.name = "dataset"``: a task from any dataset, by configuration.

Rows come from a local file (JSONL, JSON, CSV, parquet), a folder written by ``save_to_disk`` (a
``Dataset`` or a ``DatasetDict``), or a Hugging Face dataset id (with a network), all loaded with the
``datasets`` library. Knobs (``task.params``):

- Sources: ``train`` and ``test`` (two sources; ``train_split`` / ``test_split`` pick the split of a hub
  dataset or saved ``DatasetDict``, default ``train`` / ``test``; ``config`` the hub config), or
  ``path`` alone (one source, split into test and train by a seeded held-out fraction ``test_fraction``,
  default 0.1, with ``split_seed``). With ``train`` alone, the test split is cut from it the same way.
- Columns: ``prompt`` (default ``"prompt"``; plain text or a list of chat messages ``[{"role", "content"}]``),
  ``answer`` (default ``"answer"``; may be absent when a reward function needs none), ``id`` (optional).
  ``template`` renders the prompt from any columns instead: ``"Question: {question}\\nAnswer:"``.
  Every other column of a row travels to the reward functions by name (``Example.meta``).
- ``checker``: how the task's own judgement reads an answer when no reward function decides it:
  ``exact`` (the ``<answer>...</answer>`` content, else the last non-empty line, compared with the
  gold answer after collapsing whitespace and case), ``number`` (the tagged answer, else the last
  number, compared as numbers) or ``math`` (the last ``\\boxed{}``, compared with ``math-verify``).

Design decisions:

- Train and test never share a row: a held-out fraction is cut over *distinct* prompts (duplicates go
  to the same side), and two sources are checked for prompts they share (one line naming the count
  and an example). Prompts are compared after collapsing whitespace and case.
- The split is a pure function of the rows and ``split_seed``; ``examples(split, count, seed)`` is
  the ``DatasetTask`` contract (a seeded subset, in row order), so ES, GRPO and evaluation draw
  exactly as they do from the built-in datasets.
- With reward functions (``task.reward = "module:fn"``) and no ``task.correct``, pass@k counts
  ``reward >= task.correct_threshold`` unless ``checker`` is set explicitly (then the checker judges).
- The chat template is applied when the tokenizer has one (a list-of-messages prompt is templated as
  given, the system prompt prepended unless it already has one); plain text otherwise.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import math
import random
import re
from pathlib import Path
from typing import Any

from evolm.errors import ConfigError, UserError
from evolm.rewards import Verdict
from evolm.tasks.base import register
from evolm.tasks.base import Example, bos_text, last_number, same_number, tagged_answer
from evolm.tasks.data import DatasetTask, row_id

CHECKERS = ("exact", "number", "math")
SOURCE_SUFFIXES = {".jsonl": "json", ".json": "json", ".ndjson": "json", ".jsonl.gz": "json", ".json.gz": "json",
                   ".csv": "csv", ".parquet": "parquet"}
"""File suffix -> the ``datasets`` builder that reads it."""


def _builder(path: Path) -> str | None:
    name = path.name.lower()
    return next((b for suffix, b in SOURCE_SUFFIXES.items() if name.endswith(suffix)), None)


def _first_line(e: BaseException) -> str:
    lines = [line for line in str(e).splitlines() if line.strip()]
    return (lines[-1] if lines else type(e).__name__)[:300]


@contextlib.contextmanager
def quiet_datasets():
    """``datasets`` without its progress bars ("Generating train split") and log lines for the loads evolm
    makes, so an error is evolm's one line, first; the caller's settings come back afterwards."""
    import datasets

    bars = datasets.utils.are_progress_bars_disabled()
    level = datasets.logging.get_verbosity()
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)
    try:
        yield
    finally:
        datasets.logging.set_verbosity(level)
        if not bars:
            datasets.enable_progress_bars()


def _bad_json_line(path: Path) -> str | None:
    """``line N is not a JSON object (...)`` for the first such line of a JSON-lines file, else None."""
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    return f"line {number} is not a JSON object ({e.msg}, column {e.colno})"
                if not isinstance(row, dict):
                    return f"line {number} is not a JSON object (a {type(row).__name__})"
    except (OSError, UnicodeDecodeError) as e:
        return f"{type(e).__name__}: {e}"
    return None


def load_rows(source: str, split: str, config: str | None = None) -> list[dict]:
    """The rows of ``split`` of ``source``: a data file, a ``save_to_disk`` folder, or a hub dataset id
    (``datasets`` kept quiet: ``quiet_datasets``)."""
    try:
        import datasets  # noqa: F401
    except ImportError:
        raise UserError("the dataset task reads its rows with the datasets package: pip install datasets") from None
    with quiet_datasets():
        return _load_rows(source, split, config)


def _load_rows(source: str, split: str, config: str | None = None) -> list[dict]:
    import datasets

    path = Path(str(source)).expanduser()
    try:
        if path.is_dir() and ((path / "dataset_dict.json").exists() or (path / "state.json").exists()):
            loaded = datasets.load_from_disk(str(path))
            if isinstance(loaded, datasets.DatasetDict):
                if split not in loaded:
                    raise UserError(f"{path} has splits {sorted(loaded)}, not '{split}'; set task.params.train_split / "
                                    "test_split to one of them")
                loaded = loaded[split]
            return loaded.to_list()
        if path.is_file():
            builder = _builder(path)
            if builder is None:
                raise UserError(f"unsupported data file {path}; use .jsonl, .json, .csv, .parquet or a save_to_disk folder")
            return datasets.load_dataset(builder, data_files=str(path), split="train").to_list()
        if path.is_dir():
            raise UserError(f"{path} is a folder but not one written by save_to_disk (no dataset_dict.json or state.json)")
        if str(source).startswith((".", "/", "~")) or _builder(path):
            raise UserError(f"data file {source} does not exist")
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001  (datasets raises many kinds for a file that does not parse)
        lines = path.name.lower().endswith((".jsonl", ".ndjson", ".jsonl.gz"))
        where = (_bad_json_line(path) if lines else None) or _first_line(e)
        raise UserError(f"cannot read {path}: {where}; fix the file (one JSON object per line for .jsonl)") from None
    from evolm.models import hub_reachable

    if not hub_reachable():
        raise UserError(f"'{source}' is not a local file or folder, and the Hugging Face hub is unreachable (offline); "
                        "download the dataset elsewhere and point task.params at the file")
    try:
        return datasets.load_dataset(str(source), config, split=split).to_list()
    except Exception as e:  # noqa: BLE001
        raise UserError(f"cannot load hub dataset '{source}' (config {config!r}, split {split!r}): {_first_line(e)}") from None


def prompt_key(text: Any) -> str:
    """A prompt as compared across splits: its text (messages joined) with whitespace collapsed, lower case."""
    if isinstance(text, list):
        text = "\n".join(str(m.get("content", "")) if isinstance(m, dict) else str(m) for m in text)
    return " ".join(str(text).split()).lower()


def canonical_exact(text: Any) -> str | None:
    return None if text is None else " ".join(str(text).split()).lower().rstrip(".")


@register
class DatasetRows(DatasetTask):
    name = "dataset"
    splits = ("train", "test")
    instruction = ""
    own_checker = False

    def configure(self, path: str | None = None, train: str | None = None, test: str | None = None,
                  train_split: str = "train", test_split: str = "test", config: str | None = None,
                  test_fraction: float = 0.1, split_seed: int = 0, prompt: str = "prompt", answer: str = "answer",
                  id: str | None = None, template: str | None = None, checker: str | None = None, **params: Any) -> None:
        if params:
            raise ConfigError(f"task 'dataset' got unknown params {sorted(params)}; it takes path, train, test, train_split, "
                              "test_split, config, test_fraction, split_seed, prompt, answer, id, template, checker")
        if path is None and train is None:
            raise ConfigError("task 'dataset' needs its rows: set task.params.path = FILE (split by test_fraction) or "
                              "task.params.train = FILE (and optionally test = FILE); a hub id works with a network")
        if path is not None and (train is not None or test is not None):
            raise ConfigError("task 'dataset': give either path (one source, split by test_fraction) or train/test, not both")
        if not 0 < float(test_fraction) < 1:
            raise ConfigError(f"task.params.test_fraction must be in (0, 1) (got {test_fraction})")
        if checker is not None and checker not in CHECKERS:
            raise ConfigError(f"task.params.checker must be one of {list(CHECKERS)} (got '{checker}')")
        self.train_source = str(path if path is not None else train)
        self.test_source = None if test is None else str(test)
        self.train_split, self.test_split, self.config = str(train_split), str(test_split), config
        self.test_fraction, self.split_seed = float(test_fraction), int(split_seed)
        self.prompt_column, self.answer_column, self.id_column = str(prompt), str(answer), id
        self.template = template
        self.checker = checker or "exact"
        self.own_checker = checker is not None
        self.params = {k: v for k, v in dict(path=path, train=train, test=test, config=config, template=template,
                                             checker=checker).items() if v is not None}
        self._split_rows: dict[str, list[dict]] | None = None
        self._examples = {}
        self._gold: dict[str, object] = {}  # math-verify's parsed gold answers (checker = "math")

    # -- rows -------------------------------------------------------------------------------------
    def rows(self, split: str) -> list[dict]:
        split = self.canonical_split(split)
        if self._split_rows is None:
            self._split_rows = self._load_splits()
        return self._split_rows[split]

    def _load_splits(self) -> dict[str, list[dict]]:
        train = load_rows(self.train_source, self.train_split, self.config)
        if not train:
            raise UserError(f"task 'dataset': no rows in {self.train_source}")
        self._check_columns(train[0], self.train_source)
        if self.test_source is None:
            return self._held_out(train)
        test = load_rows(self.test_source, self.test_split, self.config)
        if not test:
            raise UserError(f"task 'dataset': no rows in {self.test_source}")
        self._check_columns(test[0], self.test_source)
        seen = {self._key(r) for r in train}
        shared = [r for r in test if self._key(r) in seen]
        if shared:
            example = self._key(shared[0])[:60]
            raise UserError(f"task 'dataset': {len(shared)} of {len(test)} test rows have a prompt that is also in train "
                            f"(e.g. '{example}'); remove them from one file, or give one source as path with test_fraction")
        return {"train": train, "test": test}

    def _held_out(self, rows: list[dict]) -> dict[str, list[dict]]:
        """Train and test cut from one source over its distinct prompts, seeded (duplicates stay together)."""
        keys = sorted({self._key(r) for r in rows})
        random.Random(self.split_seed).shuffle(keys)
        n_test = max(1, math.ceil(self.test_fraction * len(keys)))
        if n_test >= len(keys):
            raise UserError(f"task 'dataset': {len(keys)} distinct prompts leave no training rows at test_fraction = "
                            f"{self.test_fraction}; add rows or lower task.params.test_fraction")
        test_keys = set(keys[:n_test])
        return {"train": [r for r in rows if self._key(r) not in test_keys],
                "test": [r for r in rows if self._key(r) in test_keys]}

    def _check_columns(self, row: dict, source: str) -> None:
        needed = set(re.findall(r"{(\w+)[^{}]*}", self.template)) if self.template else {self.prompt_column}
        missing = sorted(c for c in needed if c not in row)
        if missing:
            knob = "template" if self.template else "prompt"
            raise UserError(f"task 'dataset': {source} has no column {', '.join(repr(m) for m in missing)} (task.params.{knob}); "
                            f"its columns are {', '.join(sorted(row))}")

    def _prompt_value(self, row: dict) -> Any:
        if self.template:
            try:
                return self.template.format_map(row)
            except (KeyError, IndexError, ValueError) as e:
                raise UserError(f"task.params.template = {self.template!r} cannot be filled from a row ({e}); its columns "
                                f"are {', '.join(sorted(row))}") from None
        return row[self.prompt_column]

    def _key(self, row: dict) -> str:
        return prompt_key(self._prompt_value(row))

    # -- examples ---------------------------------------------------------------------------------
    def parse_row(self, row: dict, index: int) -> Example:
        prompt = self._prompt_value(row)
        meta = {k: v for k, v in row.items() if k not in (self.prompt_column, self.answer_column)}
        if isinstance(prompt, list):
            if not all(isinstance(m, dict) and "role" in m and "content" in m for m in prompt):
                raise UserError(f"task 'dataset': column '{self.prompt_column}' holds a list that is not chat messages "
                                "[{\"role\": ..., \"content\": ...}]")
            meta["_messages"] = [{"role": str(m["role"]), "content": str(m["content"])} for m in prompt]
            question = "\n\n".join(m["content"] for m in meta["_messages"] if m["role"] != "system")
        else:
            question = str(prompt)
        ident = str(row[self.id_column]) if self.id_column and row.get(self.id_column) is not None else row_id(row, index)
        return Example(id=ident, question=question, answer=row.get(self.answer_column), meta=meta)

    def columns(self, examples: list[Example]) -> dict[str, list]:
        out = super().columns(examples)
        out.pop("_messages", None)
        return out

    # -- prompting ----------------------------------------------------------------------------------
    def reward_prompt(self, example: Example) -> Any:
        """TRL's ``prompts`` entry: a conversational row's messages as given (no system prompt added), else its text."""
        given = example.meta.get("_messages")
        return [dict(m) for m in given] if given is not None else example.question

    def messages(self, example: Example) -> list[dict[str, str]]:
        given = example.meta.get("_messages")
        if given is None:
            return super().messages(example)
        if self.system_prompt and not any(m["role"] == "system" for m in given):
            return [{"role": "system", "content": self.system_prompt}] + list(given)
        return list(given)

    def render_prompt(self, example: Example, tokenizer=None) -> str:
        if example.meta.get("_messages") is None or (tokenizer is not None and getattr(tokenizer, "chat_template", None)):
            return super().render_prompt(example, tokenizer)
        head = "".join(f"{m['content']}\n\n" for m in self.messages(example) if m["role"] == "system")
        return f"{bos_text(tokenizer)}{head}{example.question}\n"

    # -- the task's own checker ---------------------------------------------------------------------
    def _extract(self, completion: str) -> tuple[str | None, bool]:
        if self.checker == "math":
            from evolm.tasks.math500 import extract_math_answer

            return extract_math_answer(completion)
        tagged = tagged_answer(completion)
        if tagged is not None:
            return tagged, True
        if self.checker == "number":
            return last_number(completion), False
        lines = [line.strip() for line in completion.strip().splitlines() if line.strip()]
        return (lines[-1] if lines else None), False

    def extract_answer(self, completion: str) -> str | None:
        return self._extract(completion)[0]

    def check(self, completion: str, example: Example) -> Verdict:
        answer, marked = self._extract(completion)
        gold = example.answer
        if answer is None or gold is None:
            return Verdict(format_ok=marked, correct=False, answer=answer)
        if self.checker == "number":
            correct = same_number(last_number(answer) or answer, gold)
        elif self.checker == "math":
            from evolm.tasks.math500 import MATH500

            correct = MATH500.equivalent(self, answer, str(gold))
        else:
            correct = canonical_exact(answer) == canonical_exact(gold)
        return Verdict(format_ok=marked, correct=bool(correct), answer=answer)

    def canonical_answer(self, answer: str | None) -> str | None:
        return canonical_exact(answer)
