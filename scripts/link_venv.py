"""Let one virtualenv import another's packages after its own: `python scripts/link_venv.py OTHER_VENV`, run
with the first venv's python, writes a .pth file into its site-packages that appends OTHER_VENV's.

The browser test's classic-Notebook environment holds Colab's Jupyter versions and borrows torch, transformers
and the kit (an editable install) from .venv instead of downloading them again."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path


def main() -> None:
    other = Path(sys.argv[1]).resolve()
    python = other / "bin" / "python"
    if not python.exists():
        sys.exit(f"link_venv: {python} not found: give the path of a virtualenv (e.g. .venv)")
    other_site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                check=True, capture_output=True, text=True).stdout.strip()
    own_site = Path(sysconfig.get_paths()["purelib"])
    (own_site / "zz_linked_venv.pth").write_text(f"import site; site.addsitedir({other_site!r})\n")
    print(f"{own_site} now imports from {other_site} after its own packages")


if __name__ == "__main__":
    main()
