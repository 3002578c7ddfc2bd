"""`grpo-kit` command line: demo, sft, train (GRPO), eval, score and leaderboard (your task), plan, export, and
xla-check (the XLA path against eager CPU). The repository's own tools (the study, the benchmark, the smoke test)
are not installed with the package: `python -m tools` in a checkout.

Every command takes `--preset NAME` and `--config FILE.yaml` (same keys as the dataclasses in config.py,
e.g. `grpo: {learning_rate: 3e-4}`) and prints one JSON object at the end.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

from .course.stages import Stage
from .engine.hub import TINY_MODELS
from .train.config import PRESETS, RunConfig, field_docs, load_run_config
from .train.rundir import claim


def _common(p: argparse.ArgumentParser, preset: str = "auto") -> None:
    p.add_argument("--preset", default=preset, choices=["auto", *sorted(PRESETS)],
                   help=f"named settings (default {preset}; auto = picked for the detected hardware: a TPU board's "
                        "preset, the GPU preset, or cpu-tiny; Gemma 4 E2B's where --model names it)")
    p.add_argument("--config", default=None, help="YAML file of overrides, e.g. 'grpo: {steps: 100}'")
    p.add_argument(
        "--model", default=None, help="model name/path (overrides the preset): tiny-gemma, a directory or a hub id"
    )
    p.add_argument("--device", default=None, help="cpu, cuda, xla or auto (default: auto)")
    p.add_argument("--output-dir", default=None, help="where outputs go")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def _config(args: argparse.Namespace, default_out: str, *, model_is_name: bool = True) -> RunConfig:
    """The preset (and YAML) with the command's model and output directory; `model_is_name` False: --model is not a
    model's name (a checkpoint of the preset's model), so the preset's name stays."""
    from .engine.device import check_device_kind

    check_device_kind(getattr(args, "device", None))
    cfg = load_run_config(args.preset, args.config, model=args.model if model_is_name else None)
    if args.model and model_is_name:
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, name=args.model))
    out = args.output_dir or (cfg.output_dir if default_out == "runs/demo" else default_out)
    return dataclasses.replace(cfg, output_dir=out)


def _print(obj: dict[str, Any]) -> None:
    print(json.dumps(obj, indent=2, default=str))


def cmd_demo(args: argparse.Namespace) -> int:
    from .course.arc import run_demo
    from .engine.distributed import finish, launched_rank

    cfg = _config(args, "runs/demo")
    if args.time_budget is not None:
        cfg = dataclasses.replace(cfg, time_budget_minutes=args.time_budget)
    summary = run_demo(cfg, args.device, progress=not args.quiet, resume=not args.overwrite)
    finish()
    if launched_rank() != 0:  # under torchrun the main process reports
        return 0
    _print({k: v for k, v in summary.items() if k not in ("samples_after_grpo", "plan")})
    print(f"\nWrote {Path(cfg.output_dir).resolve()}/ (summary.json, progress.json, sft/ grpo/ control/, *.png)",
          file=sys.stderr)
    return 0


def cmd_score(args: argparse.Namespace) -> int:
    from .data.tasks import Columns, load_task
    from .engine.device import get_device, use_cpu_threads
    from .engine.models import load_model
    from .eval.scoring import score_model
    from .train.checkpoint import checkpoint_state, load_checkpoint, refuse_arc_adapter

    checkpoint = Path(args.model) if args.model and (Path(args.model) / "state.json").exists() else None
    where = arc_stage(args.model, args.stage)  # an arc: one of its stages, as it holds them
    if checkpoint and not where:
        refuse_arc_adapter(checkpoint)
    cfg = _config(args, "runs/score", model_is_name=checkpoint is None)
    task = load_task(args.task, columns=Columns(prompt=args.prompt_column, answer=args.answer_column),
                     answer_type=args.answer_type, num_test=args.num_test, seed=args.seed,
                     system_prompt=args.system_prompt, split=args.split)
    if where:
        arc = _arc_model(where, args.device)
        steps = {f"{p} steps": r["steps"] for p in Stage.trained() if (r := arc.done(p))}
        score = score_model(arc.model, arc.tokenizer, task, cfg.output_dir,
                            model_name=args.name or f"{arc.cfg.model.name} after {where[1]} ({where[0]})",
                            training={"arc": str(where[0]), "stage": where[1], **steps}, overwrite=args.overwrite)
        return _scored(score, cfg.output_dir)
    # a checkpoint holds weights (or an adapter) for the preset's model; a named or exported model is whole
    model_cfg = cfg.model if checkpoint else dataclasses.replace(cfg.model, lora=False)
    use_cpu_threads()
    model, tokenizer = load_model(model_cfg, get_device(args.device))
    training: dict[str, Any] = {}
    if checkpoint:
        state = checkpoint_state(checkpoint, verify=False)[1]
        training = {"checkpoint": str(checkpoint), "base model": model_cfg.name, "phase": state.get("kind"),
                    "steps": state.get("step")}
        load_checkpoint(checkpoint, model)
    name = args.name or (f"{model_cfg.name} + {checkpoint}" if checkpoint else model_cfg.name)
    score = score_model(model, tokenizer, task, cfg.output_dir, model_name=name,
                        training=training, overwrite=args.overwrite)
    return _scored(score, cfg.output_dir)


