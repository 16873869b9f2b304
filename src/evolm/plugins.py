"""The user's code, found by name: tasks and reward functions from entry points, modules and files.

A *reference* names one Python object in one of three forms, tried in this order:

- an entry-point name in a group (``evolm.tasks`` for tasks, ``evolm.rewards`` for reward functions),
  declared by an installed package in its ``pyproject.toml``::

      [project.entry-points."evolm.rewards"]
      my_accuracy = "my_package.rewards:accuracy"

- ``package.module:attribute`` (an importable module), e.g. ``"my_package.rewards:accuracy"``;
- ``path/to/file.py:attribute`` (a file, relative to the working directory or absolute);
- either of the last two with literal arguments, ``module:function(0.5, scale=2)``: a
  ``functools.partial`` of the function (``reference_of`` writes a partial this way).

Design decisions:

- One resolver serves every verb and every process: the CLI's driver, a verb that reopens a run
  (``eval --like``, ``replay``, ``analyze``), a sweep, and each Ray actor (a task pickles the
  *references* of its reward functions and resolves them again where it is unpickled; a task class or
  function loaded from a file is registered with cloudpickle to travel by value, since no other
  process can import a file-made module by name).
- A file is imported once per process under a module name derived from its resolved path
  (``evolm_user_<stem>_<hash>``), so two files with the same stem never collide and re-resolving is
  free.
- ``provenance(obj, ref)`` says where an object came from: the reference, the module, its file, the
  distribution that installed it and that distribution's version, and for a file (the running
  ``__main__`` script included) its SHA-256. A run
  records this in ``run.json`` (``plugins``), so a later verb that cannot import the code can say
  which package or file it needs (``check_recorded``).
- Every failure is a one-line ``UserError`` naming the fix: a module that does not import (with its
  own first error line), a missing attribute (with the ones present), an entry point whose target is
  broken.
- A script that trains at module level (no ``if __name__ == "__main__":``) would train again each time
  evolm imports it to find its reward, recursively: while evolm imports a file or module, the entry of
  every run (``refuse_run_on_import``, called by the trainers and ``jobs``) refuses in one line.
"""

from __future__ import annotations

import ast
import difflib
import functools
import hashlib
import importlib
import importlib.metadata
import importlib.util
import re
import sys
from pathlib import Path
from typing import Any

from evolm.errors import UserError

TASK_GROUP = "evolm.tasks"
"""Entry-point group of task classes (``Task`` subclasses)."""
REWARD_GROUP = "evolm.rewards"
"""Entry-point group of reward functions (and correctness functions)."""

_FILE_MODULES: dict[str, Any] = {}
_IMPORTING: list[str] = []
"""The files and modules evolm is importing right now (innermost last): a run started while one is imported
is a script's unguarded training call (``refuse_run_on_import``)."""


class StartedOnImport(UserError):
    """A user's file started a run while evolm imported it to find a reward or task by its reference."""


def refuse_run_on_import() -> None:
    """Called where a run starts (the trainers, the job entry points): refuse a run that a user's script starts
    at module level while evolm imports that script to find its reward (``replay``, ``eval --like``, a resume,
    a Ray actor), which would train again inside the import, recursively."""
    if _IMPORTING:
        raise StartedOnImport(f"{_IMPORTING[-1]} starts a run when imported (evolm imports it to find a function it "
                              "defines); put the training call under if __name__ == \"__main__\":")


_CALL = re.compile(r"^(?P<target>.+?):(?P<attr>[A-Za-z_][\w.]*)\((?P<args>.*)\)$", re.DOTALL)
"""``target:attr(args)``: a ``functools.partial`` of ``target:attr`` with literal arguments."""


def _split(ref: str) -> tuple[str, str, str | None]:
    """``(target, attr, args)`` of a reference; ``args`` is None without a call."""
    call = _CALL.match(ref)
    if call:
        return call["target"], call["attr"], call["args"]
    target, _, attr = ref.rpartition(":")
    return target, attr, None


def is_reference(text: str) -> bool:
    """Whether ``text`` is written as ``module:attr`` or ``file.py:attr``, optionally with literal arguments
    ``module:attr(0.5, scale=2)`` (entry-point names are bare words)."""
    if ":" not in str(text):
        return False
    module, attr, _ = _split(str(text))
    return bool(module and attr and attr.replace("_", "a").replace(".", "a").isalnum())


