"""Data parallelism under torchrun on the CPU (gloo): two processes train as one would, only rank 0 writes, a run
whose rank is killed resumes, a run resumes on another number of processes, the controls are rank 0's.

Each run is `python -m torch.distributed.run` (torchrun) around `grpo-kit train` or a short script, one thread per
process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from grpo_kit.data.rewards import DEFAULT_REWARDS
from grpo_kit.data.tasks import ArithmeticTask
from grpo_kit.engine.model_config import ModelConfig
from grpo_kit.engine.models import load_model
from grpo_kit.train.checkpoint import save_checkpoint
from grpo_kit.train.config import GRPOConfig
from grpo_kit.train.grpo import GRPOTrainer

pytestmark = pytest.mark.xdist_group("torchrun")  # two processes each: not beside each other

# timings differ between runs and processes; everything the training computes must not
VARYING = ("seconds", "tokens_per_s", "memory_", "xla_", "processes")
TOLERANCE = 1e-4
"""Largest |2 processes − 1| / max(1, |value|) of a logged number: the two sum the same terms in another order."""
CONFIG = "grpo: {steps: 6, save_every: 1, log_completions: 4, beta: 0.04, micro_batch_size: 8}\ntask: {num_test: 8}\n"
"""16 rows a step in micro-batches of 8: one process runs two, each of two processes one of the same rows. (The
update's statistics, such as the entropy, are means per micro-batch weighted by rows, so they match where the
micro-batches hold the same rows; the loss and gradients are normalised by the whole batch either way.)"""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PJRT_", "XLA_", "CPU_NUM_DEVICES"))}
    return {**env, "OMP_NUM_THREADS": "1", "GRPO_KIT_DEVICE": "cpu", "USE_TORCH_XLA": "0"}


def _torchrun(processes: int, *command: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}", *command]


def _train(processes: int, config: Path, out: Path, *extra: str, command: str = "train") -> list[str]:
    """`grpo-kit train` (GRPO) or `sft` on the tiny Gemma under torchrun."""
    return _torchrun(processes, "-m", "grpo_kit.cli", command, "--preset", "cpu-tiny-quick", "--config", str(config),
                     "--output-dir", str(out), "--quiet", *extra)


def _run(command: list[str]) -> subprocess.CompletedProcess:
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, env=_env())
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _rows(out: Path, name: str = "metrics.jsonl") -> list[dict]:
    return [json.loads(line) for line in (out / name).read_text().splitlines()]


def _files(out: Path) -> set[str]:
    return {str(p.relative_to(out)) for p in out.rglob("*")}


def _assert_same_rows(rows: list[dict], reference: list[dict]) -> None:
    assert [r["step"] for r in rows] == [r["step"] for r in reference]
    for row, ref in zip(rows, reference, strict=True):
        assert set(row) == set(ref), set(row) ^ set(ref)
        for key, value in ref.items():
            if any(part in key for part in VARYING):
                continue
            if isinstance(value, float):
                assert abs(row[key] - value) <= TOLERANCE * max(1.0, abs(value)), (row["step"], key, row[key], value)
            elif key == "completions":
                assert [c["completion"] for c in row[key]] == [c["completion"] for c in value], row["step"]
            elif key != "advantage_hist":
                assert row[key] == value, (row["step"], key)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """The same SFT warm-up in one process and in two, then the same 6-step GRPO run from the first's weights (whose
    rewards vary, so every step has advantages and a gradient) in one process and in two."""
    root = tmp_path_factory.mktemp("ddp")
    sft = root / "sft.yaml"
    sft.write_text("sft: {log_every: 1}\n")
    for processes in (1, 2):
        _run(_train(processes, sft, root / f"sft{processes}", command="sft"))
    config, whole = root / "settings.yaml", root / "whole.yaml"
    config.write_text(CONFIG)
    whole.write_text(CONFIG + "model: {shard_weights: false}\n")
    start = ("--init-from", str(root / "sft1" / "checkpoint"))
    for processes in (1, 2):
        _run(_train(processes, config, root / f"p{processes}", *start))
    _run(_train(2, whole, root / "p2-whole", *start))
    return {"config": config, "whole": whole, "start": start, "one": root / "p1", "two": root / "p2",
            "sft_one": root / "sft1", "sft_two": root / "sft2", "two_whole": root / "p2-whole"}


def test_two_processes_log_the_rows_of_one(runs):
    """Each process samples its block of the groups with the noise one process would draw for them; the update's
    gradients are the whole batch's. So two processes log what one does, to float tolerance.

    With a whole copy of the weights in each process (`shard_weights: false`, the way LoRA runs: the kit's own forward
    and one all-reduce of the gradients) the two compute what one does in the same order, and all six steps match.
    With the weights sharded (full fine-tuning's default, FSDP2) the update runs the model's own forward and the
    gradient norm is summed over shards: the same numbers up to rounding, and AdamW's first steps turn rounding in
    gradients that nearly cancel into weight differences of up to the learning rate, which after a step can change
    a sampled token. So the sharded run is held to one process's first step, sampled from the same weights."""
    one, two, sharded = _rows(runs["one"]), _rows(runs["two_whole"]), _rows(runs["two"])
    assert {r["processes"] for r in one} == {1} and {r["processes"] for r in two + sharded} == {2}
    assert len({r["reward_mean"] for r in one}) > 1 and all(r["grad_norm"] > 0 for r in one)  # a run that moves
    _assert_same_rows(two, one)
    _assert_same_rows(sharded[:1], one[:1])
    assert [r["step"] for r in sharded] == [r["step"] for r in one]


def test_two_processes_warm_up_as_one(runs):
    """SFT: each process takes its block of the batch's rows, its loss weighted by its share of the batch's tokens
    (here with the weights sharded: no sampling, so rounding stays rounding)."""
    one, two = _rows(runs["sft_one"], "sft_metrics.jsonl"), _rows(runs["sft_two"], "sft_metrics.jsonl")
    assert len({r["loss"] for r in one}) > 1
    _assert_same_rows(two, one)


def test_only_rank_0_writes(runs):
    """Two processes leave the files one does: one metrics file with one row per step, one checkpoint, one claim."""
    assert _files(runs["two"]) == _files(runs["one"])
    assert [r["step"] for r in _rows(runs["two"])] == list(range(1, 7))


def _children(pid: int) -> list[int]:
    found = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(x) for x in found.read_text().split()] if found.exists() else []


