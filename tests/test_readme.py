"""The README runs as written: every ```python block alone, in a fresh directory, in its own
Python process; the cheap shell commands (`polyft inspect` / `polyft workloads` of a bundled
workload, `--help`, `python -c`); and the numbers it states are the code's.

Conventions the README follows (so that this test can check it):

* A Python block depends only on itself: its imports, its inputs. It runs in an empty
  temporary directory, so it may write files there.
* `print(...)  # -> TEXT`: TEXT is what that line prints (the block's output must contain it;
  `...` at either end marks TEXT as a part of a longer line). Other comments are prose.
* In a ```bash block, a command's output lines are shown below it as `#   LINE` comments
  (three spaces; each must be a line of its output, `...` again marks a prefix), and a comment
  naming `exit status N` says the command exits with N (else it must exit with 0).
* `<!-- not run: WHY -->` on the line right before a fence: a block that is deliberately
  partial. It is still compiled (a Python block) or parsed (shell), never run. Used sparingly.

Shell commands that are not cheap (installing, the experiments, the test suite, the GPU
session) are listed in EXPENSIVE with the reason; any other command makes this test fail until
it is run here or listed there. The memory table and the figures the Memory section states in
prose are checked against the rows experiments/memory.py computes for memory_<preset>.csv
(`prog.memory()` and the traffic models at the paper shapes), computed here afresh; the compile
time table against results/compile_time_quick.csv (times are measured, not recomputed)."""
from __future__ import annotations

import functools
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

from helpers import shell_commands

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
NOT_RUN = re.compile(r"^<!-- not run: (.+) -->$")
TIMEOUT = 300  # seconds for one block; the whole file takes about two minutes on 2 cores

# shell commands shown but not run here (a command starting with the key), and why
EXPENSIVE = {
    "pip install": "installs packages",
    "python -m pytest": "the test suite itself",
    "POLYFT_EXAMPLES=": "a longer property-test search",
    "polyft reproduce": "runs the experiments (minutes to an hour); `polyft reproduce --help` is run",
    "python -m polyft.experiments.": "an experiment (minutes)",
    "POLYFT_MARCH=haswell python -m polyft.experiments.": "an experiment (minutes)",
    "POLYFT_MARCH=haswell polyft reproduce": "runs the experiments",
    "bash scripts/": "the GPU session's scripts (network, a GPU)",
}


@dataclass(frozen=True)
class Block:
    lang: str
    line: int  # the README line of its opening fence
    code: str
    not_run: str | None  # why, for a block marked `<!-- not run: ... -->`

    def __str__(self):
        return f"README.md:{self.line} ({self.lang})"


def blocks(text: str | None = None) -> list:
    text = README.read_text() if text is None else text
    out = []
    for m in re.finditer(r"^```(\w*)\n(.*?)^```$", text, re.S | re.M):
        line = text.count("\n", 0, m.start()) + 1
        before = text[:m.start()].rstrip("\n").rpartition("\n")[2]
        marker = NOT_RUN.match(before.strip())
        out.append(Block(m.group(1), line, m.group(2), marker.group(1) if marker else None))
    return out


def printed(code: str) -> list:
    """What the block's `print(...)  # -> TEXT` lines say they print."""
    out = []
    for line in code.splitlines():
        m = re.match(r"\s*print\(.*\)\s+# -> (.+)$", line)
        if m:
            out.append(m.group(1).strip())
    return out


def contains(output: str, expected: str) -> bool:
    """expected appears in output; `...` at either end: as a part of something longer."""
    return expected.removesuffix("...").removeprefix("...").strip() in output


def run_python(code: str, cwd: Path) -> subprocess.CompletedProcess:
    (cwd / "block.py").write_text(code)
    env = {**os.environ, "MPLBACKEND": "Agg"}
    env.pop("PYTHONPATH", None)  # as a user would: polyft as installed
    return subprocess.run([sys.executable, "block.py"], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT)


PYTHON = [b for b in blocks() if b.lang == "python"]


def test_the_readme_has_python_blocks_and_no_unlabelled_fence():
    assert len(PYTHON) >= 10
    unlabelled = [str(b) for b in blocks() if not b.lang]
    assert not unlabelled, f"fences without a language (```python, ```bash): {unlabelled}"


