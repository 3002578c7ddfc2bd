"""The black-box fault runs (scripts/faults.py): a demo beside an SFT run, a real full disk during a save, two
trainers on one directory, a push from a folder holding stray files — each through the command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_every_fault_scenario_passes():
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "faults.py")], capture_output=True, text=True, timeout=1500
    )
    results = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [r["scenario"] for r in results] == ["demo-keeps-sft-run", "full-disk-during-save", "second-trainer-refused",
                                                "push-sends-only-export"], done.stdout + done.stderr[-2000:]
    failed = [r for r in results if not r["ok"]]
    assert not failed and done.returncode == 0, failed
