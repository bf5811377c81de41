"""The `polyft` command: list workloads, inspect their ETDG / model / dependences."""
from __future__ import annotations

import argparse
import sys

from polyft.experiments.common import preset, preset_args
from polyft.schedule.coarsen import coarsen
from polyft.schedule.reorder import bounds

from .errors import PolyftError
from .program import analyze
from .tracing import trace
from .workloads import WORKLOADS, get


def _sizes(text: str | None) -> dict:
    if not text:
        return {}
    out = {}
    for item in text.split(","):
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


def cmd_inspect(args) -> int:
    mod = get(args.workload)
    specs = mod.specs(args.preset)
    etdg = trace(mod.program, *specs)
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
    if args.deps or args.schedule or args.storage:
        prog = analyze(mod.program, *specs, sizes=_sizes(args.size))
        if args.deps:
            print("\n" + prog.model.describe())
            print(prog.deps.describe(prog.model.context))
        if args.schedule:
            print("\n" + _schedules(prog))
        if args.storage:
            print("\n" + _storage(prog))
    return 0


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
    lines = ["schedules (original | auto):"]
    for name in auto.per_statement:
        lines.append(f"  {name}")
        lines.append(f"    original: {orig.per_statement[name].gist_params(ctx)}")
        lines.append(f"    auto:     {auto.per_statement[name].gist_params(ctx)}")
        lines.append(f"    T = {auto.T[name].tolist()}")
        rng = bounds(prog.model, name, auto.reordering(prog.model, name))
        lines.append("    bounds: " + ", ".join(f"{n} in {b}" for n, b in rng))
    for label, s in (("original", orig), ("auto", auto)):
        kinds = ", ".join("par" if p else "seq" for p in s.parallel)
        steps = f", sequential steps {s.sequential_steps}" if s.sequential_steps is not None else \
            " (sequential steps: give concrete --size)"
        lines.append(f"  {label} time dims [{kinds}]{steps}")
    lines.append("bands:")
    lines += [ln for ln in auto.describe(ctx).splitlines() if ln.startswith("  band")]
    return "\n".join(lines)


def cmd_reproduce(args) -> int:
    from polyft.experiments.reproduce import reproduce, summary  # matplotlib and pandas: only here
    rows = reproduce(args.artefacts, preset=preset(args), out_dir=args.out, plots=not args.no_plots)
    print("\n" + summary(rows, args.out))
    return 0 if all(r[1] == "ok" for r in rows) else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="polyft", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("workloads", help="list the paper's workloads with their type signatures")
    p.add_argument("--preset", default="small")
    p.set_defaults(run=cmd_workloads)
    p = sub.add_parser("inspect", help="print a workload's ETDG (and its ISL model)")
    p.add_argument("workload")
    p.add_argument("--preset", default="small", help="size preset for the static dims")
    p.add_argument("--dot", metavar="FILE", help="also write the ETDG as Graphviz DOT")
    p.add_argument("--deps", action="store_true",
                   help="print domains, access relations, dependences and distance vectors")
    p.add_argument("--coarsen", action="store_true",
                   help="print what the coarsening passes merge, and the ETDG after them")
    p.add_argument("--schedule", action="store_true",
                   help="print the original and transformed schedules (ISL strings, T, bounds)")
    p.add_argument("--storage", action="store_true",
                   help="print the storage mapping: live accesses, contraction, placement, bytes per buffer")
    p.add_argument("--size", metavar="N=2,L=4", help="fix symbolic lengths (concrete ISL strings)")
    p.set_defaults(run=cmd_inspect)
    p = sub.add_parser("reproduce", help="run the paper's experiments and write results/")
    p.add_argument("artefacts", nargs="*", help="which artefacts (default: all)")
    preset_args(p)
    p.add_argument("--no-plots", action="store_true", help="skip the plotting step (experiments/plot.py)")
    p.set_defaults(run=cmd_reproduce)
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except PolyftError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
