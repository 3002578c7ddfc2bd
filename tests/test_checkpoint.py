"""Checkpoints that survive a kill and run no code: the interrupted swap, leftovers, checksums, pickle payloads,
the wrong kind of checkpoint and full weights given to a LoRA model."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from grpo_kit.data.rewards import DEFAULT_REWARDS, DEFAULT_WEIGHTS
from grpo_kit.engine.model_config import ModelConfig
from grpo_kit.engine.models import load_model, load_tokenizer
from grpo_kit.train.checkpoint import TMP_PREFIX, load_checkpoint, save_checkpoint
from grpo_kit.train.config import GRPOConfig
from grpo_kit.train.grpo import GRPOTrainer


def _model(cpu: torch.device, **overrides) -> torch.nn.Module:
    return load_model(ModelConfig(**overrides), cpu)[0]


def _optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(input_ids=torch.tensor([[2, 40, 41]])).logits.sum().backward()
    opt.step()
    return opt


def test_a_save_killed_mid_swap_falls_back_to_the_previous_checkpoint(cpu, tmp_path):
    model = _model(cpu)
    save_checkpoint(tmp_path / "c", model, _optimizer(model), 1)
    # the state a kill between the two renames leaves: the previous checkpoint moved aside, no new one yet
    os.replace(tmp_path / "c", tmp_path / ".c.old")
    with pytest.warns(UserWarning, match="a save was interrupted"):
        assert load_checkpoint(tmp_path / "c", model)["step"] == 1
    save_checkpoint(tmp_path / "c", model, None, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c"]


def test_leftovers_of_a_killed_save_are_cleaned_at_the_next_save_and_no_other_checkpoints(cpu, tmp_path):
    """Only `.tmp-c-<8 hex>` is c's leftover: the temporary folder of a checkpoint named `c-best` (a save of it
    running in the same folder) is not c's to delete."""
    model = _model(cpu)
    leftover = tmp_path / f"{TMP_PREFIX}c-0123abcd"
    leftover.mkdir()
    (leftover / "weights.safetensors").write_bytes(b"half a file")
    others = [tmp_path / f"{TMP_PREFIX}c-best-0123abcd", tmp_path / f"{TMP_PREFIX}c-best"]
    for other in others:
        other.mkdir()
    save_checkpoint(tmp_path / "c", model, None, 3)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["c", *(o.name for o in others)])
    assert load_checkpoint(tmp_path / "c", model)["step"] == 3


