"""A run's output directory: when it holds a run, refusing to replace one, and the inputs
a resumed run may find at a new path.

Imports no torch, so the command line checks ``--out`` (and a resume's inputs) before it
loads anything.

* **A run** is a directory holding any of :data:`RUN_ENTRIES` (``config.json``,
  ``metrics.jsonl``, a checkpoint, ...). A fresh run refuses such a directory unless told
  to continue it (``resume``) or to replace it (``overwrite``); replacing deletes those
  entries only, never other files a user keeps there. :func:`check_out` is the rule.
* **Paths** of a run's settings are stored absolute (:func:`absolute`), so a run resumes
  from any working directory and with any spelling of its directory.
* **Inputs.** A fresh run records a SHA-256 fingerprint of its model (a directory or a GGUF
  file), task file and ``init_from`` directory in ``OUT/inputs.json`` (:func:`fingerprint`: every file's
  relative path, size and content). A resumed run may name a different path for one of
  them only if that path's fingerprint is the recorded one (:func:`check_moved_input`),
  that is, a moved or copied input with the same bytes.
* **Paths checked first.** :func:`comppo_core.rl.paths.check_paths` (above this module: it
  reads a run's settings, the models and the tasks) refuses a bad ``out`` by
  :func:`check_out`, and a bad ``model``, ``init_from`` or task file.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from ...errors import ParameterError

__all__ = [
    "INPUT_FIELDS",
    "RUN_ENTRIES",
    "absolute",
    "check_moved_input",
    "check_out",
    "clear_run",
    "describe_run",
    "fingerprint",
    "holds_run",
    "saved_checkpoint",
    "write_json_atomic",
    "write_text_atomic",
]

#: What a run writes in its directory; any of them makes the directory hold a run.
RUN_ENTRIES = (
    "config.json",
    "inputs.json",
    "metrics.jsonl",
    "critic_warmup.jsonl",
    "summary.json",
    "warmstart",
    "checkpoint",
    "checkpoint.tmp",
    "checkpoint.old",
    "tensorboard",
    "wandb",
)

#: The settings that name an input by path (a resumed run may find them moved).
INPUT_FIELDS = ("model", "task", "init_from")


def absolute(path: str) -> str:
    """``path`` with ``~`` expanded, made absolute and normalised (no ``.``, ``..`` or
    trailing slash), as a run stores it."""
    return os.path.abspath(os.path.expanduser(path))


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same directory and
    ``os.replace``: a reader sees the old file or the new one, never a part."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, data: Any, *, indent: int | None = 2) -> None:
    """:func:`write_text_atomic` of ``json.dumps(data)``."""
    write_text_atomic(path, json.dumps(data, indent=indent) + "\n")


def holds_run(out: Path) -> bool:
    """Whether ``out`` is a directory holding any of :data:`RUN_ENTRIES`."""
    return out.is_dir() and any((out / name).exists() for name in RUN_ENTRIES)


def saved_checkpoint(out: Path) -> tuple[Path, int | None] | None:
    """The complete checkpoint in ``out`` and the step it continues at (None when it
    predates ``progress.json``): ``checkpoint/``, or ``checkpoint.old/`` after a crash
    between the two renames of a save; None when there is none. Imports no torch."""
    for name in ("checkpoint", "checkpoint.old"):
        ckpt = out / name
        if (ckpt / "state.pt").is_file():
            try:
                return ckpt, int(json.loads((ckpt / "progress.json").read_text())["next_step"])
            except (OSError, ValueError, KeyError, TypeError):
                return ckpt, None
    return None


def describe_run(out: Path) -> str:
    """A few words on the run in ``out``: its arm and seed, and how far it got."""
    if (out / "compare.json").is_file():
        return "a compare (compare.json)"
    what = "a run"
    try:
        saved = json.loads((out / "config.json").read_text())
        what = f"a run of {saved.get('arm')}, seed {saved.get('seed')}, {saved.get('steps')} steps"
    except (OSError, ValueError, AttributeError):
        pass
    found = saved_checkpoint(out)
    if found is None:
        return f"{what} (no checkpoint: stopped before its first step)"
    step = found[1]
    return f"{what} (a checkpoint after {step} steps)" if step is not None else f"{what} (with a checkpoint)"


def check_out(out: str | Path, *, resume: bool, overwrite: bool) -> None:
    """The rule for a run's ``out``: not an existing file, not a compare's directory; for
    a fresh run (``resume`` False) a directory that holds no run, unless ``overwrite``. A
    ParameterError naming ``out`` otherwise (``resume`` itself is checked by the
    checkpoint's reader)."""
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise ParameterError(
            f"out: expected a directory for the run's files, got {str(path)!r}, a file", argument="out"
        )
    if resume and overwrite:
        raise ParameterError("overwrite: expected resume or overwrite, not both", argument="overwrite")
    if (path / "compare.json").is_file():
        raise ParameterError(
            f"out: {str(path)!r} holds a compare (compare.json), not a run; choose another directory", argument="out"
        )
    if not resume and not overwrite and holds_run(path):
        how = "continue it with resume (--resume) or " if saved_checkpoint(path) is not None else ""
        raise ParameterError(
            f"out: {str(path)!r} already holds {describe_run(path)}; {how}replace it with overwrite (--overwrite)",
            argument="out",
        )


def clear_run(out: Path) -> list[str]:
    """Delete the run in ``out`` (the :data:`RUN_ENTRIES` there, nothing else); the names deleted."""
    gone = []
    for name in RUN_ENTRIES:
        p = out / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif p.exists() or p.is_symlink():
            p.unlink()
        else:
            continue
        gone.append(name)
    return gone


def fingerprint(path: str | Path) -> dict[str, Any]:
    """``{"sha256": ..., "files": n, "bytes": b}`` of a file, or of a directory's files
    (sorted by relative path; each contributes its path, size and content; hidden files
    and ``__pycache__`` are skipped). Reads every byte once."""
    p = Path(path)
    files = (
        [p]
        if p.is_file()
        else sorted(
            f
            for f in p.rglob("*")
            if f.is_file() and not any(part.startswith(".") or part == "__pycache__" for part in f.relative_to(p).parts)
        )
    )
    digest = hashlib.sha256()
    total = 0
    for f in files:
        rel = "" if f == p else f.relative_to(p).as_posix()
        size = f.stat().st_size
        digest.update(f"{rel}\0{size}\0".encode())
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
        total += size
    return {"sha256": digest.hexdigest(), "files": len(files), "bytes": total}


def check_moved_input(name: str, recorded: dict[str, Any] | None, saved_path: str | None, new_path: str | None) -> None:
    """Allow a resumed run's input ``name`` at ``new_path`` instead of ``saved_path`` only if
    its :func:`fingerprint` is the ``recorded`` one (``inputs.json``); a ParameterError
    naming ``name`` otherwise."""
    if saved_path == new_path:
        return
    if saved_path is None or new_path is None or recorded is None:
        raise ParameterError(
            f"{name}: a resumed run must keep the checkpoint's {name} (the checkpoint has {saved_path!r}, got "
            f"{new_path!r})" + ("" if recorded is not None else "; no fingerprint of it was recorded (inputs.json)"),
            argument=name,
        )
    if not Path(new_path).exists():
        raise ParameterError(f"{name}: expected the run's {name} at {new_path!r}, found nothing there", argument=name)
    got = fingerprint(new_path)
    if got["sha256"] != recorded.get("sha256"):
        raise ParameterError(
            f"{name}: {new_path!r} is not the run's {name}: its content differs from {saved_path!r}, which the run "
            f"started from (SHA-256 of {got['files']} files, {got['bytes']} bytes: {got['sha256'][:12]}…, recorded "
            f"{str(recorded.get('sha256'))[:12]}…)",
            argument=name,
        )
