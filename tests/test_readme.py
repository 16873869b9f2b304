"""The README as a user reads it: short, its links and those of docs/README.md lead somewhere, and its
Python runs as written (the quickstart trains the embedded model for about a minute: slow, and in CI)."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
README_MAX_BYTES = 6 * 1024
# The pages whose every relative link (and its #heading) must resolve: the front page and every docs page but
# REPRODUCTION.md, which `evolm report --study` writes.
LINKED_PAGES = [README, *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "REPRODUCTION.md")]

_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def python_snippets(text: str) -> list[str]:
    return [body for lang, body in _FENCE.findall(text) if lang == "python"]


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = _FENCE.sub("", page.read_text())
    return {github_anchor(m) for m in re.findall(r"^#+ (.+)$", text, re.M)}


def broken_links(page: Path) -> list[str]:
    out = []
    for target in _LINK.findall(_FENCE.sub("", page.read_text())):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            out.append(f"{target} (no such file)")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            out.append(f"{target} (no heading #{anchor} in {resolved.name})")
    return out


def test_readme_fits_in_6_kb():
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes; move detail to docs/ (limit {README_MAX_BYTES})"


def test_readme_first_screen_has_what_install_and_quickstart():
    first_screen = "\n".join(README.read_text().splitlines()[:45])
    for heading in ("# evolm", "## Install", "## Quickstart", "make demo", "make test"):
        assert heading in first_screen, heading
    assert "```python" in first_screen


@pytest.mark.parametrize("page", LINKED_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    assert not broken_links(page), broken_links(page)


def test_the_link_check_finds_a_broken_link(tmp_path):
    (tmp_path / "there.md").write_text("# A heading, here\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](there.md) [ok](there.md#a-heading-here) [web](https://x.org/y) [no](missing.md) "
                    "[no](there.md#elsewhere)\n```\n[not a link](in-code.md)\n```\n")
    assert [b.split(" ")[0] for b in broken_links(page)] == ["missing.md", "there.md#elsewhere"]


def test_readme_python_parses_and_trains_only_under_a_main_guard():
    """A script that trains at import time trains again when `evolm replay` (or a resume, a Ray actor) imports it
    to find its reward function; docs/custom-tasks.md's snippet keeps the same rule."""
    snippets = python_snippets(README.read_text())
    assert snippets, "README.md has no Python snippet"
    for text in [*snippets, *python_snippets((ROOT / "docs" / "custom-tasks.md").read_text())]:
        tree = ast.parse(text)
        unguarded = [ast.unparse(n) for n in tree.body if ".train(" in ast.unparse(n)
                     and not (isinstance(n, ast.If) and ast.unparse(n.test) == "__name__ == '__main__'")]
        assert not unguarded, f"a training call outside `if __name__ == \"__main__\":`: {unguarded[0]}"
        if "Trainer(" in text:
            assert 'if __name__ == "__main__":' in text, text


@pytest.mark.slow
@pytest.mark.ci
@pytest.mark.parametrize("index", range(len(python_snippets(README.read_text()))))
def test_readme_python_runs_as_written(index, tmp_path):
    """Each Python snippet of README.md, saved as a script in an empty directory and run there (the
    quickstart: 4 ES updates of SmolLM2-135M, about a minute on one core)."""
    script = tmp_path / f"snippet_{index}.py"
    script.write_text(python_snippets(README.read_text())[index])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, script.name], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    if "ESTrainer" in script.read_text():
        assert (tmp_path / "runs" / "quickstart" / "final").is_dir() and "pass@4 before:" in out.stdout
