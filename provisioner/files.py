"""Files: content hashes, and writes that readers never see half done.

Every file provision writes goes through `write_atomically` or `write_files_atomically`: the text
is staged in a temp file beside its target (same file system) and renamed into place, so a reader
(or a run killed with -9) sees the old file or the new one, never a mix.
"""
from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import sys
import tempfile
from pathlib import Path
from typing import Mapping

from hardware_catalog import InputError


def warn(message: str) -> None:
    """One line on stderr; a warning never changes the result or the exit code."""
    sys.stderr.write(f"provision: warning: {' '.join(message.split())}\n")
    sys.stderr.flush()

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
        _write_staged(fd, text)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def _write_staged(fd: int, text: str) -> None:
    """Write `text` to the new temp file `fd` (UTF-8, whatever the locale) and close it; a full
    disk (ENOSPC) or a quota raises OSError here, before any target is touched."""
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)


def write_atomically(path: Path, text: str) -> None:
    """Temp file in the same directory + os.replace: readers see the old file or the new one.
    A failure (full disk, vanished folder) leaves no temp file and raises the OSError with the
    target as its filename (`output_errors` turns it into the CLI's one-line error)."""
    try:
        temp = stage_file(path, text)
        try:
            os.replace(temp, path)
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
    except OSError as err:
        _name_target(err, path)
        raise


def _name_target(err: OSError, path: Path) -> None:
    """The error names the file the user asked for, not the temp file staged beside it."""
    err.filename, err.filename2 = str(path), None


@contextlib.contextmanager
def output_errors(field: str, path: str | Path | None = None):
    """A failed write of an output (full disk, quota, a folder removed meanwhile) becomes one
    InputError naming the file and the option `field`: the CLI prints it, exit 2."""
    try:
        yield
    except OSError as err:
        target = err.filename or path
        raise InputError(f"cannot write the file: {err.strerror or err}; nothing was written",
                         source=None if target is None else str(target),
                         field=field) from None


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
            try:
                staged.append((stage_file(directory / name, text), directory / name))
            except OSError as err:   # e.g. a full disk: no report file has been replaced
                _name_target(err, directory / name)
                raise
        for temp, target in staged:
            os.replace(temp, target)
    finally:
        for temp, _ in staged:
            temp.unlink(missing_ok=True)
    return [target for _, target in staged]


# ------------------------------------------------------------------- outputs, checked up front
# A staged temp file's name is the target's plus ".", ".<pid>.<n>.tmp": at most this much more.
TEMP_NAME_EXTRA = 32


def check_name_lengths(path: str | Path, field: str, staged: bool = True) -> None:
    """Refuse a path the file system would refuse (ENAMETOOLONG), before any work: the whole
    path, or one of its names, is too long, or (`staged`: a file written through a temp file
    beside it) the file's name leaves no room for the temp file's."""
    path = Path(path)
    encoded = os.fsencode(str(path))
    existing = path
    while True:   # the nearest existing folder says its limits; lstat does not follow links
        try:
            os.lstat(existing)
            break
        except OSError:
            if existing == existing.parent:
                break
            existing = existing.parent
    try:
        name_max = os.pathconf(existing if existing.is_dir() else existing.parent,
                               "PC_NAME_MAX")
        path_max = os.pathconf(existing if existing.is_dir() else existing.parent,
                               "PC_PATH_MAX")
    except (OSError, ValueError):
        name_max, path_max = 255, 4096
    if len(encoded) + TEMP_NAME_EXTRA >= path_max:
        raise InputError(f"the path is too long ({len(encoded)} bytes; at most "
                         f"{path_max - TEMP_NAME_EXTRA - 1} here); choose a shorter one",
                         source=str(path)[:60] + "...", field=field)
    last = len(path.parts) - 1
    for index, part in enumerate(path.parts):
        size = len(os.fsencode(part))
        room = TEMP_NAME_EXTRA if staged and index == last else 0
        if size + room > name_max:
            shown = part if len(part) <= 40 else part[:20] + "..."
            why = ", leaving room for the temp file staged beside it" if room else ""
            raise InputError(f"the name '{shown}' is too long ({size} bytes; at most "
                             f"{name_max - room} here{why}); choose a shorter one",
                             source=str(path)[:60] + ("..." if len(str(path)) > 60 else ""),
                             field=field)


def check_output_dir(directory: str | Path, field: str, files: tuple[str, ...] = ()) -> None:
    """Fail before any simulation when `directory` cannot become a directory holding `files`
    that we can write: its name is too long, it is a file, a file in it is a directory (or a
    device), or the nearest existing folder refuses a new file (read-only, or not a real file
    system)."""
    directory = Path(directory)
    check_name_lengths(directory, field, staged=False)
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
    """Fail before any work when the file `path` cannot be written (atomically, beside it):
    its name is too long, it is a folder or a device, its folder does not exist or is not
    writable."""
    path = Path(path)
    check_name_lengths(path, field)
    if path.is_dir():
        raise InputError("is a directory, not a file; give a file path", source=str(path),
                         field=field)
    if path.exists() and not path.is_file():
        raise InputError("is not a regular file; give a file path", source=str(path),
                         field=field)
    if not path.parent.is_dir():   # a file's folder is not made for it: a typo, most likely
        raise InputError(f"the folder {path.parent} does not exist; create it first",
                         source=str(path), field=field)
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


# --------------------------------------------------------------- outputs never replace inputs
def check_not_an_input(output: str | Path, inputs: Mapping[str, str | Path], field: str) -> None:
    """Fail before any work when the output file `output` is one of the run's input files
    (`inputs`: what it is -> its path), by the same path, another spelling of it, a symlink or
    a hard link: writing it would destroy the input."""
    for what, path in inputs.items():
        try:
            same = os.path.samefile(output, path)
        except (OSError, ValueError):   # the output does not exist yet: it is no input
            continue
        if same:
            raise InputError(f"is the {what} {path}: writing it would destroy an input of "
                             "this run; choose another file", source=str(output), field=field)

