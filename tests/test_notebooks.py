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


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_the_install_cell_asks_pip_for_the_notebooks_extra(path):
    """pip reads `git+https://…[extra]` as part of the URL (no extra at all): the line must be `name[extra] @ URL`."""
    from packaging.requirements import Requirement

    nb = nbformat.read(path, as_version=4)
    install = next(c.source for c in nb.cells if c.cell_type == "code" and "GRPO_KIT_SOURCE" in c.source)
    default = install.split('os.environ.get("GRPO_KIT_SOURCE", "', 1)[1].split('"', 1)[0]
    line = install.split("install -q '", 1)[1].split("'", 1)[0].replace("{KIT}", default)
    requirement = Requirement(line)
    assert requirement.name == "grpo-kit" and requirement.extras == {"notebooks"}, line
    assert requirement.url == "git+https://github.com/grpo-kit/grpo_kit", line


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_evaluation_generates_as_many_tokens_as_training(path):
    """A real Gemma's worked answers run to the training length (256 in the Gemma presets): evaluating with fewer
    new tokens cuts them off and scores them wrong."""
    text = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")
    for call in text.split("evaluate(")[1:]:
        args = call.split(")", 1)[0]
        assert "max_new_tokens=cfg.grpo.max_new_tokens" in args, f"{path.name}: evaluate({args})"
