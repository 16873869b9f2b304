"""C4's ES/GRPO drift ratio on a stated basis (issue 40, item 7), from the committed `evolm analyze drift` outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evolm.report.study.ratios import RATIO_ROWS, drift_ratios, ratio_section

ROOT = Path(__file__).resolve().parents[1]


def _read(path: Path):
    return json.loads(Path(path).read_text())


def test_committed_ratios_by_basis():
    data = ROOT / "docs" / "study"
    rows = drift_ratios(data, _read)
    assert len(rows) == len(RATIO_ROWS)
    assert [round(r.ratio, 1) for r in rows] == [20.0, 40.3, 29.0, 29.5, 36.6]
    assert "equal update seconds" in rows[0].basis  # the matched one comes first


def test_section_states_units_and_the_assumption(tmp_path):
    (tmp_path / "analyses" / "c1c2").mkdir(parents=True)
    (tmp_path / "analyses" / "c1c2" / "drift.json").write_text(json.dumps(
        {"models": {"es": {"relative_distance": 0.01}, "grpo": {"relative_distance": 0.0005}}}))
    section = ratio_section(tmp_path, _read)
    assert [round(r.ratio, 1) for r in drift_ratios(tmp_path, _read)] == [20.0]  # rows without files are left out
    text = section.blocks[0]
    assert "percent" in text and "assumed" in text
    assert section.blocks[1].rows[0][1:4] == ["1.000", "0.0500", "20.0x"]
    assert ratio_section(tmp_path / "none", _read) is None
