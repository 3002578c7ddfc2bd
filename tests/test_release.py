"""What a user opens is what we test: the kit each notebook's cell 1 installs provides every kit name that notebook
uses, and every badge opens a notebook that exists at a commit of this repository and installs such a kit
(scripts/release.py, `make release`). The kits are imported from their commits' own trees (git), not from HEAD."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import release  # noqa: E402

V010 = "3b980bbcc09e6d462081055093deef5a707df3de"  # v0.1.0's kit, 26 Nov 2026: before exercises, quizzes, notebook 09


def test_the_release_users_open_provides_everything_its_notebooks_use():
    """The check `make release` ends with: when it fails after a change, raise the version, say what changed in
    CHANGELOG.md and run `make release` (CONTRIBUTING.md, Releasing)."""
    found = release.problems()
    assert not found, "run `make release` (raise the version and add its CHANGELOG.md section first):\n" + "\n".join(
        found)


def test_what_a_notebook_asks_of_the_kit_is_read_from_its_code():
    cells = [
        'import grpo_kit as gk\nfrom grpo_kit import notebook as nbk, rewards as R\n'
        'from grpo_kit.tasks import make_task',
        'cfg = nbk.choose_config()\nR.strict_format_reward(["x"])\ngk.GRPOConfig.beta\ngk.PRESETS["cpu-tiny"]',
        'nbk.check_exercise("02.1", globals())\nnbk.quiz("05.3")\nprint("pip could not install grpo-kit from here")',
        'if True:\n    !grpo-kit score --task my.jsonl\n%time x = 1\n'
        'subprocess.run([sys.executable, "-m", "grpo_kit.cli", "xla-check", "--json"])\n'
        'cmd = "grpo-kit plan --tpu v6e-1"',
        '!python -m grpo_kit.devtools.smoke --help',
    ]
    needs = release.needs_of_cells(cells)
    assert needs.names == {
        "grpo_kit", "grpo_kit.notebook", "grpo_kit.rewards", "grpo_kit.tasks.make_task",
        "grpo_kit.notebook.choose_config",
        "grpo_kit.rewards.strict_format_reward", "grpo_kit.GRPOConfig", "grpo_kit.GRPOConfig.beta", "grpo_kit.PRESETS",
        "grpo_kit.notebook.check_exercise", "grpo_kit.notebook.quiz", "grpo_kit.devtools.smoke"}
    assert needs.commands == {"score", "xla-check", "plan"}  # not "from", out of a message
    assert needs.exercises == {"02.1"} and needs.quizzes == {"05.3"}


def test_the_check_names_what_the_v0_1_0_kit_lacks_for_todays_notebooks():
    """What today's notebooks would meet, had their cell 1 stayed at v0.1.0: the check imports that commit's tree and
    names every missing function, subcommand, exercise and quiz."""
    today = release.Needs()
    for path in release.notebooks():
        today.update(release.needs_of_cells(release.code_cells(path.read_text())))
    missing = set(release.missing_at(V010, today))
    assert {"grpo_kit.load_task", "grpo_kit.score_model", "grpo_kit.leaderboard", "grpo_kit.test_reward",
            "grpo_kit.notebook.quiz", "grpo_kit.notebook.check_exercise", "exercise 09.1", "quiz 05.1"} <= missing
    assert "grpo_kit.GRPOTrainer" not in missing and "grpo_kit.notebook.choose_config" not in missing  # it had those
    assert release.file_at(V010, "notebooks/09_your_task.ipynb") is None  # a badge for 09 there opens nothing
    assert release.missing_at(V010, release.Needs(commands={"no-such-command"})) == ["grpo-kit no-such-command"]


def test_badges_are_read_from_colab_kaggle_and_github_links():
    text = ("[Colab](https://colab.research.google.com/github/grpo-kit/grpo_kit/blob/abc/notebooks/05_grpo.ipynb) · "
            "[Kaggle](https://kaggle.com/kernels/welcome?src=https://github.com/grpo-kit/grpo_kit/blob/v0.1.0/notebooks/"
            "09_your_task.ipynb) [page](https://github.com/grpo-kit/grpo_kit/blob/main/docs/tpu.md#pods)")
    assert release.badges(text) == [("abc", "notebooks/05_grpo.ipynb"), ("v0.1.0", "notebooks/09_your_task.ipynb"),
                                     ("main", "docs/tpu.md")]
    moved = release.point_badges(text, "f" * 40)
    assert moved.count("/blob/" + "f" * 40 + "/notebooks/") == 2 and "/blob/main/docs/tpu.md" in moved


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.mark.slow
def test_make_release_cuts_a_release_whose_badges_open_notebooks_that_install_a_kit_with_their_names(tmp_path):
    """In a clone: a notebook starts using a name the released kit lacks, so the check fails naming it; `cut` (with
    the version raised and its CHANGELOG section) then makes R1 (the notebooks pinned to the kit's commit C) and R2
    (every badge opening R1's notebooks), and the check passes."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(clone)], check=True)
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.com"}
    init = clone / "grpo_kit" / "__init__.py"
    public = '    "notebook": "course.notebook",\n'
    assert public in init.read_text()
    init.write_text(init.read_text().replace(public, public + '    "a_new_name": "course.modes",\n'))
    modes = clone / "grpo_kit" / "course" / "modes.py"
    modes.write_text(modes.read_text() + "\na_new_name = 1\n")
    nb_path = clone / "notebooks" / "03_reward_design.ipynb"
    nb = json.loads(nb_path.read_text())
    nb["cells"].append({"cell_type": "code", "execution_count": None, "id": "new-name", "metadata": {}, "outputs": [],
                        "source": ["import grpo_kit as gk\n", "gk.a_new_name"]})
    nb_path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    pyproject = clone / "pyproject.toml"
    old = release.version()
    new = f"{old}.post9"
    pyproject.write_text(pyproject.read_text().replace(f'version = "{old}"', f'version = "{new}"', 1))
    changelog = clone / "CHANGELOG.md"
    section = f"\n## v{new}\n\n- a new name for notebook 03\n\n## "
    changelog.write_text(changelog.read_text().replace("\n## ", section, 1))
    _git("commit", "-q", "-am", "a new name", cwd=clone)
    script = [sys.executable, str(clone / "scripts" / "release.py")]
    before = subprocess.run([*script, "check"], cwd=clone, env=env, capture_output=True, text=True)
    assert before.returncode == 1
    lines = [line for line in before.stdout.splitlines() if "grpo_kit.a_new_name" in line]
    culprit = r"03_reward_design.ipynb: the kit its cell 1 installs \(\w+\) lacks "
    assert len(lines) == 1 and re.match(culprit, lines[0]), before.stdout
    kit = _git("rev-parse", "HEAD", cwd=clone)
    cut = subprocess.run([*script, "cut"], cwd=clone, env=env, capture_output=True, text=True)
    assert cut.returncode == 0, cut.stdout + cut.stderr
    notebooks_at = _git("rev-parse", "HEAD~1", cwd=clone)
    assert _git("rev-parse", "HEAD~2", cwd=clone) == kit
    assert set(_git("diff", "--name-only", kit, notebooks_at, cwd=clone).split()) <= {
        f"notebooks/{p.name}" for p in release.notebooks()} | {"README.md"}  # R1's kit is C's
    assert _git("rev-parse", f"v{new}^{{commit}}", cwd=clone) == notebooks_at
    for path in (clone / "notebooks").glob("*.ipynb"):
        text = path.read_text()
        assert release.pinned(text) == [(f"v{new}", kit)]
        assert {ref for ref, _ in release.badges(text)} == {notebooks_at}
    readme = (clone / "README.md").read_text()
    assert {ref for ref, _ in release.badges(readme)} == {notebooks_at} and f"grpo_kit@{kit}" in readme
    assert f"## v{new} (notebooks at {notebooks_at[:12]}, installing the kit at {kit[:12]})" in changelog.read_text()
    after = subprocess.run([*script, "check"], cwd=clone, env=env, capture_output=True, text=True)
    assert after.returncode == 0, after.stdout
    again = subprocess.run([*script, "cut"], cwd=clone, env=env, capture_output=True, text=True)
    assert again.returncode == 1 and "already installs" in again.stderr  # a released version is not cut twice
