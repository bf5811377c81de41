"""Files only this user can write: the checks the compile cache makes before it trusts a
directory or reads (and loads) an entry in it.

A cache entry is code this process will run, so "intact" (the checksum record) is not enough:
it must also come from this user. An entry is trusted when every directory above it is
writable only by this user or root (a sticky world-writable directory such as /tmp counts:
others cannot rename or replace what is ours in it), the cache directory is this user's and
writable by no one else, and the entry itself is a regular file of this user's, writable by no
one else, of bounded size. Entries are opened with O_NOFOLLOW|O_NONBLOCK, so a symlink, a FIFO
or a device never blocks or feeds a read; what is checked is the open file itself (fstat), and
the loader is handed the path only while it still names that file (a path, since the loader
matches objects by name: /proc/self/fd/N would alias every object once loaded through
descriptor N). In a directory only this user can write, no one else can swap it in between."""
from __future__ import annotations

import errno
import os
import stat

MAX_ENTRY = 1 << 30  # bytes: no object polyft compiles comes near; a larger entry is not read


def _others_can_write(st) -> bool:
    return bool(st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def make_dirs(d: str) -> None:
    """Create `d` and any missing parents with mode 0700, whatever the umask."""
    missing = []
    p = os.path.abspath(d)
    while not os.path.lexists(p):
        missing.append(p)
        p = os.path.dirname(p)
    for p in reversed(missing):
        try:
            os.mkdir(p, 0o700)
        except FileExistsError:  # a concurrent process made it: checked like any other
            continue
        os.chmod(p, 0o700)  # mkdir's mode is masked by the umask


def untrusted_dir(d: str) -> str | None:
    """Why the directory `d` (a real path) must not hold code this process runs, or None: it is
    not this user's, others can write it, or a directory above it lets others replace it."""
    me = os.geteuid()
    st = os.stat(d)
    if not stat.S_ISDIR(st.st_mode):
        return "not a directory"
    if st.st_uid != me:
        return f"owned by uid {st.st_uid}, not by this user (uid {me})"
    if _others_can_write(st):
        who = "others" if st.st_mode & stat.S_IWOTH else "its group"
        return f"writable by {who} (mode {stat.S_IMODE(st.st_mode):o})"
    p = d
    while os.path.dirname(p) != p:
        p = os.path.dirname(p)
        up = os.stat(p)
        if up.st_uid not in (0, me):
            return f"inside {p}, owned by uid {up.st_uid}, who could replace it"
        if _others_can_write(up) and not up.st_mode & stat.S_ISVTX:
            return f"inside {p} (mode {stat.S_IMODE(up.st_mode):o}), where others could replace it"
    return None


class NotAFile(Exception):
    """An entry that is not a regular file (`kind` says what it is)."""

    def __init__(self, kind: str):
        super().__init__(kind)
        self.kind = kind


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symlink")):
        if test(mode):
            return name
    return "not a regular file"


def open_entry(path: str, limit: int | None = None) -> tuple | None:
    """(file descriptor, its stat) of the regular file `path`, this user's and writable by no
    one else, at most `limit` bytes; None if there is none. Anything else there raises NotAFile
    (a symlink, a symlink loop, a FIFO, a device, a directory, someone else's file, one too big)
    with what it is; nothing is read and nothing blocks."""
    limit = MAX_ENTRY if limit is None else limit
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:  # the last component is a symlink (a loop included)
            raise NotAFile("a symlink") from None
        if e.errno == errno.ENXIO:  # a socket, or a FIFO's peculiarities
            raise NotAFile(_kind(os.lstat(path).st_mode)) from None
        raise
    st = os.fstat(fd)
    why = None
    if not stat.S_ISREG(st.st_mode):
        why = _kind(st.st_mode)
    elif st.st_uid != os.geteuid():
        why = f"a file of uid {st.st_uid}, not of this user"
    elif _others_can_write(st):
        why = f"a file others can write (mode {stat.S_IMODE(st.st_mode):o})"
    elif st.st_size > limit:
        why = f"a file of {st.st_size} bytes, more than polyft ever writes there ({limit})"
    if why is not None:
        os.close(fd)
        raise NotAFile(why)
    return fd, st


def read_fd(fd: int, size: int) -> bytes:
    """The first `size` bytes of the open file `fd` (fewer if it is shorter)."""
    chunks, left = [], size
    while left > 0:
        b = os.pread(fd, min(left, 1 << 24), size - left)
        if not b:
            break
        chunks.append(b)
        left -= len(b)
    return b"".join(chunks)


def still_names(path: str, fd: int) -> bool:
    """Whether `path` still names the open file `fd` (the same inode on the same device)."""
    try:
        st, at = os.fstat(fd), os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (at.st_dev, at.st_ino)
