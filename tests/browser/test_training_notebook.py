"""The training notebook in a real browser, under Run All, in two front ends; Debian's headless Chromium via Playwright.

- `jupyterlab`: JupyterLab 4 + ipywidgets 8 + ipykernel 6.31 (the lock's versions, from .venv);
- `notebook6`: classic Notebook 6.5.7 + ipywidgets 7.7.1 + ipykernel 6.17.1 + ipython 7.34.0 (Colab's versions,
  from .venv-classic, which `make test` builds from requirements/colab-frontend.txt).

What a user does: open notebooks/05, choose its short version (`SHORT = True`), press Run All, and *while the training
cell is still executing* watch the reward plot move, drag the β slider, pause, wait, resume, press stop; then let the
rest of the notebook run. The test checks, all during that one cell: the plot's reward panel changed at least twice;
the metrics of a later step of the same run carry the slider's β; pause held the step count still for ≥ 5 s and resume
went on; stop ended the run early; and no cell failed. Each front end writes `runs/browser/<frontend>/report.json` and
screenshots (or under $GRPO_KIT_ARTIFACTS).

Without Chromium the test fails with what to install: set GRPO_KIT_SKIP_BROWSER=1 to leave it out deliberately on a
machine that cannot have it.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from grpo_kit.course.modes import STEPS

REPO = Path(__file__).resolve().parents[2]
NOTEBOOK = "05_grpo_training.ipynb"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or "/usr/bin/chromium"
# Flags for a sandboxed CI machine: root (no sandbox), no GPU, no calls home (the network is closed here).
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]
TOKEN = "grpo-kit-browser-test"
CLASSIC_PYTHON = REPO / ".venv-classic" / "bin" / "python"
BETA_LABEL = "β (KL weight)"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.kernel,
    pytest.mark.skipif(os.environ.get("GRPO_KIT_SKIP_BROWSER") == "1", reason="GRPO_KIT_SKIP_BROWSER=1"),
]


class JupyterLab:
    """How to drive JupyterLab 4 (ipywidgets 8) from the page."""

    name = "jupyterlab"
    python = Path(sys.executable)

    @staticmethod
    def command(port: int, root: Path) -> list[str]:
        return ["-m", "jupyterlab", "--no-browser", "--allow-root", f"--port={port}", "--ip=127.0.0.1",
                f"--ServerApp.root_dir={root}", f"--IdentityProvider.token={TOKEN}",
                "--LabApp.expose_app_in_browser=True", "--LabServerApp.extension_manager=readonly"]

    @staticmethod
    def prepare(root: Path, env: dict[str, str]) -> None:
        settings = root / ".settings"
        # All cells rendered (no virtual scrolling), so the dashboard stays in the page while other cells run.
        tracker = settings / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings"
        tracker.parent.mkdir(parents=True)
        tracker.write_text(json.dumps({"windowingMode": "none"}))
        notification = settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
        notification.parent.mkdir(parents=True)
        notification.write_text(json.dumps({"fetchNews": "false"}))  # no "Jupyter news?" toast over the screenshot
        env.update(JUPYTERLAB_SETTINGS_DIR=str(settings), JUPYTERLAB_WORKSPACES_DIR=str(root / ".workspaces"))

    url = "/lab/tree/{notebook}?token={token}"
    ready = (
        "() => window.jupyterapp && window.jupyterapp.shell.currentWidget && "
        "window.jupyterapp.shell.currentWidget.context && window.jupyterapp.shell.currentWidget.context.isReady && "
        "window.jupyterapp.shell.currentWidget.sessionContext.session && "
        "window.jupyterapp.shell.currentWidget.sessionContext.session.kernel && "
        "window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.status === 'idle'"
    )
    # Not returned: the command's promise resolves only when every cell has run, and evaluate() would wait for it.
    run_all = "() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }"
    idle = """() => {
        const panel = window.jupyterapp.shell.currentWidget;
        const kernel = panel.sessionContext.session && panel.sessionContext.session.kernel;
        const busy = [...document.querySelectorAll('.jp-InputArea-prompt')].some(p => p.textContent.includes('*'));
        return kernel && kernel.status === 'idle' && !busy;
    }"""
    notebook_json = "() => window.jupyterapp.shell.currentWidget.context.model.toJSON()"
    slider_track, slider_handle = ".noUi-target", ".noUi-handle"


class ClassicNotebook:
    """How to drive classic Notebook 6.5 (ipywidgets 7) from the page."""

    name = "notebook6"
    python = CLASSIC_PYTHON

    @staticmethod
    def command(port: int, root: Path) -> list[str]:
        return ["-m", "notebook", "--no-browser", "--allow-root", f"--port={port}", "--ip=127.0.0.1",
                f"--NotebookApp.notebook_dir={root}", f"--NotebookApp.token={TOKEN}"]

    @staticmethod
    def prepare(root: Path, env: dict[str, str]) -> None:
        pass

    url = "/notebooks/{notebook}?token={token}"
    ready = (
        "() => window.Jupyter && Jupyter.notebook && Jupyter.notebook._fully_loaded && Jupyter.notebook.kernel && "
        "Jupyter.notebook.kernel.is_connected() && document.querySelector('#kernel_indicator_icon.kernel_idle_icon')"
    )
    run_all = "() => { Jupyter.notebook.execute_all_cells(); }"
    idle = """() => {
        const busy = [...document.querySelectorAll('.input_prompt')].some(p => p.textContent.includes('*'));
        return !busy && !!document.querySelector('#kernel_indicator_icon.kernel_idle_icon');
    }"""
    notebook_json = "() => Jupyter.notebook.toJSON()"
    slider_track, slider_handle = ".ui-slider", ".ui-slider-handle"


FRONTENDS = {f.name: f for f in (JupyterLab, ClassicNotebook)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _serve(frontend: type, root: Path, env: dict[str, str]) -> Iterator[str]:
    """A Jupyter server of `frontend` on a free localhost port serving `root`; yields its URL."""
    frontend.prepare(root, env)
    port = _free_port()
    log_path = root / "server.log"
    log = open(log_path, "w")  # noqa: SIM115 - closed below
    process = subprocess.Popen([str(frontend.python), *frontend.command(port, root)], cwd=root, env=env,
                               stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            if process.poll() is not None:
                raise RuntimeError(f"{frontend.name} exited: {log_path.read_text()[-3000:]}") from None
            time.sleep(0.5)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


def _root(frontend: type, tmp_path: Path, notebook: str) -> tuple[Path, dict[str, str]]:
    if not frontend.python.exists():
        pytest.fail(f"{frontend.python} not found: `make test` builds .venv-classic (Colab's Jupyter versions) first")
    if not Path(CHROMIUM).exists():
        pytest.fail("Chromium not found: install Debian's `chromium` (make test does it with apt-get where it can), "
                    "or set GRPO_KIT_SKIP_BROWSER=1 to leave this test out on purpose")
    root = tmp_path / frontend.name
    root.mkdir()
    shutil.copy(REPO / "notebooks" / notebook, root / notebook)
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(root / ".jupyter"), "JUPYTER_RUNTIME_DIR": str(root / ".runtime")}
    return root, env


def _choose_short_version(path: Path) -> None:
    """Set `SHORT = True` in the copy, as a user on a slow runtime does: its training cell plans
    `STEPS["grpo"][1]` steps (enough to steer by hand; the test presses stop at about the sixth) and the cells after
    it run the short version's experiments. This halves the test's cost: alone on a 2-core AVX2 CPU one front end
    took 302 s, against 594 s with the full version's 60 planned steps, 8-step experiments and 200 held-out problems;
    the two front ends run one after the other in the notebooks' process (tests/scheduling.py)."""
    notebook = json.loads(path.read_text())
    flags = [i for i, cell in enumerate(notebook["cells"]) for line in cell["source"]
             if line.startswith("SHORT = False")]
    assert len(flags) == 1, f"{path.name}: expected one line starting 'SHORT = False', found {len(flags)}"
    cell = notebook["cells"][flags[0]]
    cell["source"] = [line.replace("SHORT = False", "SHORT = True", 1) if line.startswith("SHORT = False") else line
                      for line in cell["source"]]
    path.write_text(json.dumps(notebook, indent=1))


