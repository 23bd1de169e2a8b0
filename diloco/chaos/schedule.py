"""Fault schedules: timed faults, written by hand or drawn from a seed. Failures are data.

One fault per line (or separated by ';'), times and durations in simulated seconds:

  crash learner 2 at t=300s for 120s          its memory is lost; back after 120 s
  straggle learner 1 at t=50s for 100s x3     its steps take 3x longer for 100 s
  delay learner 0 at t=20s for 60s +5s        its messages (both ways) take 5 s longer
  partition learner 0 at t=10s for 30s drop   its messages are dropped (or `hold`: delivered at
                                              the end of the partition)
  corrupt learner 3 at t=80s [up|down]        bits flip in its next upload (or next download)
                                              after the checksum was computed
  poison learner 1 at t=90s [nan|inf|huge] [x1e6]  its next upload carries NaN, Inf, or values
                                              x1e6 the real ones (checksum intact: at the source)
  sync_crash at t=200s for 20s [save]         the synchronizer loses its memory and restarts from
                                              its last checkpoint after 20 s (`save`: it dies
                                              during its next checkpoint write instead)
  sync_crash shard 1 at t=200s for 20s        only shard 1 of outer.sync_shards crashes (the
                                              virtual runtime; the others merge on)

`generate` draws a schedule: per learner, faults arrive as a Poisson process with mean time between
failures `mtbf_s` (a learner's next fault is drawn after its previous one ends), of a kind drawn
uniformly from `kinds`, lasting a time drawn from the recovery distribution; synchronizer crashes
arrive as their own Poisson process. `from_config` reads a run's `chaos` section; the schedules it
generates run to SPAN times the nominal run length, because faults slow a run down (synchronous
DiLoCo most: every crash stalls every learner) and a schedule that ended at the nominal length
would leave the rest of a slowed run without faults. Faults after the token budget is spent are
ignored, and drawing further does not change the earlier faults (each process is its own stream).
"""

import dataclasses
import math
import os
import re

import ml_collections
import numpy as np

from diloco.outer.codecs import compression

LEARNER_KINDS = ("crash", "straggle", "delay", "partition", "corrupt", "poison")
KINDS = LEARNER_KINDS + ("sync_crash",)
MODES = {
    "partition": ("hold", "drop"),
    "corrupt": ("up", "down"),
    "poison": ("nan", "inf", "huge"),
    "sync_crash": ("now", "save"),
}
TIMED = ("crash", "straggle", "delay", "partition", "sync_crash")  # need `for Ns`
DEFAULT_FACTOR = {"straggle": 2.0, "delay": 1.0, "poison": 1e6}
RECOVERY = ("exp", "fixed", "uniform")
SPAN = 4.0  # generated schedules cover SPAN x the nominal run length (see the module doc)
# Presets, relative to the run's nominal length T (steps x step_s): per-learner mean time between
# failures, mean recovery time, synchronizer mean time between failures (0: none), kinds.
PRESETS = {
    "light": dict(mtbf=1.0, recovery=0.05, sync_mtbf=0.0, kinds=("crash", "straggle", "delay")),
    "heavy": dict(mtbf=0.25, recovery=0.05, sync_mtbf=0.5, kinds=LEARNER_KINDS),
}


@dataclasses.dataclass(frozen=True)
class Fault:
  """One fault. `factor`: straggle slowdown, delay seconds, poison 'huge' scale."""

  time_s: float
  kind: str
  learner: int | None = None
  duration_s: float = 0.0
  factor: float = 0.0  # 0: the kind's default
  mode: str = ""  # '': the kind's first mode
  shard: int | None = None  # sync_crash: one synchronizer shard (None: the whole synchronizer)

  def __post_init__(self):
    if self.kind not in KINDS:
      raise ValueError(f"unknown fault kind {self.kind!r}; expected one of {KINDS}")
    if not (math.isfinite(self.time_s) and self.time_s >= 0):
      raise ValueError(f"{self.kind}: time must be finite and >= 0, got {self.time_s}")
    if (self.kind == "sync_crash") != (self.learner is None):
      raise ValueError(
          f"{self.kind}: "
          + ("takes no learner" if self.kind == "sync_crash" else "needs a learner")
      )
    if self.shard is not None and (self.kind != "sync_crash" or self.shard < 0):
      raise ValueError(f"{self.kind}: only sync_crash takes a shard (>= 0), got {self.shard}")
    if self.shard is not None and self.mode == "save":
      raise ValueError("sync_crash of one shard: mode 'save' is not simulated (use 'now')")
    if self.learner is not None and self.learner < 0:
      raise ValueError(f"{self.kind}: learner must be >= 0, got {self.learner}")
    if self.kind in TIMED and not (math.isfinite(self.duration_s) and self.duration_s > 0):
      raise ValueError(f"{self.kind}: needs a duration > 0 ('for Ns'), got {self.duration_s}")
    if self.kind not in TIMED and self.duration_s:
      raise ValueError(f"{self.kind}: takes no duration")
    if not self.factor:
      object.__setattr__(self, "factor", DEFAULT_FACTOR.get(self.kind, 1.0))
    if self.kind == "straggle" and not self.factor >= 1:
      raise ValueError(f"straggle factor must be >= 1, got {self.factor}")
    if self.kind == "delay" and not self.factor > 0:
      raise ValueError(f"delay must add > 0 seconds, got {self.factor}")
    modes = MODES.get(self.kind, ("",))
    if not self.mode:
      object.__setattr__(self, "mode", modes[0])
    if self.mode not in modes:
      raise ValueError(f"{self.kind}: mode {self.mode!r} is not one of {modes}")

  @property
  def end_s(self) -> float:
    return self.time_s + self.duration_s

  def active(self, t: float) -> bool:
    return self.time_s <= t < self.end_s

  def describe(self) -> str:
    """The schedule line of this fault (`parse` reads it back)."""
    words = [self.kind] + ([f"learner {self.learner}"] if self.learner is not None else [])
    words += [f"shard {self.shard}"] if self.shard is not None else []
    words.append(f"at t={self.time_s:g}s")
    if self.duration_s:
      words.append(f"for {self.duration_s:g}s")
    if self.kind in ("straggle", "poison") and self.factor != DEFAULT_FACTOR[self.kind]:
      words.append(f"x{self.factor:g}")
    if self.kind == "delay":
      words.append(f"+{self.factor:g}s")
    if self.kind in MODES:
      words.append(self.mode)
    return " ".join(words)


