"""Files: content hashes, and writes that readers never see half done.

Every file provision writes goes through `write_atomically` or `write_files_atomically`: the text
is staged in a temp file beside its target (same file system) and renamed into place, so a reader
(or a run killed with -9) sees the old file or the new one, never a mix.
"""
from __future__ import annotations

import hashlib
import itertools
import os
import tempfile
from pathlib import Path
from typing import Mapping

from hardware_catalog import InputError


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


_STAGED = itertools.count()   # temp names: this process's pid and a counter


def stage_file(path: Path, text: str) -> Path:
    """Write `text` to a temp file in `path`'s directory and return the temp file's path (mode
    0666 less the umask, the usual file mode)."""
    path = Path(path)
    for _ in range(100):   # a name taken by another host's process on a shared file system
        tmp = path.parent / f".{path.name}.{os.getpid()}.{next(_STAGED)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"no free temp file name beside {path}")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def write_atomically(path: Path, text: str) -> None:
    """Temp file in the same directory + os.replace: readers see the old file or the new one."""
    temp = stage_file(path, text)
    try:
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def write_files_atomically(directory: Path, texts: Mapping[str, str], create: bool = True,
                           field: str = "out") -> list[Path]:
    """Stage every file beside its target, then rename them all into place: a failure while
    writing leaves the previous files (or none) and no temp files behind."""
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise InputError("exists and is not a directory", source=str(directory), field=field)
    if create:
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise InputError(f"cannot create the directory: {err.strerror}",
                             source=str(directory), field=field) from None
    staged: list[tuple[Path, Path]] = []
    try:
        for name, text in texts.items():
            staged.append((stage_file(directory / name, text), directory / name))
        for temp, target in staged:
            os.replace(temp, target)
    finally:
        for temp, _ in staged:
            temp.unlink(missing_ok=True)
    return [target for _, target in staged]


# ------------------------------------------------------------------- outputs, checked up front
def check_output_dir(directory: str | Path, field: str, files: tuple[str, ...] = ()) -> None:
    """Fail before any simulation when `directory` cannot become a directory holding `files`
    that we can write: it is a file, a file in it is a directory (or a device), or the nearest
    existing folder refuses a new file (read-only, or not a real file system)."""
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise InputError("exists and is not a directory; give a directory path",
                         source=str(directory), field=field)
    for name in files:
        target = directory / name
        if target.exists() or target.is_symlink():
            if target.is_dir():
                raise InputError(f"{name} in it is a directory; remove it or choose another "
                                 "directory", source=str(directory), field=field)
            if not target.is_file():
                raise InputError(f"{name} in it is not a regular file; remove it or choose "
                                 "another directory", source=str(directory), field=field)
    existing = directory
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise InputError(f"{existing} is not a directory; give another path",
                         source=str(directory), field=field)
    _probe_write(existing, directory, field)


def check_output_file(path: str | Path, field: str) -> None:
    """Fail before any work when the file `path` cannot be written (atomically, beside it)."""
    path = Path(path)
    if path.is_dir():
        raise InputError("is a directory, not a file; give a file path", source=str(path),
                         field=field)
    if path.exists() and not path.is_file():
        raise InputError("is not a regular file; give a file path", source=str(path),
                         field=field)
    check_output_dir(path.parent, field)


def _probe_write(existing: Path, target: Path, field: str) -> None:
    """Create (and at once drop) an unnamed temp file: permission bits alone do not tell (root
    ignores them; /proc and read-only mounts refuse anyway)."""
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as err:
        raise InputError(f"cannot write in {existing} ({err.strerror or err}); choose a "
                         "writable directory", source=str(target), field=field) from None