def _partial_of(obj: Any, ref: str, args: str) -> Any:
    """``functools.partial(obj, ...)`` from the literal arguments ``args`` of ``ref``."""
    try:
        call = ast.parse(f"f({args})", mode="eval").body
        assert isinstance(call, ast.Call) and not any(k.arg is None for k in call.keywords)
        positional = [ast.literal_eval(a) for a in call.args]
        keywords = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
    except (SyntaxError, ValueError, TypeError, AssertionError):
        raise UserError(f"'{ref}': the arguments in parentheses must be Python literals (numbers, strings, lists, "
                        "dicts), as name=value or positional") from None
    return functools.partial(obj, *positional, **keywords)


def entry_points(group: str) -> dict[str, importlib.metadata.EntryPoint]:
    """The entry points installed in ``group``, by name."""
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=group)}


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def _import_file(path: Path) -> Any:
    key = str(path)
    if key in _FILE_MODULES:
        return _FILE_MODULES[key]
    digest = hashlib.sha256(key.encode()).hexdigest()[:10]
    name = f"evolm_user_{''.join(c if c.isalnum() else '_' for c in path.stem)}_{digest}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UserError(f"cannot import {path} as a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    _IMPORTING.append(str(path))
    try:
        spec.loader.exec_module(module)
    except StartedOnImport:
        sys.modules.pop(name, None)
        raise
    except Exception as e:  # noqa: BLE001  (the user's module may raise anything)
        sys.modules.pop(name, None)
        raise UserError(f"{path} does not import: {_first_line(e)}; fix the file and run again") from None
    finally:
        _IMPORTING.pop()
    _by_value(module)
    _FILE_MODULES[key] = module
    return module


def _by_value(module: Any) -> None:
    """Let cloudpickle (Ray) ship objects of a file-made module by value: other processes cannot import it by name."""
    try:
        import cloudpickle
    except ImportError:
        try:
            from ray import cloudpickle  # ray vendors it
        except ImportError:
            return
    try:
        cloudpickle.register_pickle_by_value(module)
    except (ValueError, AttributeError):  # already registered, or an old cloudpickle
        pass


def _import_module(name: str) -> Any:
    _IMPORTING.append(f"module '{name}'")
    try:
        return importlib.import_module(name)
    except StartedOnImport:
        raise
    except ModuleNotFoundError as e:
        if e.name and (name == e.name or name.startswith(e.name + ".")):
            raise UserError(f"module '{name}' is not installed here (no module named '{e.name}'): install the package "
                            "that provides it, or give a file as path/to/file.py:NAME") from None
        raise UserError(f"module '{name}' does not import: {_first_line(e)}") from None
    except Exception as e:  # noqa: BLE001
        raise UserError(f"module '{name}' does not import: {_first_line(e)}") from None
    finally:
        _IMPORTING.pop()


def resolve(ref: str, group: str, what: str = "object") -> Any:
    """The object ``ref`` names: an entry point of ``group``, ``module:attr`` or ``file.py:attr``."""
    ref = str(ref).strip()
    installed = entry_points(group)
    if ref in installed:
        try:
            return installed[ref].load()
        except Exception as e:  # noqa: BLE001
            raise UserError(f"entry point '{ref}' of group {group} ({installed[ref].value}) does not load: "
                            f"{_first_line(e)}") from None
    if not is_reference(ref):
        names = ", ".join(sorted(installed)) or "none installed"
        close = difflib.get_close_matches(ref, list(installed), n=1)
        raise UserError(f"no {what} called '{ref}': not an entry point of group {group} ({names}); "
                        + (f"did you mean '{close[0]}'? or " if close else "")
                        + "write package.module:NAME or path/to/file.py:NAME")
    target, attr, args = _split(ref)
    if target.endswith(".py"):
        path = Path(target).expanduser().resolve()
        if not path.is_file():
            raise UserError(f"{what} file {target} does not exist (from '{ref}')")
        main = sys.modules.get("__main__")
        if getattr(main, "__file__", None) and Path(main.__file__).resolve() == path:
            module = main  # the running script itself: importing it again would run it again
        else:
            module = _import_file(path)
    else:
        module = _import_module(target)
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            present = sorted(n for n in dir(module) if not n.startswith("_"))[:12]
            raise UserError(f"'{target}' has no {what} '{attr}' (it defines {', '.join(present) or 'nothing public'})")
        obj = getattr(obj, part)
    return obj if args is None else _partial_of(obj, ref, args)


