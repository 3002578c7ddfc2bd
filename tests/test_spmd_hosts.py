"""The hosts of one SPMD program (a TPU pod slice's: one process per host), stood in for by two torchrun processes on
XLA's CPU devices: only process 0 writes, the others' loop follows process 0's decisions, a checkpoint written by
process 0 resumes on both, and the rows are those of one process running the same program.

torch_xla's CPU client cannot join processes into one runtime (it has no coordinator), so each process here runs the
whole program on its own two devices, as every host of a pod runs the whole program (`distributed.SPMD_HOSTS_VARIABLE`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

pytest.importorskip("torch_xla")
pytestmark = pytest.mark.xdist_group("torchrun")

VARYING = ("seconds", "tokens_per_s", "memory_", "xla_", "processes")
TOLERANCE = 1e-4
SETTINGS = ("model: {{lora: true, lora_r: 8}}\nsft: {{steps: 60, learning_rate: 3.0e-3}}\n"
            "grpo: {{steps: {steps}, save_every: 1, log_completions: 2, beta: 0.04, micro_batch_size: 8, "
            "max_new_tokens: 12}}\ntask: {{num_test: 4}}\n")
"""GRPO starts from an SFT checkpoint (trained on the CPU; LoRA unless a test says otherwise), whose completions earn
some reward, so its updates move the weights."""


def _env(hosts: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PJRT_", "XLA_", "CPU_NUM_DEVICES", "GRPO_KIT"))}
    env.update(PJRT_DEVICE="CPU", CPU_NUM_DEVICES="2", GRPO_KIT_DEVICE="xla", GRPO_KIT_SPMD="1", OMP_NUM_THREADS="1")
    if hosts:
        env["GRPO_KIT_SPMD_HOSTS"] = "1"
    return env


def _settings(steps: int, *, lora: bool) -> str:
    if lora:
        return SETTINGS.format(steps=steps)
    # full fine-tuning: a gentler SFT, and room for completions to close their answer tag and earn rewards that differ
    return SETTINGS.format(steps=steps).replace("lora: true", "lora: false").replace(
        "learning_rate: 3.0e-3", "learning_rate: 1.0e-3").replace("max_new_tokens: 12", "max_new_tokens: 24")


def _warm_up(tmp: Path, *, lora: bool = True) -> Path:
    """An SFT checkpoint (a LoRA adapter, or full weights), trained on the CPU, for GRPO to start from."""
    config = tmp / "sft.yaml"
    config.write_text(_settings(1, lora=lora))
    done = subprocess.run([sys.executable, "-m", "grpo_kit.cli", "sft", "--preset", "cpu-tiny-quick", "--config",
                           str(config), "--output-dir", str(tmp / "sft"), "--quiet"],
                          capture_output=True, text=True, timeout=1200, env=_cpu_env())
    assert done.returncode == 0, done.stderr[-3000:]
    return tmp / "sft" / "checkpoint"


def _cpu_env() -> dict[str, str]:
    return {**_env(hosts=False), "GRPO_KIT_DEVICE": "cpu", "USE_TORCH_XLA": "0"}


def _train(tmp: Path, out: Path, *, steps: int, hosts: bool, start: Path | None = None,
           lora: bool = True) -> subprocess.CompletedProcess:
    config = tmp / f"steps{steps}-{'lora' if lora else 'full'}.yaml"
    config.write_text(_settings(steps, lora=lora))
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"] if hosts else \
        [sys.executable]
    command = [*launcher, "-m", "grpo_kit.cli", "train", "--preset", "cpu-tiny-quick", "--config", str(config),
               "--output-dir", str(out), "--quiet", *(["--init-from", str(start)] if start else [])]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1200, env=_env(hosts))
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _same_rows(rows: list[dict], reference: list[dict]) -> None:
    for row, ref in zip(rows, reference, strict=True):
        for key, value in ref.items():
            if isinstance(value, float) and not any(part in key for part in VARYING):
                assert abs(row[key] - value) <= TOLERANCE * max(1.0, abs(value)), (row["step"], key, row[key], value)
        assert [c["completion"] for c in row["completions"]] == [c["completion"] for c in ref["completions"]]


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
    _same_rows(rows, reference)
    assert sorted(p.name for p in hosts.iterdir()) == sorted(p.name for p in one.iterdir())


@pytest.mark.multihost  # minutes of XLA compiles in five runs: make multihost, not make test
def test_full_fine_tuning_over_hosts_writes_shards_that_resume_on_hosts_or_one_process_and_export(tmp_path):
    """Full fine-tuning splits each weight over every host's chips: every host writes its shards
    (torch.distributed.checkpoint), the hosts resume from them, so does one process, and one CPU exports them."""
    start = _warm_up(tmp_path, lora=False)
    one = tmp_path / "one"
    _train(tmp_path, one, steps=2, hosts=False, start=start, lora=False)
    _train(tmp_path, one, steps=4, hosts=False, start=start, lora=False)
    hosts = tmp_path / "hosts"
    _train(tmp_path, hosts, steps=2, hosts=True, start=start, lora=False)
    checkpoint = hosts / "checkpoint"
    state = json.loads((checkpoint / "state.json").read_text())
    assert "sharded/.metadata" in state["files"] and "weights.safetensors" not in state["files"]
    assert any(name.endswith(".distcp") for name in state["files"])
    moved = tmp_path / "moved"  # the hosts' checkpoint continued by one process: the shards read whole on one host
    shutil.copytree(hosts, moved)
    _train(tmp_path, moved, steps=4, hosts=False, start=start, lora=False)
    _train(tmp_path, hosts, steps=4, hosts=True, start=start, lora=False)
    reference = _rows(one)
    assert all(r["grad_norm"] > 0 for r in reference)
    for out in (hosts, moved):
        rows = _rows(out)
        assert [r["step"] for r in rows] == [1, 2, 3, 4]
        _same_rows(rows, reference)
    exported = {}
    for out in (one, hosts):
        done = subprocess.run([sys.executable, "-m", "grpo_kit.cli", "export", "--preset", "cpu-tiny-quick",
                               "--config", str(tmp_path / "steps4-full.yaml"), "--checkpoint", str(out / "checkpoint"),
                               "--out", str(tmp_path / f"export-{out.name}")],
                              capture_output=True, text=True, timeout=600, env=_cpu_env())
        assert done.returncode == 0, done.stderr[-3000:]
        exported[out.name] = load_file(str(next((tmp_path / f"export-{out.name}").glob("*.safetensors"))))
    assert exported["one"].keys() == exported["hosts"].keys()
    for name, tensor in exported["one"].items():
        assert torch.allclose(exported["hosts"][name].float(), tensor.float(), atol=1e-4), name


def test_torchrun_on_xla_without_hosts_is_refused(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(_settings(1, lora=True))
    env = {**_env(hosts=False), "GRPO_KIT_SPMD": "0", "CPU_NUM_DEVICES": "1"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m",
                           "grpo_kit.cli", "train", "--preset", "cpu-tiny-quick", "--config", str(config),
                           "--output-dir", str(tmp_path / "out"), "--quiet"],
                          capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode != 0
    assert "a TPU host's chips are one SPMD program in one process" in done.stderr


HOSTS_SCRIPT = '''
import json, sys
from pathlib import Path
import torch, torch_xla
from safetensors.torch import save_file
from grpo_kit.engine.device import get_device
from grpo_kit.engine.distributed import finish, world
from grpo_kit.engine.model_config import ModelConfig
from grpo_kit.engine.models import load_model
from grpo_kit.train.checkpoint import load_checkpoint, save_checkpoint

out = Path(sys.argv[1])
device = get_device("xla")
model = load_model(ModelConfig(lora=False), device)[0]
hosts = world(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
model(input_ids=torch.tensor([[2, 40, 41, 42]], device=device)).logits.sum().backward()
optimizer.step()
torch_xla.sync()
if hosts.is_main:  # this stand-in host's chips hold every shard, so it can read the weights whole to compare
    save_file({k: v.cpu().contiguous() for k, v in model.state_dict().items()}, str(out / "expected.safetensors"))
    torch.save({i: {k: v.cpu() for k, v in s.items()} for i, s in optimizer.state_dict()["state"].items()},
               out / "expected-optimizer.pt")
save_checkpoint(out / "checkpoint", model, optimizer, 3, world=hosts)
(out / "not-a-checkpoint").mkdir(exist_ok=True)
try:
    save_checkpoint(out / "not-a-checkpoint", model, optimizer, 3, world=hosts)
    refused = None
except OSError as e:
    refused = f"{type(e).__name__}: {e}"
try:
    from grpo_kit.eval.export import merged_copy
    merged_copy(model)
    export_refused = None
except ValueError as e:
    export_refused = str(e)
with torch.no_grad():  # forget everything, then read it back shard by shard on both hosts
    for p in model.parameters():
        p.zero_()
fresh = torch.optim.AdamW(model.parameters(), lr=1e-3)
state = load_checkpoint(out / "checkpoint", model, fresh)
torch_xla.sync()
print(json.dumps({"rank": hosts.rank, "refused": refused, "export_refused": export_refused, "step": state["step"],
                  "reloaded": {k: v.cpu().tolist() for k, v in list(model.state_dict().items())[:2]},
                  "exp_avg": fresh.state_dict()["state"][0]["exp_avg"].cpu().tolist()}))
finish()
'''


def test_checkpoints_of_full_fine_tuning_over_hosts_hold_each_shard_once_and_read_back_anywhere(tmp_path):
    """The hosts of one SPMD program write a full fine-tuning checkpoint together (each its chips' shards), read it
    back on the hosts, and one CPU reads it whole; a save the main host cannot make fails on every host, and exporting
    the in-memory model is refused with the command that exports the checkpoint."""
    from grpo_kit.engine.model_config import ModelConfig
    from grpo_kit.engine.models import load_model
    from grpo_kit.train.checkpoint import load_checkpoint

    script = tmp_path / "hosts.py"
    script.write_text(HOSTS_SCRIPT)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           str(script), str(tmp_path)], capture_output=True, text=True, timeout=600,
                          env=_env(hosts=True))
    assert done.returncode == 0, done.stderr[-3000:]
    reports = sorted((json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")),
                     key=lambda r: r["rank"])
    assert [r["rank"] for r in reports] == [0, 1]
    expected = load_file(str(tmp_path / "expected.safetensors"))
    expected_optimizer = torch.load(tmp_path / "expected-optimizer.pt", weights_only=True)
    assert reports[0]["refused"].startswith("FileExistsError") and "is not a grpo_kit checkpoint" in \
        reports[0]["refused"]
    assert reports[1]["refused"].startswith("CheckpointSaveError: the main process could not save")
    for report in reports:  # both hosts read back what was saved
        assert report["export_refused"].startswith("this model's weights are sharded over a pod slice's hosts")
        assert report["step"] == 3
        for name, values in report["reloaded"].items():
            assert torch.equal(torch.tensor(values), expected[name]), name
        assert torch.equal(torch.tensor(report["exp_avg"]), expected_optimizer[0]["exp_avg"])
    files = json.loads((tmp_path / "checkpoint" / "state.json").read_text())["files"]
    assert "weights.safetensors" not in files and "sharded/.metadata" in files
    model = load_model(ModelConfig(lora=False), torch.device("cpu"))[0]  # one machine reads the shards whole
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    assert load_checkpoint(tmp_path / "checkpoint", model, optimizer)["step"] == 3
    tied = {"lm_head.weight"} if model.config.tie_word_embeddings else set()
    assert {k for k in expected} - tied == {k for k in model.state_dict()} - tied
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, expected[name]), name
    for index, state in optimizer.state_dict()["state"].items():
        for field, value in state.items():
            assert torch.equal(value, expected_optimizer[index][field]), (index, field)
