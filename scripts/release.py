"""Releases: the kit every notebook's cell 1 installs, and the notebook every badge opens, named by commit.

    python scripts/release.py check          (a test in `make test`) what keeps this tree from being a release
                                             users can open: see `problems`
    python scripts/release.py constraints    rewrite grpo_kit/assets/constraints.txt from requirements/lock.txt
    python scripts/release.py cut            (`make release`) on a clean tree, for the version pyproject.toml names
                                             and CHANGELOG.md describes: two commits, then the check

A notebook's cell 1 names its release and the commit it installs (`KIT_RELEASE, KIT_COMMIT = "v0.2.0", "<sha>"`);
a badge opens a notebook at a commit (`…/grpo_kit/blob/<sha>/notebooks/…`). Commits, not tags, because a commit
cannot move and travels with the history, where a tag may not. `cut` makes

    R1  every notebook's cell 1 pinned to HEAD (C), the README's pip line too: the kit at R1 is the kit at C;
    R2  every badge (README, notebooks, docs) opening R1's notebooks, and CHANGELOG's heading naming R1 and C;

then tags R1 `v<version>` for this clone's convenience. A user who follows a badge opens a notebook of R1, whose
cell 1 installs C, so `check` asks of every notebook here and of every notebook a badge opens: does the kit at the
commit its cell 1 pins provide every name it uses — each `grpo_kit` import, `gk.…`/`nbk.…` attribute, CLI
subcommand and exercise or quiz id — in that commit's own tree (extracted with `git archive` and imported)?
"""

from __future__ import annotations

import argparse
import ast
import atexit
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from dataclasses import dataclass, field
from functools import cache
from importlib.metadata import PackageNotFoundError, distribution
from io import BytesIO
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / "grpo_kit" / "assets" / "constraints.txt"
LOCK = ROOT / "requirements" / "lock.txt"
CHANGELOG = ROOT / "CHANGELOG.md"
EXTRAS = ("notebooks", "gemma-offline")
INSTALLER = "notebooks/install.py"
"""What cell 1 fetches from the commit it pins and runs."""
PIN = re.compile(r'KIT_RELEASE, KIT_COMMIT = "(v[^"]+)", "([0-9a-f]*)"')
# a badge or link that opens a file of this repository at a ref: Colab's …/github/<repo>/blob/<ref>/<path>, and
# GitHub's own URL (Kaggle's ?src=https://github.com/<repo>/blob/<ref>/<path>)
BADGE = re.compile(r"github(?:\.com)?/grpo-kit/grpo_kit/blob/([^/\s)\]]+)/([^\s)\]#?\"]+)")
PIP_LINE = re.compile(r"(grpo-kit\[notebooks\] @ git\+https://github\.com/grpo-kit/grpo_kit@)([\w.]+)")
SHA = re.compile(r"[0-9a-f]{40}")
# where links to released files live (the notebooks are read as JSON, their cells as text)
LINKED_PAGES = ("README.md", "CHANGELOG.md", "CONTRIBUTING.md", "docs/*.md")


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def version(pyproject_text: str | None = None) -> str:
    text = pyproject_text if pyproject_text is not None else (ROOT / "pyproject.toml").read_text()
    return tomllib.loads(text)["project"]["version"]


# ---------------------------------------------------------------------------------------------- shipped constraints
def lock() -> dict[str, str]:
    return {normalise(line.split("==")[0]): line.split("==")[1].strip() for line in LOCK.read_text().splitlines()
            if "==" in line and not line.startswith("#")}


