"""The package's shape: its public API, what notebooks may import, and imports that never form a cycle."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import grpo_kit as gk

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "grpo_kit"


def test_every_public_name_resolves_and_internal_names_do_not():
    for name in gk.__all__:
        assert getattr(gk, name) is not None, name
    assert callable(gk.evaluate) and callable(gk.plan), "a public function is shadowed by its module"
    assert gk.plan_table.__module__ == "grpo_kit.planner" and gk.plan_table.__name__ == "table"
    with pytest.raises(AttributeError, match="no attribute 'sample'"):
        gk.sample  # noqa: B018 - internal, not public


def test_import_is_cheap_and_leaves_transformers_and_torch_xla_unloaded():
    # the CLI sets torch_xla's environment (device count, PJRT) before torch_xla loads; transformers imports
    # an installed torch_xla by itself, so neither may load with the package
    code = "import sys, grpo_kit; print(sorted(m for m in ('transformers', 'torch_xla', 'peft') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def notebook_code(path: Path) -> str:
    cells = json.loads(path.read_text())["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")


@pytest.mark.parametrize("path", sorted((ROOT / "notebooks").glob("*.ipynb")), ids=lambda p: p.stem)
def test_notebooks_use_only_the_public_api(path):
    code = notebook_code(path)
    assert not re.findall(r"(?:from|import) grpo_kit\.\w+", code), "a notebook imports a private module"
    imported = [n.strip().split(" as ")[0] for group in re.findall(r"from grpo_kit import ([^\n]+)", code)
                for n in group.split(",")]
    assert imported, "the notebook imports nothing from grpo_kit"
    assert set(imported) <= set(gk.__all__), sorted(set(imported) - set(gk.__all__))


def module_imports(path: Path) -> set[str]:
    """The grpo_kit modules a module imports anywhere in its body (function-level imports included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module.split(".")[0])
            else:
                found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("grpo_kit."):
            found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("grpo_kit."))
    return found - {path.stem}


def test_no_import_cycle_among_modules():
    graph = {p.stem: module_imports(p) for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    assert set().union(*graph.values()) <= set(graph), "an import names a module that does not exist"
    order, state = [], {}

    def visit(module: str, path: list[str]) -> None:
        if state.get(module) == "done":
            return
        assert state.get(module) != "open", "import cycle: " + " -> ".join([*path, module])
        state[module] = "open"
        for dep in sorted(graph[module]):
            visit(dep, [*path, module])
        state[module] = "done"
        order.append(module)

    for module in sorted(graph):
        visit(module, [])
    assert order.index("device") < order.index("models") < order.index("grpo")


def readme_quick_start() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Quick start", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_quick_start_runs_as_written(tmp_path):
    run = subprocess.run([sys.executable, "-c", readme_quick_start()], cwd=tmp_path, capture_output=True, text=True,
                         timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    sft, grpo = (float(re.search(rf"after {stage}: *([0-9.]+)", run.stdout).group(1)) for stage in ("SFT", "GRPO"))
    assert 0.0 < sft <= 1.0 and 0.0 < grpo <= 1.0
    assert (tmp_path / "runs/quickstart/export/model.safetensors").exists()
    assert len((tmp_path / "runs/quickstart/grpo/metrics.jsonl").read_text().splitlines()) == 10


def test_readme_is_a_users_page_and_docs_state_facts_not_history():
    assert len((ROOT / "README.md").read_bytes()) <= 10_240
    pages = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
    for page in pages:
        text = page.read_text()
        # a dated or commit-stamped line is a work-log entry; git log holds the history
        assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text), page.name
        assert not re.search(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b", text), page.name
        for link in re.findall(r"\]\(((?!https?:)[^)#]+)\)", text):
            assert (page.parent / link).exists(), f"{page.name} links to missing {link}"