def test_a_save_never_replaces_a_directory_that_is_not_a_checkpoint(cpu, tmp_path):
    notes = tmp_path / "checkpoint"
    notes.mkdir()
    (notes / "my-notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="exists and is not a grpo_kit checkpoint"):
        save_checkpoint(notes, _model(cpu), None, 1)
    assert (notes / "my-notes.txt").read_text() == "mine"


def test_a_changed_file_fails_its_checksum(cpu, tmp_path):
    model = _model(cpu)
    save_checkpoint(tmp_path / "c", model, None, 1)
    with open(tmp_path / "c" / "weights.safetensors", "r+b") as f:
        f.seek(-4, os.SEEK_END)
        f.write(b"\x00\x01\x02\x03")
    with pytest.raises(ValueError, match="weights.safetensors does not match its checksum"):
        load_checkpoint(tmp_path / "c", model)


def test_a_checkpoint_without_a_manifest_is_refused_and_left_as_it_is(cpu, tmp_path):
    model = _model(cpu)
    save_checkpoint(tmp_path / "c", model, _optimizer(model), 1)
    state_file = tmp_path / "c" / "state.json"
    state = json.loads(state_file.read_text())
    state.pop("files")  # damaged, or altered by hand
    state_file.write_text(json.dumps(state))
    before = {p.name: p.read_bytes() for p in (tmp_path / "c").iterdir()}
    with pytest.raises(ValueError, match=r"checkpoint .*c has no file manifest \(damaged or altered\), so its files "
                                         r"cannot be checked: load a checkpoint grpo_kit saved whole, or train again"):
        load_checkpoint(tmp_path / "c", model)
    assert {p.name: p.read_bytes() for p in (tmp_path / "c").iterdir()} == before


def _rewrite_manifest(path: Path) -> None:
    """What an attacker who alters a checkpoint's files does next: state.json's checksums rewritten to match."""
    state = json.loads((path / "state.json").read_text())
    state["files"] = {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(path.iterdir())
                      if f.is_file() and f.name != "state.json"}
    (path / "state.json").write_text(json.dumps(state))


def test_missing_files_are_named_and_a_resume_without_optimizer_state_is_refused(cpu, tmp_path):
    model = _model(cpu)
    save_checkpoint(tmp_path / "c", model, _optimizer(model), 1)
    (tmp_path / "c" / "rng.pt").unlink()
    with pytest.raises(ValueError, match=r"checkpoint .*c is missing rng.pt"):
        load_checkpoint(tmp_path / "c", model)
    save_checkpoint(tmp_path / "weights-only", model, None, 1)
    assert load_checkpoint(tmp_path / "weights-only", model)["step"] == 1  # weights alone: --init-from
    with pytest.raises(
        ValueError, match="has no optimizer.pt; it was saved without optimizer state: start from its weights"
    ):
        load_checkpoint(tmp_path / "weights-only", model, torch.optim.AdamW(model.parameters()))


class _Payload:
    """Unpickling this runs `open(marker, "w")`: what a malicious checkpoint would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


@pytest.mark.parametrize("victim", ["optimizer.pt", "rng.pt"])
def test_a_pickle_payload_is_refused_without_running(cpu, tmp_path, victim):
    model = _model(cpu)
    save_checkpoint(tmp_path / "c", model, _optimizer(model), 1)
    marker = tmp_path / "payload-ran"
    torch.save({"state": _Payload(marker)}, tmp_path / "c" / victim)
    # the attacker also rewrites the manifest, so only the loader's refusal to unpickle stands in the way
    _rewrite_manifest(tmp_path / "c")
    with pytest.raises(ValueError, match=f"refusing to load .*{victim}"):
        load_checkpoint(tmp_path / "c", model, torch.optim.AdamW(model.parameters()))
    assert not marker.exists()


def test_an_sft_checkpoint_is_refused_as_a_grpo_resume(cpu, tmp_path, task):
    model = _model(cpu)
    save_checkpoint(tmp_path / "sft", model, None, 40, extra={"kind": "sft"})
    trainer = GRPOTrainer(model, load_tokenizer("tiny-gemma"), DEFAULT_REWARDS, task.prompt_stream(),
                          GRPOConfig(prompts_per_step=2, group_size=2, micro_batch_size=4, output_dir=None,
                                     reward_weights=DEFAULT_WEIGHTS))
    with pytest.raises(ValueError, match="is a sft checkpoint, not a grpo one: start GRPO from it with --init-from"):
        trainer.load(tmp_path / "sft")


def test_full_weights_given_to_a_lora_model_are_refused(cpu, tmp_path):
    save_checkpoint(tmp_path / "full", _model(cpu), None, 1)
    with pytest.raises(ValueError, match="does not match the LoRA model"):
        load_checkpoint(tmp_path / "full", _model(cpu, lora=True, lora_r=4))


def test_a_torn_last_metrics_line_is_dropped_and_a_bad_middle_line_named(tmp_path):
    from grpo_kit.train.metrics import MetricsLogger, read_jsonl

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n{"step": 3, "rew')
    with pytest.warns(UserWarning, match="dropped the torn last line 3"):
        logger = MetricsLogger(path, resume=True)
    assert [r["step"] for r in logger.rows] == [1, 2]
    logger.truncate(2)
    logger.log({"step": 3})
    assert [r["step"] for r in read_jsonl(path)] == [1, 2, 3]
    path.write_text('{"step": 1}\nnot json\n{"step": 3}\n')
    with pytest.raises(ValueError, match="line 2 is not JSON"):
        read_jsonl(path)


def _limit_file_size(limit: int) -> Callable[[], None]:
    def lower() -> None:  # in the child: no file it writes may grow past `limit` (EFBIG, as a full disk gives ENOSPC)
        import resource

        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return lower


def test_a_real_write_failure_during_a_save_keeps_the_previous_checkpoint_and_stops_with_one_line(tmp_path):
    """The writers' own errors, not an injected OSError: a `grpo-kit train` whose files may not grow past 1 MB (the
    weights are 3.9 MB) resumes a finished 2-step run for 2 more steps; the save at step 3 fails inside safetensors.
    Exit 2 with one line naming the checkpoint, the error and the free space; the step-2 checkpoint intact."""
    import subprocess
    import sys

    config = tmp_path / "settings.yaml"
    config.write_text("grpo: {steps: 2, save_every: 1}\ntask: {num_test: 8}\n")
    out = tmp_path / "run"
    command = [sys.executable, "-m", "grpo_kit.cli", "train", "--preset", "cpu-tiny-quick", "--config", str(config),
               "--output-dir", str(out), "--device", "cpu", "--quiet"]
    subprocess.run(command, check=True, capture_output=True, timeout=600)
    config.write_text(config.read_text().replace("steps: 2", "steps: 4"))
    failed = subprocess.run(command, capture_output=True, text=True, timeout=600, preexec_fn=_limit_file_size(1 << 20))
    err = failed.stderr.strip().splitlines()
    assert failed.returncode == 2, failed.stderr[-2000:]
    line = err[-1]
    assert line.startswith(f"grpo-kit train: error: could not save the checkpoint {out / 'checkpoint'} ("), line
    assert "File too large" in line and " free on that disk; the previous checkpoint is kept" in line, line
    assert json.loads((out / "checkpoint" / "state.json").read_text())["step"] == 2
    assert sorted(p.name for p in out.iterdir()) == [".grpo_kit", "checkpoint", "metrics.jsonl"]  # no half-written one
    assert load_checkpoint(out / "checkpoint", _model(torch.device("cpu")))["step"] == 2


def test_an_unwritable_output_directory_is_reported_before_training(tmp_path, capsys):
    from grpo_kit.cli import main

    (tmp_path / "a-file").write_text("")
    bad = tmp_path / "a-file" / "run"  # a directory cannot be made under a file
    assert main(["train", "--preset", "cpu-tiny-quick", "--output-dir", str(bad), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert f"cannot write to {bad} (" in err and "choose another output directory" in err, err
