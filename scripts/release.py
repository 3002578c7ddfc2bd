"""Release the version pyproject.toml names, so that a notebook opened from GitHub installs exactly its own kit.

    python scripts/release.py check          every notebook, the README and the install cell name v<version>;
                                             the shipped constraints match the lock (what `make test` also checks)
    python scripts/release.py constraints    rewrite grpo_kit/assets/constraints.txt from requirements/lock.txt
    python scripts/release.py tag            (`make release`) on a clean tree: pin the notebooks' install cell to
                                             the current commit, commit that, tag it v<version>, check

The install cell names the release (`KIT_RELEASE`, shown to the user, checked against the installed version) and
installs a commit (`KIT_COMMIT`): a tag can be moved, a commit cannot. The pinned commit is the one the release
commit is made on top of; the release commit changes only the notebooks, so the package at the tag and at the
pinned commit is the same.

`grpo_kit/assets/constraints.txt` pins, at the lock's versions, every package the kit and its `notebooks` and
`gemma-offline` extras need (the whole dependency tree). The install cell uses it for the packages a hosted runtime
does not already have, so those arrive at the versions the kit was tested with.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / "grpo_kit" / "assets" / "constraints.txt"
LOCK = ROOT / "requirements" / "lock.txt"
EXTRAS = ("notebooks", "gemma-offline")
PIN = re.compile(r'KIT_RELEASE, KIT_COMMIT = "(v[^"]+)", "([0-9a-f]*)"')


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def version() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


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


def notebooks() -> list[Path]:
    return sorted((ROOT / "notebooks").glob("*.ipynb"))


def code_of(path: Path) -> str:
    """A notebook's code cells, as text (the .ipynb holds them JSON-escaped)."""
    return "\n".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code")


def pin(path: Path, release: str, commit: str) -> None:
    """Write `release` and `commit` into the notebook's install cell, leaving every other byte as it was."""
    nb = json.loads(path.read_text())
    found = 0
    for cell in nb["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "code" and PIN.search(source):
            new = PIN.sub(f'KIT_RELEASE, KIT_COMMIT = "{release}", "{commit}"', source)
            cell["source"] = new.splitlines(keepends=True)
            found += 1
    if found != 1:
        raise SystemExit(f"release: {path.name} has {found} install cells with KIT_RELEASE, KIT_COMMIT, not 1")
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")


def check() -> list[str]:
    """What keeps this tree from being the release pyproject.toml names (empty: nothing)."""
    tag, problems = f"v{version()}", []
    for path in notebooks():
        text = path.read_text()
        pins = PIN.findall(code_of(path))
        if len(pins) != 1 or pins[0][0] != tag:
            problems.append(f"{path.name}: its install cell names {pins or 'no release'}, not {tag}")
        elif not re.fullmatch(r"[0-9a-f]{40}", pins[0][1]):
            problems.append(f"{path.name}: its install cell pins no commit ({pins[0][1]!r})")
        stale = sorted(set(re.findall(r"grpo_kit/blob/(v[\w.]+)/", text)) - {tag})
        if stale:
            problems.append(f"{path.name}: its badges open {', '.join(stale)}, not {tag}")
    stale = sorted(set(re.findall(r"grpo_kit(?:/blob/|@)(v\d[\w.]*)", (ROOT / "README.md").read_text())) - {tag})
    if stale:
        problems.append(f"README.md names {', '.join(stale)}, not {tag}")
    if CONSTRAINTS.read_text() != constraints_text():
        problems.append(
            f"{CONSTRAINTS.relative_to(ROOT)} does not match the lock: python scripts/release.py constraints")
    return problems


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()


def tag() -> None:
    release = f"v{version()}"
    if git("status", "--porcelain"):
        raise SystemExit("release: the tree has uncommitted changes; commit them first")
    if release in git("tag", "--list", release).split():
        raise SystemExit(f"release: {release} is tagged already; raise the version in pyproject.toml")
    commit = git("rev-parse", "HEAD")
    for path in notebooks():
        pin(path, release, commit)
    problems = check()
    if problems:
        git("checkout", "--", "notebooks")
        raise SystemExit("release: " + "; ".join(problems))
    git("commit", "-q", "-m", f"release {release}: the notebooks install {commit[:12]}", "--", "notebooks")
    git("tag", "-a", release, "-m", f"grpo-kit {release}")
    print(f"tagged {release} at {git('rev-parse', 'HEAD')[:12]}; notebooks install {commit[:12]}. Push with: "
          f"git push origin main {release}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("check", "constraints", "tag"))
    action = parser.parse_args().action
    if action == "constraints":
        CONSTRAINTS.write_text(constraints_text())
        print(f"wrote {CONSTRAINTS.relative_to(ROOT)}")
    elif action == "tag":
        tag()
    else:
        problems = check()
        print("\n".join(problems) or f"v{version()}: notebooks, README and constraints agree")
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