def _rank_of(pid: int) -> int | None:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    ranks = [e.split(b"=", 1)[1] for e in env if e.startswith(b"RANK=")]
    return int(ranks[0]) if ranks else None


def test_a_run_whose_rank_1_is_killed_resumes_to_the_uninterrupted_rows(runs, tmp_path):
    """SIGKILL of rank 1 mid-run ends the job (torchrun stops the other rank); the same command again resumes from
    rank 0's last checkpoint to a complete, duplicate-free metrics file equal to the uninterrupted run's."""
    out = tmp_path / "killed"
    metrics = out / "metrics.jsonl"
    job = subprocess.Popen(_train(2, runs["config"], out, *runs["start"]), stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, env=_env())
    deadline = time.monotonic() + 600
    while not (metrics.exists() and metrics.read_text().count("\n") >= 3):
        assert job.poll() is None and time.monotonic() < deadline, "the run ended or made no progress"
        time.sleep(0.05)
    ranks = {_rank_of(pid): pid for pid in _children(job.pid)}
    os.kill(ranks[1], signal.SIGKILL)
    assert job.wait(timeout=300) != 0
    assert len(_rows(out)) < 6, "the run finished before its rank was killed"

    _run(_train(2, runs["config"], out, *runs["start"]))
    _assert_same_rows(_rows(out), _rows(runs["two"]))


def test_a_run_saved_by_two_processes_resumes_in_one(runs, tmp_path):
    """A checkpoint holds the whole weights and optimizer state (one process's copy; a sharded run's gathered whole,
    as the sharding test checks) and the batch is the whole step's whatever the number of processes, so a checkpoint
    of two resumes in one (and the other way) and continues the same run."""
    short = tmp_path / "short.yaml"
    out = tmp_path / "moved"
    short.write_text(runs["whole"].read_text().replace("steps: 6", "steps: 3"))
    _run(_train(2, short, out, *runs["start"]))
    _run(_train(1, runs["config"], out, *runs["start"]))
    _assert_same_rows(_rows(out), _rows(runs["one"]))


