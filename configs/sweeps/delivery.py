r"""Decoupled DiLoCo's delivery rules on heterogeneous hardware (issue 51): the heterogeneous table
again, at the paper's setting, under each rule that keeps its learners' work. Commands (the
notebook notebooks/decoupled_delivery.py reads the table; results are checked in under
notebooks/results/delivery/):

  W=runs/delivery
  python -m experiments.sweep --config=configs/sweeps/delivery.py:part=tune \
      --workdir=$W --table=tune --parallel=2
  python -m experiments.sweep --config=configs/sweeps/delivery.py:part=extend,results=$W \
      --workdir=$W --table=extend1 --parallel=2    # until it adds no point (rungs=2: two at once)
  python -m experiments.sweep --config=configs/sweeps/delivery.py:part=seeds,results=$W \
      --workdir=$W --table=seeds --parallel=2
  python -m experiments.sweep --config=configs/sweeps/delivery.py:part=time,results=$W \
      --workdir=$W --table=time --parallel=2

(`domains=text`, `policies=wait_all` or `settings=paper,2x` narrow or widen any part; `tiny` runs a few-second
version: text, K=1 with grace only, one rate, two seeds, one equal-time run per cell.)

Everything is configs/sweeps/heterogeneous.py's run (8 learners, the Decoupled preset, P = 4
fragments every H = 20 steps, 10% log-normal step jitter, the same budgets and evaluation sets,
the policies wait_all / k1 / k1_grace), with two more axes:
  setting    paper: learners 4-7 are 18% slower (the published TPU v6e / v5p rows); 2x: twice
             as slow (the table of issue 32)
  delivery   replace | rebase | at_own_sync (outer.delivery; see diloco/outer/learner/learner.py)
and a budget:
  tokens     a run ends once the token budget is trained, whoever trains it
  time       no step starts after the simulated time in which all learners, never waiting,
             train that budget: steps·M·step_s / Σ_m 1/speed_m (2x: 1,333 s; paper: 1,083 s)

Each (setting, domain, policy, delivery) at its own outer learning rate at equal tokens
(part=tune at seed 0 over het.OUTER_LRS, part=extend past an edge), three seeds at the winner
(part=seeds), and the same winners at equal time (part=time, every seed).

Point 4, radial-directional averaging where it can matter: part=rda (then rda_extend and
rda_seeds, results=DIR) runs RDA against the plain mean at M = 8 and 16 learners (M = 16: eight of
the paper setting's speeds twice), waiting for all (K = M) and K = 1 with grace, text, under the
rule given with `delivery=`, each (M, policy, merge) at its own outer learning rate:

  python -m experiments.sweep --config=configs/sweeps/delivery.py:part=rda,delivery=rebase \
      --workdir=$W --table=rda --parallel=2

With results=$W (the point 3 workdir) the (M = 8, rda) cells take point 3's text rows at the paper
setting, which are the same runs, and part=rda skips the points they hold. lr_scale=X multiplies
the tried rates (policies=k1_grace,lr_scale=0.125 starts the K = 1 cells on rebase's scale).
"""

import ml_collections

from configs.sweeps import heterogeneous as het
from diloco.config import variants
from experiments.studies import delivery_table as dt, outer_lr_search as search, scaling_protocol as sp

SWEEP_KEYS = het.SWEEP_KEYS + ("merged_share", "tokens", "uploads_skipped")
SWEEP_ONLY = ("part", "results", "seeds", "domains", "settings", "policies", "rungs", "lr_scale")
SETTINGS = {"paper": (1, 1, 1, 1, 1.18, 1.18, 1.18, 1.18), "2x": het.SPEEDS}
DELIVERIES = ("replace", "rebase", "at_own_sync")
BUDGETS = ("tokens", "time")
KEYS = ("setting", "domain", "policy", "delivery")  # a cell of the table
RDA_KEYS = dt.RDA_KEYS  # a cell of point 4's rows: (learners, policy, merge)
RDA_PARTS = ("rda", "rda_extend", "rda_seeds")
TINY_POLICIES = ("k1_grace",)  # tiny (the test suite's): text, one policy, one lr, one time seed


def _arg(arg: str | None) -> ml_collections.ConfigDict:
  return variants.parse_arg(
      arg,
      tiny=False,
      part="tune",
      results="",
      seeds=3,
      domains="text,vision",
      settings="paper",
      policies="",
      rungs=1,
      lr_scale=1.0,
      setting="paper",
      domain="text",
      policy="k1_grace",
      delivery="rebase",
      budget="tokens",
      learners=8,
      merge="rda",
      outer_lr=0.4,
      seed=0,
  )


