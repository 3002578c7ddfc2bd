"""Black-box fault runs: the command line as a user runs it, in the situations that used to lose work.

    python scripts/faults.py [--only NAME ...]

Each scenario prints one JSON line (scenario, ok, detail, seconds); the exit status is 1 if any failed.

- demo-keeps-sft-run      `grpo-kit sft --output-dir X/sft`, then `grpo-kit demo --output-dir X` (and with
                          --overwrite): both refused, X/sft byte for byte as it was.
- full-disk-during-save   `grpo-kit train` on a real 18 MB tmpfs (room for one checkpoint, not two; mounted in a
                          private mount namespace with `unshare`, as root or as a user): the second save fails,
                          exit 2 with one line naming the checkpoint and the free space; the first checkpoint
                          loads. Where no namespace can be made, a file-size limit (RLIMIT_FSIZE) stands in, said so.
- second-trainer-refused  two `grpo-kit train` on one output directory: the second exits 2 naming the first's PID;
                          after the first is killed (SIGKILL), a third starts there.
- push-sends-only-export  `grpo-kit export --push-to` into a folder holding stray files, to a stand-in Hub client:
                          only the files the export wrote are sent, to a new private repository.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable


def kit(*args: str, cwd: Path, **popen: object) -> list[str]:
    return [PYTHON, "-m", "grpo_kit.cli", *args]


def run_kit(*args: str, cwd: Path, timeout: float = 600, **kwargs: object) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GRPO_KIT_CPU_BF16": os.environ.get("GRPO_KIT_CPU_BF16", "0")}
    return subprocess.run(kit(*args, cwd=cwd), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                          **kwargs)


def train(config: str, out: Path, *extra: str) -> tuple[str, ...]:
    """The arguments of `grpo-kit train` on the tiny quick preset, quietly on the CPU, into `out`."""
    return ("train", "--preset", "cpu-tiny-quick", "--config", config, "--output-dir", str(out), "--device", "cpu",
            "--quiet", *extra)


def settings(work: Path, text: str) -> str:
    path = work / f"settings-{abs(hash(text))}.yaml"
    path.write_text(text + "\ntask: {num_test: 8}\n")
    return str(path)


def snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*"))
            if p.is_file() and ".grpo_kit" not in p.parts}


class Failed(AssertionError):
    pass


def expect(condition: bool, what: str) -> None:
    if not condition:
        raise Failed(what)


# -- scenarios ---------------------------------------------------------------------------------------------------------
def demo_keeps_sft_run(work: Path) -> str:
    out = work / "X"
    done = run_kit("sft", "--preset", "cpu-tiny-quick", "--config", settings(work, "sft: {steps: 2}"), "--output-dir",
                   str(out / "sft"), "--device", "cpu", "--quiet", cwd=work)
    expect(done.returncode == 0, f"the SFT run failed: {done.stderr[-500:]}")
    before = snapshot(out)
    for extra in ([], ["--overwrite"]):
        done = run_kit("demo", "--preset", "cpu-tiny-quick", "--output-dir", str(out), "--device", "cpu", "--quiet",
                       *extra, cwd=work)
        expect(done.returncode == 2, f"demo {' '.join(extra)} was not refused (exit {done.returncode})")
        expect(snapshot(out) == before, f"demo {' '.join(extra)} changed the SFT run")
    return f"refused twice ({done.stderr.strip().splitlines()[-1][:160]}…); {len(before)} files of the SFT run kept"


DISK_INNER = """
set -e
mount -t tmpfs -o size=18m tmpfs "$1"
cd "$1"
"$PYTHON" -m grpo_kit.cli train --preset cpu-tiny-quick --config "$2" --output-dir "$1/run" --device cpu --quiet \
  > "$3/stdout" 2> "$3/stderr" || echo $? > "$3/exit"