def test_the_conventions_are_read_as_documented():
    text = "a\n<!-- not run: needs a GPU -->\n```python\nprint(1)  # -> 1\n```\n\n```bash\nls\n```\n"
    partial, shell = blocks(text)
    assert (partial.lang, partial.line, partial.not_run, shell.not_run) == ("python", 3, "needs a GPU", None)
    assert printed(partial.code) == ["1"] and printed("print(x)  # prose") == []
    assert contains("a: 1, b: 2", "a: 1...") and contains("x = a: 1, b", "... a: 1, b") and not contains("a: 2", "a: 1")


@pytest.mark.parametrize("block", PYTHON, ids=lambda b: f"line{b.line}")
def test_python_block_runs_alone(block, tmp_path):
    compile(block.code, str(block), "exec")  # a SyntaxError fails it: a block marked not run must still be Python
    if block.not_run:
        return
    done = run_python(block.code, tmp_path)
    assert done.returncode == 0, f"{block} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    for expected in printed(block.code):
        assert contains(done.stdout, expected), f"{block}: printed no {expected!r}; it printed:\n{done.stdout[-3000:]}"


# -- shell commands ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Command:
    text: str
    line: int
    status: int  # the exit status the README says it has
    output: tuple  # lines the README shows of its output

    def __str__(self):
        return f"README.md:{self.line}: {self.text}"


def commands() -> list:
    """Every command of the ```bash blocks (not marked not run) and every inline `polyft ...`
    span naming a bundled workload or asking for --help."""
    from polyft.workloads import WORKLOADS

    out = []
    for b in blocks():
        if b.lang != "bash" or b.not_run:
            continue
        for body, k, status, shown in shell_commands(b.code):
            out.append(Command(body, b.line + 1 + k, status, tuple(shown)))
    text = README.read_text()
    for m in re.finditer(r"`(polyft [^`]+|python -m polyft[^`]+--help)`", text):
        words = m.group(1).split()
        if words[-1] == "--help" or (words[1] in ("inspect", "workloads") and
                                     (words[1] == "workloads" or words[2:3] and words[2] in WORKLOADS)):
            out.append(Command(m.group(1), text.count("\n", 0, m.start()) + 1, 0, ()))
    return out


def expensive(command: Command) -> str | None:
    if command.text.endswith(" --help"):
        return None
    return next((why for prefix, why in EXPENSIVE.items() if command.text.startswith(prefix)), None)


COMMANDS = commands()
CHEAP = [c for c in COMMANDS if not expensive(c)]


def test_every_shell_command_is_run_or_listed_as_expensive():
    cheap_kinds = re.compile(r"^(polyft (inspect|workloads)\b|python -c |.* --help$)")
    unclassified = [str(c) for c in CHEAP if not cheap_kinds.match(c.text)]
    assert not unclassified, f"shell commands neither run here nor listed in EXPENSIVE: {unclassified}"
    assert len(CHEAP) >= 10


@pytest.mark.parametrize("command", CHEAP, ids=lambda c: f"line{c.line}")
def test_shell_command_runs(command, tmp_path):
    env = {**os.environ, "MPLBACKEND": "Agg"}
    done = subprocess.run(shlex.split(command.text), cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT)
    assert done.returncode == command.status, f"{command}: exit {done.returncode}\n{done.stdout[-2000:]}\n" \
                                              f"{done.stderr[-2000:]}"
    assert "Traceback" not in done.stderr
    lines = [ln.strip() for ln in done.stdout.splitlines()]
    for expected in command.output:
        assert any(contains(ln, expected) and ln.startswith(expected.removesuffix("...").rstrip())
                   for ln in lines), f"{command}: no output line {expected!r}"


# -- the numbers of the Memory section ----------------------------------------------------------

UNITS = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "ms": 1e-3, "s": 1}


def rounds_to(shown: str, value: float) -> bool:
    """`shown` (e.g. "12.7 MB", "1.03", "0") is `value` rounded to the digits it shows."""
    number, _, unit = shown.strip().strip("*").partition(" ")
    digits = len(number.partition(".")[2])
    scale = UNITS[unit] if unit else 1
    return abs(float(number) * scale - value) <= 0.5 * 10 ** -digits * scale * (1 + 1e-9)


