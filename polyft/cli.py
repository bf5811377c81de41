"""The `polyft` command: list workloads, inspect their ETDG / model / dependences (or your
own program's: `polyft inspect FILE.py:FUNCTION --spec ...`)."""
from __future__ import annotations

import argparse
import os
import signal
import sys
from dataclasses import dataclass

import islpy as isl

from polyft.deps.isl_helpers import union_map
from polyft.deps.model import check_sizes
from polyft.emit.isl_ast import build_ast
from polyft.experiments.reproduce import add_arguments, command
from polyft.schedule.coarsen import coarsen
from polyft.schedule.reorder import bounds
from polyft.schedule.schedule import make_schedule, schedule_kind, time_rows, user_schedule

from . import __version__
from .errors import PolyftError, ScheduleError
from .interpret import bind_params
from .loading import command_line_error, load_function, parse_specs
from .outputs import plot_format, writable_file
from .program import analyze
from .tracing import trace
from .workloads import WORKLOADS, get


def _sizes(texts: list | None) -> dict:
    """--size N=2,L=4 --size D=3: the lengths given, from every --size."""
    out = {}
    for item in (it for text in texts or () for it in text.split(",")):
        name, _, value = item.partition("=")
        if not value.strip().lstrip("-").isdigit():
            raise PolyftError(f"--size expects name=value,... got {item!r}", op="inspect")
        out[name.strip()] = int(value)
    return out


def cmd_workloads(args) -> int:
    for name, mod in WORKLOADS.items():
        sig = trace(mod.program, *mod.specs(args.preset)).signature()
        print(f"{name:<16} {mod.DESCRIPTION}\n{'':<16} {sig}\n")
    return 0


@dataclass
class _Subject:
    """What `polyft inspect` looks at: a bundled workload at a preset (`module` set), or a
    user's function with the inputs its --spec give; every view is drawn from these alone."""

    name: str
    fn: object
    specs: tuple
    module: object = None
    preset: str | None = None

    def lengths(self, view: str) -> dict:
        """Concrete lengths for a view that needs them (--plot, --profile) where --size leaves
        some out: a bundled workload's (the small preset's inputs for the picture, the preset's
        for the profile); a user's program has none but its --size."""
        if self.module is None:
            return {}
        if view == "plot":
            return bind_params(trace(self.fn, *self.module.specs("small")), self.module.inputs("small"))
        from polyft.experiments.deps_time import lengths
        return lengths(self.name, self.preset)


def _subject(args) -> _Subject:
    """The bundled workload, or the FILE.py:FUNCTION / package.module:function, args name."""
    if args.workload in WORKLOADS:
        if args.spec:
            raise command_line_error(f"--spec gives the inputs of your own function (FILE.py:FUNCTION); "
                                     f"{args.workload}'s come from --preset")
        mod, preset = get(args.workload), args.preset or "small"
        return _Subject(args.workload, mod.program, mod.specs(preset), mod, preset)
    if ":" not in args.workload:
        raise command_line_error(f"no workload {args.workload!r}: name a bundled one ({', '.join(WORKLOADS)}) or "
                                 "your own function as FILE.py:FUNCTION or package.module:function")
    if args.preset:
        raise command_line_error("--preset sizes the bundled workloads; your own program's lengths are its "
                                 "--spec's (\"[N, L]float32[1, 8]\") and --size's (N=4)")
    fn = load_function(args.workload)
    return _Subject(args.workload, fn, parse_specs(fn, args.spec))


