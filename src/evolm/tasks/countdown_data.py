"""Countdown problems from files: Qiu et al.'s ``countdown.json`` and TinyZero's JSONL/parquet.

Set as countdown task params: ``path`` (the held-out file, or the only file), ``train_path`` (a
separate training file), ``train_rows`` and ``test_rows`` (how many rows each split takes). Without
``path`` the countdown task stays procedural.

Formats, recognised per row by its columns (any file type ``evolm.tasks.data.read_table`` reads:
JSON list, JSONL, parquet, CSV, a ``save_to_disk`` directory):

- Qiu et al. 2025 (github.com/VsonicV/es-fine-tuning-paper, ``countdown/data/countdown.json``): a JSON
  list of ``{id, context, numbers, target, solution}`` with ``target`` a string of digits and
  ``context`` the whole prompt as plain text (no chat template; it ends with ``<think>``). Their
  scripts feed ``context`` to ``tokenizer(context)`` with the tokenizer's defaults, so evolm writes the
  special tokens that call adds (e.g. a BOS) into the prompt text (``special_tokens``).
- TinyZero's source rows (``Jiayi-Pan/Countdown-Tasks-3to4``): ``{nums, target}`` with no prompt:
  evolm's own countdown question and demonstrations are used.
- TinyZero/verl processed parquet: ``prompt`` = ``[{"role": "user", "content": ...}]`` and
  ``reward_model.ground_truth`` = ``{numbers, target}`` (id from ``extra_info.index``). TinyZero feeds
  the first message's content verbatim (its content already carries the template), tokenized without
  special tokens; evolm does the same for a one-message list. A list of several messages is rendered
  with the tokenizer's chat template, as plain verl does.
- A ``prompt`` column holding a string is fed verbatim, without special tokens.

Design decisions:

- Splits follow Qiu et al. when one file serves both: the first ``train_rows`` rows (default 200) are
  the train split and the last ``test_rows`` rows (default 2,000) the test split; with their 2,200-row
  file these are exactly their training set (``data[:200]``) and their evaluation set (``--eval_offset
  -2000``). The two must not overlap (one-line error otherwise). With ``train_path`` the train split
  is the first ``train_rows`` rows of that file and the test split the last ``test_rows`` rows of
  ``path`` (default: all rows of each).
- ``examples(split, count, seed)`` on file data is the whole split in file order when ``count`` is
  None or at least the split's size, else the rows at the first ``count`` positions of a seeded
  permutation, back in file order (the rule of every dataset-backed task).
- Every row is checked when the file is read; a bad file is a one-line ``UserError`` naming the file,
  the row and the field: not a record, missing numbers or target, numbers that are not a non-empty
  list of non-negative integers, a target that is not an integer, an empty or non-text prompt,
  messages without role/content text. Integers may be written as digit strings (Qiu's targets are).
  A target may be a non-integer or negative number: 58 of the 2,000 test rows of countdown.json have
  one (43 like ``"27.4"``, 15 negative integers). The text as written is kept (``target_text``),
  because Qiu et al.'s evaluation reads targets with ``str.isdigit()``, which makes those rows
  unanswerable there (``qiu_exact`` reproduces that; see ``evolm.tasks.countdown``).
- Row ids: the file's ``id`` (else ``extra_info.index``, else the position); when those are not unique
  in a file, positions are used for all rows.
- Files are read once per process (cached by path, size and modification time).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evolm.errors import ConfigError, UserError
from evolm.tasks.data import maybe_json, read_table

QIU_TRAIN_ROWS = 200
"""Qiu et al. train on the first 200 rows of countdown.json."""
QIU_TEST_ROWS = 2000
"""Qiu et al. evaluate on the last 2,000 rows of countdown.json."""

_FILES: dict[tuple, list["CountdownRow"]] = {}


@dataclass(frozen=True)
class CountdownRow:
    """One countdown problem read from a file."""

    id: str
    numbers: tuple[int, ...]
    target: int | float
    """An integer, or a float where the file gives a non-integer target (43 test rows of countdown.json)."""
    target_text: str | None = None
    """The target as the file wrote it, when it wrote it as text (Qiu et al.'s evaluation parses this text)."""
    prompt: str | None = None
    """The full prompt text, fed verbatim (None: evolm's template, or ``messages``)."""
    special_tokens: bool = False
    """The reference tokenized ``prompt`` with the tokenizer's special tokens (Qiu et al.'s ``context``)."""
    messages: tuple[tuple[str, str], ...] | None = None
    """Chat messages (role, content) rendered with the tokenizer's chat template."""
    solution: str | None = None


def _integer(value: Any) -> int | None:
    """``value`` as an int when it is an integer or an integer written as text, else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        text = value.strip()
        if text.lstrip("+-").isdigit() and text.lstrip("+-").isascii():
            return int(text)
    return None


def _target(value: Any) -> int | float | None:
    """A target: an integer (or integer text), else a finite non-integer number (or its decimal text); else None."""
    whole = _integer(value)
    if whole is not None:
        return whole
    if isinstance(value, bool):
        return None
    try:
        number = float(value.strip()) if isinstance(value, str) else float(value) if isinstance(value, float) else None
    except ValueError:
        return None
    return number if number is not None and math.isfinite(number) else None


def _field(row: dict, *path: str) -> Any:
    node: Any = row
    for key in path:
        node = maybe_json(node)
        if not isinstance(node, dict) or node.get(key) is None:
            return None
        node = node[key]
    return node


def parse_row(row: Any, index: int, where: str) -> CountdownRow:
    """One file row as a ``CountdownRow``; a one-line ``UserError`` naming the row and field when it is not one."""
    at = f"{where}: row {index}"
    if not isinstance(row, dict):
        raise UserError(f"{at} is {type(row).__name__}, not a record with numbers and target")
    numbers = next((v for v in (_field(row, "numbers"), _field(row, "nums"),
                                _field(row, "reward_model", "ground_truth", "numbers")) if v is not None), None)
    target = next((v for v in (_field(row, "target"), _field(row, "reward_model", "ground_truth", "target"))
                   if v is not None), None)
    if numbers is None or target is None:
        missing = " and ".join(n for n, v in (("numbers (or nums)", numbers), ("target", target)) if v is None)
        raise UserError(f"{at} has no {missing} (it has {sorted(map(str, row))[:12]}); a countdown row needs "
                        "numbers/nums and target, or reward_model.ground_truth")
    numbers = maybe_json(numbers)
    parsed = [_integer(n) for n in numbers] if isinstance(numbers, (list, tuple)) else None
    if not parsed or any(n is None or n < 0 for n in parsed):
        raise UserError(f"{at}: numbers must be a non-empty list of non-negative integers (got {numbers!r})")
    goal = _target(target)
    if goal is None:
        raise UserError(f"{at}: target must be a number (got {target!r})")

    prompt, special, messages = None, False, None
    context = row.get("context")
    raw = maybe_json(row.get("prompt"))
    if context is not None:
        if not isinstance(context, str) or not context.strip():
            raise UserError(f"{at}: context must be non-empty text (got {context!r:.60})")
        prompt, special = context, True
    elif isinstance(raw, str):
        if not raw.strip():
            raise UserError(f"{at}: prompt is empty")
        prompt = raw
    elif isinstance(raw, (list, tuple)):
        if not raw or not all(isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                              for m in raw):
            raise UserError(f"{at}: prompt must be text or a non-empty list of {{role, content}} messages")
        if len(raw) == 1:
            prompt = raw[0]["content"]
        else:
            messages = tuple((m["role"], m["content"]) for m in raw)
    elif raw is not None:
        raise UserError(f"{at}: prompt must be text or a list of {{role, content}} messages (got {type(raw).__name__})")

    ident = next((v for v in (row.get("id"), _field(row, "extra_info", "index")) if v not in (None, "")), index)
    solution = row.get("solution")
    return CountdownRow(id=str(ident), numbers=tuple(parsed), target=goal, target_text=target if isinstance(target, str) else None,
                        prompt=prompt, special_tokens=special, messages=messages,
                        solution=solution if isinstance(solution, str) else None)


def read_rows(path: str | Path) -> list[CountdownRow]:
    """Every row of a countdown file, checked (cached per process by path, size and modification time)."""
    path = Path(path).expanduser()
    if not path.exists():
        raise UserError(f"countdown data file {path} does not exist")
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _FILES:
        table = read_table(path)
        if not table:
            raise UserError(f"countdown data file {path} holds no rows")
        rows = [parse_row(row, i, f"countdown data {path}") for i, row in enumerate(table)]
        if len({r.id for r in rows}) != len(rows):
            rows = [CountdownRow(**{**r.__dict__, "id": str(i)}) for i, r in enumerate(rows)]
        _FILES[key] = rows
    return _FILES[key]


def _count(knob: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"task 'countdown': {knob} must be a positive integer (got {value!r})")
    return value


@dataclass(frozen=True)
class CountdownFiles:
    """Where countdown problems come from when the task reads files, and how the splits are cut."""

    path: str
    train_path: str | None = None
    train_rows: int | None = None
    test_rows: int | None = None

    @classmethod
    def from_params(cls, path: Any, train_path: Any, train_rows: Any, test_rows: Any) -> "CountdownFiles | None":
        """The file source described by the task params, or None for the procedural task (one-line errors)."""
        train_rows, test_rows = _count("train_rows", train_rows), _count("test_rows", test_rows)
        for knob, value in (("path", path), ("train_path", train_path)):
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ConfigError(f"task 'countdown': {knob} must be a file path (got {value!r})")
        if path is None:
            if train_path is not None:
                raise ConfigError("task 'countdown': train_path needs path too (the held-out file); "
                                  "give one file as path to split it as Qiu et al. did")
            if train_rows is not None or test_rows is not None:
                raise ConfigError("task 'countdown': train_rows and test_rows need path (a countdown data file)")
            return None
        return cls(path=path, train_path=train_path, train_rows=train_rows, test_rows=test_rows)

    @property
    def params(self) -> dict:
        """The params that name this source (recorded in eval.json)."""
        return {k: v for k, v in self.__dict__.items() if v is not None}

    def rows(self, split: str) -> list[CountdownRow]:
        """The rows of ``split`` ("train" or "test") under the split rule in the module docstring."""
        if self.train_path is not None:
            if split == "train":
                rows = read_rows(self.train_path)
                return rows[:self.train_rows] if self.train_rows else rows
            rows = read_rows(self.path)
            return rows[-self.test_rows:] if self.test_rows else rows
        rows = read_rows(self.path)
        n_train = self.train_rows or QIU_TRAIN_ROWS
        n_test = self.test_rows or QIU_TEST_ROWS
        if n_train + n_test > len(rows):
            raise UserError(f"countdown data {self.path} has {len(rows)} rows: the train split (first {n_train}) and the "
                            f"test split (last {n_test}) would overlap; set task params train_rows and test_rows "
                            f"(sum at most {len(rows)}) or give the training file as train_path")
        return rows[:n_train] if split == "train" else rows[-n_test:]


def seeded_subset(items: list, count: int | None, seed: int) -> list:
    """All of ``items`` (``count`` None or >= len), else ``count`` of them chosen by a seeded permutation, in order."""
    if count is None or count >= len(items):
        return list(items)
    order = list(range(len(items)))
    random.Random(seed).shuffle(order)
    return [items[i] for i in sorted(order[:count])]
