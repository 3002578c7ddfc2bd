"""The live training dashboard: plots that update while GRPO trains, and controls that act on the run.

It only reads metrics rows (from the trainer's step callback) and writes `Controls` values; the trainer
applies a change at its next step boundary and records the values it used in that step's row, so every
change shows up in the metrics and as a dotted marker on the plots.

Core ipywidgets (sliders, buttons, HTML, Image; the same in ipywidgets 7.7 and 8) plus matplotlib rendered in
the kernel to a PNG: nothing needs a front-end extension, so it renders the same in Colab, Kaggle, JupyterLab,
classic Notebook and VS Code.

Two ways to run:
- `run(steps)`, the default: training runs in the executing cell, on the main thread. Between steps the loop
  lets the kernel handle the browser's pending widget messages (`jupyter_ui_poll`), so slider moves and
  button clicks act during the run, under Run All too, and every widget update comes from the main thread,
  which is what Colab renders (it does not render updates made from other threads).
- `start(steps)`: a background thread; the cell returns at once. Needs a front end that renders widget updates
  sent from another thread, as JupyterLab does; refused in Colab, whose front end never shows them.
Redraws are rate-limited so plotting costs at most `max_plot_fraction` of the wall time (after a redraw that
took c seconds, the next waits c / fraction); the first step always draws.
"""

from __future__ import annotations

import contextlib
import html
import io
import math
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from matplotlib.figure import Figure

from ..train.controls import LIVE_SETTINGS
from .plots import (
    draw_advantage_heatmap,
    draw_advantage_histogram,
    draw_reward,
    draw_series,
    logged_metric_keys,
    reward_function_keys,
)

PANELS = (
    ("reward", ("reward_mean",), "reward (total) ± std"),
    ("per-reward means", reward_function_keys, "mean of each reward function"),
    ("accuracy", ("accuracy",), "sampled accuracy"),
    ("KL", ("kl",), "KL to the reference (per token)"),
    ("policy loss", ("policy_loss",), "≈ 0 by construction at μ = 1: watch the reward, not this"),
    ("clip fractions", ("clip_low", "clip_high"), "share of tokens clipped"),
    ("entropy", ("entropy",), "per token"),
    ("completion length", ("completion_length_mean", "completion_length_max"), "tokens"),
    ("grad norm", ("grad_norm",), "before clipping"),
)
LOGGED_PANEL = ("logged by your rewards", logged_metric_keys, "log_metric(name, value), the mean of each step")
XLA_PANEL = ("XLA", ("xla_compiles_step", "step_seconds"), "graphs compiled this step · step seconds")
MEMORY_PANEL = ("memory", ("memory_bytes_in_use", "memory_peak_bytes", "memory_bytes_limit", "memory_host_peak_bytes"),
                "GiB: device in use / peak / limit; host peak RSS")
def control_changes(rows: list[dict[str, Any]]) -> list[tuple[int, str]]:
    """Steps where a control value differs from the previous step's, with what changed — the markers."""
    out = []
    for prev, row in zip(rows, rows[1:], strict=False):
        changed = [f"{k} {prev[k]:.3g}→{row[k]:.3g}" for k, setting in LIVE_SETTINGS.items()
                   if prev.get(k) is not None and row.get(k) is not None and prev[k] != row[k]
                   and (not setting.scheduled or prev.get("controls_version") != row.get("controls_version"))]
        if prev.get("reward_weights") != row.get("reward_weights"):
            changed.append("reward weights")
        if changed:
            out.append((row["step"], ", ".join(changed)))
    return out


