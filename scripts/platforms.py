"""Platform replicas: every notebook run the way a user runs it on Colab or Kaggle (`make platforms`).

A replica is a virtualenv holding the package versions a hosted runtime ships (requirements/platforms/NAME.txt,
read from the runtime's published list) and the environment variables it sets. Each notebook then gets what a
user gets there: its own machine (a fresh copy of that virtualenv, hard-linked, and a fresh working directory
with only the .ipynb in it), a fresh Jupyter kernel, and a first cell that runs the notebooks' installer
(notebooks/install.py at the kit's commit, given as the file:// URL GRPO_KIT_INSTALLER where a user's cell 1 fetches
it from GitHub) and installs the kit from GRPO_KIT_SOURCE — a `git+file://` URL of this repository at the commit
the notebooks' cell 1 pins (what a user gets; `--kit head` installs the committed HEAD instead), the same pip code
path as the GitHub URL. Each replica
is built from its runtime's Python (Colab TPU 3.13, Kaggle TPU 3.12, Colab GPU 3.12), found under pyenv or on
PATH; a replica whose Python is missing here says so and fails. A TPU is stood in for by the XLA CPU client
(PJRT_DEVICE=CPU, CPU_NUM_DEVICES chips, TPU_ACCELERATOR_TYPE as the runtime sets it), so the kit takes its TPU
code path; only PJRT's device type differs.

    python scripts/platforms.py [--replica NAME ...] [--notebook GLOB] [--kit pinned|head]

prints one JSON line per replica (platform, python, kit, notebooks_passed, notebooks_total, seconds, xla_devices,
recompiles_after_warmup, preinstalled_unchanged, failures), then one for the broken runtimes in BAD_INPUTS
(a wrong GRPO_KIT_SOURCE, a TPU without torch_xla, torch_xla of another torch: each must stop with one message
naming the fix), and exits non-zero if a notebook failed, a preinstalled package changed version, a TPU replica
saw the wrong device count or recompiled after warm-up, or a broken runtime did not stop as expected.
Executed notebooks and logs are kept in .platforms/NAME/runs/.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import release  # scripts/release.py: how a notebook's cell 1 names its release

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".platforms"


def find_python(version: str) -> tuple[str | None, str]:
    """The interpreter of Python `version` (major.minor) here, and its full version; (None, why) where there is none.
    Looked for under pyenv's versions, then as `python<version>` on PATH (a pyenv shim of a version pyenv has not
    selected fails to run, so every candidate is run)."""
    root = subprocess.run(["pyenv", "root"], capture_output=True, text=True).stdout.strip() if shutil.which(
        "pyenv") else ""
    candidates = sorted(Path(root, "versions").glob(f"{version}.*/bin/python{version}"), reverse=True) if root else []
    candidates += [Path(p) for p in [shutil.which(f"python{version}")] if p]
    for candidate in candidates:
        found = subprocess.run([str(candidate), "-c", "import sys, platform; print(sys.executable); "
                                "print(platform.python_version())"], capture_output=True, text=True)
        lines = found.stdout.split()
        if found.returncode == 0 and len(lines) == 2 and lines[1].startswith(f"{version}."):
            return os.path.realpath(lines[0]), lines[1]
    return None, f"no Python {version} here (looked under pyenv's versions and for python{version} on PATH)"


@dataclass(frozen=True)
class Replica:
    name: str
    python: str  # the runtime's Python, major.minor, as its image ships it
    env: dict[str, str] = field(default_factory=dict)
    xla_devices: int = 0  # XLA devices the notebooks must see (0: no TPU on this runtime)

    @property
    def requirements(self) -> Path:
        return ROOT / "requirements" / "platforms" / f"{self.name}.txt"


REPLICAS = {
    r.name: r for r in [
        Replica("colab-tpu", "3.13", {"COLAB_RELEASE_TAG": "replica", "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "1",
                              "TPU_ACCELERATOR_TYPE": "v5litepod-1"}, xla_devices=1),
        Replica("kaggle-tpu", "3.12", {"KAGGLE_KERNEL_RUN_TYPE": "Interactive", "PJRT_DEVICE": "CPU",
                                       "CPU_NUM_DEVICES": "8", "TPU_ACCELERATOR_TYPE": "v5litepod-8"}, xla_devices=8),
        # No GPU on this machine: Colab's GPU package set and install path, run by the CPU. Colab's runtimes share
        # one image line; its GPU list names no Python, and 3.12 is what its wheels there are built for.
        Replica("colab-gpu", "3.12", {"COLAB_RELEASE_TAG": "replica", "CUDA_VISIBLE_DEVICES": ""}),
    ]
}


def _run(cmd: list[str], log: Path, **kwargs) -> None:
    with log.open("a") as out:
        out.write(f"$ {' '.join(map(str, cmd))}\n")
        out.flush()
        done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, **kwargs)
    if done.returncode:
        tail = "\n".join(log.read_text().splitlines()[-25:])
        raise SystemExit(
            f"platforms: `{' '.join(map(str, cmd))}` failed (exit {done.returncode}); end of {log}:\n{tail}")


def base_venv(replica: Replica) -> Path:
    """The replica's preinstalled packages in .platforms/NAME/base, on the runtime's Python (rebuilt when its
    requirement file or interpreter changes); base/preinstalled.json records every distribution's version right
    after the install. SystemExit where that Python is missing here."""
    python_path, why = find_python(replica.python)
    if python_path is None:
        raise SystemExit(f"platforms: {replica.name} runs Python {replica.python}: {why}")
    base = WORK / replica.name / "base"
    digest = hashlib.sha256(replica.requirements.read_bytes() + python_path.encode()).hexdigest()
    stamp = base / ".requirements.sha256"
    if stamp.exists() and stamp.read_text() == digest:
        return base
    shutil.rmtree(base, ignore_errors=True)
    base.parent.mkdir(parents=True, exist_ok=True)
    log = WORK / replica.name / "build.log"
    log.write_text("")
    print(f"[{replica.name}] building the runtime's package set (log: {log.relative_to(ROOT)})", file=sys.stderr)
    _run([python_path, "-m", "venv", str(base)], log)
    python = str(base / "bin" / "python")
    _run([python, "-m", "pip", "install", "--quiet", "--upgrade", "pip"], log)
    _run([python, "-m", "pip", "install", "-r", str(replica.requirements)], log)
    (base / "preinstalled.json").write_text(json.dumps(installed_versions(base / "bin" / "python"), indent=1))
    stamp.write_text(digest)
    return base


VERSIONS_SCRIPT = (
    "import importlib.metadata as m, json, re\n"
    "seen = {}\n"
    "for d in m.distributions():\n"
    "    name = re.sub(r'[-_.]+', '-', d.metadata['Name']).lower()\n"
    "    seen.setdefault(name, d.version)  # the first on sys.path is the one imported\n"
    "print(json.dumps(seen))\n"
)


def installed_versions(python: Path) -> dict[str, str]:
    # -I: not this checkout's own metadata (grpo_kit.egg-info), which the working directory would put first
    out = subprocess.run([str(python), "-I", "-c", VERSIONS_SCRIPT], check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def fresh_machine(replica: Replica, base: Path, notebook: Path, label: str) -> tuple[Path, Path, dict[str, str]]:
    """One notebook's machine: a hard-linked copy of the replica's virtualenv (pip may change it freely; the
    base stays as built), an empty working directory holding only the notebook, fresh caches, the runtime's
    environment variables. Returns (venv, workdir, env)."""
    home = WORK / replica.name / "runs" / label
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    venv = home / "venv"
    subprocess.run(["cp", "-al", str(base), str(venv)], check=True)
    workdir = home / "content"
    workdir.mkdir()
    (home / "home").mkdir()
    shutil.copy(notebook, workdir / notebook.name)
    installer = home / "install.py"  # what cell 1 fetches from GitHub: notebooks/install.py at the kit's commit
    installer.write_text(installer_text())
    kernel_dir = home / "jupyter" / "kernels" / "replica"
    kernel_dir.mkdir(parents=True)
    kernel = {"argv": [str(venv / "bin" / "python"), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
              "display_name": replica.name, "language": "python"}
    (kernel_dir / "kernel.json").write_text(json.dumps(kernel))
    env = {
        "PATH": f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin", "HOME": str(home / "home"),
        "LANG": "C.UTF-8", "VIRTUAL_ENV": str(venv), "JUPYTER_PATH": str(home / "jupyter"),
        "JUPYTER_DATA_DIR": str(home / "jupyter"), "JUPYTER_CONFIG_DIR": str(home / "jupyter" / "config"),
        "XDG_CACHE_HOME": str(home / "cache"), "HF_HOME": str(home / "cache" / "huggingface"),
        "MPLCONFIGDIR": str(home / "cache" / "matplotlib"), "MPLBACKEND": "module://matplotlib_inline.backend_inline",
        # pip's download cache is kept, as a fast mirror of PyPI; what it installs is still decided afresh
        "PIP_CACHE_DIR": os.environ.get("PIP_CACHE_DIR", str(Path.home() / ".cache" / "pip")),
        "GRPO_KIT_QUICK": os.environ.get("GRPO_KIT_QUICK", "1"), "GRPO_KIT_SOURCE": source_url(),
        "GRPO_KIT_INSTALLER": installer.as_uri(),
        "GRPO_KIT_SOLUTIONS": "1",  # the exercises solved (grpo_kit/course/exercises.py), as in `make test`
        "TF_CPP_MIN_LOG_LEVEL": "2", "PYDEVD_DISABLE_FILE_VALIDATION": "1", **replica.env,
    }
    for keep in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_CONFIG_FILE", "http_proxy",
                 "https_proxy"):
        if keep in os.environ:
            env[keep] = os.environ[keep]
    return venv, workdir, env


@dataclass(frozen=True)
class Kit:
    """What cell 1 installs on the replicas: `source` (GRPO_KIT_SOURCE), shown as `label`, expected at `commit`."""

    source: str
    label: str
    commit: str | None


def pinned_release() -> tuple[str, str]:
    """The (release, commit) every notebook's cell 1 pins; SystemExit when they differ."""
    pins = {pin for path in release.notebooks() for pin in release.pinned(path.read_text())}
    if len(pins) != 1:
        raise SystemExit(f"platforms: the notebooks pin {len(pins)} releases ({sorted(pins)}), not one")
    return pins.pop()


