"""The package's shape: its public API, what notebooks may import, the subpackages' import rules, the repository's
tools kept out of the wheel, short functions and named arguments, option lists written once."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import grpo_kit as gk

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "grpo_kit"


def test_every_public_name_resolves_and_internal_names_do_not():
    for name in gk.__all__:
        assert getattr(gk, name) is not None, name
    assert callable(gk.evaluate) and callable(gk.plan), "a public function is shadowed by its module"
    assert gk.plan_table.__module__ == "grpo_kit.eval.planner" and gk.plan_table.__name__ == "table"
    with pytest.raises(AttributeError, match="no attribute 'sample'"):
        gk.sample  # noqa: B018 - internal, not public


def test_import_is_cheap_and_leaves_transformers_and_torch_xla_unloaded():
    # the CLI sets torch_xla's environment (device count, PJRT) before torch_xla loads; transformers imports
    # an installed torch_xla by itself, so neither may load with the package
    code = "import sys, grpo_kit; print(sorted(m for m in ('transformers', 'torch_xla', 'peft') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def notebook_code(path: Path) -> str:
    cells = json.loads(path.read_text())["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")


@pytest.mark.parametrize("path", sorted((ROOT / "notebooks").glob("*.ipynb")), ids=lambda p: p.stem)
def test_notebooks_use_only_the_public_api(path):
    code = notebook_code(path)
    assert not re.findall(r"(?:from|import) grpo_kit\.\w+", code), "a notebook imports a private module"
    imported = [n.strip().split(" as ")[0] for group in re.findall(r"from grpo_kit import ([^\n]+)", code)
                for n in group.split(",")]
    assert imported, "the notebook imports nothing from grpo_kit"
    assert set(imported) <= set(gk.__all__), sorted(set(imported) - set(gk.__all__))


def module_name(path: Path) -> str:
    """A package file's module under grpo_kit: `train.grpo`, `options`, `course` (a subpackage's __init__)."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts) or "__init__"


def module_imports(path: Path) -> set[str]:
    """The grpo_kit modules a package file imports anywhere in its body (function-level imports included), as
    module names under grpo_kit (`engine.device`); `from . import x` counts as the module x where x is one, and an
    import of the repository's `tools` as `tools`."""
    here = list(path.parent.relative_to(PACKAGE).parts)  # the package a relative import starts from
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = here[: len(here) - (node.level - 1)]
            target = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names if not node.module else []:
                if (PACKAGE / Path(*target.split("."), f"{alias.name}.py")).exists() if target else (
                        PACKAGE / f"{alias.name}.py").exists():
                    found.add(f"{target}.{alias.name}" if target else alias.name)
            if node.module:
                found.add(target)
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            for name in names:
                if name.startswith("grpo_kit."):
                    found.add(name.removeprefix("grpo_kit."))
                elif name.split(".")[0] == "tools":
                    found.add("tools")
    return found - {module_name(path), ""}


def import_graph() -> dict[str, set[str]]:
    return {module_name(p): module_imports(p) for p in PACKAGE.rglob("*.py")}


def test_no_import_cycle_among_modules():
    graph = import_graph()
    subpackages = {m for m in graph if (PACKAGE / m.replace(".", "/") / "__init__.py").exists()}
    assert set().union(*graph.values()) - subpackages <= set(graph), "an import names a module that does not exist"
    order, state = [], {}

    def visit(module: str, path: list[str]) -> None:
        if state.get(module) == "done" or module not in graph:
            return
        assert state.get(module) != "open", "import cycle: " + " -> ".join([*path, module])
        state[module] = "open"
        for dep in sorted(graph[module]):
            visit(dep, [*path, module])
        state[module] = "done"
        order.append(module)

    for module in sorted(graph):
        visit(module, [])
    assert order.index("engine.device") < order.index("engine.models") < order.index("train.grpo")


FOUNDATIONS = {"options", "validation"}
"""Top-level modules every subpackage may import: the allowed values of choice settings and the checks."""

