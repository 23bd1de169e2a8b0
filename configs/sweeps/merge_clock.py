r"""Decoupled DiLoCo's merge clock and scale (issue 69): does the outer rate that wins stay put as
learners come and go, and does either axis close the gap? Four studies, each cell of
(clock, scale) = arrival|period x one|tokens at its own outer rate (a doubling ladder from GRID,
extended past an edge, then seeds 1 and 2 at the winner), read by notebooks/merge_clock.py;
results are checked in under notebooks/results/merge_clock/:

  W=runs/merge_clock
  python -m experiments.sweep --config=configs/sweeps/merge_clock.py:study=d,part=tune --workdir=$W --table=d_tune --parallel=2
  python -m experiments.sweep --config=configs/sweeps/merge_clock.py:study=d,part=extend,results=$W --workdir=$W --table=d_extend1 --parallel=2   # until it adds no point
  python -m experiments.sweep --config=configs/sweeps/merge_clock.py:study=d,part=seeds,results=$W --workdir=$W --table=d_seeds --parallel=2
  (the same with study=a, c and b; `studies_m=2/16` narrows study a to those M, `pairs=
  period/one+arrival/one` any study to the pairs named, `policies=k1/wait_all` study c to those
  policies, `rates=0.1/0.2` part=tune to those rates)

study=a  invariance: the heterogeneous table's text run at the paper's setting (configs/sweeps/
         delivery.py: rebase, RDA, token weights, K = 1 with the grace window, P = 4, H = 20, the
         tiny decoder at 1 KB per learner step, 10% jitter) with M = 2, 4, 8, 16 learners, the
         second half of them 18% slower, on one budget of 8,000 learner steps' tokens
         (8,000 / M steps each), scored on the whole validation split.
study=c  heterogeneous hardware at the paper's setting: the same run at M = 8 with K = 1 (no
         grace) and K = 1 with grace (study a's M = 8 cells) under every pair, and waiting for
         all (K = 8, blocking learners) by arrival (the period clock is refused with blocking
         learners; a round of all takes a whole step under tokens too, but for each fragment's
         first merge, of the stagger's 5, 10 or 15 steps).
study=b  scavenging: configs/sweeps/scavenging.py's runs (4 learners, 1/2/4/12 more for a
         stretch; time to the 4-learner run's final loss) under a pair, at the preset's outer
         rate (part=preset, every seed; `rates=0.2`: at that one rate instead, as a user who set
         it once) and at each row's own rate (part=tune/extend/seeds).
study=d  the README main job's Decoupled DiLoCo (configs/sweeps/main_job.py's decoupled point,
         inner lr 1e-2: two learners, the second 3x slower, 4,096,000 bytes) under every pair;
         part=baseline: the main job's synchronous DiLoCo (its tuned inner lr, the preset's
         outer rate 0.4), every seed, the reference of the gap.
`tiny`: the test suite's version (study a at M = 4 and 8 on the tiny run, one rate, one seed).
"""

import ml_collections

from configs.sweeps import delivery, main_job, scavenging
from diloco.config import variants
from experiments.studies import outer_lr_search as search, scaling_protocol as sp

SWEEP_KEYS = (
    "eval_loss",
    "eval_bpb",
    "sim_time_s",
    "merges",
    "mean_quorum",
    "merged_share",
    "merge_clock",
    "eval_curve",
    "finished",
    "tokens",
)
SWEEP_ONLY = ("part", "results", "seeds", "pairs", "studies_m", "policies", "rates")
PAIRS = (("arrival", "one"), ("period", "one"), ("arrival", "tokens"), ("period", "tokens"))
LEARNERS = (2, 4, 8, 16)
BUDGET = 8000  # learner steps' tokens of studies a and c (8 x 1,000, the heterogeneous table's)
GRID = (0.05, 0.1, 0.2, 0.4)  # part=tune's rates; part=extend doubles or halves past an edge
KEYS = {  # a cell of each study
    "a": ("learners", "clock", "scale"),
    "b": ("extra", "clock", "scale"),
    "c": ("policy", "clock", "scale"),
    "d": ("clock", "scale"),
}


def _arg(arg: str | None) -> ml_collections.ConfigDict:
  return variants.parse_arg(
      arg,
      tiny=False,
      study="a",
      part="tune",
      results="",
      seeds=3,
      pairs="",
      studies_m="",
      policies="",
      rates="",
      learners=8,
      policy="k1_grace",
      extra=0,
      method="decoupled",
      clock="arrival",
      scale="one",
      outer_lr=0.1,
      seed=0,
  )


