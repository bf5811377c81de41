"""What every artefact shares: the row metadata (device, commit, date) and the command line
(--quick | --paper, --out)."""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return f"{line.split(':', 1)[1].strip()} x{os.cpu_count()}"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()} x{os.cpu_count()}"


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=os.path.dirname(__file__)).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def meta() -> dict:
    return {"device": cpu_name(), "commit": commit(), "date": datetime.date.today().isoformat()}


def preset_args(parser: argparse.ArgumentParser, quick: str = "small sizes on the CPU (the default)",
                paper: str = "the paper's shapes (for a GPU machine)") -> None:
    """The options every artefact takes: --quick (the default) or --paper, and --out DIR."""
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help=quick)
    size.add_argument("--paper", action="store_true", help=paper)
    parser.add_argument("--out", default="results", help="output folder (default: results)")


def preset(args: argparse.Namespace) -> str:
    return "paper" if args.paper else "quick"


def main(run, doc: str, argv=None) -> int:
    """The command line of an artefact: `python -m polyft.experiments.NAME [--quick | --paper]
    [--out DIR]`, calling run(preset, out_dir)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    preset_args(ap)
    args = ap.parse_args(argv)
    run(preset(args), args.out)
    return 0