CONTROLLED = textwrap.dedent('''
    import json, sys
    import torch
    import grpo_kit as gk
    from grpo_kit.data.rewards import DEFAULT_REWARDS
    from grpo_kit.engine.model_config import ModelConfig
    from grpo_kit.engine.models import load_model

    model, tok = load_model(ModelConfig(name="tiny-gemma", dtype="float32"), torch.device("cpu"))
    cfg = gk.GRPOConfig(steps=6, prompts_per_step=4, group_size=4, micro_batch_size=16, max_new_tokens=16,
                        output_dir=None, log_completions=0)
    trainer = gk.GRPOTrainer(model, tok, DEFAULT_REWARDS, gk.ArithmeticTask().prompt_stream(), cfg)

    def steer(trainer, row):
        if trainer.world.is_main and row["step"] == 2:  # the dashboard lives beside rank 0
            trainer.controls.update(temperature=0.5, beta=0.1)
        if trainer.world.is_main and row["step"] == 4:
            trainer.controls.update(stop_requested=True)

    rows = trainer.train(progress=False, callback=steer)
    print("ROWS", json.dumps([{k: r[k] for k in ("step", "temperature", "beta", "controls_version")} for r in rows]))
''')


def test_a_control_changed_on_rank_0_reaches_both_ranks_at_the_same_step(tmp_path):
    script = tmp_path / "controlled.py"
    script.write_text(CONTROLLED)
    done = _run(_torchrun(2, "--tee=1", str(script)))
    per_rank: dict[int, list] = {}
    for line in done.stdout.splitlines():  # torchrun prefixes each line with its rank: "[default0]:ROWS [...]"
        prefix, _, text = line.partition("]:")
        if text.startswith("ROWS "):
            per_rank[int(prefix.rsplit("default", 1)[1])] = json.loads(text.removeprefix("ROWS "))
    assert set(per_rank) == {0, 1}, done.stdout[-2000:]
    assert per_rank[0] == per_rank[1]
    temperatures = [r["temperature"] for r in per_rank[0]]
    assert temperatures[0] == temperatures[1] != 0.5 and temperatures[2:] == [0.5, 0.5]  # set after step 2
    assert [r["beta"] for r in per_rank[0]][2:] == [0.1, 0.1]
    assert len(per_rank[0]) == 4  # stop asked after step 4: both ranks stopped there


SEPARATE_DIRS = textwrap.dedent('''
    import os, sys
    import torch
    import grpo_kit as gk
    from grpo_kit.data.rewards import DEFAULT_REWARDS
    from grpo_kit.engine.model_config import ModelConfig
    from grpo_kit.engine.models import load_model

    model, tok = load_model(ModelConfig(name="tiny-gemma", dtype="float32"), torch.device("cpu"))
    # each process its own directory: what two machines without a shared file system would see
    out = os.path.join(sys.argv[1], "rank" + os.environ["RANK"])
    cfg = gk.GRPOConfig(steps=1, prompts_per_step=4, group_size=4, micro_batch_size=8, max_new_tokens=8, output_dir=out)
    gk.GRPOTrainer(model, tok, DEFAULT_REWARDS, gk.ArithmeticTask().prompt_stream(), cfg)
''')


def test_processes_that_do_not_share_the_output_directory_are_refused(tmp_path):
    """A resume reads the checkpoint in every process, so each must see the directory rank 0 writes."""
    script = tmp_path / "separate.py"
    script.write_text(SEPARATE_DIRS)
    done = subprocess.run(_torchrun(2, str(script), str(tmp_path)), capture_output=True, text=True, timeout=600,
                          env=_env())
    assert done.returncode != 0
    assert "process 1 of 2 does not see what process 0 wrote there" in done.stderr
    assert not (tmp_path / "rank1" / "metrics.jsonl").exists()