@functools.lru_cache(maxsize=1)
def memory_rows() -> pd.DataFrame:
    """memory_<preset>.csv's paper-shape rows as the code computes them now (experiments.memory.measure:
    prog.memory() and the traffic models; a few seconds), one per workload, for code built for
    AVX-512 as the README's table says (which weights are packed depends on the ISA's panel; the
    code is only analysed, so any x86 host computes them)."""
    from polyft.emit import isa
    from polyft.experiments.memory import measure
    from polyft.workloads import WORKLOADS

    with isa.building_for("skylake-avx512"):
        return pd.DataFrame([measure(name, "paper") for name in WORKLOADS]).set_index("workload")


def section(title: str) -> str:
    text = README.read_text()
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def test_rounds_to():
    assert rounds_to("12.7 MB", 12713984) and not rounds_to("6.4 MB", 12713984)
    assert rounds_to("1141 MB", 1140850688) and rounds_to("**1.000**", 1.0001) and rounds_to("0", 0)
    assert not rounds_to("1.13", 1.25)


def test_memory_table_is_what_the_code_computes():
    """The table counts a thread's scratch once per thread of the 2 it says, whatever this machine has."""
    rows = memory_rows()
    text = section("Memory")
    assert "the C target's local scratch counted\nonce per thread (2 threads here)" in text
    table = [ln for ln in text.splitlines() if ln.startswith("| ") and "---" not in ln]
    header = [c.strip() for c in table[0].strip("|").split("|")]
    assert header[:5] == ["workload, paper shape", "io", "before: total / io", "after: total / io",
                          "a thread's scratch"]
    seen = set()
    for line in table[1:]:
        name, io, before, after, scratch = [c.strip() for c in line.strip("|").split("|")][:5]
        r = rows.loc[name]
        for shown, value in ((io, r.io_bytes), (before, r.ratio_full), (after, at_threads(r, 2)),
                             (scratch, r.intermediate_local_bytes)):
            assert rounds_to(shown, value), f"memory table, {name}: {shown!r} but the code gives {value}"
        seen.add(name)
    assert seen == set(rows.index)


def at_threads(r, threads: int) -> float:
    """The C target's total over io were the scratch allocated for `threads` threads."""
    return (r.io_bytes + r.intermediate_allocated_bytes + threads * r.intermediate_local_bytes
            + r.packed_bytes) / r.io_bytes


def test_memory_prose_numbers_are_what_the_code_computes():
    text = " ".join(section("Memory").split())
    rows = memory_rows()
    m = re.search(r"on (\d+) threads the dilated RNN's total would be ([\d.]+)x its io at the paper shape, "
                  r"flash attention's ([\d.]+)x", text)
    assert m, "the Memory section's sentence on many threads moved: update this test"
    threads = int(m.group(1))
    assert rounds_to(m.group(2), at_threads(rows.loc["dilated_rnn"], threads))
    assert rounds_to(m.group(3), at_threads(rows.loc["flash_attention"], threads))
    m = re.search(r"flash attention's thread keeps the states of .*? \(([\d.]+ MB)\)", text)
    assert m and rounds_to(m.group(1), rows.loc["flash_attention"].intermediate_local_bytes)
    fa = rows.loc["flash_attention"]
    m = re.search(r"\(m, l, o\) of every key tile: ([\d.]+ GB) in all for ([\d.]+ GB) of data", text)
    assert m and rounds_to(m.group(1), fa.total_full_bytes) and rounds_to(m.group(2), fa.io_bytes)
    m = re.search(r"the code moves ([\d.]+ GB) in all, ([\d.]+ GB) of it to and from shared memory .*? the "
                  r"generated code moves ([\d.]+ GB) .*? the deferred plan's ([\d.]+ GB)", text)
    assert m, "the Memory section's sentence on bytes moved moved: update this test"
    for shown, value in zip(m.groups(), (fa.code_bytes_moved_with_local, fa.code_bytes_moved,
                                         fa.code_dram_bytes_ideal_cache, fa.deferred_model_bytes)):
        assert rounds_to(shown, value), (shown, value)


