"""The notebooks as files: each teaching (objectives) and checking (an exercise). That they are committed
without outputs is checked in test_config_cli.py.

Running them is nbmake's job: `make test` collects `notebooks/*.ipynb` with `--nbmake` and GRPO_KIT_QUICK=1.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_the_course_arc_is_there():
    names = [p.stem for p in NOTEBOOKS]
    assert [n[:2] for n in names] == [f"{i:02d}" for i in range(10)], names
    for word, i in [("setup", 0), ("sft", 2), ("reward", 3), ("advantages", 4), ("grpo", 5), ("export", 6), ("tpu", 7),
                    ("gsm8k", 8), ("your_task", 9)]:
        assert word in names[i], (word, names[i])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_objectives_and_a_checked_exercise(path):
    nb = nbformat.read(path, as_version=4)
    assert "You will learn" in nb.cells[0].source, f"{path.name}: the first cell states the learning objectives"
    text = "\n".join(c.source for c in nb.cells)
    assert "### Exercise" in text and "nbk.check_exercise(" in text, (
        f"{path.name}: needs an exercise and a cell that checks it")


def install_cell(path: Path) -> str:
    nb = nbformat.read(path, as_version=4)
    return next(c.source for c in nb.cells if c.cell_type == "code" and "KIT_COMMIT" in c.source)


INSTALLER = ROOT / "notebooks" / "install.py"


def test_every_notebook_has_the_same_install_cell_of_at_most_six_lines():
    """Cell 1 is the notebook's first code cell, the same everywhere, and short: the logic is the installer's."""
    assert len({install_cell(path) for path in NOTEBOOKS}) == 1
    for path in NOTEBOOKS:
        first = next(c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")
        assert first.source == install_cell(path), path.name
    assert len(install_cell(NOTEBOOKS[0]).splitlines()) <= 6


def test_the_install_cell_runs_its_commits_installer_which_installs_that_commit_with_the_notebooks_extra():
    """The cell names a release and a commit of this repository (a tag can move; `make release` writes both, and
    tests/test_release.py checks that kit against the notebooks); it fetches notebooks/install.py at that commit,
    which installs the same commit; pip reads `git+https://…[extra]` as part of the URL (no extra at all), so the
    extra is asked for as `grpo-kit[notebooks]` once the kit is in."""
    from packaging.requirements import Requirement

    install = install_cell(NOTEBOOKS[0])
    release, commit = re.search(r'KIT_RELEASE, KIT_COMMIT = "(v[^"]+)", "([0-9a-f]*)"', install).groups()
    assert re.fullmatch(r"v\d+\.\d+\.\d+\S*", release) and re.fullmatch(r"[0-9a-f]{40}", commit), (release, commit)
    fetched = install.split('os.environ.get("GRPO_KIT_INSTALLER", f"', 1)[1].split('"', 1)[0]
    assert fetched == "https://raw.githubusercontent.com/grpo-kit/grpo_kit/{KIT_COMMIT}/notebooks/install.py"
    installer = INSTALLER.read_text()
    default = installer.split('os.environ.get("GRPO_KIT_SOURCE", f"', 1)[1].split('"', 1)[0]
    requirement = Requirement("grpo-kit @ " + default.replace("{commit}", commit))
    assert requirement.url == f"git+https://github.com/grpo-kit/grpo_kit@{commit}"
    assert 'pip("--no-deps", f"grpo-kit @ {kit}")' in installer and '"grpo-kit[notebooks]")' in installer


def _cell_with_local_installer(**replace: str) -> str:
    cell = install_cell(NOTEBOOKS[0]).replace("from grpo_kit import notebook as nbk", "")
    for old, new in replace.items():
        cell = cell.replace(old, new)
    return cell


def test_the_install_cell_pins_what_it_adds_and_never_prints_a_credential(tmp_path):
    """Run the cell's install path with pip stood in for (a script that records its arguments and fails the way a
    private GitHub URL does, echoing the URL): the kit's constraints reach pip for packages the runtime lacks,
    never for ones it has, and the token in GRPO_KIT_SOURCE is printed nowhere."""
    # as on a runtime whose packages are this venv's (torch among them) and which has no kit yet
    cell = _cell_with_local_installer(**{'importlib.util.find_spec("grpo_kit") is None': "True"})
    secret = "ghp_SENTINEL0123456789"
    recorded = tmp_path / "pip-args.txt"
    fake_python = tmp_path / "python"
    fake_python.write_text(f"""#!{sys.executable}
