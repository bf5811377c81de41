"""The names user code gives (lengths, buffers), as they are written in ISL and in generated C/CUDA.

Any Python identifier is a valid name, and none is reserved; but ISL has keywords (`min`,
`exists`, `mod`, `true`, ...) and names of its own (`e0`, `c1`), C has keywords, the headers
macros and functions, and the generated code identifiers of its own (`c`, `ctx`, `params`, `b0`,
`c1_w`, `S_b0_t0`). So a name is written as the user wrote it only when it has the form of the
paper's lengths, `[A-Z][A-Za-z0-9]*` (`N`, `L2`, `NH`, `Seq`), except the few such names the
headers take (`NULL`, `EOF`, `NAN`, `FILE`: `TAKEN`) and Python's `None`, `True`, `False`; any
other is written `ftu_<name>`, a namespace nothing else uses, with `_` doubled and any
character outside ASCII letters and digits written `_u<hex>_` (`xé` -> `ftu_x_ue9_`,
`c1_w` -> `ftu_c1__w`). The map is one-to-one, so distinct names stay distinct, and `shown`
turns a written name back into the user's.

Buffers (a function's arguments and results) name ISL tuples and C comments only, never C
identifiers, so `tuple_name` keeps every name ISL can read (`xs`, `w`, `out`) and writes only
the others (keywords such as `exists`, names outside ASCII) as above."""
from __future__ import annotations

import keyword
import re

PREFIX = "ftu_"
_PLAIN = re.compile(r"[A-Z][A-Za-z0-9]*")
# names of that form the generated code's headers define at file scope (the C library's macros,
# stdio's FILE, emit/tiles.cuh's structs): a length of one of these names is written ftu_ too
TAKEN = frozenset("""BUFSIZ EOF FILE INFINITY MAXFLOAT NAN NFDBITS NGREG NULL SNAN SNANF SNANF128 SNANF32 SNANF32X
    SNANF64 SNANF64X SNANL WCONTINUED WEXITED WEXITSTATUS WIFCONTINUED WIFEXITED WIFSIGNALED WIFSTOPPED WNOHANG
    WNOWAIT WSTOPPED WSTOPSIG WTERMSIG WUNTRACED Batch Chunks Copies Copy In LayoutB Max Precision RowsOf Sum
    Rows""".split())
_CODE = re.compile(r"__|_u([0-9a-f]+)_")
# the words ISL's parser reads as keywords (isl_stream.c), not as names
ISL_KEYWORDS = frozenset({"exists", "and", "or", "xor", "implies", "not", "mod", "floor", "ceil", "floord", "ceild",
                          "min", "max", "rat", "true", "false", "infty", "NaN", "domain", "range", "cond"})


def written(name: str) -> str:
    """The name `name` (a Python identifier) as ISL and generated code spell it."""
    if _PLAIN.fullmatch(name) and name not in TAKEN and not keyword.iskeyword(name):  # None: the host driver is Python
        return name
    return PREFIX + "".join("__" if c == "_" else c if c.isascii() and c.isalnum() else f"_u{ord(c):x}_"
                            for c in name)


def shown(name: str) -> str:
    """The user's name for a `written` one (others unchanged)."""
    if not name.startswith(PREFIX):
        return name
    return _CODE.sub(lambda m: "_" if m.group(0) == "__" else chr(int(m.group(1), 16)), name[len(PREFIX):])


def tuple_name(name: str) -> str:
    """The name `name` (a Python identifier) as a buffer's ISL tuple name."""
    if name.isascii() and name not in ISL_KEYWORDS and not name.startswith(PREFIX):
        return name
    return written(name)