def test_the_coarsening_section_memory_of_hyperplanes_against_bands():
    """'56 MB shared at the paper's sizes, where the band schedule keeps 4.2 MB per thread': the
    dilated RNN analysed at concrete sizes (per-statement hyperplanes) and from specs (bands)."""
    import polyft as ft
    from polyft.experiments.deps_time import lengths
    from polyft.workloads import dilated_rnn

    text = " ".join(section("Coarsening").split())
    m = re.search(r"\((\d+ MB) shared at the paper's sizes, where the band schedule keeps ([\d.]+ MB) per thread", text)
    assert m, "the Coarsening section's sentence on the dilated RNN's memory moved: update this test"
    prog = ft.analyze(dilated_rnn.program, *dilated_rnn.specs("paper"), sizes=lengths("dilated_rnn", "paper"))
    mem = prog.memory()
    assert rounds_to(m.group(1), mem.loc[mem["role"] == "intermediate", "allocated_bytes"].sum())
    assert rounds_to(m.group(2), memory_rows().loc["dilated_rnn"].intermediate_local_bytes)


def test_the_compile_time_table_is_the_committed_csv():
    """Each row of 'Deep programs compile in seconds' is results/compile_time_quick.csv's: the
    total, coarsening and compiler CPU seconds at the size it names, and the fitted exponent
    from the third size as the plot draws it; every program there has its one statement."""
    from polyft.experiments.plot import exponent

    df = pd.read_csv(ROOT / "results" / "compile_time_quick.csv")
    rows = {"chain of 256 layers (H = 16)": ("chain", 256), "8 layers of 16 sibling branches": ("branches", 16),
            "12-layer transformer encoder": ("encoder", 12),
            "one layer, a captured 4096 x 4096 weight": ("captured", 4096),
            "the same layer, the weight an input": ("input", 4096)}
    text = section("Coarsening")
    table = [ln for ln in text[text.index("| program | total CPU s"):].split("\n\n")[0].splitlines() if "---" not in ln]
    seen = set()
    for line in table[1:]:
        name, total, coarsen, cc, growth = [c.strip() for c in line.strip("|").split("|")]
        family, size = rows[name]
        at = df[(df["family"] == family) & (df["size"] == size)].set_index("stage")["seconds"]
        for shown, stage in ((total, "total"), (coarsen, "coarsen"), (cc, "cc")):
            assert rounds_to(shown, at[stage]), f"compile time table, {name}: {stage} {shown} but the CSV has {at[stage]}"
        e = exponent(df, family)
        assert (growth == "-") if e is None else rounds_to(growth.partition("^")[2].split()[0], e), (name, growth, e)
        seen.add(name)
    assert seen == set(rows) and (df["statements"] == 1).all() and (df["sequential_steps"] == 1).all()


def test_the_gradient_benchmark_table_is_the_committed_csv():
    """Each row of the Gradients section's benchmark table is results/grad_bench_<preset>.csv's: the
    median seconds per system ('-' where the CSV has no row) and the program's memory, at the shape
    the row names; every shape of the CSVs has its row."""
    df = pd.concat([pd.read_csv(ROOT / "results" / f"grad_bench_{preset}.csv") for preset in ("quick", "paper")])
    systems = {"polyft C": "polyft-c-auto", "polyft eager": "polyft-eager", "torch.nn.LSTM": "torch-nn.LSTM",
               "JAX": "jax-grad-lax.scan"}
    text = section("Gradients")
    table = [ln for ln in text[text.index("| N, H, L, D |"):].split("\n\n")[0].splitlines() if "---" not in ln]
    header = [c.strip() for c in table[0].strip("|").split("|")]
    shapes = set()
    for line in table[1:]:
        cells = dict(zip(header, (c.strip() for c in line.strip("|").split("|"))))
        shape = "N={},H={},L={},D={}".format(*cells["N, H, L, D"].split(", "))
        rows = df[df["shape"] == shape].set_index("system")
        for column, system in systems.items():
            if system not in rows.index:
                assert cells[column] == "-", (shape, column)
            else:
                assert rounds_to(cells[column], rows.loc[system, "seconds"]), (shape, column, rows.loc[system, "seconds"])
        assert rounds_to(cells["memory of the C program"], rows["backward_memory_bytes"].iloc[0]), shape
        shapes.add(shape)
    assert shapes == set(df["shape"])
