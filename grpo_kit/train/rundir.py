"""Output directories the kit owns: a manifest of what it wrote there, a lock against a second writer, and
starting over without deleting anything it did not write.

Every command and trainer that writes into an output directory claims it first (`claim`):

- an empty or new directory becomes the kit's: `.grpo_kit/run.json` records the kind of run (arc, sft, grpo,
  export) and, as they are written, the names of the entries it writes there (`RunDir.add`);
- a directory holding files the kit did not write is refused, unless the caller overwrites — and then the kit
  writes beside those files, refusing any entry whose name it would share with one of them;
- `overwrite=True` moves the run's own entries (and only those) aside in one rename each, before the first step,
  then deletes them, so a crash never leaves the previous run's checkpoint where a resume would find it;
- `.grpo_kit/lock` is held (an OS file lock, released by the kernel when the process ends, a crash included)
  for as long as an object of this process writes there: a second process is refused, and the message names the
  process that holds it.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import weakref
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .checkpoint import previous_path, temporary_names, write_whole

MARK = ".grpo_kit"
"""The kit's folder inside an output directory: run.json (the manifest) and lock."""
KINDS = ("arc", "sft", "grpo", "rft", "export", "study", "score")


class RunDirError(ValueError):
    """An output directory cannot be used as asked; the message names it and says what to do."""


def _owned(entries: Iterable[str], present: Iterable[str]) -> list[str]:
    """Of the names `present` in a directory, those the manifest's `entries` cover: an entry, and the hidden names a
    checkpoint save derives from it (`checkpoint.previous_path`, `checkpoint.temporary_names`)."""
    entries = list(entries)
    previous = {previous_path(Path(e)).name for e in entries}
    temporary = [temporary_names(Path(e)) for e in entries]
    return [p for p in present if p in entries or p in previous or any(rx.match(p) for rx in temporary)]


# -- the lock ------------------------------------------------------------------------------------------------------
_HELD: dict[str, list[Any]] = {}
"""Locks this process holds: resolved directory → [open lock file, number of RunDir objects using it]."""


def _try_lock(fd: int) -> bool:
    try:
        import fcntl
    except ImportError:  # Windows
        import msvcrt

        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
            return True
        except OSError:
            return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False


def _acquire(directory: Path) -> str:
    key = str(directory.resolve())
    if key in _HELD:
        _HELD[key][1] += 1
        return key
    lock_path = directory / MARK / "lock"
    handle = open(lock_path, "a+")  # noqa: SIM115 - held open for as long as the lock is
    if not _try_lock(handle.fileno()):
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        handle.close()
        raise RunDirError(
            f"{directory} is in use by another grpo-kit process (PID {holder}): wait for it to end or stop "
            "it, or choose another output directory"
        )
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    _HELD[key] = [handle, 1]
    return key


def _release(key: str) -> None:
    held = _HELD.get(key)
    if held is None:
        return
    held[1] -= 1
    if held[1] <= 0:
        held[0].close()  # closing the file releases the OS lock
        del _HELD[key]


# -- the manifest ----------------------------------------------------------------------------------------------------
class RunDir:
    """A claimed output directory (see the module docstring). `add(name)` records an entry before it is written;
    the lock is released when the last RunDir of this process for the directory is garbage-collected."""

    def __init__(self, path: Path, kind: str, entries: list[str]) -> None:
        self.path, self.kind, self.entries = path, kind, entries
        self._key = _acquire(path)
        self._finalizer = weakref.finalize(self, _release, self._key)

    @property
    def manifest_path(self) -> Path:
        return self.path / MARK / "run.json"

    def _write(self) -> None:
        write_whole(self.manifest_path, json.dumps({"kind": self.kind, "entries": self.entries}, indent=2),
                    tmp=self.manifest_path.with_suffix(".tmp"))

    def add(self, name: str) -> Path:
        """Record `name` as the kit's before it is written there; refuses a name the directory already holds
        that the kit did not write. Returns the entry's path."""
        if "/" in name or name in ("", ".", "..", MARK):
            raise ValueError(f"RunDir.add: {name!r} is not an entry name")
        on_disk = _read_manifest(
            self.path)  # another RunDir of this process (a trainer inside a command) may have added
        self.entries += [e for e in (on_disk or {}).get("entries", []) if e not in self.entries]
        if name not in self.entries:
            target = self.path / name
            if target.exists() or target.is_symlink():
                raise RunDirError(f"{target} exists and was not written by this grpo-kit {self.kind} run: move it, "
                                  "or choose another output directory")
            self.entries.append(name)
            self._write()
        return self.path / name

    def files(self) -> list[str]:
        """Every file under the entries, as paths relative to the directory (what an upload of it may send)."""
        return _files(self.path, self.entries)

    def clear(self) -> None:
        """Remove every entry this run wrote (moved aside first: see `_move_aside_and_delete`), nothing else."""
        present = sorted(p.name for p in self.path.iterdir() if p.name != MARK)
        _move_aside_and_delete(self.path, _owned(self.entries, present))
        self.entries = []
        self._write()

    def release(self) -> None:
        """Release the lock now (otherwise when this object is collected or the process ends)."""
        self._finalizer()