def cmd_inspect(args) -> int:
    for path, option in ((args.plot, "--plot"), (args.dot, "--dot")):  # before anything is printed
        if path is not None:
            writable_file(path, option)
    plot_as = plot_format(args.plot) if args.plot else None
    subject = _subject(args)
    specs = subject.specs
    sizes = _sizes(args.size)
    if args.profile or args.target != "c":
        return _profile(subject, args, sizes)
    if args.schedule in ("auto", "original"):
        args.schedule = True  # the named schedules: both are printed
    if isinstance(args.schedule, str):
        schedule_kind(args.schedule)  # unreadable ISL: an error before any output
    etdg = trace(subject.fn, *specs)
    check_sizes(sizes, etdg.params, op="inspect --size")  # likewise unknown lengths
    picture = _picture(subject, sizes) if args.plot else None  # too many points: before output too
    print(etdg)
    if args.dot:
        with open(args.dot, "w") as f:
            f.write(etdg.to_dot())
        print(f"\nwrote {args.dot}")
    if args.coarsen:
        coarsened, log = coarsen(etdg)
        print("\ncoarsening (paper §5.1):")
        print("\n".join(f"  {line}" for line in log) or "  nothing to merge")
        print("\nafter coarsening:\n" + str(coarsened))
    status = 0
    if args.deps or args.schedule is not None or args.storage:
        prog = analyze(subject.fn, *specs, sizes=sizes) if args.deps or args.schedule is True or args.storage \
            else None
        if args.deps:
            print("\n" + prog.model.describe())
            print(prog.deps.describe(prog.model.context))
        if args.schedule is True:
            print("\n" + _schedules(prog))
        elif args.schedule is not None:  # a user's schedule: 1 when it is illegal
            text, status = _user_schedule(subject.fn, specs, args.schedule, sizes)
            print("\n" + text)
        if args.storage:
            print("\n" + _storage(prog))
    if picture is not None:
        picture.savefig(args.plot, dpi=100, format=plot_as)  # format given: matplotlib writes args.plot as named
        print(f"\nwrote {args.plot}")
    return status


def _profile(subject, args, sizes) -> int:
    """--target cuda --profile: the GPU profile (Program.gpu_profile) at the preset's lengths,
    overridden by --size (a user's program: --size's)."""
    if not (args.profile and args.target == "cuda"):
        raise PolyftError("--profile and --target go together: `polyft inspect NAME --target cuda --profile` "
                          "(the C target has no GPU profile)", op="inspect")
    lengths = {**subject.lengths("profile"), **sizes}
    _concrete(subject, lengths, "--profile")
    prog = analyze(subject.fn, *subject.specs, sizes=lengths)  # as compiled for these lengths: local buffers sized
    profile = prog.gpu_profile(precision=args.precision)
    shown = ", ".join([subject.preset] * bool(subject.preset) + [f"{k}={v}" for k, v in lengths.items()])
    print(f"{subject.name} ({shown}), CUDA target, precision {args.precision}:\n")
    print(profile)
    return 0


def _picture(subject, sizes):
    """The schedule picture (Schedule.plot) at `sizes`, a bundled workload's lengths not given
    taken from the small preset's inputs (a picture needs concrete ones)."""
    lengths = {**subject.lengths("plot"), **sizes}
    _concrete(subject, lengths, "--plot")
    return analyze(subject.fn, *subject.specs, sizes=lengths).schedule.plot()


def _concrete(subject, lengths: dict, view: str) -> None:
    """A view that needs every length: an error naming the --size to give."""
    missing = [p for p in trace(subject.fn, *subject.specs).params if p not in lengths]
    if missing:
        raise command_line_error(f"{view} needs concrete lengths: give --size "
                                 f"{','.join(f'{p}=4' for p in missing)} (or other values) for {subject.name}")


def _storage(prog) -> str:
    """The contracted buffers with their accesses in schedule time, then bytes per buffer."""
    lines = ["storage (intermediate buffers under the auto schedule):", prog.storage.describe(prog.model.context)]
    missing = [p for p in prog.model.params if p not in prog.model.sizes]
    if missing:
        lines.append(f"(bytes per buffer: give concrete --size for {', '.join(missing)})")
    else:
        lines += ["", prog.memory().to_string(index=False)]
    return "\n".join(lines)