"$PYTHON" - "$1/run" "$3" <<'EOF'
import json, sys
from pathlib import Path
import torch
from grpo_kit.train.checkpoint import load_checkpoint
from grpo_kit.engine.model_config import ModelConfig
from grpo_kit.engine.models import load_model
run, report = Path(sys.argv[1]), Path(sys.argv[2])
model = load_model(ModelConfig(), torch.device("cpu"))[0]
state = load_checkpoint(run / "checkpoint", model)
names = sorted(p.name for p in run.iterdir())
(report / "after.json").write_text(json.dumps({"step": state["step"], "names": names}))
EOF
"""


def full_disk_during_save(work: Path) -> str:
    mount, report = work / "disk", work / "report"
    mount.mkdir()
    report.mkdir()
    config = settings(work, "grpo: {steps: 4, save_every: 1}")
    env = {**os.environ, "PYTHON": PYTHON, "PYTHONPATH": str(ROOT), "GRPO_KIT_CPU_BF16": "0"}
    namespace = ["unshare", "-m"] if os.geteuid() == 0 else ["unshare", "-r", "-m"]
    done = subprocess.run([*namespace, "sh", "-c", DISK_INNER, "inner", str(mount), config, str(report)], env=env,
                          capture_output=True, text=True, timeout=600) if shutil.which("unshare") else None
    if done is None or ("mount" in done.stderr and not (report / "exit").exists()
                        and not (report / "after.json").exists()):
        return rlimit_stand_in(work, config, why=(done.stderr.strip()[-200:] if done else "no unshare here"))
    expect(done.returncode == 0, f"the check inside the namespace failed: {done.stderr[-800:]}")
    code = (report / "exit").read_text().strip() if (report / "exit").exists() else "0"
    line = (report / "stderr").read_text().strip().splitlines()[-1]
    after = json.loads((report / "after.json").read_text())
    expect(code == "2", f"exit {code}, not 2: {line}")
    expect("could not save the checkpoint" in line and "free on that disk" in line and "previous checkpoint is kept" in
           line, f"the message: {line}")
    expect(after["step"] >= 1 and after["names"] == [".grpo_kit", "checkpoint", "metrics.jsonl"],
           f"after the failure: {after}")
    return f"tmpfs 18 MB: exit 2, step-{after['step']} checkpoint loads; message: {line[:220]}"


def rlimit_stand_in(work: Path, config: str, why: str) -> str:
    import resource

    out = work / "rlimit-run"
    first = run_kit(*train(config.replace("steps: 4", "steps: 1"), out), cwd=work)
    expect(first.returncode == 0, first.stderr[-500:])
    Path(config).write_text(Path(config).read_text())

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))

    done = run_kit(*train(config, out), cwd=work, preexec_fn=limit)
    line = done.stderr.strip().splitlines()[-1]
    expect(done.returncode == 2 and "previous checkpoint is kept" in line, f"exit {done.returncode}: {line}")
    return f"no private tmpfs ({why}); RLIMIT_FSIZE stood in: exit 2; {line[:200]}"


def second_trainer_refused(work: Path) -> str:
    out, config = work / "run", settings(work, "grpo: {steps: 500}")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GRPO_KIT_CPU_BF16": "0"}
    first = subprocess.Popen(kit(*train(config, out), cwd=work), cwd=work, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while not ((out / "metrics.jsonl").exists() and (out / "metrics.jsonl").read_text()):
            expect(first.poll() is None and time.monotonic() < deadline, "the first trainer made no step")
            time.sleep(0.05)
        second = run_kit(*train(config, out), cwd=work)
        line = second.stderr.strip().splitlines()[-1] if second.stderr.strip() else ""
        expect(second.returncode == 2 and f"PID {first.pid}" in line,
               f"second trainer: exit {second.returncode}: {line}")
        expect(first.poll() is None, "the first trainer stopped")
    finally:
        first.kill()
        first.wait()
    third = run_kit(*train(settings(work, "grpo: {steps: 1}"), out, "--overwrite"), cwd=work)
    expect(third.returncode == 0, f"after the first was killed the directory stayed locked: {third.stderr[-300:]}")
    return f"second refused ({line[:140]}); after SIGKILL of the first, a third ran there"


PUSH_INNER = """
import json, sys
from pathlib import Path
import huggingface_hub
from huggingface_hub.utils import filter_repo_objects