_NUM = r"([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)"


def parse_line(line: str) -> Fault:
  """One hand-written fault (see the module doc); ValueError naming the line otherwise."""
  words = line.split()
  try:
    if not words or words[0] not in KINDS:
      raise ValueError(f"unknown fault kind; expected one of {KINDS}")
    fields: dict = {"kind": words[0]}
    i = 1
    while i < len(words):
      w = words[i]
      nxt = words[i + 1] if i + 1 < len(words) else ""
      if w == "learner" and re.fullmatch(r"[0-9]+", nxt):
        fields["learner"], i = int(nxt), i + 2
      elif w == "shard" and re.fullmatch(r"[0-9]+", nxt):
        fields["shard"], i = int(nxt), i + 2
      elif w == "at" and (m := re.fullmatch(rf"t={_NUM}s", nxt)):
        fields["time_s"], i = float(m.group(1)), i + 2
      elif w == "for" and (m := re.fullmatch(rf"{_NUM}s", nxt)):
        fields["duration_s"], i = float(m.group(1)), i + 2
      elif m := re.fullmatch(rf"x{_NUM}", w):
        fields["factor"], i = float(m.group(1)), i + 1
      elif (m := re.fullmatch(rf"\+{_NUM}s", w)) and fields["kind"] == "delay":
        fields["factor"], i = float(m.group(1)), i + 1
      elif w in MODES.get(fields["kind"], ()):
        fields["mode"], i = w, i + 1
      else:
        raise ValueError(f"unexpected {w!r}")
    if "time_s" not in fields:
      raise ValueError("missing 'at t=<seconds>s'")
    return Fault(**fields)
  except ValueError as err:
    raise ValueError(f"bad fault line {line.strip()!r}: {err}") from None


def parse(text: str) -> list[Fault]:
  """Faults of a schedule text (lines or ';'-separated; '#' starts a comment), sorted by time."""
  lines = [part.split("#")[0].strip() for line in text.splitlines() for part in line.split(";")]
  return sorted((parse_line(line) for line in lines if line), key=lambda f: f.time_s)


def format_schedule(faults: list[Fault]) -> str:
  return "".join(f.describe() + "\n" for f in faults)


def draw_duration(rng: np.random.Generator, mean_s: float, dist: str) -> float:
  """A recovery time: 'exp' (exponential), 'fixed', or 'uniform' on [0.5, 1.5] x the mean."""
  if dist == "exp":
    return float(rng.exponential(mean_s))
  if dist == "fixed":
    return float(mean_s)
  if dist == "uniform":
    return float(rng.uniform(0.5 * mean_s, 1.5 * mean_s))
  raise ValueError(f"unknown recovery distribution {dist!r}; expected one of {RECOVERY}")