def _schedules(prog) -> str:
    """Original and transformed schedules side by side, per statement, with T and bounds."""
    orig, auto, ctx = prog.original_schedule(), prog.schedule, prog.model.context
    lines = auto.coarsening.describe() + ["schedules (original | auto):"]  # which statements are which
    for name in auto.per_statement:
        lines.append(f"  {name}")
        lines.append(f"    original: {orig.per_statement[name].gist_params(ctx)}")
        lines.append(f"    auto:     {auto.per_statement[name].gist_params(ctx)}")
        rows, dom = time_rows(auto.per_statement[name]), prog.model.domains[name]
        dims = ", ".join(dom.get_dim_name(isl.dim_type.set, k) for k in range(dom.dim(isl.dim_type.set)))
        moved = [(k, r[1]) for k, r in enumerate(rows or []) if any(r[0])]  # the time dims T gives
        shown = f": auto time dims {', '.join(f'c{k}' for k, _ in moved)} = T·[{dims}] + " \
            f"[{', '.join(o for _, o in moved)}]" if rows is not None else ""
        lines.append(f"    T = {auto.T[name].tolist()}{shown}")
        rng = bounds(prog.model, name, auto.reordering(prog.model, name))
        lines.append("    bounds of T·x, outer to inner: " + ", ".join(f"{n} in {b}" for n, b in rng))
    for label, s in (("original", orig), ("auto", auto)):
        kinds = ", ".join("par" if p else "seq" for p in s.parallel)
        steps = f", sequential steps {s.sequential_steps}" if s.sequential_steps is not None else \
            " (sequential steps: give concrete --size)"
        lines.append(f"  {label} time dims [{kinds}]{steps}")
    lines.append("bands:")
    lines += [ln for ln in auto.describe(ctx).splitlines() if ln.startswith("  band")]
    if any(d.reversed for b in auto.bands for d in b.dims):
        lines.append("  (a band's T acts on its dims in execution order: a right aggregate's dim x as its "
                     "length - 1 - x; the T above, per statement, on the dims themselves)")
    return "\n".join(lines)


def _user_schedule(fn, specs, text, sizes) -> tuple[str, int]:
    """A user's schedule for the traced (not coarsened) program: per statement its time map and
    matrix, whether it is legal (else the violating pair of instances), the time dims named
    c0, c1, ... outer to inner as the loops of the ISL AST are, parallel or sequential, the
    sequential steps, and the loop nest as C. (text, exit status: 0 legal, 1 not)."""
    prog = analyze(fn, *specs, sizes=sizes, schedule="original")  # the same ETDG a user schedule sees
    model, ctx = prog.model, prog.model.context
    kind = schedule_kind(text)  # unreadable, unknown statements, wrong arity: an error (exit 2)
    per = user_schedule(model, kind)
    lines = [f"user schedule {text}:"]
    for name, m in per.items():
        lines.append(f"  {name}: {m.gist_params(ctx)}")
        rows = time_rows(m)
        if rows is not None:
            dom = model.domains[name]
            dims = [dom.get_dim_name(isl.dim_type.set, k) for k in range(dom.dim(isl.dim_type.set))]
            lines.append(f"    [{', '.join(f'c{k}' for k in range(len(rows)))}] = "
                         f"{[r[0] for r in rows]}·[{', '.join(dims)}] + [{', '.join(r[1] for r in rows)}]")
    try:
        schedule = make_schedule(model, prog.deps, kind)
    except ScheduleError as e:  # a dependence violated, or two instances at one time
        lines.append(f"legal: no: {e.detail}")
        lines.append("loop nest (the ISL AST of this schedule; polyft generates no code for it):")
        space = isl.Space.params_alloc(ctx.get_ctx(), 0)
        lines += ["  " + ln for ln in build_ast(union_map(per.values(), space), ctx).to_C_str().splitlines()]
        return "\n".join(lines), 1
    names = [f"c{k}" for k in range(len(schedule.parallel))]
    lines.append("legal: yes (every dependence runs forward in time, every instance has its own time)")
    lines.append("time dims (outer to inner): " + ", ".join(f"{n} {'par' if p else 'seq'}"
                                                          for n, p in zip(names, schedule.parallel)))
    lines.append("parallel dims: " + (", ".join(n for n, p in zip(names, schedule.parallel) if p) or "none"))
    missing = [p for p in model.params if p not in model.sizes]
    lines.append(f"sequential steps: {schedule.sequential_steps}" if schedule.sequential_steps is not None
                 else f"sequential steps: give concrete --size for {', '.join(missing)}")
    lines.append("loop nest (ISL AST):")
    lines += ["  " + ln for ln in build_ast(schedule.map, ctx).to_C_str().splitlines()]
    return "\n".join(lines), 0


