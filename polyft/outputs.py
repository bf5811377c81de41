"""Where a command writes (`polyft inspect --dot/--plot FILE`, `polyft reproduce --out DIR`),
checked before it prints or writes anything: a command never reports a file it cannot write, and
writes exactly the path it names."""
from __future__ import annotations

import os
import stat
import tempfile

from .errors import PolyftError

# --plot's formats (matplotlib's raster and vector ones), by the file's suffix, any case
PLOT_FORMATS = ("png", "pdf", "svg", "jpg", "jpeg", "eps", "ps", "tif", "tiff", "webp")


def _error(message: str, op: str) -> PolyftError:
    return PolyftError(message, op=op, where="")


def _can_create_in(folder: str) -> str | None:
    """Why no file can be created in the existing folder `folder`, or None (tried: root's access()
    says yes to anything but a read-only mount, /proc's folders included)."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".polyft-probe-", dir=folder)
    except OSError as e:
        return e.strerror or str(e)
    os.close(fd)
    os.unlink(probe)
    return None


def writable_file(path: str, option: str, op: str = "inspect") -> None:
    """An error unless `path` names a file that can be written: in an existing, writable folder,
    and not a folder or a special file itself."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise _error(f"{option} {path}: no folder {folder} to write it in", op)
    if os.path.lexists(path):
        st = os.stat(path)
        if stat.S_ISDIR(st.st_mode):
            raise _error(f"{option} {path}: that is a folder; name a file in it", op)
        if not stat.S_ISREG(st.st_mode) or folder.startswith(("/proc/", "/sys/")):
            raise _error(f"{option} {path}: not a file that can be written", op)
        try:
            open(path, "ab").close()  # appending nothing: the file as it was
        except OSError as e:
            raise _error(f"{option} {path}: cannot write it ({e.strerror or e})", op) from None
        return
    why = _can_create_in(folder)
    if why is not None:
        raise _error(f"{option} {path}: cannot create a file in {folder} ({why})", op)


def plot_format(path: str, option: str = "--plot") -> str:
    """The picture format `path` asks for by its suffix (png without one)."""
    suffix = os.path.splitext(path)[1].lower().lstrip(".")
    if not suffix:
        return "png"
    if suffix not in PLOT_FORMATS:
        raise _error(f"{option} {path}: .{suffix} is not a picture format; name a .png file (or "
                     f"{', '.join('.' + f for f in PLOT_FORMATS[1:4])})", "inspect")
    return suffix


def writable_folder(path: str, option: str, op: str = "reproduce") -> None:
    """An error unless `path` is a folder that can be written, or one that can be made (every
    existing part of it a folder, the deepest existing one writable)."""
    existing = os.path.abspath(path)
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise _error(f"{option} {path}: {existing} is a file, not a folder", op)
    why = _can_create_in(existing)
    if why is not None:
        raise _error(f"{option} {path}: cannot write in {existing} ({why})", op)
