"""Running artefacts of the registry (registry.py), as `polyft reproduce [NAME ...]` (also
`python -m polyft.experiments.reproduce`) and `python -m polyft.experiments.NAME` all do: each
artefact runs and its result is printed (the module's result_text, read back from the files it
wrote), then the plots drawn from those artefacts' CSVs are redrawn, the folder is indexed, and
every file written is listed at the end (found by comparing the folder before and after, so
nothing is written silently). The folder is a fresh one unless --out names one
(common.fresh_out): the committed results/ are the record of what was measured where, written
only when asked for by name."""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from dataclasses import dataclass

from polyft.errors import PolyftError
from polyft.outputs import writable_folder

from .common import fresh_out, preset as preset_of, preset_args, run_args
from .registry import ARTEFACTS, INDEX, PLOTS, PRESETS, write_index


@dataclass
class Step:
    name: str
    status: str  # "ok" or "FAILED: ..."
    seconds: float


def check(names) -> list:
    """The artefacts to run (all for none named); unknown names raise before anything runs."""
    names = list(names or ARTEFACTS)
    unknown = [n for n in names if n not in ARTEFACTS]
    if unknown:
        raise PolyftError(f"unknown artefacts {', '.join(unknown)}; known: {', '.join(ARTEFACTS)}", op="reproduce",
                          where="")  # a command-line mistake: no line of a program to point at
    return names


def _files(out_dir) -> dict:
    """Each file in out_dir -> what changes when it is written."""
    out = {}
    for entry in os.scandir(out_dir):
        if entry.is_file():
            st = entry.stat()
            out[entry.path] = (st.st_mtime_ns, st.st_ino, st.st_size)
    return out


def _step(name, fn) -> Step:
    """Run fn, print one line with its status and time, then the text it returns (if any)."""
    t0 = time.perf_counter()
    text = None
    try:
        text = fn()
        status = "ok"
    except Exception as e:  # one failing artefact must not hide the others' results
        status = f"FAILED: {type(e).__name__}: {e}"
    seconds = time.perf_counter() - t0
    print(f"[{name}] {status} in {seconds:.1f} s", flush=True)
    if text:
        print(text.rstrip() + "\n", flush=True)
    return Step(name, status, seconds)


def _artefact(name, preset, out_dir, resume) -> str:
    mod = importlib.import_module(ARTEFACTS[name].module)
    mod.run(preset=preset, out_dir=out_dir, resume=resume)
    return mod.result_text(out_dir, preset)


def _plots(names, preset, out_dir) -> list:
    """The plot step, when some plot is drawn from these artefacts' CSVs; its text: the derived
    tables (fig7's speedups, depth scaling)."""
    from . import plot  # matplotlib: only when drawing

    if not any(set(sources) & set(names) for sources in plot.PLOT_SOURCES.values()):
        return []

    def draw():
        plot.run(out_dir, preset, names)
        return plot.summary(out_dir, preset, names)
    return [_step("plot", draw)]


def reproduce(names=None, preset: str = "quick", out_dir: str | None = None, plots: bool = True,
              resume: bool = False, steps=()) -> tuple:
    """Run the named artefacts (all by default), then `steps` ((name, fn returning text or None):
    e.g. table7's --ncu), the plots drawn from their CSVs and the index, into out_dir (None: a
    fresh folder, common.fresh_out). Returns (the Steps, the paths of the files written)."""
    names = check(names)
    out_dir = fresh_out(resume) if out_dir is None else out_dir
    if preset not in PRESETS:
        raise PolyftError(f"preset {preset!r}: one of {', '.join(PRESETS)}", op="reproduce", where="")
    os.makedirs(out_dir, exist_ok=True)
    before = _files(out_dir)
    rows = [_step(n, lambda n=n: _artefact(n, preset, out_dir, resume)) for n in names]
    rows += [_step(name, fn) for name, fn in steps]
    if plots:
        rows += _plots(names, preset, out_dir)
    write_index(out_dir)
    written = sorted(f for f, state in _files(out_dir).items() if before.get(f) != state)
    return rows, written


def summary(rows, written, out_dir: str) -> str:
    """What ran (status, seconds), then every file written, one line each."""
    lines = ["| artefact | reproduces | status | seconds |", "|---|---|---|---|"]
    for r in rows:
        paper = ARTEFACTS[r.name].paper if r.name in ARTEFACTS else "-"
        lines.append(f"| {r.name} | {paper} | {r.status} | {r.seconds:.1f} |")
    lines.append(f"\n{sum(r.seconds for r in rows):.0f} s in all; what every file shows: "
                 f"{os.path.join(out_dir, INDEX)}")
    lines += [f"wrote {f}" for f in written]
    return "\n".join(lines)


def command(names, args, steps=()) -> int:
    """Run `names` as the command line asked (common.preset_args and run_args) and print the
    summary; the exit status: 0 when every step ran, else 1. Without --out, args.out becomes a
    fresh folder (steps read it when they run)."""
    names = check(names)  # before a folder is made
    if args.out is None:
        args.out = fresh_out(args.resume)
    writable_folder(args.out, "--out")  # a file, below a file, /proc: an error before anything is printed
    print(f"writing into {args.out}" + ("" if os.path.isdir(args.out) else " (a new folder)"), flush=True)
    rows, written = reproduce(names, preset_of(args), args.out, plots=not args.no_plots, resume=args.resume,
                              steps=steps)
    print(summary(rows, written, args.out))
    return 0 if all(r.status == "ok" for r in rows) else 1


def artefact_list() -> str:
    """The artefacts of the registry, one line each: name, what it reproduces, its files."""
    lines = ["artefacts (experiments/registry.py; files carry the preset: fig7_quick.csv, fig7_paper.csv):"]
    for name, a in ARTEFACTS.items():
        lines.append(f"  {name:<16}{a.paper}: {', '.join(a.files)}")
    lines.append(f"then the plots and tables drawn from their CSVs: {', '.join(PLOTS)}")
    return "\n".join(lines)


def command_line(name: str, doc: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=f"python -m polyft.experiments.{name}", description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    preset_args(ap)
    run_args(ap)
    return ap


DESCRIPTION = "Run the paper's artefacts (all, or those named), print each one's result and the files written."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`polyft reproduce`'s command line on `parser`: its description, the artefacts listed after
    the options, and the arguments (the artefacts, then preset_args and run_args)."""
    parser.description, parser.epilog = DESCRIPTION, artefact_list()
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("artefacts", nargs="*", metavar="ARTEFACT", help="which artefacts (default: all; listed below)")
    preset_args(parser)
    run_args(parser)


def run_all(argv=None) -> int:
    """`polyft reproduce` as `python -m polyft.experiments.reproduce`: the same arguments, run and
    exit status (a PolyftError: one line, status 2)."""
    ap = argparse.ArgumentParser(prog="python -m polyft.experiments.reproduce")
    add_arguments(ap)
    args = ap.parse_args(argv)
    try:
        return command(args.artefacts, args)
    except PolyftError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def main(name: str, doc: str, argv=None) -> int:
    """The command line of artefact `name`: `python -m polyft.experiments.NAME [--quick | --paper]
    [--out DIR] [--resume] [--no-plots]`, the same run and output as `polyft reproduce NAME`."""
    return command([name], command_line(name, doc).parse_args(argv))


if __name__ == "__main__":
    sys.exit(run_all())
