"""Check an output path before any work is spent on it.

Why: ``run`` and ``ab`` measure for minutes before they write. A results path that cannot
be written (under a regular file, a directory given as a file, a read-only file system)
used to end in a traceback after the whole measurement. These checks run first and answer
with one line naming the option and the path. A missing directory is created (as the
writers always did) when its nearest existing parent is a writable directory.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


class OutputPathError(ValueError):
    """An output path that cannot be written; the message names the option and the path."""


def _usable_dir(d: Path, label: str) -> None:
    """Make ``d`` exist as a directory we can create files in, or raise OutputPathError
    starting with ``label`` (the option and the path as given)."""
    for parent in (d, *d.parents):
        if parent.exists() or parent.is_symlink():
            if not parent.is_dir():
                raise OutputPathError(f"{label}: {parent} is a regular file, not a directory")
            break
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputPathError(f"{label}: cannot create the directory {d} ({e.strerror or e})") from None
    try:  # the probe: access() says yes to root on a read-only mount; creating a file does not
        fd, probe = tempfile.mkstemp(prefix=".optimus-bench-probe.", dir=d)
    except OSError as e:
        raise OutputPathError(f"{label}: directory {d} is not writable ({e.strerror or e})") from None
    os.close(fd)
    os.unlink(probe)


def check_output_file(path: str | os.PathLike[str], option: str = "--out") -> Path:
    """``path`` will be written (atomically, via a temp file in its directory): check it can be."""
    p = Path(path)
    if str(path) == "" or p.name in ("", ".", ".."):
        raise OutputPathError(f"{option} {str(path)!r}: not a file name")
    if p.is_dir():
        raise OutputPathError(f"{option} {p}: is a directory; give a file path")
    _usable_dir(p.parent if str(p.parent) else Path("."), f"{option} {p}")
    return p


def check_output_dir(path: str | os.PathLike[str], option: str = "--out-dir") -> Path:
    """``path`` is a directory files will be written into: create it if needed, check it is writable."""
    p = Path(path)
    if str(path) == "":
        raise OutputPathError(f"{option}: empty path")
    _usable_dir(p, f"{option} {p}")
    return p


def check_stem(stem: str, option: str = "--stem") -> str:
    """A file-name stem: a plain name, so the files it names stay inside their directory."""
    if not stem or stem in (".", "..") or "/" in stem or "\\" in stem or "\0" in stem:
        raise OutputPathError(f"{option} {stem!r}: must be a plain file name (no '/', '\\', '..')")
    return stem
