"""What coarsening (§5.1) did to the traced program's statements, said per statement.

Coarsening renames statements, merges several into one and removes copies and dead stores, so
the statements a schedule lists are not the ones the user's function traced to, and a hand
schedule (`schedule="{ S_b0[i, j] -> ... }"`, traced names unless `coarsen=True`) must use the
traced ones. `Coarsening` pairs the two: each scheduled statement with the traced statements
whose operation nodes it runs (followed by node identity, not by name: passes rename blocks,
and a block a pass creates may take the name of one it removed), the traced statements left
out, and the coarsening log's lines about each. `Schedule.describe()` prints it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from polyft.errors import ScheduleError
from polyft.etdg import ETDG, Statement

# the passes' log tags (schedule/coarsen.py) as the kinds of change they make
_KINDS = {"horizontal": "horizontal merge", "vertical": "vertical merge", "depthwise": "depthwise merge",
          "fuse": "access-map fusion", "dead": "dead stores removed"}


def instance(st: Statement) -> str:
    """`S_b0[i, j]`: a statement with its dims, as a schedule's map names it."""
    return f"{st.name}[{', '.join(d.name for d in st.dims)}]"


def _mentions(line: str, names) -> bool:
    return any(re.search(rf"\b{re.escape(n)}\b", line) for n in names)


def _kind(line: str) -> str:
    return "perfect nest flattened" if "perfect nest" in line else _KINDS.get(line.split(":")[0], "coarsening")


@dataclass(frozen=True)
class Coarsening:
    """`runs`: scheduled statement -> the traced statements whose operations it runs;
    `removed`: traced statement -> the log lines that removed it; `how`: scheduled statement
    -> the log lines about its traced statements; `coarsened`: whether the passes ran at all."""

    traced: dict  # traced name -> instance, in program order
    scheduled: dict  # scheduled name -> instance, in program order
    runs: dict
    removed: dict
    how: dict
    log: tuple
    coarsened: bool

    @classmethod
    def of(cls, traced: ETDG, scheduled: ETDG, log, coarsened: bool) -> "Coarsening":
        owner = {op.id: st.name for st in traced.statements for op in st.ops}
        block_of = {st.name: st.block.name for st in traced.statements}
        runs, how = {}, {}
        for st in scheduled.statements:
            runs[st.name] = list(dict.fromkeys(owner[op.id] for op in st.ops if op.id in owner))
            names = {block_of[m] for m in runs[st.name]}
            if st.block.name not in block_of.values() or st.block.name in names:  # a reused name is another block
                names.add(st.block.name)
            how[st.name] = [ln for ln in log if _kind(ln) not in ("access-map fusion", "dead stores removed")
                            and _mentions(ln, names)]  # those remove statements: below
        kept = {name for ms in runs.values() for name in ms}
        removed = {}
        for st in traced.statements:
            if st.name not in kept:  # its stores were fused away or dead: the lines naming what it stored
                stored = {op.buffer.resolve().name for op in st.ops if op.op == "store"}
                removed[st.name] = [ln for ln in log if ln.startswith(("fuse:", "dead:")) and _mentions(ln, stored)]
        return cls({st.name: instance(st) for st in traced.statements},
                   {st.name: instance(st) for st in scheduled.statements}, runs, removed, how, tuple(log), coarsened)

    def check_names(self, named) -> None:
        """A hand schedule given with coarsen=True that names traced statements coarsening
        merged or removed: a ScheduleError saying where each went and which names to use."""
        gone = [n for n in dict.fromkeys(named) if n in self.traced and n not in self.scheduled]
        if not gone:
            return
        into = {m: self.scheduled[s] for s, ms in self.runs.items() for m in ms}
        where = "; ".join(f"{self.traced[n]} " + (f"is part of {into[n]}" if n in into else "was removed")
                          for n in gone)
        raise ScheduleError(f"the schedule names traced statements that coarsening (coarsen=True) changed: {where}. "
                            f"With coarsen=True name the coarsened statements ({', '.join(self.scheduled.values())}),"
                            " or leave coarsen out to schedule the traced ones", op="schedule")

    @property
    def changed(self) -> bool:
        return bool(self.removed) or any(ms != [name] or self.how[name] for name, ms in self.runs.items())

    def describe(self) -> list:
        """Lines for Schedule.describe(): each scheduled statement with the traced ones it
        runs and how they merged, the traced statements removed, the coarsening log, and the
        statement names a hand schedule uses."""
        traced = ", ".join(self.traced.values())
        if not self.coarsened or not self.changed:
            why = "no coarsening" if not self.coarsened else "coarsening (§5.1) changed nothing"
            return [f"statements as traced ({why}); a hand schedule names them: {traced}"]
        lines = [f"coarsening (§5.1) made {len(self.scheduled)} statement(s) of the {len(self.traced)} traced:"]
        for name, members in self.runs.items():
            kinds = list(dict.fromkeys(_kind(ln) for ln in self.how[name]))
            if members == [name] and not kinds:
                lines.append(f"  {self.scheduled[name]} as traced")
                continue
            ran = " + ".join(self.traced[m] for m in members) or "no traced statement's operations"
            lines.append(f"  {self.scheduled[name]} runs traced {ran}" + (f" ({', '.join(kinds)})" if kinds else ""))
        for name, why in self.removed.items():
            why = "; ".join(why) or "its stores were removed"
            lines.append(f"  {self.traced[name]} removed by coarsening: {why}")
        lines.append("  coarsening steps (prog.coarsen_log):")
        lines += [f"    {ln}" for ln in self.log]
        lines.append(f"a hand schedule (schedule=\"{{ ... }}\", traced unless coarsen=True) names the traced "
                     f"statements: {traced}; with coarsen=True the ones above: {', '.join(self.scheduled.values())}")
        return lines