def reference_of(obj: Any, what: str = "function") -> str:
    """The reference that finds ``obj`` again in another process (``module:qualname``, or ``file.py:qualname``
    for an object of the running script or of a file-made module); a ``UserError`` for one no other process
    can find (a lambda, a function defined inside a function)."""
    if isinstance(obj, str):
        return obj
    if isinstance(obj, functools.partial):  # recorded with its arguments: module:function(0.5, scale=2)
        shown = [*map(repr, obj.args), *(f"{k}={v!r}" for k, v in obj.keywords.items())]
        for value, text in zip([*obj.args, *obj.keywords.values()], shown):
            try:
                same = ast.literal_eval(repr(value)) == value
            except (ValueError, SyntaxError, TypeError):
                same = False
            if not same:
                raise UserError(f"argument {text[:60]} of partial {what} {reference_of(obj.func, what)} is not a literal "
                                "(a number, string, list, dict); pass literals only, so other processes rebuild it")
        return f"{reference_of(obj.func, what)}({', '.join(shown)})"
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    module_name = getattr(obj, "__module__", None)
    if not name or not module_name or "<" in name:
        shown = name or type(obj).__name__
        raise UserError(f"{what} {shown} is a lambda or defined inside a function; define it at module level (or pass "
                        "'module:function'), so a run can be resumed, replayed and evaluated from the command line")
    module = sys.modules.get(module_name)
    if module_name == "__main__" or module_name.startswith("evolm_user_"):
        file = getattr(module, "__file__", None)
        if not file:
            raise UserError(f"{what} {name} lives in an interactive session (no file); put it in a .py file or module")
        return f"{Path(file).resolve()}:{name}"
    return f"{module_name}:{name}"


def _distribution_of(module_name: str) -> tuple[str | None, str | None]:
    top = module_name.split(".")[0]
    for dist in importlib.metadata.packages_distributions().get(top, []):
        try:
            return dist, importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None, None


def provenance(obj: Any, ref: str) -> dict:
    """Where ``obj`` (resolved from ``ref``) came from: reference, module, file, distribution and version, file hash."""
    while isinstance(obj, functools.partial):  # a partial's code is its function's
        obj = obj.func
    module_name = getattr(obj, "__module__", None) or ""
    module = sys.modules.get(module_name)
    file = getattr(module, "__file__", None)
    out: dict[str, Any] = {"ref": ref, "module": module_name}
    if file:
        out["file"] = str(file)
    if (module_name.startswith("evolm_user_") or module_name == "__main__") and file:  # a file, the running script too
        out["sha256"] = hashlib.sha256(Path(file).read_bytes()).hexdigest()
    else:
        dist, version = _distribution_of(module_name)
        if dist:
            out["distribution"], out["version"] = dist, version
    return out


def describe_source(record: dict) -> str:
    """``record`` (a ``provenance``) as a few words: ``my-pkg 0.1 (module my_pkg.rewards)`` or ``file a/b.py``."""
    if record.get("distribution"):
        return f"{record['distribution']} {record.get('version', '')} (module {record.get('module')})".replace("  ", " ")
    if record.get("sha256"):
        return f"file {record.get('file')}"
    return f"module {record.get('module') or record.get('ref')}"


def check_recorded(plugins: dict | None, where: str) -> None:
    """Refuse, in one line, a run whose recorded task or reward code cannot be imported in this process.

    ``plugins`` is ``run.json``'s ``plugins`` record: ``{"task": provenance, "rewards": [provenance, ...],
    "correct": provenance}`` (any may be absent); ``where`` names the run for the message.
    """
    if not plugins:
        return
    records = [plugins.get("task")] + list(plugins.get("rewards") or []) + [plugins.get("correct")]
    for record in filter(None, records):
        group = TASK_GROUP if record is plugins.get("task") else REWARD_GROUP
        try:
            resolve(record["ref"], group)
        except StartedOnImport:
            raise
        except UserError as e:
            fix = (f"pip install {record['distribution']}=={record.get('version')}" if record.get("distribution")
                   else f"restore {record.get('file')}" if record.get("file") else "make it importable")
            raise UserError(f"{where} was trained with '{record['ref']}' from {describe_source(record)}, which cannot be "
                            f"imported here ({e}); {fix}") from None
