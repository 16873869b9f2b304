"""The HTML report in a real headless browser (Debian's Chromium driven by Playwright): the page loads
with no console error, no page error and no failed request, every figure decodes to a real image, and
the warnings are visible. Skipped when Chromium or Playwright is absent (``make browser`` installs
Chromium; CI's ``.ci/run`` does)."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from test_report import inputs  # noqa: F401  (the module-scoped tiny runs, analyses and sweep)

playwright = pytest.importorskip("playwright.sync_api")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (make browser)")

FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]


def load(page_path, screenshot=None) -> dict:
    """Open ``page_path`` in headless Chromium; return its console errors, page errors, failed requests and
    every image's (alt, complete, natural width, natural height)."""
    seen = {"console": [], "pageerror": [], "requestfailed": []}
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            page.on("console", lambda m: seen["console"].append(m.text) if m.type in ("error", "assert") else None)
            page.on("pageerror", lambda e: seen["pageerror"].append(str(e)))
            page.on("requestfailed", lambda r: seen["requestfailed"].append(r.url[:80]))
            page.goto(page_path.resolve().as_uri(), wait_until="load")
            page.wait_for_function("Array.from(document.images).every(i => i.complete)")
            seen["images"] = page.evaluate(
                "Array.from(document.images).map(i => [i.alt, i.complete, i.naturalWidth, i.naturalHeight])")
            seen["warnings"] = page.evaluate(
                "Array.from(document.querySelectorAll('.warning')).map(w => [w.innerText, w.getBoundingClientRect().height])")
            seen["title"] = page.title()
            if screenshot is not None:
                page.screenshot(path=str(screenshot), full_page=True)
        finally:
            browser.close()
    return seen


def broken_images(seen: dict) -> list:
    return [alt for alt, complete, width, height in seen["images"] if not complete or width == 0 or height == 0]


def test_the_report_loads_in_headless_chromium_with_every_image_and_no_error(inputs, tmp_path):  # noqa: F811
    from evolm.report import build_report

    out = tmp_path / "report"
    (inputs["es"] / "analysis").mkdir(exist_ok=True)  # an all-zero analysis gets a visible warning
    (inputs["es"] / "analysis" / "drift.json").write_text(json.dumps(
        {"kind": "drift", "models": {"es": {"relative_distance": 0.0, "distance": 0.0, "by_category": {}}}}))
    try:
        paths = [str(inputs["es"]), str(inputs["analysis"]), str(inputs["sweep"])] + \
            ([str(inputs["grpo"])] if "grpo" in inputs else [])
        build_report(paths, out)
    finally:
        shutil.rmtree(inputs["es"] / "analysis")
    seen = load(out / "report.html", screenshot=tmp_path / "page.png")
    figures = json.loads((out / "report.json").read_text())["figures"]
    assert seen["title"] == "evolm report"
    assert len(seen["images"]) == len(figures) >= 6
    assert broken_images(seen) == []
    assert seen["console"] == [] and seen["pageerror"] == [] and seen["requestfailed"] == []
    texts = [t for t, height in seen["warnings"] if height > 0]
    assert any("all-zero drift" in t for t in texts), seen["warnings"]
    assert any("too few to support a claim" in t for t in texts)


def test_the_browser_check_catches_a_broken_image_and_a_console_error(inputs, tmp_path):  # noqa: F811
    from evolm.report import build_report

    out = tmp_path / "report"
    build_report([str(inputs["es"])], out)
    page = (out / "report.html").read_text()
    broken = re.sub(r"src='data:image/png;base64,[^']{40}", "src='data:image/png;base64,AAAA", page, count=1)
    broken = broken.replace("</body>", "<script>console.error('boom')</script></body>")
    (out / "broken.html").write_text(broken)
    seen = load(out / "broken.html")
    assert len(broken_images(seen)) == 1 and seen["console"] == ["boom"]
