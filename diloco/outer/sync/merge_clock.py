"""When a fragment merges (`outer.merge_clock`) and how large its outer step is (`outer.merge_scale`).

Two independent axes of Decoupled DiLoCo's synchronizer (docs/algorithms.md, "The merge clock"):

clock  arrival: a fragment's round opens at its first upload and merges at the quorum plus the
         grace window (rounds.py); with K = 1 nearly every upload is its own merge, so M learners
         make up to M merges of a fragment per H steps.
       period: fragment p merges on the synchronizer's schedule, once per period T = H · (the
         reference step time). Its first merge is the arrival rule's (K uploads, then the grace
         window), so the schedule's phase is the learners' own stagger (fragment p is uploaded
         at steps ≡ p·H/P mod H); every merge sets the next one T after its scheduled time, or
         T after its own time when it came late. At the scheduled time a merge takes every
         upload of p that arrived since the last one; with fewer than K it waits for the K-th,
         then the grace window. Before that time a round merges only once every live learner
         has uploaded (it waits for nobody).
scale  one: every merge is one outer step, whatever it holds.
       tokens: a merge is the share s = min(1, its tokens / a full round's expected tokens) of an
         outer step (a fractional Nesterov step, optimizers.fractional_step: the momentum decays
         by μ^s and takes s·g, the parameters move by lr·s·(g + μ·m)), so that the merges of one
         full round add up to about one outer step whatever their number.

The reference step time is the EMA of the K-th fastest live learner's step time (K the quorum;
every live learner counts with a quorum of all, so it is the slowest's): the pace at which a
quorum's worth of a fragment's uploads comes in. A full round's expected tokens are, over the
live learners measured, H steps' tokens each, times its share of a reference period it trains
(min(1, reference / its step time)): every learner's one upload when they keep the same pace.
"""

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from diloco.outer import policies
from diloco.outer.protocol import Upload

ARRIVAL, PERIOD = "arrival", "period"
CLOCKS = (ARRIVAL, PERIOD)
ONE, TOKENS = "one", "tokens"
SCALES = (ONE, TOKENS)


@dataclasses.dataclass
class Pace:
  """Each learner's EMAs of seconds and tokens per inner step, from its uploads.

  A learner's seconds per step are measured between its uploads' arrivals: the seconds between
  two over the inner steps it took in between (`Upload.step`), everything it does in a step
  counted (its uploads, polls and merges applied as well as the step itself). Until it has two,
  the step time it reports (the step alone) stands in; the first measured interval replaces it.
  """

  decay: float
  step_s: dict[int, policies.Ema] = dataclasses.field(default_factory=dict)
  tokens: dict[int, policies.Ema] = dataclasses.field(default_factory=dict)  # per step
  last: dict[int, tuple[float, int]] = dataclasses.field(default_factory=dict)  # (arrival, step)
  measured: set[int] = dataclasses.field(default_factory=set)  # learners with an interval

  def observe(self, up: Upload) -> None:
    m, ema = up.learner, self.step_s.get(up.learner)
    before, self.last[m] = self.last.get(m), (up.time, up.step)
    if before is not None and up.step > before[1] >= 0 and up.time >= before[0]:
      sample = (up.time - before[0]) / (up.step - before[1])
      if m not in self.measured or ema is None:
        self.step_s[m], ema = policies.Ema(self.decay), None
        self.measured.add(m)
      self.step_s[m].update(sample)
    elif ema is None and up.step_time > 0 and math.isfinite(up.step_time):
      self.step_s[m] = policies.Ema(self.decay, float(up.step_time))
    if up.steps > 0 and up.tokens > 0:
      self.tokens.setdefault(m, policies.Ema(self.decay)).update(up.tokens / up.steps)

  def reference_s(self, live: Iterable[int], quorum: policies.Quorum) -> float | None:
    """The K-th fastest live learner's step time (None: no live learner measured yet)."""
    times = sorted(self.step_s[m].get() for m in live if m in self.step_s)
    if not times:
      return None
    return times[quorum.required(len(times)) - 1]

  def round_tokens(self, live: Iterable[int], reference_s: float, steps: int) -> float:
    """A full round's expected tokens: Σ over live learners measured of H·tokens per step·
    min(1, reference / step time)."""
    total = 0.0
    for m in live:
      if m in self.step_s and m in self.tokens:
        total += steps * self.tokens[m].get() * min(1.0, reference_s / self.step_s[m].get())
    return total

  def state(self) -> list:
    """Each learner's [id, seconds per step, tokens per step, measured between arrivals]; the
    last arrivals are not kept (an interval across a restart is not a step's)."""
    return [
        [
            m,
            self.step_s[m].value,
            self.tokens[m].value if m in self.tokens else None,
            m in self.measured,
        ]
        for m in sorted(self.step_s)
    ]

  def load(self, rows: Sequence) -> None:
    self.step_s, self.tokens, self.last, self.measured = {}, {}, {}, set()
    for m, step_s, tokens, measured in rows:
      self.step_s[int(m)] = policies.Ema(self.decay, float(step_s))
      if tokens is not None:
        self.tokens[int(m)] = policies.Ema(self.decay, float(tokens))
      if measured:
        self.measured.add(int(m))


