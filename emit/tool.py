"""Running a compiler with a time limit: a compiler that never returns (a wedged wrapper, a
network filesystem that stopped answering) must become a CompileError, not a `compile` that
blocks for good.

The limit is $POLYFT_CC_TIMEOUT seconds (DEFAULT_TIMEOUT unless set; `inf` for none). The
compiler runs in a session of its own, so that on time-out the whole process group is killed:
a wrapper script's children (the real compiler, its assembler) would otherwise keep the output
pipes open and the wait for them would block in turn.

Nor does a compiler outlive polyft: it is killed (SIGKILL, by the kernel: PR_SET_PDEATHSIG, set by
util-linux's setpriv where it is installed) when the thread that started it dies; its process group is killed at interpreter exit and, where the
program left SIGTERM's default, on SIGTERM. A process that ignores SIGCHLD cannot read a
compiler's exit status, and one without a free file descriptor cannot start it: each is a
CompileError that says what to do."""
from __future__ import annotations

import atexit
import errno
import math
import os
import shutil
import signal
import subprocess
import sys
import threading

from polyft.errors import CompileError, SettingError

DEFAULT_TIMEOUT = 600.0
ENV = "POLYFT_CC_TIMEOUT"


def timeout() -> float:
    """The compiler time limit in seconds ($POLYFT_CC_TIMEOUT, checked)."""
    text = os.environ.get(ENV, "").strip()
    if not text:
        return DEFAULT_TIMEOUT
    try:
        limit = float(text)
    except ValueError:
        limit = math.nan
    if not limit > 0:  # NaN included
        raise SettingError(f"{ENV}={text!r} is not a positive number of seconds (e.g. 600, or inf for no limit)",
                           op="compile", where=ENV)
    return limit


# The compiler is started through util-linux's setpriv, which sets PR_SET_PDEATHSIG and execs it:
# Python code run in the child between fork and exec (subprocess's preexec_fn) is unsafe in a
# threaded program and makes JAX (and others that hook os.fork) warn of deadlocks at every compile.
_SETPRIV = shutil.which("setpriv") if sys.platform.startswith("linux") else None
_running: set = set()  # process groups of compilers running now
_lock = threading.Lock()


def _killed_with_parent(command: list) -> list:
    """`command`, killed (SIGKILL, by the kernel) when the thread that starts it dies, where setpriv
    can arrange it; FileNotFoundError, as Popen's, where the compiler itself is missing."""
    if shutil.which(command[0]) is None:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), command[0])
    return [_SETPRIV, "--pdeathsig", "KILL", "--", *command] if _SETPRIV else list(command)


def _kill_running() -> None:
    with _lock:
        groups = list(_running)
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass  # finished meanwhile


atexit.register(_kill_running)


class _KillOnTerm:
    """While a compiler runs in the main thread of a program that left SIGTERM's default action:
    SIGTERM kills the compiler's process group, then the program as the default would."""

    def __enter__(self):
        self.old = None
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            self.old = signal.signal(signal.SIGTERM, self._term)
        return self

    @staticmethod
    def _term(signum, frame):
        _kill_running()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    def __exit__(self, *exc):
        if self.old is not None:
            signal.signal(signal.SIGTERM, self.old)


def _popen(command: list, where: str) -> subprocess.Popen:
    if signal.getsignal(signal.SIGCHLD) == signal.SIG_IGN:
        raise CompileError(f"this program ignores SIGCHLD (signal.SIG_IGN), so the exit status of {command[0]} "
                           "cannot be read: restore the default before compiling, signal.signal(signal.SIGCHLD, "
                           "signal.SIG_DFL)", op="compile", where=where)
    try:
        return subprocess.Popen(_killed_with_parent(command), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
    except OSError as e:
        if e.errno in (errno.EMFILE, errno.ENFILE):
            raise CompileError(f"cannot start {command[0]}: every file descriptor is in use ({e.strerror}); close "
                               "files this program keeps open, or raise the limit (ulimit -n, "
                               "resource.setrlimit(resource.RLIMIT_NOFILE, ...))", op="compile", where=where) from None
        raise


def run(command: list, where: str = "generated C") -> subprocess.CompletedProcess:
    """`command` run to completion with its output captured, or CompileError past the limit."""
    limit = timeout()
    with _KillOnTerm(), _popen(command, where) as p:
        with _lock:
            _running.add(p.pid)  # its own session: the group's id is its pid
        try:
            out, err = p.communicate(timeout=None if math.isinf(limit) else limit)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
            raise CompileError(f"{command[0]} did not finish within {limit:g} s (${ENV}; the command: "
                               f"{' '.join(command)}); it was killed. Raise ${ENV} for a slow compiler, "
                               "or set CC to one that works", op="compile", where=where) from None
        except BaseException:  # KeyboardInterrupt: no compiler left running behind us
            os.killpg(p.pid, signal.SIGKILL)
            raise
        finally:
            with _lock:
                _running.discard(p.pid)
    return subprocess.CompletedProcess(command, p.returncode, out, err)
