"""Time every notebook of the course with the tiny Gemma on this machine in full mode (exercises solved; 08 and 09
train a real Gemma for their preset's time budget and are left out), write `grpo_kit/assets/course_minutes.json`, keep
the
executed notebooks in runs/course-times/ (the guided experiments' verdicts are in their outputs), and put each
notebook's time header (`course.header`) into its first cell. `make course-times`; nothing else running (two torch
processes on 2 cores slow each other many times over).

    python scripts/course_times.py [--notebooks 00 03] [--headers-only]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from grpo_kit.course.modes import BUDGETED_NOTEBOOKS, HEADER_MARK, MINUTES_FILE, header  # noqa: E402
from grpo_kit.engine.device import describe_machine  # noqa: E402

OUT = ROOT / "runs" / "course-times"


def run(path: Path, runs: Path) -> float:
    """Minutes to execute `path` top to bottom in full mode in a fresh kernel, in a scratch directory, keeping
    checkpoints in `runs` (shared by the notebooks of one pass, in order, as Drive or /kaggle/working keeps them for a
    learner); the executed notebook goes to runs/course-times/."""
    nb = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory() as scratch:
        os.environ.update(GRPO_KIT_QUICK="0", GRPO_KIT_SOLUTIONS="1", GRPO_KIT_RUNS_DIR=str(runs))
        start = time.perf_counter()
        try:
            NotebookClient(nb, timeout=7200, kernel_name="python3", resources={"metadata": {"path": scratch}}).execute()
        finally:
            OUT.mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, OUT / path.name)
        return round((time.perf_counter() - start) / 60, 1)


def write_headers() -> None:
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        lines = [line for line in nb.cells[0].source.splitlines() if not line.startswith(HEADER_MARK)]
        start = next(i for i, line in enumerate(lines) if line.startswith("*Runtime:"))
        end = next((i for i in range(start, len(lines)) if not lines[i].strip()), len(lines))  # that paragraph's end
        text = "\n".join([*lines[:end], "", header(path.name[:2]), *lines[end:]])
        while "\n\n\n" in text:
            text = text.replace("\n\n\n", "\n\n")
        nb.cells[0].source = text
        nbformat.write(nb, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--notebooks", nargs="*", help="numbers (default: all)")
    parser.add_argument("--headers-only", action="store_true", help="only rewrite the headers from the JSON")
    args = parser.parse_args()
    if not args.headers_only:
        table = json.loads(MINUTES_FILE.read_text()) if MINUTES_FILE.exists() else {}
        machine = describe_machine()
        cpu = re.sub(r"\(R\)|\(TM\)| Processor| CPU", "", machine.get("cpu_model", "a CPU")).strip()
        table.update(machine=machine, machine_short=f"a {machine['cpu_count']}-core {cpu}")
        with tempfile.TemporaryDirectory() as runs:
            for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
                if (args.notebooks and path.name[:2] not in args.notebooks) or path.name[:2] in BUDGETED_NOTEBOOKS:
                    continue  # they run for their preset's time budget
                minutes = run(path, runs=Path(runs))
                table.setdefault("full", {})[path.name[:2]] = minutes
                print(json.dumps({"notebook": path.name, "minutes": minutes}), flush=True)
                MINUTES_FILE.write_text(json.dumps(table, indent=2) + "\n")
    write_headers()


if __name__ == "__main__":
    main()
