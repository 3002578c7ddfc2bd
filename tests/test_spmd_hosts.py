"""The hosts of one SPMD program (a TPU pod slice's: one process per host), stood in for by two torchrun processes on
XLA's CPU devices: only process 0 writes, the others' loop follows process 0's decisions, a checkpoint written by
process 0 resumes on both, and the rows are those of one process running the same program.

torch_xla's CPU client cannot join processes into one runtime (it has no coordinator), so each process here runs the
whole program on its own two devices, as every host of a pod runs the whole program (`distributed.SPMD_HOSTS_VARIABLE`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch_xla")
pytestmark = pytest.mark.xdist_group("torchrun")

VARYING = ("seconds", "tokens_per_s", "memory_", "xla_", "processes")
TOLERANCE = 1e-4
SETTINGS = ("model: {{lora: true, lora_r: 8}}\nsft: {{steps: 60, learning_rate: 3.0e-3}}\n"
            "grpo: {{steps: {steps}, save_every: 1, log_completions: 2, beta: 0.04, micro_batch_size: 8, "
            "max_new_tokens: 12}}\ntask: {{num_test: 4}}\n")
"""LoRA: a pod slice trains LoRA (full fine-tuning over several hosts is refused). GRPO starts from an SFT adapter
(on the CPU), whose completions earn some reward, so its updates move the weights."""


def _env(hosts: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PJRT_", "XLA_", "CPU_NUM_DEVICES", "GRPO_KIT"))}
    env.update(PJRT_DEVICE="CPU", CPU_NUM_DEVICES="2", GRPO_KIT_DEVICE="xla", GRPO_KIT_SPMD="1", OMP_NUM_THREADS="1")
    if hosts:
        env["GRPO_KIT_SPMD_HOSTS"] = "1"
    return env


def _warm_up(tmp: Path) -> Path:
    """A LoRA SFT adapter, trained on the CPU, for GRPO to start from."""
    config = tmp / "sft.yaml"
    config.write_text(SETTINGS.format(steps=1))
    env = {**_env(hosts=False), "GRPO_KIT_DEVICE": "cpu", "USE_TORCH_XLA": "0"}
    done = subprocess.run([sys.executable, "-m", "grpo_kit.cli", "sft", "--preset", "cpu-tiny-quick", "--config",
                           str(config), "--output-dir", str(tmp / "sft"), "--quiet"],
                          capture_output=True, text=True, timeout=1200, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return tmp / "sft" / "checkpoint"


def _train(tmp: Path, out: Path, *, steps: int, hosts: bool, start: Path | None = None) -> subprocess.CompletedProcess:
    config = tmp / f"steps{steps}.yaml"
    config.write_text(SETTINGS.format(steps=steps))
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"] if hosts else \
        [sys.executable]
    command = [*launcher, "-m", "grpo_kit.cli", "train", "--preset", "cpu-tiny-quick", "--config", str(config),
               "--output-dir", str(out), "--quiet", *(["--init-from", str(start)] if start else [])]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1200, env=_env(hosts))
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.multihost  # minutes of XLA compiles in three runs: make multihost, not make test
def test_hosts_of_one_program_write_once_and_resume_as_one(tmp_path):
    start = _warm_up(tmp_path)
    one = tmp_path / "one"
    # the same history as the hosts' run: on XLA a resumed process compiles its first step afresh, whose products may
    # round otherwise than the uninterrupted run's (1e-5 of the KL at the first resumed step), and training grows that
    _train(tmp_path, one, steps=2, hosts=False, start=start)
    _train(tmp_path, one, steps=4, hosts=False, start=start)
    hosts = tmp_path / "hosts"
    first = _train(tmp_path, hosts, steps=2, hosts=True, start=start)
    assert first.stdout.count('"checkpoint"') == 1  # the summary printed once (both hosts evaluated)
    _train(tmp_path, hosts, steps=4, hosts=True, start=start)  # continues from process 0's checkpoint
    reference, rows = _rows(one), _rows(hosts)
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and {r["processes"] for r in rows} == {2}
    assert all(r["grad_norm"] > 0 for r in reference)  # a run that moves (its completions are the tiny model's)
    for row, ref in zip(rows, reference, strict=True):
        for key, value in ref.items():
            if isinstance(value, float) and not any(part in key for part in VARYING):
                assert abs(row[key] - value) <= TOLERANCE * max(1.0, abs(value)), (row["step"], key, row[key], value)
        assert [c["completion"] for c in row["completions"]] == [c["completion"] for c in ref["completions"]]
    assert sorted(p.name for p in hosts.iterdir()) == sorted(p.name for p in one.iterdir())


def test_full_fine_tuning_over_hosts_is_refused(tmp_path):
    config = tmp_path / "full.yaml"
    config.write_text(SETTINGS.format(steps=1).replace("lora: true", "lora: false"))
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m",
                           "grpo_kit.cli", "train", "--preset", "cpu-tiny-quick", "--config", str(config),
                           "--output-dir", str(tmp_path / "out"), "--quiet"],
                          capture_output=True, text=True, timeout=600, env=_env(hosts=True))
    assert done.returncode != 0 and "full fine-tuning over a pod slice's 2 hosts" in done.stderr
    assert not (tmp_path / "out" / "metrics.jsonl").exists()


def test_torchrun_on_xla_without_hosts_is_refused(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(SETTINGS.format(steps=1))
    env = {**_env(hosts=False), "GRPO_KIT_SPMD": "0", "CPU_NUM_DEVICES": "1"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m",
                           "grpo_kit.cli", "train", "--preset", "cpu-tiny-quick", "--config", str(config),
                           "--output-dir", str(tmp_path / "out"), "--quiet"],
                          capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode != 0
    assert "a TPU host's chips are one SPMD program in one process" in done.stderr