def test_the_demo_arc_runs_in_two_processes(tmp_path):
    """`grpo-kit demo` under torchrun with a time budget: each phase's size is the main process's clock's (its plan
    taken by every process at each save), so both train the same steps and the run ends; the main process alone
    writes and evaluates, and the directory holds what one process's arc leaves."""
    config = tmp_path / "arc.yaml"
    config.write_text("sft: {log_every: 1}\ngrpo: {prompts_per_step: 4, group_size: 4, micro_batch_size: 8, "
                      "max_new_tokens: 16}\ntask: {num_test: 8}\ncontrol: true\nrft_control: true\n")
    out = tmp_path / "arc"
    done = _run(_torchrun(2, "-m", "grpo_kit.cli", "demo", "--preset", "cpu-tiny-quick", "--config", str(config),
                          "--output-dir", str(out), "--time-budget", "1", "--quiet"))
    summary = json.loads(done.stdout[done.stdout.index("{\n"):])  # after gloo's own lines
    for stage in ("base", "sft", "grpo", "control", "rft"):
        assert 0.0 <= summary[f"{stage}_accuracy"] <= 1.0, stage
    assert summary["grpo_steps"] >= 2 and summary["control_steps"] >= 1 and summary["rft_steps"] >= 1
    grpo_rows = _rows(out / "grpo")
    assert [r["step"] for r in grpo_rows] == list(range(1, summary["grpo_steps"] + 1))
    assert {r["processes"] for r in grpo_rows} == {2}
    assert {"progress.json", "summary.json", "sft", "grpo", "control", "rft", "reward_curve.png",
            "accuracy.png"} <= {p.name for p in out.iterdir()}
    plan = json.loads((out / "progress.json").read_text())["plan"]
    assert {"sft_steps", "grpo_steps", "control_steps", "rft_steps"} <= set(plan)  # every phase sized by the clock


RFT_STEPS = textwrap.dedent('''
    import json, sys
    import torch
    import grpo_kit as gk
    import grpo_kit.train.rft as rft
    from grpo_kit.engine.model_config import ModelConfig
    from grpo_kit.engine.models import load_model
    from grpo_kit.train.checkpoint import load_checkpoint

    # full fine-tuning: under torchrun the weights are sharded over the processes unless argv[2] is 0
    model, tok = load_model(ModelConfig(name="tiny-gemma", dtype="float32", shard_weights=sys.argv[2] == "1"),
                            torch.device("cpu"))
    load_checkpoint(sys.argv[1], model)
    task = gk.ArithmeticTask()
    rows = list(task.test_set())
    # the verifier accepts the first completion of each step's first prompt only: one row for two processes
    first = {rows[0]["answer"], rows[2]["answer"]}
    assert not first & {rows[1]["answer"], rows[3]["answer"]}
    rft.correctness_reward = lambda prompts, texts, answer=None, **_: [
        1.0 if i == 0 and a in first else 0.0 for i, a in enumerate(answer)]
    cfg = gk.RFTConfig(steps=2, prompts_per_step=2, group_size=2, max_new_tokens=40, max_length=128, warmup_steps=0,
                       learning_rate=1e-3, log_every=1, output_dir=None)
    trained = rft.RFTTrainer(model, tok, iter(rows), cfg).train(progress=False)
    keys = ("step", "accepted", "sampled_accuracy", "loss", "grad_norm", "tokens")
    print("ROWS", json.dumps([{k: r.get(k) for k in keys} for r in trained]))
''')


def test_an_rft_step_that_keeps_fewer_rows_than_processes_is_the_step_of_one(sft_state, tmp_path):
    """RFT under torchrun: each process samples its block of the prompts and all train on what they kept together;
    a step that keeps a single completion leaves one of two processes no row, and still takes one process's step:
    both steps with a whole copy of the weights in each process, the first with sharded weights (after it, rounding
    may change what is sampled: see `test_two_processes_log_the_rows_of_one`)."""
    weights, script = tmp_path / "sft", tmp_path / "rft.py"
    model, _ = load_model(ModelConfig(name="tiny-gemma", dtype="float32"), torch.device("cpu"))
    model.load_state_dict(sft_state)
    save_checkpoint(weights, model, None, 0)
    script.write_text(RFT_STEPS)
    logged = {}
    for processes, sharded in ((1, "1"), (2, "0"), (2, "1")):
        done = _run(_torchrun(processes, "--tee=1", str(script), str(weights), sharded))
        logged[processes, sharded] = [json.loads(line.partition("ROWS ")[2]) for line in done.stdout.splitlines()
                                      if "]:ROWS " in line]
    assert [len(rows) for rows in logged.values()] == [1, 2, 2]
    assert all(rows[0] == rows[1] for rows in list(logged.values())[1:])  # both ranks log the same
    one = logged[1, "1"][0]
    assert [r["accepted"] for r in one] == [1, 1] and all(r["loss"] > 0 for r in one)
    for two, steps in ((logged[2, "0"][0], 2), (logged[2, "1"][0], 1)):
        assert len(two) == 2 and [r["accepted"] for r in two[:steps]] == [1] * steps
        for row, ref in zip(two[:steps], one[:steps], strict=True):
            for key, value in ref.items():
                assert abs(row[key] - value) <= TOLERANCE * max(1.0, abs(value)), (row["step"], key, row[key], value)