def draw(rows: list[dict[str, Any]], width: float = 13.0) -> Figure:
    """All panels plus the advantage histogram (latest) and its history (a heat map), as one figure."""
    panels = list(PANELS) + ([XLA_PANEL] if any("xla_compiles_step" in r for r in rows) else [])
    panels += [MEMORY_PANEL] if any(k.startswith("memory_") for r in rows[-1:] for k in r) else []
    panels += [LOGGED_PANEL] if logged_metric_keys(rows) else []
    cols = 3
    nrows = (len(panels) + 2 + cols - 1) // cols
    fig = Figure(figsize=(width, 2.6 * nrows), layout="constrained")
    axes = fig.subplots(nrows, cols).ravel()
    markers = control_changes(rows)
    for ax, (title, keys, subtitle) in zip(axes, panels, strict=False):
        if title == "reward":
            draw_reward(ax, rows)
        else:
            draw_series(ax, rows, keys(rows) if callable(keys) else keys)  # a panel's keys, or what finds them
        for step, _ in markers:
            ax.axvline(step, color="grey", linestyle=":", linewidth=1)
        ax.set_title(f"{title}\n{subtitle}", fontsize=9)
        ax.tick_params(labelsize=7)
    draw_advantage_histogram(axes[len(panels)], rows)
    draw_advantage_heatmap(axes[len(panels) + 1], rows)
    for ax in axes[len(panels) + 2:]:
        ax.axis("off")
    if markers:
        fig.suptitle(
            "dotted lines: control changes — " + "; ".join(f"step {s}: {d}" for s, d in markers[-3:]), fontsize=8
        )
    return fig


def completions_html(row: dict[str, Any]) -> str:
    """The logged completions of one step as an HTML table (prompt, completion, each reward, advantage)."""
    items = row.get("completions") or []
    if not items:
        return "<i>no completions logged (GRPOConfig.log_completions = 0)</i>"
    names = list(items[0]["rewards"])
    head = "".join(f"<th>{html.escape(n)}</th>" for n in ["prompt", "completion", *names, "total", "advantage"])
    body = []
    for it in items:
        cells = [html.escape(str(it["prompt"])), f"<code>{html.escape(it['completion'])}</code>"]
        cells += ["–" if it["rewards"][n] is None else f"{it['rewards'][n]:.2f}" for n in names]
        cells += [f"{it['reward']:.2f}", f"{it['advantage']:+.2f}"]
        body.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return f"<b>step {row['step']}</b><table><tr>{head}</tr>{''.join(body)}</table>"