def _scored(score: dict[str, Any], output_dir: str) -> int:
    _print({k: v for k, v in score.items() if k not in ("items", "machine")})
    print(f"\nWrote {Path(output_dir).resolve()}/ (score.json, RESULTS.md)", file=sys.stderr)
    return 0


def cmd_leaderboard(args: argparse.Namespace) -> int:
    from .eval.scoring import leaderboard

    table = leaderboard(args.scores, by=args.by)
    if args.output:
        Path(args.output).write_text(table)
    print(table, end="")
    return 0


def _setup(args: argparse.Namespace, default_out: str, *, init_from: str | None = None,
           cfg: RunConfig | None = None, device: Any = None) -> tuple[RunConfig, Any, Any, Any, Any]:
    from .data.tasks import make_task
    from .engine.models import load_model
    from .train.checkpoint import load_checkpoint, refuse_arc_adapter

    cfg = cfg or _config(args, default_out)
    init_from = init_from or getattr(args, "init_from", None)
    if init_from:
        refuse_arc_adapter(init_from)  # before the model loads: a minute on a real Gemma
    dev = device or _device(args)
    model, tokenizer = load_model(cfg.model, dev)
    if init_from:
        load_checkpoint(init_from, model)
    task = make_task(cfg.task)
    return cfg, dev, model, tokenizer, task


def cmd_sft(args: argparse.Namespace) -> int:
    from .train.sft import SFTTrainer

    cfg = _config(args, "runs/sft")
    dev = _device(args)
    run_dir = _claim_on_main(cfg, "sft", args, dev)  # noqa: F841 - held (the lock) while training
    resume = _resume_point(args, cfg, section="sft", steps=cfg.sft.steps)
    cfg, _, model, tokenizer, task = _setup(args, "runs/sft", cfg=cfg, device=dev)
    trainer = SFTTrainer(model, tokenizer, task.demonstrations(),
                         dataclasses.replace(cfg.sft, output_dir=cfg.output_dir), resume_metrics=resume is not None)
    _load_resume_point(args, trainer, resume)
    return _train_save_evaluate(args, cfg, trainer, tokenizer, task)


def _device(args: argparse.Namespace) -> Any:
    """The command's device, chosen before the output directory is claimed: on a pod slice, which host claims it is
    the XLA runtime's to say."""
    from .engine.device import get_device, use_cpu_threads

    use_cpu_threads()
    return get_device(args.device)


def _claim_on_main(cfg: RunConfig, kind: str, args: argparse.Namespace, device: Any) -> Any:
    """The output directory claimed for the whole command (`rundir.claim`); under torchrun, or on a pod slice's
    hosts, by the main process only, the one that writes (the others get None)."""
    from .engine.distributed import process_rank

    return claim(cfg.output_dir, kind, overwrite=args.overwrite) if process_rank(device) == 0 else None


def _train_save_evaluate(args: argparse.Namespace, cfg: RunConfig, trainer: Any, tokenizer: Any, task: Any) -> int:
    """Shared tail of `sft` and `train`: run, save `output_dir/checkpoint`, evaluate, print one JSON object. Under
    torchrun the main process saves, evaluates and prints; the others are done once training is. The hosts of one
    SPMD program (a pod slice) all evaluate, since each of its computations spans them all; the main one prints."""
    from .engine.distributed import finish
    from .engine.sharding import gathered
    from .eval.evaluation import evaluate

    trainer.train(progress=not args.quiet)
    ckpt = trainer.save(Path(cfg.output_dir) / "checkpoint")
    world = trainer.world
    with gathered(trainer.model):  # weights sharded over the processes: whole on each (every process gathers)
        if world.is_main or not world.splits_batch:
            result = evaluate(trainer.model, tokenizer, task.test_set(), max_new_tokens=cfg.grpo.max_new_tokens)
    finish()
    if not world.is_main:
        return 0
    _print(
        {"checkpoint": str(ckpt), "steps": trainer.step, "accuracy": result["accuracy"],
         "format_rate": result["format_rate"]}
    )
    return 0