def dependency_tree() -> set[str]:
    """Every package `grpo-kit[notebooks,gemma-offline]` pulls in, read from the installed metadata (.venv)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    todo = [Requirement(r) for r in project["dependencies"]]
    todo += [Requirement(r) for extra in EXTRAS for r in project["optional-dependencies"][extra]]
    found: set[str] = set()
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = normalise(req.name)
        if name in found:
            continue
        found.add(name)
        try:
            todo += [Requirement(r) for r in distribution(name).requires or []]
        except PackageNotFoundError:
            pass
    return found


def constraints_text() -> str:
    pins = lock()
    missing = sorted(n for n in dependency_tree() if n not in pins)
    if missing:
        raise SystemExit(f"release: {', '.join(missing)} not in {LOCK.relative_to(ROOT)}: regenerate the lock first")
    lines = [f"{name}=={pins[name]}" for name in sorted(dependency_tree())]
    header = (
        "# The versions grpo-kit was tested with, for what a hosted runtime lacks (the notebooks' install cell).\n"
        "# Generated from requirements/lock.txt by `python scripts/release.py constraints`: do not edit.\n"
    )
    return header + "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------ what a notebook uses
@dataclass
class Needs:
    """What a notebook asks of the kit it installs."""

    names: set[str] = field(default_factory=set)  # dotted, from `grpo_kit`: grpo_kit.notebook.quiz
    commands: set[str] = field(default_factory=set)  # CLI subcommands: plan, xla-check
    exercises: set[str] = field(default_factory=set)  # ids given to nbk.check_exercise
    quizzes: set[str] = field(default_factory=set)  # ids given to nbk.quiz

    def update(self, other: Needs) -> None:
        for part in ("names", "commands", "exercises", "quizzes"):
            getattr(self, part).update(getattr(other, part))

    def as_json(self) -> dict[str, list[str]]:
        return {part: sorted(getattr(self, part)) for part in ("names", "commands", "exercises", "quizzes")}


SHELL_COMMAND = re.compile(r"(?:^|[!\s])(?:grpo-kit|-m\s+grpo_kit\.cli)\s+([a-z][\w-]*)")
COMMAND_STRING = re.compile(r"\s*(?:grpo-kit|python3?\s+-m\s+grpo_kit\.cli)\s+([a-z][\w-]*)")
SHELL_MODULE = re.compile(r"-m\s+(grpo_kit(?:\.\w+)+)")


def _python_of(cell: str) -> tuple[str, list[str]]:
    """A code cell's Python, with IPython's `!shell` and `%magic` lines replaced by `pass`, and those lines."""
    python, shell = [], []
    for line in cell.splitlines():
        stripped = line.lstrip()
        if stripped.startswith(("!", "%")):
            shell.append(stripped)
            python.append(line[: len(line) - len(stripped)] + "pass")
        else:
            python.append(line)
    return "\n".join(python), shell


def _chain(node: ast.AST) -> list[str] | None:
    """`a.b.c` as ['a', 'b', 'c']; None for anything but names joined by dots."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def needs_of_cells(cells: list[str]) -> Needs:
    """What these code cells (a notebook's, in order) ask of the kit."""
    needs, aliases = Needs(), {}
    for cell in cells:
        python, shell = _python_of(cell)
        for line in shell:
            needs.commands.update(SHELL_COMMAND.findall(line))
            needs.names.update(SHELL_MODULE.findall(line))
        tree = ast.parse(python)
        for node in ast.walk(tree):  # imports first: a name is used after the cell that imports it
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] == "grpo_kit":
                        needs.names.add(a.name)
                        aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else "grpo_kit"
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "grpo_kit":
                for a in node.names:
                    needs.names.add(f"{node.module}.{a.name}")
                    aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and (chain := _chain(node)) and chain[0] in aliases:
                needs.names.add(".".join([aliases[chain[0]], *chain[1:]]))
            if isinstance(node, ast.Call) and (chain := _chain(node.func)) and chain[0] in aliases:
                called = ".".join([aliases[chain[0]], *chain[1:]])
                first = node.args[0] if node.args else None
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    if called == "grpo_kit.notebook.check_exercise":
                        needs.exercises.add(first.value)
                    elif called == "grpo_kit.notebook.quiz":
                        needs.quizzes.add(first.value)
            if isinstance(node, (ast.List, ast.Tuple)):  # subprocess.run([python, "-m", "grpo_kit.cli", "plan", …])
                words = [e.value if isinstance(e, ast.Constant) and isinstance(e.value, str) else None
                         for e in node.elts]
                for i, word in enumerate(words[:-1]):
                    if word in ("grpo-kit", "grpo_kit.cli") and words[i + 1] and not words[i + 1].startswith("-"):
                        needs.commands.add(words[i + 1])
            if isinstance(node, ast.Constant) and isinstance(node.value, str):  # "grpo-kit plan --tpu v5e-8"
                if command := COMMAND_STRING.match(node.value):
                    needs.commands.add(command.group(1))
    return needs