@pytest.fixture(params=list(FRONTENDS))
def server(request, tmp_path) -> Iterator[tuple[type, str, Path]]:
    """A Jupyter server of the front end on a free localhost port, serving a fresh folder holding the notebook."""
    frontend = FRONTENDS[request.param]
    root, env = _root(frontend, tmp_path, NOTEBOOK)
    _choose_short_version(root / NOTEBOOK)
    env.update(GRPO_KIT_QUICK="0",  # not CI's quick mode: the short version (above), long enough to steer by hand
               GRPO_KIT_SOLUTIONS="1")  # Run All goes on past the exercise cells
    with _serve(frontend, root, env) as url:
        yield frontend, url, root


def _reward_panel(image_png: bytes):
    """The top-left corner of the dashboard figure (3 columns × 4–5 rows): the total reward ± std panel."""
    from PIL import Image

    img = Image.open(io.BytesIO(image_png)).convert("RGB")
    return img.crop((0, 0, img.width // 3, img.height // 5))


def _same_panel(first_png: bytes, second_png: bytes) -> bool:
    from PIL import ImageChops

    return ImageChops.difference(_reward_panel(first_png), _reward_panel(second_png)).getbbox() is None


class Run:
    """Reads the run's progress from its metrics file, which the kernel appends to after every step."""

    def __init__(self, root: Path) -> None:
        self.path = root / "runs" / "course" / "grpo" / "metrics.jsonl"

    def rows(self) -> list[dict]:
        if not self.path.exists():
            return []
        lines = self.path.read_text().splitlines()
        return [json.loads(line) for line in lines if line.endswith("}")]

    def step(self) -> int:
        rows = self.rows()
        return rows[-1]["step"] if rows else 0

    def wait_for(self, condition, timeout_s: float, what: str) -> list[dict]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            rows = self.rows()
            if condition(rows):
                return rows
            time.sleep(0.3)
        raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}; last step {self.step()}")


def test_training_notebook_under_run_all(server):
    from playwright.sync_api import sync_playwright

    frontend, url, root = server
    artifacts = Path(os.environ.get("GRPO_KIT_ARTIFACTS", REPO / "runs" / "browser")) / frontend.name
    artifacts.mkdir(parents=True, exist_ok=True)
    run = Run(root)
    report: dict = {"frontend": frontend.name, "run_all": True}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1600, "height": 1400})
        page_errors: list[str] = []
        page.on("pageerror", lambda e: page_errors.append(str(e)))
        try:
            page.goto(url + frontend.url.format(notebook=NOTEBOOK, token=TOKEN), timeout=120_000)
            page.wait_for_function(frontend.ready, timeout=120_000, polling=500)
            page.evaluate(frontend.run_all)
            started = time.monotonic()

            # The training cell is running once the dashboard's plot is in the page and a step has been logged.
            run.wait_for(lambda rows: len(rows) >= 1, 600, "the first GRPO step")
            report["first_step_seen_after_s"] = round(time.monotonic() - started, 1)
            page.screenshot(path=str(artifacts / "first_step.png"))
            image = page.locator("img.widget-image").first
            image.wait_for(state="visible", timeout=60_000)
            report["plot_visible_at_step"] = run.step()
            image.scroll_into_view_if_needed()
            shots = [image.screenshot()]
            plot_changes = 0

            def watch_plot() -> None:
                nonlocal plot_changes
                shot = image.screenshot()
                if not _same_panel(shots[-1], shot):
                    plot_changes += 1
                    shots.append(shot)

            # Drag the β slider's handle to about a fifth of its track (0 … 1 → ≈ 0.2).
            slider = page.locator(
                ".widget-slider, .widget-hslider", has=page.locator("label", has_text=BETA_LABEL)
            ).first
            track, handle = slider.locator(frontend.slider_track).first, slider.locator(frontend.slider_handle).first
            box, hbox = track.bounding_box(), handle.bounding_box()
            page.mouse.move(hbox["x"] + hbox["width"] / 2, hbox["y"] + hbox["height"] / 2)
            page.mouse.down()
            page.mouse.move(box["x"] + 0.2 * box["width"], hbox["y"] + hbox["height"] / 2, steps=8)
            page.mouse.up()
            beta_shown = float(slider.locator(".widget-readout").first.inner_text())
            assert 0.1 <= beta_shown <= 0.3, f"the β slider reads {beta_shown} after the drag"
            report["beta_set_at_step"] = beta_set_at = run.step()
            rows = run.wait_for(lambda rows: any(abs(r["beta"] - beta_shown) < 1e-9 for r in rows), 300,
                                f"a step with β = {beta_shown}")
            report["beta_seen_at_step"] = next(r["step"] for r in rows if abs(r["beta"] - beta_shown) < 1e-9)
            report["beta_value"] = beta_shown
            watch_plot()

            # Pause: the status line says so once the running step is done; then the step count holds still.
            page.locator("button", has_text="pause").first.click()
            page.locator(".widget-html-content", has_text="paused after step").first.wait_for(timeout=120_000)
            held_from, start = run.step(), time.monotonic()
            while time.monotonic() - start < 6.0:
                watch_plot()  # nothing should move, but look anyway
                time.sleep(0.5)
            report["paused_seconds"] = round(time.monotonic() - start, 1) if run.step() == held_from else 0.0
            report["paused_at_step"] = held_from
            page.locator("button", has_text="resume").first.click()
            run.wait_for(lambda rows: rows and rows[-1]["step"] > held_from, 120, "a step after resume")
            report["resumed_to_step"] = run.step()

            # Watch the plot for a few more steps, then stop the run early.
            deadline = time.monotonic() + 90
            while plot_changes < 2 and time.monotonic() < deadline:
                time.sleep(1.0)
                watch_plot()
            report["plot_changes_during_run"] = plot_changes
            (artifacts / "dashboard.png").write_bytes(shots[-1])
            page.locator("button", has_text="stop").first.click()
            # The training cell has ended when the next cell prints the run's length (Run All goes on from there).
            summary = page.locator("pre", has_text=re.compile(r"\d+ steps; reward")).first
            summary.wait_for(timeout=120_000)
            report["stopped_at_step"] = int(re.search(r"(\d+) steps; reward", summary.inner_text()).group(1))
            report["steps_planned"] = STEPS["grpo"][1]  # the short version's

            # The rest of the notebook runs on its own (Run All): experiments, evaluation, the exercise.
            page.wait_for_function(frontend.idle, timeout=900_000, polling=1000)
            page.screenshot(path=str(artifacts / "notebook.png"), full_page=True)
            notebook = page.evaluate(frontend.notebook_json)
            errors = [f"cell {i}: {o.get('ename')}: {o.get('evalue')}" for i, cell in enumerate(notebook["cells"])
                      for o in cell.get("outputs", []) if o.get("output_type") == "error"]
            report["cells_failed"] = len(errors)
            report["errors"] = errors
        except BaseException:
            page.screenshot(path=str(artifacts / "failure.png"), full_page=True)
            raise
        finally:
            (artifacts / "report.json").write_text(json.dumps(report, indent=1))
            browser.close()

    assert not errors, errors
    assert not page_errors, page_errors
    assert report["plot_changes_during_run"] >= 2, report
    assert report["beta_seen_at_step"] > beta_set_at, report
    assert report["paused_seconds"] >= 5.0, report
    assert report["resumed_to_step"] > report["paused_at_step"], report
    assert report["stopped_at_step"] < report["steps_planned"], report
    # One run: the steps are numbered 1, 2, … without a gap or a restart up to the stop.
    steps = [r["step"] for r in run.rows()]
    assert steps[: report["stopped_at_step"]] == list(range(1, report["stopped_at_step"] + 1)), steps