SHARDED = textwrap.dedent('''
    import json, sys
    import torch
    import grpo_kit as gk
    from grpo_kit.data.rewards import DEFAULT_REWARDS
    from grpo_kit.engine.decoder import supports
    from grpo_kit.engine.model_config import ModelConfig
    from grpo_kit.engine.models import load_model

    def local(t):  # this process's part of a tensor (its shard of a sharded one)
        return t.to_local() if hasattr(t, "to_local") else t

    model, tok = load_model(ModelConfig(name="tiny-gemma", dtype="float32", shard_weights=sys.argv[2] == "1"),
                            torch.device("cpu"))
    cfg = gk.GRPOConfig(steps=2, prompts_per_step=4, group_size=4, micro_batch_size=8, max_new_tokens=16, beta=0.04,
                        ema_reference=0.5, output_dir=sys.argv[1], save_every=1, log_completions=0)
    trainer = gk.GRPOTrainer(model, tok, DEFAULT_REWARDS, gk.ArithmeticTask().prompt_stream(), cfg)
    trainer.train(progress=False)
    moments = [v for state in trainer.optimizer.state.values() for k, v in state.items() if k.startswith("exp_avg")]
    print("SIZES", json.dumps({
        "lean": supports(model),  # the kit's own decoder samples the sharded layers
        "total": sum(p.numel() for p in model.parameters()),
        "weights": sum(local(p).numel() for p in model.parameters()),
        "moments": sum(local(v).numel() for v in moments),
        "reference": sum(local(p).numel() for p in trainer.reference.frozen.parameters()),
    }))
''')


def _sizes(out: Path, *, sharded: bool) -> dict[int, dict]:
    script = out.parent / "sharded.py"
    script.write_text(SHARDED)
    done = _run(_torchrun(2, "--tee=1", str(script), str(out), "1" if sharded else "0"))
    return {int(line.partition("default")[2].partition("]")[0]): json.loads(line.partition("SIZES ")[2])
            for line in done.stdout.splitlines() if "]:SIZES " in line}


def test_sharded_weights_hold_half_the_weights_moments_and_reference_in_each_process(tmp_path):
    """Full fine-tuning over two processes: each holds its half of the weights, AdamW's two moments and the frozen
    reference (FSDP2's shards: every tensor split along its first dimension, rounded up), where with
    `shard_weights: false` each holds them all; the checkpoint holds them whole (an EMA reference included) and
    continues in one process."""
    sharded, whole = _sizes(tmp_path / "sharded", sharded=True), _sizes(tmp_path / "whole", sharded=False)
    assert set(sharded) == set(whole) == {0, 1}
    total = whole[0]["total"]
    for rank in (0, 1):
        assert whole[rank] == {"lean": True, "total": total, "weights": total, "moments": 2 * total,
                               "reference": total}
        assert sharded[rank]["lean"]
        half = sharded[rank]
        assert half["total"] == total
        assert total / 2 - 1000 <= half["weights"] <= total / 2 + 1000, half  # a row of padding per tensor at most
        assert half["weights"] == half["reference"] and half["moments"] == 2 * half["weights"]
    assert sharded[0]["weights"] + sharded[1]["weights"] >= total
    saved = load_file(str(tmp_path / "sharded" / "checkpoint" / "weights.safetensors"))
    assert sum(t.numel() for t in saved.values()) == sum(
        t.numel() for t in load_file(str(tmp_path / "whole" / "checkpoint" / "weights.safetensors")).values())
    model, tok = load_model(ModelConfig(name="tiny-gemma", dtype="float32"), torch.device("cpu"))
    cfg = GRPOConfig(steps=3, prompts_per_step=4, group_size=4, micro_batch_size=8, max_new_tokens=16, beta=0.04,
                     ema_reference=0.5, output_dir=str(tmp_path / "sharded"), log_completions=0)
    trainer = GRPOTrainer(model, tok, DEFAULT_REWARDS, ArithmeticTask().prompt_stream(), cfg, resume_metrics=True)
    trainer.load(tmp_path / "sharded" / "checkpoint")
    assert trainer.step == 2 and len(trainer.optimizer.state) == len(list(model.parameters()))
    assert [r["step"] for r in trainer.train(progress=False)] == [1, 2, 3]