def _resume_point(args: argparse.Namespace, cfg: RunConfig, *, section: str, steps: int) -> dict[str, Any] | None:
    """The checkpoint `sft`/`train` continues from: `--resume PATH`, or (`--resume auto`, the default) the output
    directory's own `checkpoint/` when it holds a valid one; None to start from the beginning. Refuses to start
    over on top of a run without `--overwrite`, and to "resume" a run that has no steps left."""
    from .train.checkpoint import checkpoint_state

    if args.overwrite:
        return None
    own = Path(cfg.output_dir) / "checkpoint"
    if args.no_resume:
        try:
            checkpoint_state(own, verify=False)
        except FileNotFoundError:
            return None
        raise ValueError(
            f"{cfg.output_dir} holds a run already: pass --overwrite to start it over, or another --output-dir")
    auto = args.resume == "auto"
    try:
        path, state = checkpoint_state(own if auto else Path(args.resume), verify=False)  # loading verifies the files
    except FileNotFoundError:
        if auto:
            return None
        raise
    if state["step"] >= steps:
        raise ValueError(
            f"{path} is a finished run ({state['step']} of {section}.steps={steps}): raise {section}.steps to "
            "train on, pass --overwrite to start it over, or choose another --output-dir"
        )
    return {"path": str(path), **state}


def _load_resume_point(args: argparse.Namespace, trainer: Any, resume: dict[str, Any] | None) -> None:
    if resume is not None:
        trainer.load(resume["path"])
        if not args.quiet:
            print(f"grpo-kit {args.command}: resuming from {resume['path']} at step {trainer.step}", file=sys.stderr)


def cmd_train(args: argparse.Namespace) -> int:
    from .data.rewards import DEFAULT_REWARDS, DEFAULT_WEIGHTS
    from .train.grpo import GRPOTrainer

    cfg = _config(args, "runs/grpo")
    dev = _device(args)
    run_dir = _claim_on_main(cfg, "grpo", args, dev)  # noqa: F841 - held (the lock) while training
    resume = _resume_point(args, cfg, section="grpo", steps=cfg.grpo.steps)
    # the starting weights the run was begun from (so a resumed full fine-tuning rebuilds the same reference)
    cfg, _, model, tokenizer, task = _setup(args, "runs/grpo", init_from=(resume or {}).get("init_from"), cfg=cfg,
                                            device=dev)
    grpo_cfg = dataclasses.replace(
        cfg.grpo, output_dir=cfg.output_dir, reward_weights=cfg.grpo.reward_weights or DEFAULT_WEIGHTS
    )
    trainer = GRPOTrainer(
        model, tokenizer, DEFAULT_REWARDS, task.prompt_stream(), grpo_cfg, resume_metrics=resume is not None
    )
    trainer.init_from = (resume or {}).get("init_from") or args.init_from
    _load_resume_point(args, trainer, resume)
    return _train_save_evaluate(args, cfg, trainer, tokenizer, task)


def cmd_eval(args: argparse.Namespace) -> int:
    from .eval.evaluation import evaluate

    if where := arc_stage(args.init_from):  # an arc's stage: its model, on the arc's own held-out set
        arc = _arc_model(where, args.device)
        _print(evaluate(arc.model, arc.tokenizer, arc.test, max_new_tokens=arc.cfg.grpo.max_new_tokens))
        return 0
    cfg, _, model, tokenizer, task = _setup(args, "runs/eval")
    result = evaluate(model, tokenizer, task.test_set(), max_new_tokens=cfg.grpo.max_new_tokens)
    _print(result)
    return 0