LEARNER_NOTEBOOK = "04_advantages_and_losses.ipynb"


def test_a_learner_answers_an_exercise_and_a_quiz_by_typing_in_classic_notebook(tmp_path):
    """Colab's front end (classic Notebook 6.5.7, ipywidgets 7.7.1) and the notebook as a learner gets it (blanks,
    no solutions injected): run the cells up to exercise 04.1, type a wrong answer into its cell and run it and the
    check (which says what is wrong), type the right one (✅), then run quiz 04.2, click a choice and check."""
    from playwright.sync_api import sync_playwright

    frontend = ClassicNotebook
    root, env = _root(frontend, tmp_path, LEARNER_NOTEBOOK)
    env.pop("GRPO_KIT_SOLUTIONS", None)
    artifacts = Path(os.environ.get("GRPO_KIT_ARTIFACTS", REPO / "runs" / "browser")) / "learner"
    artifacts.mkdir(parents=True, exist_ok=True)
    cells = json.loads((root / LEARNER_NOTEBOOK).read_text())["cells"]
    exercise = next(i for i, c in enumerate(cells) if "".join(c["source"]).startswith("# Exercise 04.1:"))
    quiz = next(i for i, c in enumerate(cells) if "".join(c["source"]) == 'nbk.quiz("04.2")')
    with _serve(frontend, root, env) as url, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1200})
        try:
            page.goto(url + frontend.url.format(notebook=LEARNER_NOTEBOOK, token=TOKEN), timeout=120_000)
            page.wait_for_function(frontend.ready, timeout=120_000, polling=500)
            page.evaluate(f"() => Jupyter.notebook.execute_cell_range(0, {exercise})")
            page.wait_for_function(frontend.idle, timeout=600_000, polling=500)

            def answer(text: str) -> str:
                """Type `text` over the exercise cell as a learner would, run it and the check; the check's output."""
                editor = page.locator("#notebook-container > .cell").nth(exercise).locator(".CodeMirror")
                editor.click()
                page.keyboard.press("Control+A")
                page.keyboard.press("Delete")
                page.keyboard.type(text)
                page.keyboard.press("Shift+Enter")  # runs the exercise cell and selects the check cell
                page.keyboard.press("Shift+Enter")
                page.wait_for_function(frontend.idle, timeout=120_000, polling=500)
                return (
                    page.locator("#notebook-container > .cell").nth(exercise + 1).locator(".output_area").inner_text())

            wrong = answer("# Exercise 04.1: mine\nmy_advantage = 0.75 / 0.433")
            right = answer("# Exercise 04.1: mine\nmy_advantage = 0.75 / ((0.75**2 + 3 * 0.25**2) / 3) ** 0.5")
            page.evaluate(f"() => Jupyter.notebook.execute_cells([{quiz}])")
            page.wait_for_function(frontend.idle, timeout=120_000, polling=500)
            box = page.locator(".grpo-kit-quiz").first
            box.locator("label", has_text="Nothing: its std is 0").click()
            box.locator("button", has_text="check").click()
            feedback = box.locator(".widget-html-content", has_text="Right").first
            feedback.wait_for(timeout=30_000)
            verdict = feedback.inner_text()
            page.screenshot(path=str(artifacts / "learner.png"), full_page=True)
        except BaseException:
            page.screenshot(path=str(artifacts / "failure.png"), full_page=True)
            raise
        finally:
            browser.close()
    assert "Not yet (04.1)" in wrong and "population std" in wrong, wrong
    assert "✅ 04.1 correct" in right, right
    assert verdict.startswith("✅ Right.") and "pass rate near 0.5" in verdict, verdict
