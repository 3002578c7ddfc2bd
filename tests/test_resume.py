"""Fault injection: a `grpo-kit train` process killed with SIGKILL at random points of its run (in a step, a save or
a metrics append) and run again, five times over, ends with every step logged exactly once and the same last row
as a run that was never interrupted."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

# timings, memory and compile counts differ between runs; everything the training computes must not
VARYING = ("seconds", "tokens_per_s", "memory_", "xla_")


def _train(config: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "grpo_kit.cli", "train", "--preset", "cpu-tiny-quick", "--config", str(config),
            "--output-dir", str(out), "--device", "cpu", "--quiet"]


def _lines(path: Path) -> int:
    return path.read_text().count("\n") if path.exists() else 0


def _computed(row: dict) -> dict:
    return {k: v for k, v in row.items() if not any(part in k for part in VARYING)}


@pytest.mark.slow
def test_a_run_killed_five_times_resumes_to_the_uninterrupted_result(tmp_path):
    config = tmp_path / "settings.yaml"
    config.write_text("grpo: {steps: 10, save_every: 1, log_completions: 0}\ntask: {num_test: 8}\n")
    subprocess.run(_train(config, tmp_path / "uninterrupted"), check=True, capture_output=True, timeout=600)
    reference = [json.loads(line) for line in (tmp_path / "uninterrupted" / "metrics.jsonl").read_text().splitlines()]

    out, rng, kills = tmp_path / "killed", random.Random(0), []
    metrics = out / "metrics.jsonl"
    for _ in range(5):
        before = _lines(metrics)
        proc = subprocess.Popen(_train(config, out), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 300
        while _lines(metrics) <= before and proc.poll() is None:  # wait for the run to make progress, then kill
            assert time.monotonic() < deadline, "the run made no progress"
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.25))  # somewhere in the next step, save or append
        proc.kill()
        proc.wait()
        kills.append((_lines(metrics), proc.returncode))
    assert all(code == -9 for _, code in kills), f"a run ended before it was killed: {kills}"

    final = subprocess.run(_train(config, out), capture_output=True, text=True, timeout=600)
    assert final.returncode == 0, final.stderr[-2000:]
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 11)), f"steps logged: {[r['step'] for r in rows]} after kills {kills}"
    assert _computed(rows[-1]) == _computed(reference[-1])
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint", "metrics.jsonl"]  # no leftovers
