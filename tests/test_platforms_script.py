"""scripts/platforms.py's own choices (the replicas themselves run in `make platforms`): each replica's runtime Python,
found or said missing; the kit it installs, the notebooks' pinned commit unless asked for HEAD."""

from __future__ import annotations

import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import platforms  # noqa: E402
import release  # noqa: E402


def test_each_replica_runs_its_runtimes_python():
    assert {name: r.python for name, r in platforms.REPLICAS.items()} == {
        "colab-tpu": "3.13", "kaggle-tpu": "3.12", "colab-gpu": "3.12"}
    here = ".".join(platform.python_version_tuple()[:2])
    found, version = platforms.find_python(here)
    assert found is not None and version.startswith(f"{here}.")


def test_a_replica_whose_python_is_missing_says_so_in_its_line_instead_of_running_on_another(monkeypatch):
    monkeypatch.setattr(platforms, "KIT", platforms.choose_kit("pinned"))
    assert platforms.find_python("2.1") == (
        None, "no Python 2.1 here (looked under pyenv's versions and for python2.1 on PATH)")
    missing = platforms.Replica("old-runtime", "2.1")
    line = platforms.run_replica(missing, [ROOT / "notebooks" / "00_setup.ipynb"], timeout=10)
    assert line["python"].startswith("2.1 missing: no Python 2.1 here") and line["notebooks_passed"] == 0
    assert "preinstalled_unchanged" not in line  # so main() counts it failed


def test_the_replicas_install_the_commit_the_notebooks_pin_unless_asked_for_head(monkeypatch):
    monkeypatch.delenv("PLATFORM_KIT_SOURCE", raising=False)
    pinned = platforms.choose_kit("pinned")
    (release_name, commit), = {pin for p in release.notebooks() for pin in release.pinned(p.read_text())}
    assert pinned.source == f"git+file://{ROOT}@{commit}" and pinned.commit == commit
    assert pinned.label == f"pinned {release_name} {commit[:12]}"
    head = platforms.choose_kit("head")
    assert head.source == f"git+file://{ROOT}" and head.commit == release.git("rev-parse", "HEAD")
