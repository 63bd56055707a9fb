"""Files: content hashes, and writes that readers never see half done.

Every file provision writes goes through `write_atomically` or `write_files_atomically`: the text
is staged in a temp file beside its target (same file system) and renamed into place, so a reader
(or a run killed with -9) sees the old file or the new one, never a mix.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Mapping

from hardware_catalog import InputError


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@lru_cache(maxsize=1)
def _umask() -> int:
    """The process umask (the only portable way to read it is to set and restore it)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def stage_file(path: Path, text: str) -> Path:
    """Write `text` to a temp file in `path`'s directory and return the temp file's path."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the usual file mode
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


def write_atomically(path: Path, text: str) -> None:
    """Temp file in the same directory + os.replace: readers see the old file or the new one."""
    write_files_atomically(Path(path).parent, {Path(path).name: text}, create=False)


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