SUBPACKAGES: dict[str, set[str]] = {
    "algo": set(),
    "data": set(),
    "engine": {"data"},
    "train": {"algo", "data", "engine"},
    "eval": {"algo", "data", "engine", "train"},
    "course": {"algo", "data", "engine", "train", "eval"},
}
"""What each subpackage may import besides itself and the foundations (docs/architecture.md's import rules)."""


def test_each_subpackage_imports_only_what_its_rule_allows():
    graph = import_graph()
    assert {m.split(".")[0] for m in graph if "." in m} == set(SUBPACKAGES), "a subpackage without an import rule"
    broken = []
    for module, deps in sorted(graph.items()):
        top = module.split(".")[0]
        if top in SUBPACKAGES:
            allowed = SUBPACKAGES[top] | {top} | FOUNDATIONS
        elif module in FOUNDATIONS:
            allowed = set()
        else:  # the entry points: __init__ (gk.*) and cli
            assert module in ("__init__", "cli"), f"{module}: a top-level module that is neither a foundation nor " \
                                                 "an entry point"
            allowed = set(SUBPACKAGES) | FOUNDATIONS
        broken += [f"{module} imports {dep}" for dep in sorted(deps) if dep.split(".")[0] not in allowed]
    assert not broken, broken
    course_users = sorted(m for m, deps in graph.items() if any(d.split(".")[0] == "course" for d in deps)
                          and m.split(".")[0] != "course")
    assert set(course_users) <= {"__init__", "cli"}, f"the course is imported by {course_users}"


def test_math_modules_import_only_the_foundations_and_the_sampler_never_imports_the_log_probs():
    graph = import_graph()
    for module in ("algo.losses", "algo.advantages", "algo.difficulty"):
        assert graph[module] <= FOUNDATIONS, f"{module} imports {sorted(graph[module] - FOUNDATIONS)}: it is pure math"
    assert "engine.logprobs" not in graph["engine.sampling"], "the sampler generates; log-probs live in logprobs.py"
    for name in ("completion_logprobs", "packed_logprobs", "token_logprobs_and_entropy", "frozen_head_logprobs",
                 "logprobs_from_head_mean", "logit_chunks"):  # one home: defined in logprobs.py and nowhere else
        homes = [p.stem for p in PACKAGE.rglob("*.py") if re.search(rf"^def {name}\(", p.read_text(), re.M)]
        assert homes == ["logprobs"], (name, homes)


def test_the_cpu_fast_paths_sit_behind_the_engine_and_lean_on_the_token_choice_math_only():
    """engine/cpu/ (bf16 and prepacked products, the streamed head) imports torch, `engine.choice` and itself only,
    and only the engine imports it: the rest of the kit reaches the fast paths through the sampler and the
    log-probs, never by name."""
    graph = import_graph()
    fast = {m for m in graph if m.startswith("engine.cpu.")}
    assert fast >= {"engine.cpu.products", "engine.cpu.streamed_head"}, fast
    fast.add("engine.cpu")  # `from ..engine.cpu import products` names the subpackage
    for module in sorted(fast):
        assert graph.get(module, set()) <= fast | {"engine.choice"}, (module, sorted(graph[module]))
    users = sorted(m for m, deps in graph.items() if deps & fast and not m.startswith("engine."))
    assert not users, f"outside the engine {users} import the CPU's fast paths"


