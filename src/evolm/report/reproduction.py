"""``evolm report --study``: the reproduction study's page. The page lives in ``evolm.report.study.page``; this
module keeps the name the report package and callers import it by."""

from __future__ import annotations

from evolm.document import pick_colour
from evolm.report.study.page import FIGURES, PAGE, StudyResult, build_study, shown

__all__ = ["PAGE", "FIGURES", "StudyResult", "build_study", "shown", "pick_colour"]
