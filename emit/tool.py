"""Running a compiler with a time limit: a compiler that never returns (a wedged wrapper, a
network filesystem that stopped answering) must become a CompileError, not a `compile` that
blocks for good.

The limit is $POLYFT_CC_TIMEOUT seconds (DEFAULT_TIMEOUT unless set; `inf` for none). The
compiler runs in a session of its own, so that on time-out the whole process group is killed:
a wrapper script's children (the real compiler, its assembler) would otherwise keep the output
pipes open and the wait for them would block in turn."""
from __future__ import annotations

import math
import os
import signal
import subprocess

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


def run(command: list, where: str = "generated C") -> subprocess.CompletedProcess:
    """`command` run to completion with its output captured, or CompileError past the limit."""
    limit = timeout()
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as p:
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
    return subprocess.CompletedProcess(command, p.returncode, out, err)