import sys
if sys.argv[1:3] == ["-m", "pip"]:
    open({str(recorded)!r}, "a").write(" ".join(sys.argv[3:]) + "\\n")
    if "--no-deps" in sys.argv:
        sys.exit(0)
    print("ERROR: could not fetch " + [a for a in sys.argv if "@" in a][-1] + " for grpo-kit", file=sys.stderr)
    sys.exit(1)
print({str(ROOT / "grpo_kit" / "assets" / "constraints.txt")!r})
""")
    fake_python.chmod(0o755)
    source = f"git+https://oauth2:{secret}@github.com/me/grpo_kit@main"
    lacks = ("kagglehub", "jupyter-ui-poll", "jupyter_ui_poll")  # as Colab's TPU runtime lacks them
    script = (f"import sys; sys.executable = {str(fake_python)!r}\n"
              "import importlib.metadata as md; every = md.distributions\n"
              f"md.distributions = lambda: [d for d in every() if d.metadata['Name'] not in {lacks!r}]\n" + cell)
    env = {**os.environ, "GRPO_KIT_SOURCE": source, "GRPO_KIT_INSTALLER": INSTALLER.as_uri()}
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode != 0 and "pip could not install grpo-kit from git+https://***@github.com" in done.stderr
    assert secret not in done.stdout + done.stderr, done.stdout + done.stderr
    first, second = recorded.read_text().splitlines()
    assert first.endswith(f"--no-deps grpo-kit @ {source}")
    assert second.endswith("-c /tmp/runtime-packages.txt -c /tmp/kit-constraints.txt grpo-kit[notebooks]")
    added = Path("/tmp/kit-constraints.txt").read_text()
    assert "kagglehub==" in added and "jupyter-ui-poll==" in added  # what the runtime lacks comes pinned …
    assert "torch==" not in added and "pip==" not in added  # … what this one has is left to it


def test_a_wrong_source_stops_the_install_cell_with_the_fix(tmp_path):
    """Run as on a fresh runtime (no kit importable: python -S, an empty directory): pip fails on the bad URL and
    the cell ends with one message naming the source and the fix, not a ModuleNotFoundError further down."""
    cell = _cell_with_local_installer()
    env = {**os.environ, "GRPO_KIT_SOURCE": f"file://{tmp_path}/no-such-checkout",
           "GRPO_KIT_INSTALLER": INSTALLER.as_uri()}
    done = subprocess.run([sys.executable, "-S", "-c", cell], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode != 0
    message = done.stderr.strip().splitlines()
    assert message[0].startswith(f"pip could not install grpo-kit from file://{tmp_path}/no-such-checkout"), done.stderr
    assert message[-1].startswith("Fix: unset GRPO_KIT_SOURCE"), done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_evaluation_generates_as_many_tokens_as_training(path):
    """A real Gemma's worked answers run to the training length (256 in the Gemma presets): evaluating with fewer
    new tokens cuts them off and scores them wrong."""
    text = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")
    for call in re.split(r"(?<![\w.])evaluate\(", text)[1:]:  # the kit's evaluate (Arc.evaluate uses GRPO's own)
        args = call.split(")", 1)[0]
        assert "max_new_tokens=cfg.grpo.max_new_tokens" in args, f"{path.name}: evaluate({args})"


TRAINS_ON_THE_DEVICE = {"00", "01", "02", "03", "05", "06", "07", "08", "09"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_each_notebook_opens_on_its_runtime_with_its_own_badges(path):
    """Colab and Kaggle read the accelerator from the notebook's metadata: a notebook that runs a model opens on a
    TPU (Colab v5e-1, Kaggle v5e-8); the badges open this very notebook, both at the same commit (the release's:
    tests/test_release.py checks that it exists and installs a kit with the notebook's names)."""
    nb = nbformat.read(path, as_version=4)
    intro = nb.cells[0].source
    colab = re.findall(r"\(https://colab\.research\.google\.com/github/grpo-kit/grpo_kit/blob/([\w.]+)/(\S+)\)", intro)
    kaggle = re.findall(r"\(https://kaggle\.com/kernels/welcome\?src=https://github\.com/grpo-kit/grpo_kit/blob/([\w.]+)/"
                        r"(\S+)\)", intro)
    assert colab and colab == kaggle and colab[0][1] == f"notebooks/{path.name}", (colab, kaggle)
    uses_device = any(
        word in c.source
        for c in nb.cells
        if c.cell_type == "code"
        for word in ("get_device", "xla_check", "choose_config", "capstone_config", "your_task_config")
    )
    assert uses_device == (path.name[:2] in TRAINS_ON_THE_DEVICE)
    if uses_device:
        assert nb.metadata["accelerator"] == "TPU" and nb.metadata["colab"]["gpuType"] == "V5E1"
        assert nb.metadata["kaggle"]["accelerator"] == "tpuV5e8"
    else:
        assert "accelerator" not in nb.metadata and nb.metadata["kaggle"]["accelerator"] == "none"


@pytest.mark.kernel
def test_the_setup_notebook_shows_no_hub_token(monkeypatch):
    """Notebook 00 displays the chosen settings and the hub access check; run with a token in HF_TOKEN (where Colab
    and Kaggle secrets end up), none of its outputs may contain it."""
    from nbclient import NotebookClient

    secret = "hf_SENTINEL_9876543210"
    monkeypatch.setenv("HF_TOKEN", secret)
    monkeypatch.setenv("GRPO_KIT_SOLUTIONS", "1")  # its exercise solved, as in `make test`
    nb = nbformat.read(NOTEBOOKS[0], as_version=4)
    NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(ROOT / "notebooks")}}
    ).execute()
    shown = nbformat.writes(nb)
    assert "preset " in shown  # the cells ran and printed the chosen settings
    assert secret not in shown


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_each_notebook_opens_with_its_time_from_the_measurements(path):
    """The time header (`course.header`): measured minutes with the tiny Gemma (assets/course_minutes.json, written
    by `make course-times` with the machine), an estimate for Gemma 3 1B-IT where the notebook trains it, or the time
    budget of the notebooks that train a real Gemma."""
    from grpo_kit.course.modes import HEADER_MARK, header, measured_minutes

    first = nbformat.read(path, as_version=4).cells[0].source
    lines = [line for line in first.splitlines() if line.startswith(HEADER_MARK)]
    assert lines == [header(path.name[:2])], f"{path.name}: run `python scripts/course_times.py --headers-only`"
    assert "min" in lines[0] and ("measured" in lines[0] or "time budget" in lines[0])
    assert measured_minutes()["machine"]["cpu_count"] >= 1