def choose_kit(which: str) -> Kit:
    """`pinned`: this repository at the commit the notebooks pin, as a user gets it; `head`: the committed HEAD
    (a developer's check of unreleased work). PLATFORM_KIT_SOURCE overrides both."""
    if "PLATFORM_KIT_SOURCE" in os.environ:
        return Kit(os.environ["PLATFORM_KIT_SOURCE"], f"PLATFORM_KIT_SOURCE={os.environ['PLATFORM_KIT_SOURCE']}", None)
    if which == "head":
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
        return Kit(f"git+file://{ROOT}", f"head {head[:12]}", head)
    release, commit = pinned_release()
    return Kit(f"git+file://{ROOT}@{commit}", f"pinned {release} {commit[:12]}", commit)


KIT: Kit | None = None  # chosen in main()


def source_url() -> str:
    """GRPO_KIT_SOURCE for the notebooks' install cell (`choose_kit`)."""
    return KIT.source if KIT is not None else choose_kit("pinned").source


def installer_text() -> str:
    """notebooks/install.py as cell 1 fetches it: at the kit's commit, or this checkout's with PLATFORM_KIT_SOURCE."""
    commit = KIT.commit if KIT is not None else choose_kit("pinned").commit
    if commit is None:
        return (ROOT / "notebooks" / "install.py").read_text()
    return subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:notebooks/install.py"], capture_output=True,
                          text=True, check=True).stdout


