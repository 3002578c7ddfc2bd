"""The training notebook in a real browser: JupyterLab on localhost, Debian's headless Chromium, Playwright.

What a user does, step by step: open notebooks/05 in JupyterLab, run its cells, watch the dashboard's reward
plot move, drag the β slider while it trains, press stop, run the rest. The test then checks the notebook
ran without an error, that the reward panel changed between two moments of the run, and that the β the
slider shows is the β recorded in the metrics of the steps after the drag. A screenshot of the dashboard is
saved to `runs/browser/` (or $GRPO_KIT_ARTIFACTS).

The browser is /usr/bin/chromium (Debian's package, which `make test` installs with apt); Playwright only
drives it — nothing is downloaded. Without Chromium the test fails with what to install: set
GRPO_KIT_SKIP_BROWSER=1 to leave it out deliberately on a machine that cannot have it.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NOTEBOOK = "05_grpo_training.ipynb"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or "/usr/bin/chromium"
# Flags for a sandboxed CI machine: root (no sandbox), no GPU, no calls home (the network is closed here).
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]
TOKEN = "grpo-kit-browser-test"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("GRPO_KIT_SKIP_BROWSER") == "1", reason="GRPO_KIT_SKIP_BROWSER=1"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def artifacts() -> Path:
    path = Path(os.environ.get("GRPO_KIT_ARTIFACTS", REPO / "runs" / "browser"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def jupyterlab(tmp_path_factory) -> Iterator[tuple[str, Path]]:
    """JupyterLab on a free localhost port, serving a fresh folder holding the training notebook."""
    root = tmp_path_factory.mktemp("lab")
    shutil.copy(REPO / "notebooks" / NOTEBOOK, root / NOTEBOOK)
    settings = root / ".settings"
    # All cells rendered (no virtual scrolling), so the dashboard stays in the page while other cells run.
    tracker = settings / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings"
    tracker.parent.mkdir(parents=True)
    tracker.write_text(json.dumps({"windowingMode": "none"}))
    notification = settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    notification.parent.mkdir(parents=True)
    notification.write_text(json.dumps({"fetchNews": "false"}))  # no "Jupyter news?" toast over the screenshot
    env = {**os.environ, "JUPYTERLAB_SETTINGS_DIR": str(settings), "JUPYTERLAB_WORKSPACES_DIR": str(root / ".workspaces"),
           "JUPYTER_CONFIG_DIR": str(root / ".jupyter"), "JUPYTER_RUNTIME_DIR": str(root / ".runtime"),
           "GRPO_KIT_QUICK": "0"}  # the full run: long enough to steer by hand; the test presses stop early
    port = _free_port()
    log = open(root / "jupyterlab.log", "w")  # noqa: SIM115 - closed below
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", f"--port={port}", "--ip=127.0.0.1",
         f"--ServerApp.root_dir={root}", f"--IdentityProvider.token={TOKEN}", "--LabApp.expose_app_in_browser=True",
         "--LabServerApp.extension_manager=readonly"],
        cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            if server.poll() is not None:
                raise RuntimeError(f"JupyterLab exited: {(root / 'jupyterlab.log').read_text()[-3000:]}") from None
            time.sleep(0.5)
    try:
        yield url, root
    finally:
        server.terminate()
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def _run_cell(page, index: int) -> None:
    page.evaluate("""(i) => {
        const panel = window.jupyterapp.shell.currentWidget;
        panel.content.activeCellIndex = i;
        return window.jupyterapp.commands.execute('notebook:run-cell');
    }""", index)


def _wait_idle(page, timeout_s: float) -> None:
    """Until every queued cell has run (no cell shows the [*] prompt) and the kernel is idle."""
    page.wait_for_function("""() => {
        const panel = window.jupyterapp.shell.currentWidget;
        const kernel = panel.sessionContext.session && panel.sessionContext.session.kernel;
        const busy = [...document.querySelectorAll('.jp-InputArea-prompt')].some(p => p.textContent.includes('*'));
        return kernel && kernel.status === 'idle' && !busy;
    }""", timeout=timeout_s * 1000, polling=500)


def _errors(page) -> list[str]:
    notebook = page.evaluate("() => window.jupyterapp.shell.currentWidget.context.model.toJSON()")
    return [f"cell {i}: {o.get('ename')}: {o.get('evalue')}" for i, cell in enumerate(notebook["cells"])
            for o in cell.get("outputs", []) if o.get("output_type") == "error"]


def _reward_panel(image_png: bytes):
    """The top-left corner of the dashboard figure (3 columns × 4–5 rows): the total reward ± std panel."""
    from PIL import Image

    img = Image.open(io.BytesIO(image_png)).convert("RGB")
    return img.crop((0, 0, img.width // 3, img.height // 5))


def _same_panel(first_png: bytes, second_png: bytes) -> bool:
    from PIL import ImageChops

    return ImageChops.difference(_reward_panel(first_png), _reward_panel(second_png)).getbbox() is None


def _dashboard_step(page) -> int:
    text = page.locator(".widget-html-content", has_text="step ").filter(has_text="reward").first.inner_text()
    return int(text.split("step", 1)[1].split(":", 1)[0])


def test_training_notebook_in_chromium(jupyterlab, artifacts):
    if not Path(CHROMIUM).exists():
        pytest.fail("Chromium not found: install Debian's `chromium` (make test does it with apt-get where it can), "
                    "or set GRPO_KIT_SKIP_BROWSER=1 to leave this test out on purpose")
    from playwright.sync_api import sync_playwright

    url, root = jupyterlab
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1600, "height": 1400})
        console_errors: list[str] = []
        page.on("pageerror", lambda e: console_errors.append(str(e)))
        try:
            page.goto(f"{url}/lab/tree/{NOTEBOOK}?token={TOKEN}", timeout=120_000)
            page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell.currentWidget"
                                   " && window.jupyterapp.shell.currentWidget.context"
                                   " && window.jupyterapp.shell.currentWidget.context.isReady", timeout=120_000)
            _wait_idle(page, 120)
            cells = page.evaluate("() => window.jupyterapp.shell.currentWidget.context.model.toJSON().cells"
                                  ".map(c => c.cell_type + ':' + (Array.isArray(c.source) ? c.source.join('') : c.source))")
            dashboard_cell = next(i for i, c in enumerate(cells) if c.startswith("code:") and "Dashboard(trainer)" in c)

            # Like a user: run the cells down to the dashboard one by one (set-up, SFT warm-up, the dashboard).
            for i in range(dashboard_cell + 1):
                _run_cell(page, i)
            _wait_idle(page, 600)
            assert not _errors(page), _errors(page)

            image = page.locator(".jp-OutputArea img").last
            image.wait_for(state="visible", timeout=300_000)
            page.wait_for_function("() => [...document.querySelectorAll('.widget-html-content')]"
                                   ".some(e => /step [2-9]\\d*:|step \\d{2,}:/.test(e.textContent))",
                                   timeout=300_000, polling=500)
            image.scroll_into_view_if_needed()
            first_shot = image.screenshot()
            step_before = _dashboard_step(page)

            # Drag the β slider's handle to about a fifth of its track (0 … 0.5 → ≈ 0.1).
            slider = page.locator(".widget-slider", has=page.locator("label", has_text="β (KL weight)"))
            handle, track = slider.locator(".noUi-handle"), slider.locator(".noUi-target")
            box, hbox = track.bounding_box(), handle.bounding_box()
            page.mouse.move(hbox["x"] + hbox["width"] / 2, hbox["y"] + hbox["height"] / 2)
            page.mouse.down()
            page.mouse.move(box["x"] + 0.2 * box["width"], hbox["y"] + hbox["height"] / 2, steps=8)
            page.mouse.up()
            beta_shown = float(slider.locator(".widget-readout").inner_text())
            assert 0.05 <= beta_shown <= 0.15, f"the β slider reads {beta_shown} after the drag"

            # Two more steps, so the change has been applied and logged, and the plot redrawn.
            page.wait_for_function("(s) => [...document.querySelectorAll('.widget-html-content')]"
                                   ".some(e => { const m = e.textContent.match(/step (\\d+):/); return m && +m[1] >= s; })",
                                   arg=step_before + 2, timeout=300_000, polling=500)
            # the dashboard redraws on a wall-clock budget, so wait (up to a minute) for the plot to change
            deadline = time.monotonic() + 60
            second_shot = image.screenshot()
            while _same_panel(first_shot, second_shot) and time.monotonic() < deadline:
                time.sleep(1.0)
                second_shot = image.screenshot()
            (artifacts / "dashboard.png").write_bytes(second_shot)
            page.locator("button", has_text="stop").click()

            # The rest of the notebook: wait for the run, evaluate, save, the exercise.
            for i in range(dashboard_cell + 1, len(cells)):
                _run_cell(page, i)
            _wait_idle(page, 600)
            page.screenshot(path=str(artifacts / "notebook.png"), full_page=True)
            assert not _errors(page), _errors(page)
        except BaseException:
            page.screenshot(path=str(artifacts / "failure.png"), full_page=True)
            raise
        finally:
            browser.close()

    assert not console_errors, console_errors
    assert not _same_panel(first_shot, second_shot), "the reward panel did not change within a minute of two more steps"

    rows = [json.loads(line) for line in (root / "runs" / "course" / "grpo" / "metrics.jsonl").read_text().splitlines()]
    betas = {r["step"]: r["beta"] for r in rows}
    changed = [s for s, b in sorted(betas.items()) if abs(b - beta_shown) < 1e-9]
    assert betas[1] == 0.0, betas
    assert changed, f"no step recorded β = {beta_shown} (the slider's value): {betas}"
    assert changed[0] > step_before - 1 and all(abs(betas[s] - beta_shown) < 1e-9 for s in betas if s >= changed[0] and s < max(betas)), betas
    assert max(betas) < 45, "stop did not end the run early"