sent = []

class StandInHub:
    def __init__(self, token=None): pass
    def repo_info(self, repo_id):
        from huggingface_hub.errors import RepositoryNotFoundError
        error = RepositoryNotFoundError.__new__(RepositoryNotFoundError)
        Exception.__init__(error, "404 Client Error")
        raise error
    def create_repo(self, repo_id, private=None, exist_ok=False):
        sent.append(("create_repo", repo_id, private))
        return "https://huggingface.co/" + repo_id
    def upload_folder(self, repo_id, folder_path, allow_patterns=None, commit_message=None):
        every = [p.relative_to(folder_path).as_posix() for p in Path(folder_path).rglob("*") if p.is_file()]
        sent.append(("upload_folder", repo_id, sorted(filter_repo_objects(every, allow_patterns=allow_patterns))))

huggingface_hub.HfApi = StandInHub
from grpo_kit.cli import main
code = main(sys.argv[2:])
Path(sys.argv[1]).write_text(json.dumps({"exit": code, "calls": sent}))
"""


def push_sends_only_export(work: Path) -> str:
    run, out = work / "run", work / "export"
    done = run_kit("sft", "--preset", "cpu-tiny-quick", "--config", settings(work, "sft: {steps: 1}"), "--output-dir",
                   str(run), "--device", "cpu", "--quiet", cwd=work)
    expect(done.returncode == 0, done.stderr[-500:])
    export = ["export", "--preset", "cpu-tiny-quick", "--checkpoint", str(run / "checkpoint"), "--out", str(out),
              "--device", "cpu", "--quiet"]
    expect(run_kit(*export, cwd=work).returncode == 0, "the first export failed")
    (out / "stray-notes.txt").write_text("not part of the export")
    (out / "old-checkpoint").mkdir()
    (out / "old-checkpoint" / "optimizer.pt").write_bytes(b"nor this")
    report = work / "push.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_TOKEN": "hf_stand_in_token", "GRPO_KIT_CPU_BF16": "0"}
    done = subprocess.run([PYTHON, "-c", PUSH_INNER, str(report), *export, "--push-to", "me/tiny"], cwd=work, env=env,
                          capture_output=True, text=True, timeout=600)
    expect(report.exists(), f"the push run failed: {done.stderr[-500:]}")
    result = json.loads(report.read_text())
    (_, _, private), (_, _, sent) = result["calls"]
    exported = sorted(p.name for p in out.iterdir() if p.is_file() and p.name != "stray-notes.txt")
    expect(result["exit"] == 0 and private is True, f"exit {result['exit']}, private {private}")
    expect(sent == exported and "stray-notes.txt" not in sent and not any("old-checkpoint" in s for s in sent),
           f"sent {sent}")
    return f"sent {len(sent)} files ({', '.join(sent)}) to a new private repo; stray files stayed home"


SCENARIOS: dict[str, Callable[[Path], str]] = {
    "demo-keeps-sft-run": demo_keeps_sft_run,
    "full-disk-during-save": full_disk_during_save,
    "second-trainer-refused": second_trainer_refused,
    "push-sends-only-export": push_sends_only_export,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", choices=sorted(SCENARIOS), default=None)
    names = parser.parse_args().only or list(SCENARIOS)
    failed = 0
    for name in names:
        work, start = Path(tempfile.mkdtemp(prefix=f"faults-{name}-")), time.perf_counter()
        try:
            detail, ok = SCENARIOS[name](work), True
        except (Failed, subprocess.TimeoutExpired) as e:
            detail, ok = str(e), False
        failed += not ok
        seconds = round(time.perf_counter() - start, 1)
        print(json.dumps({"scenario": name, "ok": ok, "detail": detail, "seconds": seconds}), flush=True)
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