class Dashboard:
    """Live plots and controls for a `GRPOTrainer`, or for a `LaunchedRun` (a run in processes of its own, torchrun's
    several GPUs among them: the plots read its metrics file, the controls write its controls file).

        dash = Dashboard(trainer)
        dash.run(steps=40)     # trains in this cell; the widgets shown above it steer the run as it goes

    Stop, an interrupt (Jupyter's stop button) or an error inside a step end the loop at a step boundary: stop
    lets the next cells run, an interrupt or an error is shown in the status line and raised in the cell.
    """

    def __init__(self, trainer: Any, redraw_seconds: float = 2.0, max_plot_fraction: float = 0.1) -> None:
        if getattr(trainer, "is_training", False):
            raise RuntimeError("this trainer is being trained by another loop right now (a running Dashboard or "
                               "thread): stop that run first instead of attaching a second dashboard")
        self.trainer = trainer
        self.controls = trainer.controls
        self.rows: list[dict[str, Any]] = list(trainer.logger.rows)
        self.redraw_seconds = redraw_seconds
        self.max_plot_fraction = max_plot_fraction
        self.plot_seconds = 0.0
        self.redraws = 0
        self._last_draw = 0.0
        self._last_cost = 0.0
        self._thread: threading.Thread | None = None
        self._interrupted = False
        self._shown_in: int | None = None
        self.error: BaseException | None = None
        self._build_widgets()
    # ---- the widgets ------------------------------------------------------------------------------------
    def _build_widgets(self) -> None:
        import ipywidgets as w

        c = self.controls.snapshot()
        style = {"description_width": "110px"}
        layout = w.Layout(width="340px")
        self.sliders: dict[str, Any] = {}
        notes = []
        for name, setting in LIVE_SETTINGS.items():
            reason = setting.inert(self.trainer.config)
            if (
                reason
            ):  # a slider that cannot act is not shown; its note has the sliders' width, so it cannot squeeze the plot
                notes.append(w.HTML(f"<small>{setting.label} is not shown: {reason}</small>", layout=layout))
                continue
            common = {"value": c[name], "step": setting.step, "description": setting.label,
                      "readout_format": setting.readout, "style": style, "layout": layout}
            if setting.log_scale:
                self.sliders[name] = w.FloatLogSlider(
                    base=10, min=math.log10(setting.low), max=math.log10(setting.high), **common
                )
            else:
                self.sliders[name] = w.FloatSlider(min=setting.low, max=setting.high, **common)
        weights = {**{n: 1.0 for n in self.trainer.reward_names}, **(self.trainer.config.reward_weights or {}),
                   **c["reward_weights"]}
        self.weight_sliders = {
            name: w.FloatSlider(value=weights[name], min=0.0, max=2.0, step=0.05,
                                description=name.removesuffix("_reward"), style=style, layout=layout)
            for name in self.trainer.reward_names
        }
        for name, slider in self.sliders.items():
            slider.observe(lambda change, name=name: self.set_control(name, change["new"]), names="value")
        for name, slider in self.weight_sliders.items():
            slider.observe(lambda change, name=name: self.set_reward_weight(name, change["new"]), names="value")
        self.buttons = {
            label: w.Button(description=label, layout=w.Layout(width="auto"))
            for label in ("pause", "resume", "stop", "save")
        }
        self.buttons["pause"].on_click(lambda _: self.pause())
        self.buttons["resume"].on_click(lambda _: self.resume())
        self.buttons["stop"].on_click(lambda _: self.stop())
        self.buttons["save"].on_click(lambda _: self.save())
        self.status = w.HTML("not started")
        self.image = w.Image(format="png", layout=w.Layout(flex="1 1 auto", min_width="0", max_width="100%"))
        self.browser = w.HTML()
        controls = w.VBox([w.HTML("<b>controls</b> (act at the next step)"), *self.sliders.values(), *notes,
                           w.HTML("<b>reward weights</b>"), *self.weight_sliders.values(),
                           w.HBox(list(self.buttons.values())), self.status],
                          layout=w.Layout(flex="0 0 auto", min_width="350px"))  # the plot shrinks, not the controls
        self.widget = w.VBox([w.HBox([controls, self.image]), w.HTML("<b>latest completions</b>"), self.browser])

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)

    # ---- writing controls ---------------------------------------------------------------------------------
    def set_control(self, name: str, value: float) -> None:
        self.controls.update(**{name: float(value)})

    def set_reward_weight(self, name: str, value: float) -> None:
        self.controls.update(reward_weights={name: float(value)})

    def move(self, **values: float) -> None:
        """Move sliders as a drag would (the control changes through the slider, so both agree): a control
        (`controls.LIVE_SETTINGS`) or a reward function's name for its weight."""
        sliders = {name: self._slider(name) for name in values}  # all names checked before anything moves
        for name, value in values.items():
            sliders[name].value = value

    def _slider(self, name: str) -> Any:
        slider = self.sliders.get(name) or self.weight_sliders.get(name)
        reason = LIVE_SETTINGS[name].inert(self.trainer.config) if name in LIVE_SETTINGS else None
        if slider is None and reason:
            raise ValueError(f"{LIVE_SETTINGS[name].label} is not among the controls: {reason}")
        if slider is None:
            raise ValueError(f"no control named {name!r}; controls: {sorted(self.sliders)}, "
                             f"reward weights: {sorted(self.weight_sliders)}")
        return slider

    def pause(self) -> None:
        self.controls.update(paused=True)
        self.status.value = "pausing after this step…"

    def resume(self) -> None:
        self.controls.update(paused=False)
        self.status.value = "running"

    def stop(self) -> None:
        self.controls.update(stop_requested=True, paused=False)
        self.status.value = "stopping after this step…"

    def save(self) -> None:
        self.controls.update(save_requested=True)
        self.status.value = "will save a checkpoint after this step"

    # ---- reading metrics ----------------------------------------------------------------------------------
    def on_step(self, trainer: Any, row: dict[str, Any]) -> None:
        """The trainer's step callback: record the row, redraw when due."""
        self.rows.append(row)
        self.status.value = (
            f"step {row['step']}: reward {row['reward_mean']:.3f}, "
            f"accuracy {row.get('accuracy', float('nan')):.2f}, step {row.get('step_seconds', 0):.1f} s"
        )
        self.browser.value = completions_html(row)
        # A wall-clock rule, not a share of the training time so far: that one starves the plot once steps are
        # fast (a draw then waits for many steps while the numbers move on).
        interval = max(self.redraw_seconds, self._last_cost / self.max_plot_fraction)
        if time.perf_counter() - self._last_draw >= interval:
            self.redraw()

    def redraw(self) -> None:
        start = time.perf_counter()
        fig = draw(self.rows)
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=72)
        self.image.value = buffer.getvalue()
        self._last_cost = time.perf_counter() - start
        self.plot_seconds += self._last_cost
        self._last_draw = time.perf_counter()
        self.redraws += 1

    # ---- running in the foreground (the default) ---------------------------------------------------------
    def run(self, steps: int | None = None) -> list[dict[str, Any]]:
        """Train in this cell up to `steps` total steps (default: the config's) and return the metrics rows.

        Shows the dashboard in this cell's output (once per cell) and keeps it live: between steps, and while
        paused, the kernel handles the browser's widget messages. The first interrupt stops after the running
        step and raises KeyboardInterrupt; a second one interrupts the step itself."""
        if self.running:
            raise RuntimeError("this dashboard is already training in the background: stop it first")
        self._show_here()
        self.controls.update(stop_requested=False, paused=False)
        self._interrupted = False
        self.error = None
        self.status.value = "running"
        try:
            with self.trainer.exclusive(), _widget_events() as pump, self._interrupt_stops():
                self.trainer.train(steps, progress=False, callback=self.on_step, poll=lambda: self._between_steps(pump))
        except BaseException as e:
            self.error = e
            self.status.value = _error_html(e, self.trainer.step)
            raise
        finally:
            self.redraw()
        if self._interrupted:
            self.status.value = f"interrupted: stopped after step {self.trainer.step}"
            raise KeyboardInterrupt(f"training interrupted; stopped cleanly after step {self.trainer.step}")
        stopped = self.controls.snapshot()["stop_requested"]
        self.status.value = f"{'stopped' if stopped else 'finished'} at step {self.trainer.step}"
        return self.rows

    def _show_here(self) -> None:
        """Display the widgets in the running cell's output, unless this cell shows them already."""
        try:
            from IPython import get_ipython
        except ImportError:
            return
        shell = get_ipython()
        if shell is None or not hasattr(shell, "kernel"):
            return
        if self._shown_in != shell.execution_count:
            self._shown_in = shell.execution_count
            from IPython.display import display

            display(self.widget)

    def _between_steps(self, pump: Callable[[], None]) -> None:
        pump()
        if self._interrupted and not self.controls.snapshot()["stop_requested"]:
            self.controls.update(stop_requested=True, paused=False)
        if self.controls.snapshot()["paused"]:
            self.status.value = f"paused after step {self.trainer.step}: press resume (or stop)"

    @contextlib.contextmanager
    def _interrupt_stops(self) -> Iterator[None]:
        """The first SIGINT asks for a stop at the next step boundary; the second raises as usual.

        The handler only sets a flag: it runs between two bytecodes of the main thread, which may be holding
        the controls' lock at that moment."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = signal.getsignal(signal.SIGINT)

        def handler(signum: int, frame: Any) -> None:
            if self._interrupted:
                signal.signal(signal.SIGINT, previous)
                raise KeyboardInterrupt("interrupted twice: stopped inside a step")
            self._interrupted = True

        signal.signal(signal.SIGINT, handler)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)

    def experiment(self, change: dict[str, float], steps: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Run `steps` steps as they are, move the sliders named in `change` (as a drag would), run `steps` more.

        `change` maps a control (learning_rate, beta, temperature, top_p, epsilon) or a reward function's name
        to its new value. Returns the rows before and after the change."""
        for name in change:
            self._slider(name)
        first = self.trainer.step
        self.run(first + steps)
        self.move(**change)
        middle = self.trainer.step
        self.run(middle + steps)
        rows = [r for r in self.rows if r["step"] > first]
        return [r for r in rows if r["step"] <= middle], [r for r in rows if r["step"] > middle]

    # ---- running in a background thread (not in Colab) -----------------------------------------------------
    def start(self, steps: int | None = None) -> Dashboard:
        """Train in a background thread (to `steps` total, default the config's); returns self at once.

        Refused in Colab, which does not render widget updates made from a background thread (use `run`)."""
        if "google.colab" in sys.modules:
            raise RuntimeError("Colab does not show widget updates made from a background thread: "
                               "use dash.run(steps), which trains in the cell and keeps the controls live")
        if self.running or self.trainer.is_training:
            raise RuntimeError("training is already running; stop() it or wait() for it first")
        self.controls.update(stop_requested=False, paused=False)
        self.error = None

        def run() -> None:
            try:
                self.trainer.train(steps, progress=False, callback=self.on_step)
            except BaseException as e:  # noqa: BLE001 - shown in the status line and re-raised by wait()
                self.error = e
                self.status.value = _error_html(e, self.trainer.step)
            else:
                self.status.value = f"finished at step {self.trainer.step}"
            finally:
                self.redraw()

        self.status.value = "running"
        self._thread = threading.Thread(target=run, name="grpo-train", daemon=True)
        self._thread.start()
        return self

    @property
    def running(self) -> bool:
        """True while a background run (`start`) is alive."""
        return self._thread is not None and self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> list[dict[str, Any]]:
        """Block until a background run ends (or `timeout` seconds); re-raise its error; return the rows.

        While this waits, the kernel does not handle widget messages: the controls act again once it returns."""
        if self._thread is not None:
            self._thread.join(timeout)
        if self.error is not None:
            raise self.error
        return self.rows