def test_the_trainers_share_one_loop():
    """Optimizer, clip-and-guard step, skip guard, save-due check, checkpoint save/restore with its resume check,
    progress bar and time limit: written once, in loop.py; the trainers are their algorithms."""
    shared = {"torch.optim.AdamW(": "the optimizer", "clip_grad_norm_(": "the clipped step",
              "tqdm(": "the progress bar", "check_skipped_in_a_row(": "the skip guard", "save_checkpoint(": "saving",
              "load_checkpoint(": "loading", "self._last_save >=": "the save-due check",
              "resume with the same value": "the resume check", "max_seconds": "the time limit",
              "claim(": "the output directory's claim"}
    for trainer in ("sft", "grpo", "rft"):
        code = "\n".join(line for line in (PACKAGE / "train" / f"{trainer}.py").read_text().splitlines()
                         if not line.lstrip().startswith(("#", '"""')))
        repeats = [what for needle, what in shared.items() if needle in code]
        assert not repeats, f"{trainer}.py repeats the shared loop's {repeats}: use loop.TrainingLoop"
    from grpo_kit.train.loop import TrainingLoop

    assert issubclass(gk.SFTTrainer, TrainingLoop) and issubclass(gk.GRPOTrainer, TrainingLoop)
    for policy in ("host_syncs_are_cheap(self.device):\n            # XLA compiles", "def _reuses_sampler_head",
                   "def _cpu_bf16", "def _rollout_product_dtype"):  # speed/XLA policies live with the sampler
        assert policy not in (PACKAGE / "train" / "grpo.py").read_text(), policy


def test_the_repositorys_tools_stay_out_of_the_package():
    importers = sorted(module for module, deps in import_graph().items() if "tools" in deps)
    assert not importers, f"package modules import the repository's tools/: {importers}"
    assert not (PACKAGE / "devtools").exists() and not (PACKAGE / "study.py").exists()
    assert not (ROOT / "benchmarks").exists(), "benchmarks live in tools/"


def string_constants(path: Path) -> list[tuple[int, str]]:
    """The string literals of a package file that are not docstrings (the values the code uses)."""
    tree = ast.parse(path.read_text())
    docs = {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body
            and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs]


REPOSITORY_PATHS = re.compile(
    r"^(?:\./)?(?:docs|notebooks|scripts|tools|tests)/|^(?:CHANGELOG|CONTRIBUTING)\.md$")


def test_no_package_code_names_a_path_in_the_repository():
    """The wheel works wherever it is installed: no module reads or writes the repository's docs/, notebooks/ or
    pages (a path relative to the working directory is a checkout's); the tools that do live in tools/."""
    found = [f"{path.relative_to(ROOT)}:{line} {value!r}" for path in package_sources()
             for line, value in string_constants(path) if REPOSITORY_PATHS.search(value)]
    assert not found, found


