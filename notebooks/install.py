"""The notebooks' installer: cell 1 of every notebook fetches this file from the commit it pins and runs it.

It installs grpo-kit from that commit (or from GRPO_KIT_SOURCE, a pip URL of another checkout) and then what the kit
needs, adding only what the runtime lacks: every package the runtime already has (torch, torch_xla, transformers,
ipywidgets …) is held at its version by a constraint, and what is added comes at the versions the kit was tested with
(the kit's assets/constraints.txt). Standard library only: it runs before anything is installed. A credential in a
URL is never printed. A failure ends in one message naming the source and the fix.

Cell 1 runs it with `exec`, its names KIT_RELEASE and KIT_COMMIT already set; `python notebooks/install.py RELEASE
COMMIT` does the same from a shell.
"""

import os
import re
import subprocess
import sys
from importlib.metadata import distributions

RUNTIME_PACKAGES = "/tmp/runtime-packages.txt"
"""Constraints holding every package the runtime has at its version."""
KIT_CONSTRAINTS = "/tmp/kit-constraints.txt"
"""The kit's tested versions of the packages the runtime lacks."""


def install_kit(release: str, commit: str) -> None:
    """Install grpo-kit `release` from `commit` of the public repository (GRPO_KIT_SOURCE: another pip URL), then
    its `notebooks` extra, never changing a package the runtime has. SystemExit with the fix when pip fails."""

    def hide(text: str) -> str:  # a credential in a URL is never printed
        return re.sub(r"://[^/@\s]+@", "://***@", text)

    def name(text: str) -> str:
        return re.sub(r"[-_.]+", "-", text).lower()

    kit = os.environ.get("GRPO_KIT_SOURCE", f"git+https://github.com/grpo-kit/grpo_kit@{commit}")
    runtime = {name(d.metadata["Name"]): d.version for d in reversed(list(distributions())) if d.metadata["Name"]}
    with open(RUNTIME_PACKAGES, "w") as f:
        f.writelines(f"{n}=={v}\n" for n, v in runtime.items() if n != "grpo-kit")

    def pip(*args: str) -> None:
        done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", *args], capture_output=True, text=True)
        if done.returncode:
            lines = done.stderr.splitlines()
            why = [line for line in lines if line.startswith("ERROR")] or lines[-3:]
            raise SystemExit(f"pip could not install grpo-kit from {hide(kit)}: {hide(' '.join(why))[:600]}\n"
                             "Fix: unset GRPO_KIT_SOURCE to install from GitHub, or set it to a pip URL of a checkout "
                             "(git+file:///path/to/grpo_kit or git+https://…@commit).")

    print(f"installing grpo-kit {release} from {hide(kit)} (a minute or two) …")
    pip("--no-deps", f"grpo-kit @ {kit}")
    # where pip put the kit's constraints.txt, found without importing the kit (its import stops a broken runtime)
    where = ("import importlib.util as u, pathlib; "
             "print(pathlib.Path(u.find_spec('grpo_kit').origin).parent / 'assets' / 'constraints.txt')")
    shipped = subprocess.run([sys.executable, "-c", where], capture_output=True, text=True).stdout.strip()
    with open(shipped) as f, open(KIT_CONSTRAINTS, "w") as out:
        out.writelines(line for line in f if "==" in line and name(line.split("==")[0]) not in runtime)
    pip("-c", RUNTIME_PACKAGES, "-c", KIT_CONSTRAINTS, "grpo-kit[notebooks]")


if "KIT_COMMIT" in globals():  # run by cell 1's exec, which set KIT_RELEASE and KIT_COMMIT
    install_kit(KIT_RELEASE, KIT_COMMIT)  # noqa: F821
    del install_kit
elif __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: python notebooks/install.py RELEASE COMMIT")
    install_kit(*sys.argv[1:])
