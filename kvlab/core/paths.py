"""Output paths: checked before anything is measured (``check_output``), written atomically (``write_atomic``: a reader
sees the old file or the whole new one; a symlink is written through, a device or FIFO written in place)."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from .errors import ConfigError, clip


def _nearest_existing(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists (``path`` made absolute first)."""
    path = Path(os.path.abspath(path))
    while not os.path.lexists(path) and path != path.parent:
        path = path.parent
    return path


def _probe(folder: Path, what: str, path: Path) -> None:
    """ConfigError unless a file can really be made in ``folder`` (``os.access`` says yes to root everywhere)."""
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".kvlab-probe-")
    except OSError as exc:
        raise ConfigError(
            f"{what} {str(path)!r}: cannot write in {str(folder)!r}: making a file there failed "
            f"({exc.strerror or exc}); choose a path in a folder this user can write in"
        ) from None
    os.close(fd)
    os.unlink(probe)


def check_output(path: str | os.PathLike, what: str, folder: bool) -> Path:
    """``path`` as a Path when kvlab can write there: a folder (``folder=True``: new or existing, made later) or a
    file (new or replaced). Raises ConfigError naming ``what`` (e.g. "--out") and the path otherwise."""
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise ConfigError(f"{what} {path!r} must be a non-empty path")
    path = Path(path)
    if path.exists() and _special(path):  # written through: kvlab needs to open it, not to make files beside it
        if not os.access(path, os.W_OK):
            raise ConfigError(f"{what} {str(path)!r} is not writable by this user")
        return path
    if path.exists():
        if folder and not path.is_dir():
            raise ConfigError(f"{what} {str(path)!r} is an existing file; it must name a folder (new or existing)")
        if not folder and path.is_dir():
            raise ConfigError(f"{what} {str(path)!r} is a folder; it must name a file (new or to replace)")
    base = _nearest_existing(path if folder else path.parent)
    if not base.is_dir():
        raise ConfigError(f"{what} {str(path)!r}: {str(base)!r} is not a folder, so nothing can be written under it")
    _probe(base, what, path)
    return path


def _special(path: Path) -> bool:
    """Whether ``path`` (followed through symlinks) exists and is neither a regular file nor a folder."""
    return path.exists() and not path.is_file() and not path.is_dir()


def write_atomic(path: str | os.PathLike, data: str | bytes) -> Path:
    """Write ``data`` to ``path`` (returned as a Path): a regular file through a temporary file beside it and
    ``os.replace``; a symlink's target so; a device or FIFO opened and written. ConfigError naming the path, the bytes
    and the reason (a full disk: the room) when it cannot; the old file then stays and no temporary file."""
    path = Path(path)
    data = data.encode() if isinstance(data, str) else data
    target = Path(os.path.realpath(path))  # a symlink is written through
    try:
        if _special(target):
            with open(target, "wb") as f:
                f.write(data)
            return path
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        full = no_room(exc) and not _special(target)  # a device's "full" is the device's, not a disk's room
        room = f"; it needs {len(data)} bytes, more than {room_left(target.parent)}" if full else ""
        what = f"cannot write {len(data)} bytes to {clip(str(path))!r}"
        raise ConfigError(f"{what} ({exc.strerror or exc}{room})") from None
    return path


NO_ROOM = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT}  # a disk or a file-size limit that takes no more bytes
_NO_ROOM_TEXT = ("No space left on device", "File too large", "Disk quota exceeded", "os error 28", "os error 27")


def no_room(exc: BaseException) -> bool:
    """Whether ``exc`` (or one it was raised from or during) says a disk or a file-size limit took no more bytes: an
    OSError with ENOSPC, EFBIG or EDQUOT, or the text of one."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in NO_ROOM or any(t in str(exc) for t in _NO_ROOM_TEXT):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def room_left(folder: Path) -> str:
    """What ``folder``'s disk (or its nearest existing ancestor's) still takes, as words for a message: "the N
    bytes free in <folder>", and the process's file-size limit where one is set."""
    try:
        st = os.statvfs(_nearest_existing(folder))
        free = f"the {st.f_bavail * st.f_frsize} bytes free in {str(folder)!r}"
    except OSError:
        free = f"what is free in {str(folder)!r}"
    try:
        import resource

        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    except (ImportError, OSError, ValueError):
        limit = -1
    return free + (f" (and files are limited to {limit} bytes: ulimit -f)" if limit >= 0 else "")
