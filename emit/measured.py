"""A choice among ways to run the same call (thread counts, schedules), made by timing calls
per key (the call's lengths), not by a model of the machine: on a shared VM the faster way
changes with the load, and no model knows what another process does.

`MeasuredChoice.pick(key)` says which option the next call at `key` runs and `record` takes
its time. The first call at a key warms up (pages, scratch, caches) on `first` and is not
counted; with `warm_each`, every option's first call is a warm-up (options built apart, each
with memory of its own to touch first). Then each option is tried once, then the faster runs,
the other probed after 2 calls, then 4, 8, ... up to MAX_INTERVAL while it keeps losing (back
to 2 when it wins), so a change of load is found again; and at the latest once the calls since
the last probe took PROBE_SHARE times the other's time, so a probe costs at most 1/PROBE_SHARE
of the time and a choice made in a busy spell does not outlast it by hundreds of calls (a 9 ms
LSTM on a shared VM ran on one thread for seconds after the spell: 256 calls). An option's time
is the median of its last KEEP calls; a probe's time replaces the probed option's.
"""
from __future__ import annotations

import statistics
import time

FIRST_INTERVAL = 2
MAX_INTERVAL = 256
PROBE_SHARE = 20
KEEP = 3


class _Seen:
    """What has been measured at one key."""

    def __init__(self, options):
        self.times = {o: [] for o in options}
        self.warm = set()  # the options whose warm-up call is done
        self.calls = 0
        self.interval = FIRST_INTERVAL
        self.probe_at = 0
        self.since = 0.0  # time of the calls since the last probe


class MeasuredChoice:
    """Which of one or two `options` each call runs, measured per key (module docstring);
    `clock()` reads a clock in any unit (time.perf_counter; the tests pass a fake one)."""

    def __init__(self, options, first=None, warm_each=False, clock=time.perf_counter):
        self.options = list(options)
        assert 1 <= len(self.options) <= 2
        self.first = self.options[0] if first is None else first
        self.warm_each = warm_each
        self.clock = clock
        self._seen = {}

    def pick(self, key):
        """The option the next call at `key` runs."""
        s = self._seen.get(key)
        if s is None:
            s = self._seen[key] = _Seen(self.options)
        if not s.warm or len(self.options) == 1:
            return self.first
        cold = [o for o in self.options if o not in s.warm]
        if cold:
            return cold[0]
        untried = [o for o in self.options if not s.times[o]]
        if untried:
            return untried[0]
        best = self.best(key)
        other = next(o for o in self.options if o != best)
        if s.calls >= s.probe_at or s.since >= PROBE_SHARE * s.times[other][-1]:
            return other
        return best

    def best(self, key):
        """The option with the lowest median time at `key`; None before every one is measured."""
        s = self._seen.get(key)
        if s is None or not all(s.times.values()):
            return None
        return min(self.options, key=lambda o: statistics.median(s.times[o]))

    def record(self, key, option, seconds):
        """The time of a call at `key` that ran `option` (as `pick` said)."""
        s = self._seen[key]
        s.calls += 1
        if option not in s.warm:
            s.warm |= {option} if self.warm_each else set(self.options)
            return
        before = self.best(key)
        if before is not None and option != before:  # a probe: its time alone stands for it
            s.times[option] = [seconds]
            s.since = 0.0
            won = self.best(key) == option
            s.interval = FIRST_INTERVAL if won else min(2 * s.interval, MAX_INTERVAL)
            s.probe_at = s.calls + s.interval
            return
        s.times[option] = (s.times[option] + [seconds])[-KEEP:]
        s.since += seconds
        if before is None and self.best(key) is not None:
            s.probe_at = s.calls + s.interval

    def run(self, key, call):
        """`call(option)` on the option picked for `key`, timed and recorded; its result."""
        option = self.pick(key)
        t0 = self.clock()
        out = call(option)
        self.record(key, option, self.clock() - t0)
        return out