def test_the_wheel_holds_the_package_and_none_of_the_tools(tmp_path):
    """`pip install .` installs what `pip wheel .` builds: the package, its assets, and no study or benchmark."""
    import shutil
    import zipfile

    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv*", ".platforms", "runs", "*.egg-info", "build", "__pycache__", ".pytest_cache", "notebooks",
        "docs"))
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w",
                            str(tmp_path / "wheel"), str(source)], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = (tmp_path / "wheel").glob("grpo_kit-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"grpo_kit"}, tops
    assert "grpo_kit/train/grpo.py" in names and "grpo_kit/assets/models/tiny-gemma/config.json" in names
    shipped_tools = [n for n in names if re.search(r"(study|bench|smoke|gpu_check|plan_vs_measured|rft_rate)\.py$", n)]
    assert not shipped_tools, shipped_tools


def package_sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


SHAPE_METHODS = {"view", "reshape", "permute", "expand", "repeat", "transpose", "new_zeros", "new_full", "new_ones",
                 "new_empty", "narrow", "checkpoint"}


def parameter_names(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    """Every parameter a caller can pass (positional, keyword-only, and *args/**kwargs), bar self and cls."""
    args = node.args
    names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
    names += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
    return [n for n in names if n not in ("self", "cls")]


def test_functions_are_short_take_few_parameters_and_long_calls_name_their_arguments():
    long_functions, many_parameters, positional_calls = [], [], []
    for path in package_sources():
        for node in ast.walk(ast.parse(path.read_text())):
            where = f"{path.relative_to(ROOT)}:{node.lineno}" if hasattr(node, "lineno") else ""
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if node.end_lineno - node.lineno + 1 > 60:
                    long_functions.append(f"{where} {node.name} ({node.end_lineno - node.lineno + 1} lines)")
                if len(parameter_names(node)) > 8:
                    many_parameters.append(f"{where} {node.name} ({len(parameter_names(node))} parameters)")
            if isinstance(node, ast.Call) and len([a for a in node.args if not isinstance(a, ast.Starred)]) > 5:
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "?")
                if name not in SHAPE_METHODS:
                    positional_calls.append(f"{where} {name}(...) with {len(node.args)} positional arguments")
    assert not long_functions, long_functions
    assert not many_parameters, many_parameters
    assert not positional_calls, positional_calls


def test_the_parameter_count_sees_every_kind_of_parameter():
    tree = ast.parse("def f(self, a, /, b, *args, c, d=1, **kwargs): pass")
    assert parameter_names(tree.body[0]) == ["a", "b", "c", "d", "args", "kwargs"]


def test_each_option_list_is_the_one_the_code_dispatches_on():
    import torch

    from grpo_kit.algo import advantages, losses
    from grpo_kit.train.config import GRPOConfig

    rewards, logp = torch.tensor([1.0, 0.0, 0.5, 0.5]), torch.zeros(4, 3)
    for clip in advantages.CLIP_MODES:
        assert advantages.compute_advantages(rewards, 2, clip=clip).shape == (4,)
    for estimator in advantages.ESTIMATORS:
        assert advantages.compute_advantages(rewards, 2, estimator=estimator).shape == (4,)
    for loss_type in losses.LOSSES:
        for level in losses.IMPORTANCE_SAMPLING_LEVELS:
            for kl in losses.KL_ESTIMATORS:
                spec = losses.LossSpec(beta=0.1, kl_estimator=kl, loss_type=loss_type, importance_sampling_level=level)
                loss, _ = losses.policy_loss(logp, logp, torch.ones(4), torch.ones(4, 3), spec, ref_logp=logp)
                assert torch.isfinite(loss)
    for setting, allowed in (("loss_type", losses.LOSSES), ("advantage", advantages.ESTIMATORS),
                             ("kl_estimator", losses.KL_ESTIMATORS), ("advantage_clip", advantages.CLIP_MODES)):
        with pytest.raises(ValueError, match=rf"GRPOConfig\.{setting}='nope': must be one of {', '.join(allowed)}"):
            GRPOConfig(**{setting: "nope"})


def readme_quick_start() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Quick start", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_quick_start_runs_as_written(tmp_path):
    run = subprocess.run([sys.executable, "-c", readme_quick_start()], cwd=tmp_path, capture_output=True, text=True,
                         timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    sft, grpo = (float(re.search(rf"after {stage}: *([0-9.]+)", run.stdout).group(1)) for stage in ("SFT", "GRPO"))
    assert 0.0 < sft <= 1.0 and 0.0 < grpo <= 1.0
    assert (tmp_path / "runs/quickstart/export/model.safetensors").exists()
    assert len((tmp_path / "runs/quickstart/grpo/metrics.jsonl").read_text().splitlines()) == 10


RELEASE_REF = re.compile(r"(?<=grpo_kit/blob/)[0-9a-f]{40}(?=/)|(?<=grpo_kit@)[0-9a-f]{40}\b")
"""A commit in a release link (a badge's blob/<commit>/, the pip line's @<commit>): where users open the release,
written by `make release`, not history."""


def test_readme_is_a_users_page_and_docs_state_facts_not_history():
    readme = RELEASE_REF.sub("<commit>", (ROOT / "README.md").read_text())
    assert len(readme.encode()) <= 10_240  # the words, not the length of the release's commit ids
    pages = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
    for page in pages:
        text = RELEASE_REF.sub("<commit>", page.read_text())
        # a dated or commit-stamped line is a work-log entry; git log holds the history
        assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text), page.name
        assert not re.search(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b", text), page.name
        for link in re.findall(r"\]\(((?!https?:)[^)#]+)\)", text):
            assert (page.parent / link).exists(), f"{page.name} links to missing {link}"


def test_the_troubleshooting_page_quotes_messages_the_kit_prints():
    """Each quoted message (a `> ` line) of docs/troubleshooting.md, cut at its `…` placeholders, is in the package's
    source: the page cannot drift from what users see."""
    source = "".join(p.read_text() for p in package_sources())
    source = re.sub(r"\"\s*\n\s*f?\"|'\s*\n\s*f?'", "", source)  # adjacent string literals, as Python joins them
    quotes = [
        line[2:] for line in (ROOT / "docs" / "troubleshooting.md").read_text().splitlines() if line.startswith("> ")]
    assert len(quotes) >= 12
    for quote in quotes:
        for fragment in quote.split("…"):
            if len(fragment.strip()) >= 12:
                assert fragment in source, f"troubleshooting.md quotes {fragment!r}, which the kit does not print"


def test_the_answer_format_has_one_home():
    """The tags live in `answer_format` alone: no other module writes them in its code (docstrings may show them, and
    the exercises' and quizzes' example completions are text for the learner); the tiny tokenizer's added tokens
    are the same tags."""
    import ast

    from grpo_kit.data.answer_format import TAGS
    from grpo_kit.engine.models import TINY_TAGS

    assert TINY_TAGS == list(TAGS)
    elsewhere = []
    for path in sorted((ROOT / "grpo_kit").rglob("*.py")):
        if path.name in ("answer_format.py", "exercises.py", "quizzes.py"):
            continue
        tree = ast.parse(path.read_text())
        docs = {
            id(node.value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        }
        elsewhere += [
            f"{path.name}:{node.lineno}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docs
            and any(tag in node.value for tag in TAGS)
        ]
    assert not elsewhere, f"the answer format's tags written outside answer_format.py: {elsewhere}"


RUNTIME_PROVIDED = {
    "IPython": "the Jupyter kernel the notebook helpers and the dashboard run in",
    "ipykernel": "the Jupyter kernel the dashboard's foreground loop runs in",
    "google.colab": "Colab's runtime (its secrets and Drive)",
    "kaggle_secrets": "Kaggle's runtime (its secrets)",
    "triton": "torch's CUDA wheels (the compiled sampler on a GPU)",
    "torch_xla": "the xla and tpu extras, or the TPU runtime itself",
}
"""Modules the package imports that no requirement of the kit installs: the runtime brings them, or an extra does."""


def test_every_third_party_module_the_package_imports_is_declared_and_every_dependency_is_imported():
    """pyproject.toml names what the kit imports (core or an extra), by distribution; no core dependency goes unused.
    A module the runtime provides is in RUNTIME_PROVIDED with the reason."""
    import sys
    import tomllib
    from importlib.metadata import packages_distributions

    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {Requirement(r).name.lower().replace("_", "-") for r in project["dependencies"]}
    extras = {Requirement(r).name.lower().replace("_", "-") for reqs in project["optional-dependencies"].values()
              for r in reqs}
    imported: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and not node.level else [])
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top != "grpo_kit":
                    imported.setdefault(".".join(name.split(".")[:2]) if top == "google" else top, set()).add(
                        path.name)
    distributions = packages_distributions()
    used = set()
    for module, where in sorted(imported.items()):
        if module in RUNTIME_PROVIDED:
            continue
        dists = {d.lower().replace("_", "-") for d in distributions.get(module, [])}
        assert dists & (core | extras), f"{module} (imported in {sorted(where)}) is not declared in pyproject.toml"
        used |= dists
    assert not core - used, f"declared but never imported: {sorted(core - used)}"


def test_the_package_samples_only_through_the_sampler_seam():
    """`sampling.sample` and the prompt encoders are called by the seam (`engine/sampler.py`) alone: GRPO, RFT and
    evaluation cannot drift apart in how they sample."""
    callers = {}
    for path in package_sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):  # the kit's own, not rng.sample
                name = node.func.id
                if name in ("sample", "GroupPrompts"):
                    callers.setdefault(name, set()).add(module_name(path))
    assert callers == {"sample": {"engine.sampler", "engine.sampling"}, "GroupPrompts": {"engine.sampler"}}, callers