def equal_time_s(speeds, steps: int, step_s: float) -> float:
  """The simulated seconds in which len(speeds) learners, never waiting, train steps·M steps."""
  return steps * len(speeds) * step_s / sum(1.0 / s for s in speeds)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  a = _arg(variants.drop(arg, SWEEP_ONLY))
  for name, value, known in (
      ("setting", a.setting, tuple(SETTINGS)),
      ("delivery", a.delivery, DELIVERIES),
      ("budget", a.budget, BUDGETS),
  ):
    if value not in known:
      raise ValueError(f"{name}={value!r}: expected one of {known}")
  base = f"tiny={a.tiny},domain={a.domain},policy={a.policy},outer_lr={a.outer_lr},seed={a.seed}"
  c = het.get_config(base)
  if a.learners not in (8, 16) or a.merge not in ("mean", "rda"):
    raise ValueError(f"learners={a.learners}, merge={a.merge!r}: expected 8 or 16, mean or rda")
  speeds = SETTINGS[a.setting] * (a.learners // 8)  # M = 16: 8 fast, 8 slow
  c.outer.learners = a.learners
  if a.policy == "wait_all":
    c.outer.quorum = a.learners
  c.sim.speeds = ",".join(str(s) for s in speeds)
  c.outer.delivery, c.outer.merge = a.delivery, a.merge
  if a.budget == "time":
    c.sim.time_limit_s = equal_time_s(speeds, c.steps, c.sim.step_s)
  return c


def _cells(a) -> list[tuple]:
  settings, domains = a.settings.split(","), a.domains.split(",")
  policies = a.policies.split(",") if a.policies else het.POLICIES
  policies = TINY_POLICIES if a.tiny else policies
  if a.tiny:
    domains = ["text"]
  return [(s, d, p, r) for s in settings for d in domains for p in policies for r in DELIVERIES]


def _extend(rows, cells, rungs: int) -> list[dict]:
  """`rungs` rates of the doubling ladder past every winner on the edge of its tried rates (one
  at a time is search.past_edges; more save a stage where a cell is far from its optimum)."""
  best, out = search.winners(rows, KEYS), []
  for *cell, nxt in search.past_edges(rows, KEYS, cells):
    step = nxt / best[tuple(cell)]
    out += [_point(tuple(cell), outer_lr=nxt * step**k, seed=0) for k in range(rungs)]
  return out


def _point(cell: tuple, **more) -> dict:
  return dict(zip(KEYS, cell), **more)


def _rda_sweep(a) -> list[dict]:
  """Point 4 of issue 51: RDA against the mean at M = 8 and 16, waiting for all (K = M) and K = 1
  with grace, text at the paper's setting, under the rule given (`delivery=`). part=rda tries
  het.OUTER_LRS times `lr_scale` (a cell near point 3's winners starts on their scale), less the
  points a row of `results=` already holds."""
  policies = a.policies.split(",") if a.policies else dt.RDA_POLICIES
  policies, counts = (TINY_POLICIES, (8,)) if a.tiny else (policies, (8, 16))
  cells = [(m, p, g) for m in counts for p in policies for g in ("mean", "rda")]
  point = lambda c, **more: dict(zip(RDA_KEYS, c), delivery=a.delivery, **more)
  rows = dt.rda_rows(sp.read_rows(a.results), a.delivery) if a.results else []
  # point 3's runs stand in for their points; point 4's own stay listed (the sweep skips them as
  # finished, and a stage's table keeps every point it lists)
  done = {
      (*search.cell_of(r, RDA_KEYS), float(r["outer_lr"]), int(r["seed"]))
      for r in rows
      if "setting" in r
  }
  key = lambda p: (*(p[k] for k in RDA_KEYS), p["outer_lr"], p["seed"])
  undone = lambda points: [p for p in points if key(p) not in done]
  lrs = [lr * a.lr_scale for lr in (het.OUTER_LRS[1:2] if a.tiny else het.OUTER_LRS)]
  return undone(
      search.stage_points(
          "rda_tune" if a.part == "rda" else a.part,
          a.results,
          keys=RDA_KEYS,
          cells=cells,
          grid=lrs,
          point=lambda c, lr, seed: point(c, outer_lr=lr, seed=seed),
          rows=lambda: rows,
          seeds=range(1, a.seeds),
          extend=(lambda rows: []) if a.tiny else None,
          prefix="rda_",
          needs="the sweep workdir holding part=rda's rows",
          extend_tuned=True,  # (a cell that point 3's rows tuned goes on before the others)
      )
  )


def get_sweep(arg: str | None = None) -> list[dict]:
  a = _arg(arg)
  if a.part in RDA_PARTS:
    if a.part != "rda" and not a.results:
      raise ValueError(
          f"part={a.part} needs results=DIR, the sweep workdir holding part=rda's rows"
      )
    return _rda_sweep(a)
  cells = _cells(a)

  def time_budget(rows, best) -> list[dict]:  # each cell at its winner, on equal time
    seeds = range(1 if a.tiny else a.seeds)
    return [_point(c, outer_lr=best[c], seed=s, budget="time") for c in cells for s in seeds]

  return search.stage_points(
      a.part,
      a.results,
      keys=KEYS,
      cells=cells,
      grid=het.OUTER_LRS[1:2] if a.tiny else het.OUTER_LRS,
      point=lambda c, lr, seed: _point(c, outer_lr=lr, seed=seed),
      rows=lambda: [  # point 3's rows (point 4's, in the same workdir, have `merge`)
          r
          for r in sp.read_rows(a.results)
          if (r.get("budget") or "tokens") == "tokens" and not r.get("merge")
      ],
      seeds=range(1, a.seeds),
      extend=(lambda rows: []) if a.tiny else (lambda rows: _extend(rows, cells, a.rungs)),
      more={"time": time_budget},
      extend_tuned=True,
  )