def _hetero(a) -> ml_collections.ConfigDict:
  """Studies a and c: the delivery table's paper-setting text run with M learners on BUDGET."""
  c = delivery.get_config(
      f"tiny={a.tiny},policy={a.policy},delivery=rebase,outer_lr={a.outer_lr},seed={a.seed}"
  )
  m = a.learners
  c.outer.learners = m
  if a.policy == "wait_all":
    c.outer.quorum = m
  slow = m // 2
  c.sim.speeds = ",".join(["1"] * (m - slow) + ["1.18"] * slow)
  steps = (48 if a.tiny else BUDGET) // m
  warmup = c.optimizer.warmup_steps
  c.steps = steps
  c.optimizer.decay_steps = steps - warmup
  c.log_every = max(steps // 30, 1)
  c.eval_every = c.checkpoint_every = steps
  return c


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  a = _arg(variants.drop(arg, SWEEP_ONLY))
  if (a.clock, a.scale) not in PAIRS:
    raise ValueError(f"clock={a.clock!r}, scale={a.scale!r}: expected a pair of {PAIRS}")
  if a.study in ("a", "c"):
    c = _hetero(a)
  elif a.study == "b":
    c = scavenging.get_config(f"tiny={a.tiny},extra={a.extra},seed={a.seed},outer_lr={a.outer_lr}")
  elif a.study == "d" and a.method == "diloco":  # the gap's reference, as the main job runs it
    return main_job.get_config(f"tiny={a.tiny},method=diloco,seed={a.seed}")
  elif a.study == "d":
    c = main_job.get_config(f"tiny={a.tiny},method=decoupled,lr=0.01,seed={a.seed}")
    c.outer.lr = a.outer_lr
  else:
    raise ValueError(f"study={a.study!r}: expected one of {tuple(KEYS)}")
  c.outer.merge_clock, c.outer.merge_scale = a.clock, a.scale
  return c


def _cells(a) -> list[tuple]:
  pairs = [tuple(p.split("/")) for p in a.pairs.split("+")] if a.pairs else list(PAIRS)
  if unknown := [p for p in pairs if p not in PAIRS]:
    raise ValueError(f"pairs={a.pairs!r}: {unknown} not among {PAIRS} (pairs=clock/scale+...)")
  if a.study == "a":
    counts = (4, 8) if a.tiny else LEARNERS  # (tiny: 8 test devices split evenly, batch 2)
    counts = [int(m) for m in a.studies_m.split("/")] if a.studies_m else counts
    return [(m, *p) for m in counts for p in pairs]
  if a.study == "b":
    return [(k, *p) for k in scavenging.EXTRAS for p in pairs]
  if a.study == "c":
    cells = [(pol, *p) for pol in ("k1", "k1_grace") for p in pairs]
    cells += [("wait_all", *p) for p in pairs if p[0] == "arrival"]  # (period: refused, blocking)
    named = a.policies.split("/") if a.policies else None
    return [c for c in cells if named is None or c[0] in named]
  return pairs


def _point(study: str, cell: tuple, **more) -> dict:
  point = dict(zip(KEYS[study], cell))
  if study in ("a", "c"):  # the same run in both studies: one point, one directory
    learners, policy = point.pop("learners", 8), point.pop("policy", "k1_grace")
    return dict(study="a", learners=learners, policy=policy, **point, **more)
  return dict(study=study, **point, **more)


def mine(study: str):
  """Whether a finished row belongs to `study`'s cells (a and c share their M = 8, K = 1 with
  grace runs)."""
  if study == "a":
    return lambda r: r.get("study") == "a" and r.get("policy") == "k1_grace"
  if study == "c":
    return lambda r: r.get("study") == "a" and int(r.get("learners", 0)) == 8
  return lambda r: r.get("study") == study and r.get("method", "decoupled") == "decoupled"


def get_sweep(arg: str | None = None) -> list[dict]:
  a = _arg(arg)
  if a.study not in KEYS:
    raise ValueError(f"study={a.study!r}: expected one of {tuple(KEYS)}")
  keys, cells = KEYS[a.study], _cells(a)
  if a.study == "b" and a.part == "preset":  # every row at one outer rate, every seed: 0.1 (the
    rate = float(a.rates) if a.rates else 0.1  # preset's until the period clock), or one named
    return [_point("b", c, outer_lr=rate, seed=s) for s in range(a.seeds) for c in cells]
  if a.study == "d" and a.part == "baseline":
    return [dict(study="d", method="diloco", seed=s) for s in range(a.seeds)]
  belongs = mine(a.study)
  return search.stage_points(
      a.part,
      a.results,
      keys=keys,
      cells=cells,
      grid=[float(x) for x in a.rates.split("/")] if a.rates else GRID[1:2] if a.tiny else GRID,
      point=lambda c, lr, seed: _point(a.study, c, outer_lr=lr, seed=seed),
      rows=lambda: [flat(r) for r in sp.read_rows(a.results) if belongs(r)],
      seeds=range(1, a.seeds),
      extend=(lambda rows: []) if a.tiny else None,
      extend_tuned=True,
  )


def flat(row: dict) -> dict:
  """A sweep row with its cell's keys as the sweep wrote them (ints for counts)."""
  out = dict(row)
  for k in ("learners", "extra"):
    if out.get(k) not in (None, ""):
      out[k] = int(out[k])
  return out