def arc_stage(path: str | Path | None, stage: str | None = None) -> tuple[Path, str] | None:
    """(the arc's directory, the stage) when `path` is an arc's output directory (`stage`, default grpo) or a stage's
    `final` checkpoint inside one (ARC/grpo/final): such weights are whole only as the arc holds them (a LoRA stage is
    an adapter over the merged SFT model), so they are loaded through `Arc.hold`. None otherwise."""
    if not path:
        return None
    path = Path(path)
    if (path / "progress.json").exists():
        return path, stage or "grpo"
    arc = path.parent.parent
    if path.parent.name in Stage.trained() and (arc / "progress.json").exists():
        if path.name != "final":
            raise ValueError(f"{path} is an unfinished phase of the arc in {arc}: run the arc again to finish it, then "
                             f"give the arc's directory ({arc}) and --stage {path.parent.name}")
        return arc, path.parent.name
    return None


def _arc_model(where: tuple[Path, str], device: str | None) -> Any:
    from .course.arc import Arc

    arc = Arc.from_dir(where[0], device)
    arc.hold(where[1])
    return arc


def cmd_export(args: argparse.Namespace) -> int:
    import torch

    from .eval.export import export_model, push

    if not args.init_from:
        raise SystemExit("grpo-kit export: --checkpoint DIR is required (the sft/train output_dir's checkpoint/, or an "
                         "arc's output directory)")
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, None: None}[args.dtype]
    notes, score = "", None
    if args.results:  # RESULTS.md, or the directory grpo-kit score wrote; its score.json gives the card's model-index
        results = Path(args.results)
        notes = (results / "RESULTS.md" if results.is_dir() else results).read_text()
        score_file = (results if results.is_dir() else results.parent) / "score.json"
        score = json.loads(score_file.read_text()) if score_file.exists() else None
    if where := arc_stage(args.init_from):
        arc = _arc_model(where, args.device)
        model, tokenizer, base = arc.model, arc.tokenizer, arc.cfg.model.name
    else:
        cfg, _, model, tokenizer, _ = _setup(args, "runs/export")
        base = cfg.model.name
    out = export_model(model, tokenizer, args.out, base_name=base, notes=notes, score=score, dtype=dtype)
    if args.push_to:
        push(out, args.push_to, allow_public=args.public)
    _print({"exported": str(out), "pushed_to": args.push_to})
    return 0


def cmd_xla_check(args: argparse.Namespace) -> int:
    from .eval.xla_check import prepare_environment

    prepare_environment(args.devices)  # before torch_xla is imported
    from .eval.xla_check import run_xla_check

    report = run_xla_check(args.devices, args.steps, args.max_new_tokens, args.tolerance, model=args.model)
    if args.json:
        print(json.dumps(report, default=str))
    else:
        _print(report)
    if not report["ok"]:
        why = []
        if report["recompiles_after_warmup"]:
            why.append(
                f"{report['recompiles_after_warmup']} recompilation(s) after warm-up: {report['recompile_warnings']}")
        if report["cpu_fallback_ops"]:
            why.append(f"ops fell back to the CPU (phase:op → count): {report['cpu_fallback_ops']}")
        if report["max_scaled_diff_vs_eager"] > args.tolerance:
            why.append(
                f"XLA and eager CPU differ by {report['max_scaled_diff_vs_eager']:.3g} of max(1, |value|) "
                f"> {args.tolerance:g}: "
                f"{report['abs_diff_by_metric']}"
            )
        if report["update_rel_diff"] > report["update_tolerance"]:
            why.append(f"XLA's weight update differs from eager's by {report['update_rel_diff']:.3g} of its size "
                       f"> {report['update_tolerance']:g}")
        print("grpo-kit xla-check: FAILED: " + "; ".join(why), file=sys.stderr)
        return 1
    return 0


PLAN_FLAGS = ("model", "tpu", "lora_r", "prompts_per_step", "group_size", "prompt_length", "max_new_tokens",
              "micro_batch_size", "gradient_checkpointing", "beta", "ple_on_host")
"""`grpo-kit plan`'s flags: `planner.PlanInput` fields, with its defaults and its field docs as help (and --full)."""


def _plan_flags(p: argparse.ArgumentParser) -> None:
    from .eval.planner import PlanInput

    docs = field_docs(PlanInput)
    p.add_argument("--full", action="store_true", help="full fine-tuning instead of LoRA")
    for f in dataclasses.fields(PlanInput):
        if f.name not in PLAN_FLAGS:
            continue
        flag, kind = "--" + f.name.replace("_", "-"), f.type.split(" | ")[0]
        described = f"{docs[f.name]} (default {f.default})"
        if kind == "bool":
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default, help=described)
        else:
            p.add_argument(flag, type={"int": int, "float": float, "str": str}[kind], default=f.default, help=described)