def installed_commit(python: Path) -> str | None:
    """The commit pip installed grpo-kit from (its direct_url.json), or None."""
    script = ("import importlib.metadata as m, json\n"
              "try: print(json.loads(m.distribution('grpo-kit').read_text('direct_url.json'))"
              "['vcs_info']['commit_id'])\n"
              "except Exception: print('')")
    out = subprocess.run([str(python), "-I", "-c", script], capture_output=True, text=True).stdout.strip()
    return out or None


def grpo_runs(workdir: Path) -> list[list[dict]]:
    """The metrics.jsonl of every GRPO run a notebook left (rows with a reward_mean)."""
    runs = []
    for path in sorted(workdir.rglob("metrics.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if rows and "reward_mean" in rows[0]:
            runs.append(rows)
    return runs


def run_notebook(replica: Replica, base: Path, notebook: Path, timeout: int, *, env_extra: dict | None = None,
                 preinstall: list[str] | None = None, label: str | None = None) -> dict:
    """Run one notebook on a fresh machine of `replica` (after `pip install *preinstall` there, to set up a broken
    runtime) and report what happened: ok / the error the user saw, seconds, changed preinstalled packages, the
    GRPO runs' recompiles and XLA device counts."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError

    venv, workdir, env = fresh_machine(replica, base, notebook, label or notebook.stem)
    env.update(env_extra or {})
    if preinstall:
        _run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", *preinstall],
             workdir.parent / "preinstall.log")
    nb = nbformat.read(workdir / notebook.name, as_version=4)
    client = NotebookClient(nb, kernel_name="replica", timeout=timeout, resources={"metadata": {"path": str(workdir)}})
    start = time.time()
    error = None
    os.environ["JUPYTER_PATH"] = env["JUPYTER_PATH"]  # where nbclient looks the kernel up
    kernel_log = (workdir.parent / "kernel.log").open("w")  # XLA's and the kernel's own stderr
    try:
        client.execute(env=env, cwd=str(workdir), stdout=kernel_log, stderr=kernel_log)
    except (CellExecutionError, CellTimeoutError) as exc:
        error = str(exc).strip().splitlines()[-1][:300] if str(exc).strip() else type(exc).__name__
    except Exception as exc:  # noqa: BLE001 - a kernel that died is a failed notebook, reported with its reason
        error = f"{type(exc).__name__}: {exc}"[:300]
    seconds = time.time() - start
    kernel_log.close()
    nbformat.write(nb, workdir.parent / f"executed-{notebook.name}")
    preinstalled = json.loads((base / "preinstalled.json").read_text())
    now = installed_versions(venv / "bin" / "python")
    changed = {k: f"{v} → {now.get(k, 'removed')}" for k, v in preinstalled.items() if now.get(k) != v}
    runs = grpo_runs(workdir)
    recompiles = sum(int(r.get("xla_recompiles_step", 0)) for rows in runs for r in rows)  # GRPO steps after warm-up
    devices = sorted({int(r["xla_devices"]) for rows in runs for r in rows if "xla_devices" in r})
    shown = next(
        (o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"), None
    )
    if shown is not None:
        error = f"{shown.ename}: {shown.evalue}"
    commit = installed_commit(venv / "bin" / "python")
    if error is None and KIT is not None and KIT.commit and commit != KIT.commit:
        error = f"the notebook ran with grpo-kit from commit {commit}, not {KIT.commit}"
    return {"notebook": notebook.name, "ok": error is None, "error": error, "seconds": round(seconds, 1),
            "traceback_lines": len("\n".join(shown.traceback).splitlines()) if shown is not None else 0,
            "changed": changed, "grpo_runs": len(runs), "recompiles_after_warmup": recompiles, "xla_devices": devices,
            "kit_installed": now.get("grpo-kit"), "kit_commit": commit}


def run_replica(replica: Replica, notebooks: list[Path], timeout: int) -> dict:
    python_path, version = find_python(replica.python)
    if python_path is None:
        return {"platform": replica.name, "python": f"{replica.python} missing: {version}", "kit": KIT.label,
                "notebooks_passed": 0, "notebooks_total": len(notebooks), "failures": {"python": version}}
    base = base_venv(replica)
    start = time.time()
    results = []
    for notebook in notebooks:
        print(f"[{replica.name}] {notebook.name} …", file=sys.stderr, flush=True)
        result = run_notebook(replica, base, notebook, timeout)
        status = "ok" if result["ok"] else f"FAILED: {result['error']}"
        print(f"[{replica.name}] {notebook.name} {status} ({result['seconds']:.0f} s)", file=sys.stderr, flush=True)
        results.append(result)
    (WORK / replica.name / "report.json").write_text(json.dumps(results, indent=1))
    devices = sorted({d for r in results for d in r["xla_devices"]})
    return {
        "platform": replica.name,
        "python": version,
        "kit": KIT.label,
        "notebooks_passed": sum(r["ok"] for r in results),
        "notebooks_total": len(results),
        "seconds": round(time.time() - start),
        "xla_devices": devices[0] if len(devices) == 1 else devices,
        "recompiles_after_warmup": sum(r["recompiles_after_warmup"] for r in results),
        "preinstalled_unchanged": not any(r["changed"] for r in results),
        "failures": {r["notebook"]: r["error"] or r["changed"] for r in results if not r["ok"] or r["changed"]},
    }


# A broken runtime must stop in the first cell that needs what is missing, with one message naming the fix.
BAD_INPUTS = [
    {"case": "wrong GRPO_KIT_SOURCE", "replica": "colab-tpu", "notebook": "00_setup",
     "env": {"GRPO_KIT_SOURCE": "git+file:///nonexistent/grpo_kit"},
     "expect": "SystemExit: pip could not install grpo-kit from git+file:///nonexistent/grpo_kit"},
    {
        "case": "TPU runtime without torch_xla",
        "replica": "colab-gpu",
        "notebook": "02_sft_warmup",
        "env": {"TPU_ACCELERATOR_TYPE": "v5litepod-1", "PJRT_DEVICE": "CPU"},
        "expect": "SetupError: this is a TPU runtime, but torch_xla is not installed: run  %pip install "
                  "'torch_xla[tpu]~=2.11.0'",
    },
    {"case": "torch_xla of another torch release", "replica": "kaggle-tpu", "notebook": "02_sft_warmup",
     "preinstall": ["--no-deps", "torch_xla==2.9.0"],
     "expect": "SetupError: torch_xla 2.9.0 does not match torch 2.8.0: run  %pip install 'torch_xla[tpu]~=2.8.0'"},
]
MAX_ERROR_LINES = 4  # the message (and IPython's one-line note for SystemExit), not a wall of frames


def run_bad_inputs(names: list[str], timeout: int) -> dict:
    results = []
    for case in BAD_INPUTS:
        if case["replica"] not in names:
            continue
        replica = REPLICAS[case["replica"]]
        notebook = ROOT / "notebooks" / f"{case['notebook']}.ipynb"
        result = run_notebook(replica, base_venv(replica), notebook, timeout, env_extra=case.get("env"),
                              preinstall=case.get("preinstall"), label=f"bad-input-{notebook.stem}")
        held = (not result["ok"] and (result["error"] or "").startswith(case["expect"])
                and result["traceback_lines"] <= MAX_ERROR_LINES)
        print(f"[bad input] {case['case']}: {'as expected' if held else 'NOT as expected'} — {result['error']!r} "
              f"({result['traceback_lines']} lines)", file=sys.stderr, flush=True)
        results.append({"case": case["case"], "ok": held, "error": result["error"], "lines": result["traceback_lines"]})
    return {"platform": "bad-inputs", "cases_passed": sum(r["ok"] for r in results), "cases_total": len(results),
            "failures": {r["case"]: r["error"] for r in results if not r["ok"]}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replica", action="append", choices=sorted(REPLICAS), help="default: all three")
    parser.add_argument("--notebook", default="*", help="glob over notebooks/*.ipynb names (default: all)")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds one cell may run")
    parser.add_argument("--kit", choices=("pinned", "head"), default="pinned",
                        help="install the commit the notebooks pin (default: what users get) or the committed HEAD")
    parser.add_argument("--build-only", action="store_true", help="build the replicas' package sets and stop")
    parser.add_argument("--no-bad-inputs", action="store_true", help="skip the broken-runtime cases")
    parser.add_argument("--only-bad-inputs", action="store_true", help="run the broken-runtime cases only")
    args = parser.parse_args()
    names = args.replica or list(REPLICAS)
    if args.build_only:
        for name in names:
            base_venv(REPLICAS[name])
        return
    global KIT
    KIT = choose_kit(args.kit)
    if "PLATFORM_KIT_SOURCE" not in os.environ and args.kit == "head":
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        if dirty:
            print(
                "platforms: the notebooks install the committed HEAD (git+file://); uncommitted changes are not in it",
                file=sys.stderr)
    notebooks = sorted((ROOT / "notebooks").glob(f"{args.notebook}.ipynb"))
    if not notebooks:
        raise SystemExit(f"platforms: no notebook matches --notebook {args.notebook!r} in notebooks/")
    failed = False
    for name in [] if args.only_bad_inputs else names:
        line = run_replica(REPLICAS[name], notebooks, args.timeout)
        expected = REPLICAS[name].xla_devices
        failed |= (line["notebooks_passed"] < line["notebooks_total"] or not line.get("preinstalled_unchanged")
                   or (expected and (line.get("xla_devices") != expected or line.get("recompiles_after_warmup"))))
        print(json.dumps(line), flush=True)
    if not args.no_bad_inputs:
        line = run_bad_inputs(names, args.timeout)
        failed |= line["cases_passed"] < line["cases_total"]
        print(json.dumps(line), flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