def cmd_reproduce(args) -> int:
    return command(args.artefacts, args)  # unknown artefacts: a PolyftError before anything runs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="polyft", description=__doc__)
    parser.add_argument("--version", action="version", version=f"polyft {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("workloads", help="list the paper's workloads with their type signatures")
    p.add_argument("--preset", default="small",
                   help="the size preset whose static dims the signatures show (small, the default; paper; the "
                        "RNNs also middle, large)")
    p.set_defaults(run=cmd_workloads)
    p = sub.add_parser("inspect", help="print a workload's or your own program's ETDG (and its ISL model)")
    p.add_argument("workload", metavar="WORKLOAD",
                   help=f"one of: {', '.join(WORKLOADS)}; or your own function: FILE.py:FUNCTION or "
                        "package.module:function, with --spec for its inputs")
    p.add_argument("--spec", action="append", metavar="TYPE",
                   help="your own function's inputs, one --spec per parameter in order, as ft.spec takes them: "
                        "\"[N, L]float32[1, 8]\" (a depth-2 list of symbolic lengths N, L), \"float32[8, 8]\"")
    p.add_argument("--preset", help="a bundled workload's size preset for the static dims (small, the default; "
                                    "paper; the RNNs also middle, large)")
    p.add_argument("--dot", metavar="FILE", help="also write the ETDG as Graphviz DOT")
    p.add_argument("--deps", action="store_true",
                   help="print domains, access relations, dependences and distance vectors")
    p.add_argument("--coarsen", action="store_true",
                   help="print what the coarsening passes merge, and the ETDG after them")
    p.add_argument("--schedule", nargs="?", const=True, default=None, metavar="ISL",
                   help="print the original and transformed schedules (ISL strings, T, bounds; also with "
                        "\"auto\" or \"original\"); with an ISL "
                        "schedule (\"{ S_b0[i, j, k] -> [j + k, j, i] }\"), check that one instead: legality, "
                        "parallel time dims, sequential steps, the loop nest (exit status 1 when illegal)")
    p.add_argument("--storage", action="store_true",
                   help="print the storage mapping: live accesses, contraction, placement, bytes per buffer")
    p.add_argument("--size", action="append", metavar="N=2,L=4",
                   help="fix symbolic lengths (concrete ISL strings); repeatable: --size N=2 --size L=4")
    p.add_argument("--target", choices=["c", "cuda"], default="c", help="the target --profile describes")
    p.add_argument("--profile", action="store_true",
                   help="with --target cuda: the GPU profile at the preset's lengths (or --size; your own "
                        "program: --size for every length): kernels with "
                        "grids, shared memory, ptxas registers and spills, launches, where each buffer lives, "
                        "global and DRAM bytes per call, a roofline time on an H100")
    p.add_argument("--precision", default="fp32", help="matmul precision for --profile (fp32, tf32, fp16, bf16)")
    p.add_argument("--plot", metavar="FILE",
                   help="draw the schedule picture into FILE (.png): a band's instances, flow dependences and "
                        "sequential steps as written and auto, the wavefront's hyperplanes; a bundled workload's "
                        "lengths not in --size are the small preset's, your own program needs --size for each")
    p.set_defaults(run=cmd_inspect)
    p = sub.add_parser("reproduce", help="run the paper's experiments into a fresh folder (--out DIR to choose)")
    add_arguments(p)
    p.set_defaults(run=cmd_reproduce)
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except BrokenPipeError:  # the reader went away (`polyft inspect ... | head`): stop quietly, as a shell tool does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's final flush must not fail too
        return 128 + signal.SIGPIPE
    except PolyftError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a file the command was told to read or write: one line, not a traceback
        print(f"error: {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