def _error_html(error: BaseException, step: int) -> str:
    return (f"<span style='color:red'>stopped by an error after step {step}, the last step logged: "
            f"{html.escape(type(error).__name__)}: {html.escape(str(error))}</span>")


@contextlib.contextmanager
def _widget_events() -> Iterator[Callable[[], None]]:
    """A function that lets the kernel handle the pending widget messages; a no-op outside a Jupyter kernel."""
    try:
        from IPython import get_ipython
    except ImportError:
        get_ipython = None  # noqa: N806
    shell = get_ipython() if get_ipython is not None else None
    if shell is None or getattr(shell, "kernel", None) is None:
        yield lambda: None
        return
    import ipykernel

    if int(ipykernel.__version__.split(".")[0]) >= 7:
        # jupyter_ui_poll's pump does not reach ipykernel 7's shell messages (measured: a slider update sent
        # during the loop arrives only after the cell), so say so instead of pretending the controls are live.
        warnings.warn(f"ipykernel {ipykernel.__version__}: the controls act only after this cell ends (jupyter-ui-poll "
                      "cannot take widget messages during a cell under ipykernel 7 yet); Jupyter's interrupt button "
                      "still stops the run after the current step. ipykernel 6 (as on Colab) keeps them live.",
                      RuntimeWarning, stacklevel=4)
        yield lambda: None
        return
    from jupyter_ui_poll import ui_events

    with ui_events() as poll:
        yield lambda: poll(100)  # up to 100 messages: a slider drag sends one per position