def generate(
    seed: int,
    learners: int,
    horizon_s: float,
    mtbf_s: float,
    kinds: tuple[str, ...] = LEARNER_KINDS,
    recovery_s: float = 60.0,
    recovery_dist: str = "exp",
    sync_mtbf_s: float = 0.0,
) -> list[Fault]:
  """A seeded schedule over [0, horizon_s): see the module doc. Same arguments, same faults."""
  if learners < 1 or not horizon_s > 0 or not mtbf_s > 0 or not recovery_s > 0:
    raise ValueError(
        f"need learners >= 1 and horizon_s, mtbf_s, recovery_s > 0; got "
        f"{learners}, {horizon_s}, {mtbf_s}, {recovery_s}"
    )
  bad = [k for k in kinds if k not in LEARNER_KINDS]
  if bad or not kinds:
    raise ValueError(f"kinds {bad or kinds} must be a non-empty subset of {LEARNER_KINDS}")
  faults = []
  for m in range(learners):
    rng = np.random.default_rng([seed, m])
    t = 0.0
    while (t := t + float(rng.exponential(mtbf_s))) < horizon_s:
      kind = kinds[int(rng.integers(len(kinds)))]
      duration = max(draw_duration(rng, recovery_s, recovery_dist), 1e-3)
      fault = {
          "crash": lambda: Fault(t, kind, m, duration),
          "straggle": lambda: Fault(t, kind, m, duration, float(rng.choice([2.0, 3.0, 5.0]))),
          "delay": lambda: Fault(t, kind, m, duration, float(rng.choice([1.0, 2.0, 5.0]))),
          "partition": lambda: Fault(t, kind, m, duration, mode=str(rng.choice(["hold", "drop"]))),
          "corrupt": lambda: Fault(t, kind, m, mode=str(rng.choice(["up", "down"]))),
          "poison": lambda: Fault(t, kind, m, mode=str(rng.choice(["nan", "inf", "huge"]))),
      }[kind]()
      faults.append(fault)
      t = fault.end_s
  if sync_mtbf_s > 0:
    rng = np.random.default_rng([seed, learners, 1])
    t = 0.0
    while (t := t + float(rng.exponential(sync_mtbf_s))) < horizon_s:
      duration = max(draw_duration(rng, recovery_s, recovery_dist), 1e-3)
      faults.append(Fault(t, "sync_crash", None, duration, mode=str(rng.choice(["now", "save"]))))
      t += duration
  return sorted(faults, key=lambda f: (f.time_s, -1 if f.learner is None else f.learner))


def from_config(c: ml_collections.ConfigDict, learners: int, horizon_s: float) -> list[Fault]:
  """The run's schedule from its `chaos` section; learner indices checked against `learners`.

  `horizon_s` is the run's nominal length: presets scale with it, and generated schedules cover
  SPAN times it."""
  schedule = str(c.schedule).strip()
  if schedule in ("", "none"):
    return []
  if schedule in PRESETS:
    preset = PRESETS[schedule]
    kinds = tuple(k for k in str(c.kinds).split(",") if k) or preset["kinds"]
    sync_mtbf = c.sync_mtbf_s if c.sync_mtbf_s >= 0 else preset["sync_mtbf"] * horizon_s
    faults = generate(
        c.seed,
        learners,
        SPAN * horizon_s,
        c.mtbf_s or preset["mtbf"] * horizon_s,
        kinds,
        c.recovery_s or preset["recovery"] * horizon_s,
        c.recovery_dist,
        sync_mtbf,
    )
  elif " at t=" in schedule:
    faults = parse(schedule)
  elif os.path.isfile(schedule):
    with open(schedule, encoding="utf-8") as f:
      faults = parse(f.read())
  else:
    raise ValueError(
        f"chaos.schedule={schedule!r} is none|light|heavy, fault lines, or a "
        "schedule file; no such file"
    )
  for f in faults:
    if f.learner is not None and f.learner >= learners:
      raise ValueError(f"fault {f.describe()!r} names learner {f.learner} of {learners}")
  return faults


# ---- what a fault does to a message ----


def flip_bits(tree: dict, rng: np.random.Generator) -> dict:
  """A copy of a path-keyed payload (Encoded or arrays) with 1-8 bytes of one tensor XOR-ed with
  random non-zero masks: bits flipped in transit, after the sender's checksum."""
  paths = [k for k in sorted(tree) if _nbytes(tree[k])]
  if not paths:
    raise ValueError("nothing to corrupt: every tensor of the payload is empty")
  path = paths[int(rng.integers(len(paths)))]
  x = tree[path]
  raw = bytearray(
      x.payload if isinstance(x, compression.Encoded) else np.ascontiguousarray(x).tobytes()
  )
  for i in rng.choice(len(raw), size=min(len(raw), int(rng.integers(1, 9))), replace=False):
    raw[int(i)] ^= int(rng.integers(1, 256))
  if isinstance(x, compression.Encoded):
    bad = dataclasses.replace(x, payload=bytes(raw))
  else:
    bad = np.frombuffer(bytes(raw), x.dtype).reshape(x.shape)
  return {**tree, path: bad}


def poison(delta: dict, mode: str, factor: float) -> dict:
  """An outer gradient a broken learner could send, built as raw float32 bytes (past the
  encoder's finite check): NaN or ±Inf in every tensor, or every value times `factor`."""
  out = {}
  for path, e in delta.items():
    x = np.array(compression.decode(e), np.float32)
    if mode == "huge":
      x = x * np.float32(factor) if np.any(x) else np.full_like(x, factor)
    elif mode in ("nan", "inf"):
      bad = np.nan if mode == "nan" else np.inf
      x.reshape(-1)[:: max(1, x.size // 4)] = bad
      x.reshape(-1)[1 :: max(2, x.size // 3)] = -bad if mode == "inf" else bad
    else:
      raise ValueError(f"unknown poison mode {mode!r}; expected one of {MODES['poison']}")
    out[path] = compression.Encoded("fp32", x.shape, x.astype("<f4").tobytes(), e.block)
  return out


def _nbytes(x) -> int:
  return x.nbytes if isinstance(x, compression.Encoded) else np.asarray(x).nbytes