def code_cells(notebook_text: str) -> list[str]:
    return ["".join(c["source"]) for c in json.loads(notebook_text)["cells"] if c["cell_type"] == "code"]


def pinned(notebook_text: str) -> list[tuple[str, str]]:
    """The (release, commit) pairs its code cells name."""
    return PIN.findall("\n".join(code_cells(notebook_text)))


# ------------------------------------------------------------------------------------------------- git and kits
def git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def is_commit(ref: str) -> bool:
    return bool(SHA.fullmatch(ref)) and subprocess.run(
        ["git", "cat-file", "-e", f"{ref}^{{commit}}"], cwd=ROOT, capture_output=True).returncode == 0


def file_at(ref: str, path: str) -> str | None:
    done = subprocess.run(["git", "show", f"{ref}:{path}"], cwd=ROOT, capture_output=True)
    return done.stdout.decode() if done.returncode == 0 else None


RESOLVE = r"""
import importlib, json, os, subprocess, sys
needs, root = json.loads(sys.argv[1]), os.path.realpath(sys.argv[2])
# an editable install of another checkout answers for any grpo_kit module this tree lacks: not here
sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")]
sys.path_hooks[:] = [h for h in sys.path_hooks if not getattr(h, "__module__", "").startswith("__editable__")]
sys.path_importer_cache.clear()
missing = []

def resolve(dotted):
    parts = dotted.split(".")
    value = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], start=1):
        try:
            value = getattr(value, part)
        except AttributeError:
            try:
                value = importlib.import_module(".".join(parts[: i + 1]))
            except ModuleNotFoundError as exc:
                if exc.name != ".".join(parts[: i + 1]):
                    raise
                raise LookupError(dotted) from None
    return value

for name in needs["names"]:
    try:
        resolve(name)
    except LookupError:
        missing.append(name)
    except Exception as exc:
        missing.append(f"{name} ({type(exc).__name__}: {str(exc)[:200]})")
# the registries' homes: the package's course/ subpackage, or the flat layout of releases before it
for kind, label, homes in (("exercises", "exercise", ("grpo_kit.course.exercises", "grpo_kit.exercises")),
                           ("quizzes", "quiz", ("grpo_kit.course.quizzes", "grpo_kit.quizzes"))):
    known = {}
    for home in homes if needs[kind] else ():
        try:
            known = resolve(f"{home}.{kind.upper()}")
            break
        except Exception:
            continue
    missing += [f"{label} {i}" for i in needs[kind] if i not in known]
for command in needs["commands"]:
    done = subprocess.run([sys.executable, "-m", "grpo_kit.cli", command, "--help"], capture_output=True)
    if done.returncode:
        missing.append(f"grpo-kit {command}")
outside = sorted(n for n, m in sys.modules.items() if n.split(".")[0] == "grpo_kit"
                 and getattr(m, "__file__", None) and not os.path.realpath(m.__file__).startswith(root))
if outside:
    sys.exit(f"resolve: {', '.join(outside)} imported from outside {root}")
print(json.dumps(missing))
"""


@cache
def _kit_tree(commit: str) -> Path:
    """The package at `commit` (grpo_kit/ and pyproject.toml), extracted from git into a temporary directory that
    goes when this process ends."""
    tar = subprocess.run(["git", "archive", "--format=tar", commit, "grpo_kit", "pyproject.toml"], cwd=ROOT,
                         check=True, capture_output=True).stdout
    where = Path(tempfile.mkdtemp(prefix=f"kit-{commit[:12]}-"))
    atexit.register(shutil.rmtree, where, ignore_errors=True)
    with tarfile.open(fileobj=BytesIO(tar)) as archive:
        archive.extractall(where, filter="data")
    return where