@dataclasses.dataclass
class MergeClock:
  """A synchronizer's merge clock and scale: the learners' pace and, under `period`, each owned
  fragment's next scheduled merge (on the runtime's clock: the simulated one, or the host's
  monotonic seconds)."""

  clock: str
  scale: str
  steps: int  # H
  pace: Pace
  due: dict[int, float | None]  # fragment -> its next scheduled merge; None: not yet scheduled
  period: dict[int, float] = dataclasses.field(default_factory=dict)  # ... and the period it kept
  restored: bool = False  # loaded from a checkpoint; its schedule not yet moved to the clock
  now: float = 0.0  # the time of the last merge (a checkpoint's: its last before the save)
  # fragment -> (time of its last merge, [intervals between its merges, their sum in periods])
  intervals: dict[int, tuple[float, list[float]]] = dataclasses.field(default_factory=dict)

  @classmethod
  def of(cls, clock: str, scale: str, steps: int, decay: float, owned: Iterable[int]):
    if clock not in CLOCKS:
      raise ValueError(f"unknown outer.merge_clock {clock!r}; expected one of {CLOCKS}")
    if scale not in SCALES:
      raise ValueError(f"unknown outer.merge_scale {scale!r}; expected one of {SCALES}")
    if steps < 1:
      raise ValueError(f"the merge clock needs inner_steps >= 1, got {steps}")
    return cls(clock, scale, steps, Pace(decay), {p: None for p in owned})

  @property
  def stateful(self) -> bool:
    """Whether there is anything to save: the durable state of arrival with scale one is as
    before the merge clock (no metadata key)."""
    return self.clock != ARRIVAL or self.scale != ONE

  def period_s(self, live: Iterable[int], quorum: policies.Quorum, fallback_s: float) -> float:
    """T = H · the reference step time (`fallback_s`, the EMA of all uploads, when none of the
    live learners is measured)."""
    ref = self.pace.reference_s(live, quorum)
    return self.steps * (ref if ref is not None else fallback_s)

  def due_at(self, p: int) -> float | None:
    """Fragment p's next scheduled merge under `period`; None: merge by arrival."""
    return self.due[p] if self.clock == PERIOD else None

  def merged(self, p: int, now: float, on_time: bool, period_s: float) -> None:
    """Schedules fragment p's next merge after one at `now`: one period after the scheduled time
    when the merge kept it (`on_time`), else one period after `now`."""
    due = self.due[p]
    base = due if on_time and due is not None else now
    self.due[p], self.period[p], self.now = base + period_s, period_s, now
    last, counts = self.intervals.get(p, (now, [0, 0.0]))
    if now > last and period_s > 0:
      counts[0], counts[1] = counts[0] + 1, counts[1] + (now - last) / period_s
    self.intervals[p] = (now, counts)

  def merges_per_period(self) -> dict[int, float]:
    """Fragment -> its merges per period since this synchronizer started: the intervals
    between its consecutive merges over their sum in periods (each in the period its later
    merge measured). Under `period` at most about 1; under `arrival` up to the learners'."""
    return {p: n / t for p, (_, (n, t)) in sorted(self.intervals.items()) if t > 0}

  def resume(self, now: float) -> None:
    """After a restore, at the first event, moves the schedule to the clock. On the same clock
    (`now` not before the checkpoint's last merge: the simulated clock, a host that keeps its
    origin) each scheduled merge that passed while the
    synchronizer was down moves on by whole periods to the first at or after `now`: the phase is
    kept. A clock that started again (a new synchronizer process counts from its own start)
    cannot say how long it was down: the schedule resumes as it stood at the checkpoint's last
    merge, from `now` (each fragment's stagger and period kept, the phase moved by the
    downtime). Called on the events that may change the state (a Join, an upload that passed
    its checks, a timer), never on one that is refused."""
    if not self.restored:
      return
    self.restored = False
    shift = now - self.now if now < self.now else 0.0
    for p, due in self.due.items():
      period = self.period.get(p, 0.0)
      if due is None:
        continue
      due += shift
      if due < now and period > 0:
        due += period * math.ceil((now - due) / period)
      self.due[p] = due

  def share(self, tokens: Sequence[int], live: Iterable[int], quorum: policies.Quorum) -> float:
    """The share of an outer step a merge of uploads with `tokens` takes (1 under scale one, or
    while nothing is measured)."""
    if self.scale == ONE:
      return 1.0
    live = list(live)
    ref = self.pace.reference_s(live, quorum)
    full = self.pace.round_tokens(live, ref, self.steps) if ref is not None else 0.0
    return min(1.0, sum(tokens) / full) if full > 0 else 1.0

  def state(self) -> dict[str, Any]:
    return {
        "clock": self.clock,
        "scale": self.scale,
        "pace": self.pace.state(),
        "due": [[p, d, self.period.get(p)] for p, d in sorted(self.due.items())],
        "now": self.now,
    }

  def load(self, meta: Mapping[str, Any] | None) -> None:
    """Restores the pace and schedule a checkpoint kept (nothing in one saved under arrival and
    scale one, or before the merge clock: the schedule starts again from the learners' uploads)."""
    self.due, self.period, self.restored = dict.fromkeys(self.due), {}, True
    self.pace.load([])
    if not meta:
      return
    self.pace.load(meta["pace"])
    self.now = float(meta["now"])
    for p, d, t in meta["due"]:
      if int(p) in self.due and d is not None:
        self.due[int(p)], self.period[int(p)] = float(d), float(t)


def summary(clocks: Sequence[MergeClock]) -> dict[str, Any]:
  """A run's `merge_clock` summary key from its synchronizer's clocks (one per shard): the clock,
  the scale and each fragment's merges per period."""
  per = {p: x for c in clocks for p, x in c.merges_per_period().items()}
  return {
      "clock": clocks[0].clock,
      "scale": clocks[0].scale,
      "merges_per_period": {str(p): x for p, x in sorted(per.items())},
      "mean_merges_per_period": sum(per.values()) / len(per) if per else None,
  }