def cmd_plan(args: argparse.Namespace) -> int:
    from .eval.planner import PlanInput, plan, table
    from .eval.scaling import predict, speeds_for

    if args.table:
        print(table())
        return 0
    inputs = PlanInput(lora=not args.full, **{name: getattr(args, name) for name in PLAN_FLAGS})
    report = plan(inputs)
    if report["fits"] and speeds_for(inputs.tpu):  # boards with published speeds: the step's time too (a prediction)
        sized = dataclasses.replace(inputs, micro_batch_size=report["micro_batch_size"])
        report["predicted"] = predict(sized, checkpointing=report["gradient_checkpointing"])
    _print(report)
    if not report["fits"]:
        print(f"grpo-kit plan: does not fit: {report['advice']}", file=sys.stderr)
        return 1
    return 0


def _resume_options(p: argparse.ArgumentParser, kind: str) -> None:
    p.add_argument(
        "--resume",
        default="auto",
        help=f"{kind} checkpoint to resume (weights, optimizer, RNG, step); default "
        "auto: the output directory's checkpoint/ when there is one",
    )
    p.add_argument("--no-resume", action="store_true",
                   help="start from the beginning; refused where the output directory holds a run, unless --overwrite")
    p.add_argument("--overwrite", action="store_true", help="start over in an output directory that holds a run (only "
                   "the files the run wrote are removed), or write beside files grpo-kit did not write")


def _export_parser(sub: Any) -> None:
    p = sub.add_parser(
        "export", help="merge LoRA into the weights and save a transformers directory (optionally push it)"
    )
    _common(p)
    p.add_argument("--init-from", "--checkpoint", dest="init_from", default=None, help="checkpoint to export")
    p.add_argument("--out", required=True, help="directory to write (safetensors, tokenizer, chat template, README.md)")
    p.add_argument(
        "--dtype", choices=("float32", "bfloat16"), default=None, help="weights' dtype (default: as trained)"
    )
    p.add_argument(
        "--push-to",
        default=None,
        help="upload the exported files to a Hugging Face repo id, or to Kaggle Models "
        "as kaggle:<owner>/<model> (a new repo or model is private; an existing public one is refused unless --public)",
    )
    p.add_argument("--public", action="store_true", help="allow the upload into an existing public repository")
    p.add_argument("--results", default=None, metavar="RESULTS.md", help="a results card (grpo-kit score), or the "
                   "directory holding it, to end the model card with; its score.json becomes the card's model-index")
    p.set_defaults(func=cmd_export)


