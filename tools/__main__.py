"""The repository's own tools, run from a checkout (`python -m tools COMMAND`; the make targets call them):

- `study`: does GRPO beat more SFT? Regimes × seeds on Gemma 3 270M (hours; `make study`).
- `bench`: the kit against HF generate and TRL's GRPOTrainer (`make bench`).
- `scaling`: the scaling model's predictions against runs on 1 and several devices here (`make scaling`).
- `smoke`: a real Gemma end to end: LoRA, one SFT and one GRPO step, adapter and merged-export reloads.

They import the package like any user; nothing in the package imports them, and the wheel does not hold them.
Errors are reported as `grpo-kit` reports them (one line, `GRPO_KIT_DEBUG=1` for the traceback).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

from grpo_kit.cli import run
from grpo_kit.train.config import PRESETS


def _print(obj: dict[str, Any]) -> None:
    print(json.dumps(obj, indent=2, default=str))


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


def cmd_smoke(args: argparse.Namespace) -> int:
    import time

    from .smoke import run_smoke

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
        print(f"python -m tools smoke: FAILED: {why}", file=sys.stderr)
        return 1
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    # TRL runs through accelerate, which picks torch_xla whenever it imports; the comparison is on the CPU
    # (the XLA graph counts run in their own process with XLA on).
    os.environ["USE_TORCH_XLA"] = "0"
    from .bench import BenchSizes, run_bench, write_report

    sizes = BenchSizes.quick() if args.quick else BenchSizes.full()
    if args.no_real_model:
        sizes = dataclasses.replace(sizes, real_model=None)
    result = run_bench(sizes, xla=not args.no_xla, progress=not args.quiet)
    if args.report:
        print(f"wrote {write_report(result, args.report)}", file=sys.stderr)
    summary = {k: v for k, v in result.items() if k != "details"}
    print(json.dumps(summary, default=str) if args.json else json.dumps(summary, indent=2, default=str))
    return 0


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


def _smoke_and_bench_parsers(sub: Any) -> None:
    p = sub.add_parser("smoke", help="a real Gemma end to end: LoRA, one SFT and one GRPO step, adapter "
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
        help="kit vs HF generate and TRL's GRPOTrainer: rollout tokens/s, step time, XLA graphs, accuracy "
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


def cmd_scaling(args: argparse.Namespace) -> int:
    from .scaling import run_scaling, write_report

    if args.predictions_only:
        result = json.loads(Path(args.from_json).read_text()) if args.from_json else None
    else:
        result = run_scaling(progress=not args.quiet)
        Path(args.json_out).write_text(json.dumps(result, indent=1, default=str) + "\n")
    if args.report:
        print(f"wrote {write_report(result, args.report)}", file=sys.stderr)
    return 0


def _scaling_parser(sub: Any) -> None:
    p = sub.add_parser("scaling", help="the scaling model against runs here (1 vs 2 processes, 1 vs 8 XLA devices) "
                       "and its predictions per board (docs/scaling.md)")
    p.add_argument("--json-out", default="docs/scaling.json", help="where the measured runs go (default "
                   "docs/scaling.json)")
    p.add_argument("--report", default=None, help="write the generated tables of this page (docs/scaling.md)")
    p.add_argument("--predictions-only", action="store_true", help="run nothing: the predictions table, and the "
                   "measured one from --from-json")
    p.add_argument("--from-json", default=None, help="with --predictions-only: a scaling.json to report")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.set_defaults(func=cmd_scaling)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tools",
                                     description="The repository's tools: study, bench, smoke, scaling.")
    sub = parser.add_subparsers(dest="command", required=True)
    _study_parser(sub)
    _smoke_and_bench_parsers(sub)
    _scaling_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv), prog="python -m tools")


if __name__ == "__main__":
    raise SystemExit(main())