def missing_at(commit: str, needs: Needs) -> list[str]:
    """What of `needs` the kit at `commit` does not provide, imported from that commit's own tree."""
    tree = _kit_tree(commit)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GRPO_KIT_", "PYTHON"))}
    env.update(PYTHONPATH=str(tree), OMP_NUM_THREADS="1", TRANSFORMERS_VERBOSITY="error")
    done = subprocess.run([sys.executable, "-c", RESOLVE, json.dumps(needs.as_json()), str(tree)], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=900)
    if done.returncode:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        return [f"the kit at {commit[:12]} does not import here: {tail}"]
    return json.loads(done.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------------------------ the check
def notebooks() -> list[Path]:
    return sorted((ROOT / "notebooks").glob("*.ipynb"))


def linked_pages() -> list[Path]:
    pages = [p for pattern in LINKED_PAGES for p in sorted(ROOT.glob(pattern))]
    return pages + notebooks()


def badges(text: str) -> list[tuple[str, str]]:
    """Every (ref, path) a badge or link in `text` opens."""
    return BADGE.findall(text)


def release_problems(label: str, text: str, *, kits: dict[str, list[tuple[str, Needs]]]) -> list[str]:
    """Check one notebook's cell 1 (`label`: where it is shown) and queue its needs under the commit it installs."""
    pins = pinned(text)
    if len(pins) != 1:
        return [f"{label}: {len(pins)} install cells name KIT_RELEASE, KIT_COMMIT (expected 1)"]
    release, commit = pins[0]
    if not is_commit(commit):
        return [f"{label}: its cell 1 installs {commit or 'no commit'!r}, not a commit of this repository"]
    kit_version = version(file_at(commit, "pyproject.toml"))
    problems = []
    if release != f"v{kit_version}":
        problems.append(f"{label}: its cell 1 names {release}, but the kit at {commit[:12]} is v{kit_version}")
    if INSTALLER in text and file_at(commit, INSTALLER) is None:
        problems.append(f"{label}: its cell 1 fetches {INSTALLER} at {commit[:12]}, which has none")
    kits.setdefault(commit, []).append((label, needs_of_cells(code_cells(text))))
    return problems


def problems() -> list[str]:
    """What keeps this tree from being a release users can open (empty: nothing):

    - each notebook's cell 1 pins one commit of this repository, whose kit is the version the cell names and
      provides every kit name the notebook uses;
    - every badge and link to a file of this repository (README, CHANGELOG, docs, notebooks) names a commit of this
      repository at which the file exists; a notebook opened that way passes the check above at that commit; and
      the badges all open the release this tree's notebooks install;
    - the README's pip line installs a commit; CHANGELOG.md has a section for that release;
    - the shipped constraints match the lock.
    """
    found: list[str] = []
    kits: dict[str, list[tuple[str, Needs]]] = {}  # commit -> (notebook, what it needs) for each that installs it
    installs = set()
    for path in notebooks():
        text = path.read_text()
        found += release_problems(path.name, text, kits=kits)
        installs.update(commit for _, commit in pinned(text))
    opened = set()
    for page in linked_pages():
        for ref, target in sorted(set(badges(page.read_text()))):
            where = f"{page.relative_to(ROOT)}: a link opens {target} at {ref[:12]}"
            if not is_commit(ref):
                found.append(f"{page.relative_to(ROOT)}: a link opens {target} at {ref!r}, not a commit of this "
                             "repository")
                continue
            text = file_at(ref, target)
            if text is None:
                found.append(f"{where}, where it does not exist")
            elif target.endswith(".ipynb") and (ref, target) not in opened:
                opened.add((ref, target))
                found += release_problems(f"{target} at {ref[:12]}", text, kits=kits)
                installs.update(commit for _, commit in pinned(text))
    if len(installs) > 1:
        found.append(f"the notebooks here and those the badges open install {len(installs)} different commits "
                     f"({', '.join(sorted(c[:12] for c in installs))}): the badges must open the current release")
    for commit, users in kits.items():
        every = Needs()
        for _, needs in users:
            every.update(needs)
        missing = missing_at(commit, every)  # one import of that kit for all the notebooks that install it
        found += [m for m in missing if m.startswith("the kit at")]
        for label, needs in users:
            own = sorted(m for m in missing if _named(m, needs))
            if own:
                found.append(f"{label}: the kit its cell 1 installs ({commit[:12]}) lacks {', '.join(own)}")
    readme = (ROOT / "README.md").read_text()
    for ref in PIP_LINE.findall(readme):
        if not is_commit(ref[1]):
            found.append(f"README.md: its pip line installs {ref[1]!r}, not a commit of this repository")
    releases = {release for path in notebooks() for release, _ in pinned(path.read_text())}
    heads = set(re.findall(r"^## (v\d[\w.]*)", CHANGELOG.read_text(), re.M)) if CHANGELOG.exists() else set()
    for release in sorted(releases - heads):
        found.append(f"CHANGELOG.md has no section '## {release}' for the release the notebooks install")
    if CONSTRAINTS.read_text() != constraints_text():
        found.append(f"{CONSTRAINTS.relative_to(ROOT)} does not match the lock: python scripts/release.py constraints")
    return found


def _named(missing: str, needs: Needs) -> bool:
    """Whether a line of `missing_at`'s answer is about something `needs` asks for."""
    name = missing.split(" (")[0]
    return (name in needs.names or name.removeprefix("grpo-kit ") in needs.commands
            or name.removeprefix("exercise ") in needs.exercises or name.removeprefix("quiz ") in needs.quizzes)


# -------------------------------------------------------------------------------------------------------- the cut
def pin(text: str, release: str, commit: str) -> str:
    """A notebook's JSON text with `release` and `commit` in its install cell, every other cell as it was."""
    nb = json.loads(text)
    found = 0
    for cell in nb["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "code" and PIN.search(source):
            cell["source"] = PIN.sub(f'KIT_RELEASE, KIT_COMMIT = "{release}", "{commit}"', source).splitlines(
                keepends=True)
            found += 1
    if found != 1:
        raise SystemExit(f"release: a notebook has {found} install cells with KIT_RELEASE, KIT_COMMIT, not 1")
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


def point_badges(text: str, ref: str) -> str:
    """Every badge and link to a notebook of this repository opening it at `ref`."""
    return BADGE.sub(lambda m: m.group(0).replace(f"/blob/{m.group(1)}/", f"/blob/{ref}/")
                     if m.group(2).startswith("notebooks/") else m.group(0), text)


def cut() -> None:
    release = f"v{version()}"
    if git("status", "--porcelain"):
        raise SystemExit("release: the tree has uncommitted changes; commit them first")
    heads = re.findall(r"^## (v\d[\w.]*)", CHANGELOG.read_text(), re.M) if CHANGELOG.exists() else []
    if release not in heads:
        raise SystemExit(f"release: CHANGELOG.md has no '## {release}' section: say what {release} changes for "
                         "users first")
    for path in notebooks():
        for _, commit in pinned(path.read_text()):
            if is_commit(commit) and version(file_at(commit, "pyproject.toml")) == version():
                raise SystemExit(f"release: {path.name} already installs {release} ({commit[:12]}): raise the version "
                                 "in pyproject.toml and add its CHANGELOG.md section")
    start = git("rev-parse", "HEAD")
    for path in notebooks():
        path.write_text(pin(path.read_text(), release, start))
    readme = ROOT / "README.md"
    readme.write_text(PIP_LINE.sub(lambda m: m.group(1) + start, readme.read_text()))
    git("commit", "-q", "-m", f"release {release}: the notebooks install the kit at {start[:12]}", "--",
        "notebooks", "README.md")
    notebooks_at = git("rev-parse", "HEAD")
    for page in linked_pages():
        page.write_text(point_badges(page.read_text(), notebooks_at))
    CHANGELOG.write_text(re.sub(
        rf"^## {re.escape(release)}\b.*$",
        f"## {release} (notebooks at {notebooks_at[:12]}, installing the kit at {start[:12]})",
        CHANGELOG.read_text(), count=1, flags=re.M))
    git("commit", "-q", "-am", f"release {release}: every badge opens the notebooks of {notebooks_at[:12]}")
    git("tag", "-f", "-a", release, notebooks_at, "-m", f"grpo-kit {release}")
    found = problems()
    if found:
        git("reset", "-q", "--keep", start)
        git("tag", "-d", release)
        raise SystemExit("release: " + "\n".join(found))
    print(f"released {release}: notebooks at {notebooks_at[:12]} install the kit at {start[:12]}; badges at "
          f"{git('rev-parse', 'HEAD')[:12]} open them")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("check", "constraints", "cut"))
    action = parser.parse_args().action
    if action == "constraints":
        CONSTRAINTS.write_text(constraints_text())
        print(f"wrote {CONSTRAINTS.relative_to(ROOT)}")
    elif action == "cut":
        cut()
    else:
        found = problems()
        print("\n".join(found) or "the notebooks, their badges and the kits they install agree")
        return 1 if found else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