def _score_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "score",
        help="the frozen evaluation harness: score a model on your task's held-out split; writes "
        "score.json and RESULTS.md",
    )
    _common(p, preset="cpu-tiny")
    p.add_argument(
        "--task", required=True, help="your data: a .jsonl/.json/.csv/.parquet file or a Hugging Face dataset id"
    )
    p.epilog = (
        "--model: a model name (tiny-gemma, gemma-3-270m, a hub id), an exported directory, a checkpoint (state.json: "
        "the preset's model with its weights), or an arc's output directory (progress.json: --stage)"
    )
    p.add_argument("--prompt-column", default="prompt", help="the column holding the questions (default prompt)")
    p.add_argument("--answer-column", default="answer", help="the column holding the right answers (default answer)")
    p.add_argument(
        "--answer-type", default="auto",
        help="number, choice, string, regex, math (math-verify: fractions, LaTeX, expressions), or auto (inferred per "
        "row; default)"
    )
    p.add_argument("--num-test", type=int, default=200, help="held-out rows (default 200; the same as for training)")
    p.add_argument("--seed", type=int, default=1234, help="the split's seed (default 1234; the same as for training)")
    p.add_argument("--system-prompt", default=None, help="the instruction each question gets (as for training)")
    p.add_argument("--split", default="train", help="a hub dataset's split (default train)")
    p.add_argument("--name", default=None, help="the entry's name on the leaderboard (default: the model)")
    p.add_argument("--stage", default=None, choices=tuple(Stage),
                   help="with --model an arc's output directory (grpo-kit demo): the stage to score (default grpo)")
    p.add_argument("--overwrite", action="store_true", help="score again into a directory holding a score")
    p.set_defaults(func=cmd_score)
    from .eval.scoring import RANK_BY

    p = sub.add_parser("leaderboard", help="rank score files (grpo-kit score) on the same split as a Markdown table")
    p.add_argument("scores", nargs="+", help="score.json files (or the directories holding them)")
    p.add_argument("--output", default=None, help="also write the table to this Markdown file")
    p.add_argument("--by", default="accuracy", choices=list(RANK_BY),
                   help="what to rank by (default: greedy accuracy, the score; ties go to greedy accuracy)")
    p.set_defaults(func=cmd_leaderboard)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="grpo-kit", description="SFT warm-up → reward design → GRPO on Gemma.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="the whole arc: evaluate the base model, SFT, GRPO (and the SFT control), "
                       "evaluating after each; default: the tiny Gemma on the CPU; --preset cpu-gemma-270m: a real "
                       "Gemma in under an hour")
    _common(p, preset="cpu-tiny")
    p.add_argument("--time-budget", type=float, default=None, metavar="MINUTES",
                   help="size SFT and GRPO so the whole run takes about this long (overrides the preset)")
    p.add_argument("--overwrite", action="store_true", help="start over, removing only the files the arc wrote; by "
                   "default a run in the output directory with the same settings continues where it stopped")
    p.set_defaults(func=cmd_demo)
    _score_parsers(sub)
    p = sub.add_parser("sft", help="SFT warm-up on the demonstration pool; saves a checkpoint as it goes")
    _common(p)
    p.add_argument("--init-from", default=None, help="checkpoint directory to start from")
    _resume_options(p, "SFT")
    p.set_defaults(func=cmd_sft)
    p = sub.add_parser("train", help="GRPO training (start from an SFT checkpoint with --init-from)")
    _common(p)
    p.add_argument("--init-from", default=None, help="checkpoint to start from (weights only)")
    _resume_options(p, "GRPO")
    p.set_defaults(func=cmd_train)
    p = sub.add_parser("eval", help="greedy accuracy on the held-out set")
    _common(p)
    p.add_argument("--init-from", "--checkpoint", dest="init_from", default=None, help="checkpoint to evaluate")
    p.set_defaults(func=cmd_eval)
    _export_parser(sub)
    p = sub.add_parser(
        "plan", help="per-device memory estimate; recommends micro-batch and checkpointing, or says what to change"
    )
    _plan_flags(p)
    p.add_argument("--table", action="store_true", help="print the README table of models × TPUs")
    p.set_defaults(func=cmd_plan)
    _xla_check_parser(sub)
    return parser


def _xla_check_parser(sub: Any) -> None:
    p = sub.add_parser(
        "xla-check", help="GRPO on the XLA device vs eager CPU: compile counts, recompiles, agreement"
    )
    p.add_argument("--devices", type=int, default=1, help="XLA devices; > 1 runs SPMD over them (CPU: virtual devices)")
    p.add_argument("--steps", type=int, default=20, help="GRPO steps (default 20)")
    p.add_argument("--max-new-tokens", type=int, default=16, help="completion length (default 16)")
    p.add_argument("--tolerance", type=float, default=1e-4,
                   help="largest allowed |XLA − eager| / max(1, |eager|) per metric and step (default 1e-4)")
    p.add_argument("--model", default="tiny-gemma", choices=TINY_MODELS,
                   help="the embedded model the job trains (default tiny-gemma; tiny-gemma-4: Gemma 4's layers)")
    p.add_argument("--json", action="store_true", help="print one JSON line")
    p.set_defaults(func=cmd_xla_check)


DEBUG_VARIABLE = "GRPO_KIT_DEBUG"
"""Set to 1: errors are raised with their full traceback instead of the one-line message."""


def run(args: argparse.Namespace, *, prog: str) -> int:
    """Run a parsed command: a user mistake or an environment failure prints one line naming the command (the
    traceback too with GRPO_KIT_DEBUG=1) and returns 2; anything else is raised."""
    try:
        return args.func(args)
    except (ValueError, OSError, RuntimeError) as e:  # user mistakes and environment failures: one line, no traceback
        if os.environ.get(DEBUG_VARIABLE, "") not in ("", "0"):
            raise
        from .engine.hub import ModelAccessError, redact
        from .train.checkpoint import CheckpointSaveError

        # a setting, a file or an access problem says all there is to say; anything else may be a bug
        explained = isinstance(e, (ValueError, ModelAccessError, CheckpointSaveError))
        hint = "" if explained else f" ({type(e).__name__}; {DEBUG_VARIABLE}=1 shows the traceback)"
        print(redact(f"{prog} {args.command}: error: {e}{hint}"), file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv), prog="grpo-kit")


if __name__ == "__main__":
    raise SystemExit(main())