def _read_manifest(path: Path) -> dict[str, Any] | None:
    manifest = path / MARK / "run.json"
    if not manifest.exists():
        return None
    try:
        data = json.loads(manifest.read_text())
        if data.get("kind") in KINDS and isinstance(data.get("entries"), list):
            return data
    except (json.JSONDecodeError, AttributeError):
        pass
    raise RunDirError(f"{manifest} is not a grpo-kit manifest (damaged?): choose another output directory")


def claim(directory: str | Path, kind: str, *, overwrite: bool = False) -> RunDir:
    """Take `directory` for a run of `kind` (see the module docstring): creates it, or checks it holds this kind
    of run or nothing; with `overwrite` the run's own entries are removed first, nothing else. Raises
    RunDirError with a one-line message naming the directory and what to do."""
    if kind not in KINDS:
        raise ValueError(f"claim: kind {kind!r} is not one of {', '.join(KINDS)}")
    path = Path(directory)
    try:
        path.mkdir(parents=True, exist_ok=True)
        (path / MARK).mkdir(exist_ok=True)
    except OSError as e:
        raise RunDirError(f"cannot write to {path} ({e.strerror or e}): choose another output directory") from None
    manifest = _read_manifest(path)
    present = sorted(p.name for p in path.iterdir() if p.name != MARK)
    if manifest is not None and manifest["kind"] != kind:
        raise RunDirError(
            f"{path} holds a grpo-kit {manifest['kind']} run, not a {kind} one: choose another output directory")
    if manifest is None:
        if present and not overwrite:
            shown = ", ".join(present[:4]) + (", …" if len(present) > 4 else "")
            raise RunDirError(
                f"{path} is not empty and was not written by grpo-kit ({shown}): choose another output "
                "directory, or pass --overwrite to write beside those files (grpo-kit removes only what it wrote)"
            )
        else:
            entries = []
    else:
        entries = list(manifest["entries"])
    run = RunDir(path, kind, entries)  # locks before anything is moved
    if overwrite:
        run.clear()
    else:
        run._write()
    return run


def _move_aside_and_delete(path: Path, names: list[str]) -> None:
    """Rename each of `names` into one fresh hidden folder (each rename atomic; the checkpoint first, so no resume
    can find it once the overwrite has begun), then delete that folder."""
    for leftover in (path / MARK).glob("overwritten-*"):  # an earlier overwrite killed mid-delete
        shutil.rmtree(leftover, ignore_errors=True)
    if not names:
        return
    aside = path / MARK / f"overwritten-{secrets.token_hex(4)}"
    aside.mkdir()
    for name in sorted(names, key=lambda n: n != "checkpoint"):
        os.replace(path / name, aside / name)
    shutil.rmtree(aside, ignore_errors=True)


def record_entry(run: RunDir | None, path: str | Path) -> None:
    """Before writing `path`: record it in `run`'s manifest when it lies directly in the run's directory (a save
    elsewhere is the caller's own choice of place)."""
    path = Path(path)
    if run is not None and path.parent.resolve() == run.path.resolve():
        run.add(path.name)


def owned_files(directory: str | Path, kind: str) -> list[str]:
    """The files a run of `kind` wrote in `directory` (from its manifest), relative to it; RunDirError when the
    directory has no manifest of that kind."""
    path = Path(directory)
    manifest = _read_manifest(path)
    if manifest is None or manifest["kind"] != kind:
        raise RunDirError(f"{path} was not written by grpo-kit {kind} (no manifest {MARK}/run.json of that kind): "
                          f"only what the kit wrote is sent")
    return _files(path, manifest["entries"])


def _files(path: Path, entries: list[str]) -> list[str]:
    found = []
    for name in entries:
        target = path / name
        if target.is_file():
            found.append(name)
        elif target.is_dir():
            found += sorted(p.relative_to(path).as_posix() for p in target.rglob("*") if p.is_file())
    return found