QUICK_MODE_NAMES = {"quick", "steps"}  # nbk.quick(), nbk.steps(full, quick): CI's switches, read inside the kit


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_learner_cell_reads_cis_quick_mode(path):
    """CI's quick mode lives in the kit: no code cell calls nbk.quick or nbk.steps or reads GRPO_KIT_QUICK."""
    import ast

    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type != "code":
            continue
        assert "GRPO_KIT_QUICK" not in cell.source, f"{path.name}: {cell.source[:80]!r}"
        python = [line for line in cell.source.splitlines() if not line.lstrip().startswith(("!", "%"))]
        tree = ast.parse("\n".join(python))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "nbk":
                assert node.attr not in QUICK_MODE_NAMES, f"{path.name}: nbk.{node.attr} in {cell.source[:80]!r}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_a_v2_8_is_named_only_as_one_board_among_several(path):
    """The runtimes learners open are v5e-1, v5e-8 and v6e-1: a cell that names a v2-8 names another board too."""
    for cell in nbformat.read(path, as_version=4).cells:
        if "v2-8" in cell.source:
            assert re.search(r"v5e-\d|v6e-\d", cell.source), f"{path.name}: {cell.source[:120]!r}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_exercises_come_in_their_numbered_order(path):
    ids = [m.group(1) for c in nbformat.read(path, as_version=4).cells
           if (m := re.match(r"# Exercise (\d\d\.\d+):", c.source))]
    assert ids == sorted(ids, key=lambda i: int(i.split(".")[1])), (path.name, ids)


def test_the_capstone_notebook_tells_its_finding_in_under_a_thousand_words():
    """Notebook 08's markdown, every cell together (the study's generated table included), is at most 1,000 words,
    and its section on when GRPO pays at most 300."""
    cells = nbformat.read(ROOT / "notebooks" / "08_gemma_gsm8k.ipynb", as_version=4).cells
    words = sum(len(c.source.split()) for c in cells if c.cell_type == "markdown")
    assert words <= 1000, words
    (finding,) = [c.source for c in cells if c.source.startswith("## 7 · When does GRPO pay?")]
    assert len(finding.split()) <= 300, len(finding.split())
