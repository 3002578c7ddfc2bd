"""The notebooks as files: each teaching (objectives) and checking (an exercise). That they are committed
without outputs is checked in test_config_cli.py.

Running them is nbmake's job: `make test` collects `notebooks/*.ipynb` with `--nbmake` and GRPO_KIT_QUICK=1.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


def test_the_course_arc_is_there():
    names = [p.stem for p in NOTEBOOKS]
    assert [n[:2] for n in names] == [f"{i:02d}" for i in range(8)], names
    for word, i in [("setup", 0), ("sft", 2), ("reward", 3), ("advantages", 4), ("grpo", 5), ("export", 6), ("tpu", 7)]:
        assert word in names[i], (word, names[i])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_objectives_and_a_checked_exercise(path):
    nb = nbformat.read(path, as_version=4)
    assert "You will learn" in nb.cells[0].source, f"{path.name}: the first cell states the learning objectives"
    text = "\n".join(c.source for c in nb.cells)
    assert "### Exercise" in text and "nbk.check(" in text, f"{path.name}: needs an exercise and a cell that checks it"
