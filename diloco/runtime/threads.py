"""The threads runtime: real time, one process, one thread per learner on its own sub-mesh.

Each learner thread runs `learner_loop.run_learner` over an in-process link that calls the shared
`sync_host.SyncHost` directly (no serialization: the objects are handed over as they are). The
synchronizer state machine, learner step and fragment schedule are the ones the virtual runtime
drives; only time is real, so results agree with the virtual runtime whenever timing cannot change
them (quorum = all learners, blocking learners; see tests/test_threads.py).

A fault schedule (the `chaos` section, as in the virtual runtime) applies in real time: each link
is an InProcessLink wrapped in a `faulty_link.FaultyLink` (delays, partitions, corrupted and
poisoned messages, a synchronizer that is down), and `threads_chaos.Driver` crashes and restarts
learners and the synchronizer from their checkpoints; see tests/test_threads_chaos.py.

With `outer.sync_shards` S > 1 each shard has its own host and every learner a link to each,
routed by fragment (`sharded_link.ShardedLink`); fault schedules are not run with shards here (the
virtual runtime and the gRPC processes run them).
"""

import collections
import tempfile
import threading
import time
import uuid
from typing import Any

import ml_collections
import numpy as np

from diloco import metrics
from diloco.config import build
from diloco.outer import protocol
from diloco.outer.learner.learner import Learner
from diloco.outer.sync.synchronizer import Synchronizer
from diloco.runtime import faulty_link, learner_loop, sharded_link, sync_host, threads_chaos
from diloco.runtime.link import Joined


class InProcessLink:
  """A learner's link to a SyncHost in the same process."""

  def __init__(self, host: sync_host.SyncHost, learner: int):
    self.host, self.learner, self.session = host, learner, uuid.uuid4().hex
    self.acked = 0

  def join(self, versions, generations) -> Joined:
    _, self.acked, joined = self.host.join(self.learner, self.session, versions, generations)
    return joined

  def progress(self, finished: bool) -> bool:
    return self.host.progress(self.learner, self.session, finished)

  def upload(self, up: protocol.Upload) -> None:
    self.host.upload(self.learner, self.session, up)

  def poll(self, wait_s: float) -> list[protocol.Send]:
    got = self.host.poll(self.learner, self.session, self.acked, wait_s)
    if got:
      self.acked = got[-1][0]
    return [s for _, s in got]


def build_parts(config: ml_collections.ConfigDict) -> tuple[build.Parts, list[Learner]]:
  """The run's parts (islands on disjoint sub-meshes) and its learners, holding nothing yet."""
  parts = build.local_learners(config)
  return parts, [parts.make_learner(m) for m in range(config.outer.learners)]


def run(config: ml_collections.ConfigDict, workdir: str | None = None) -> dict[str, Any]:
  """Trains every learner for `config.steps` inner steps in its own thread; a JSON-able summary."""
  return train(config, workdir)[0]


def train(
    config: ml_collections.ConfigDict, workdir: str | None = None
) -> tuple[dict[str, Any], dict[str, np.ndarray], list[dict[str, np.ndarray]]]:
  """(summary, the synchronizer's global parameters, each learner's copy of them).

  With a fault schedule (the `chaos` section) faults act in real time, schedule seconds x
  `deploy.chaos_time_scale` wall seconds after every learner took its first step (see
  threads_chaos.py and faulty_link.py); checkpoints then go to WORKDIR/checkpoints (a temporary
  directory without a workdir) and a learner silent for `deploy.absent_after_s` is absent.
  """
  m_count = config.outer.learners
  parts, learners = build_parts(config)
  faults = build.faults(config)
  recover = None
  if parts.checkpoints_on(bool(faults)):
    recover = parts.recovery(workdir or tempfile.mkdtemp(prefix="threads-"))
  absent_s = float(config.deploy.absent_after_s) if faults else 60.0
  shared = faulty_link.Shared(m_count, config.chaos.seed)
  records = _Records(shared, absent_s)
  clock = faulty_link.FaultClock(faults, float(config.deploy.get("chaos_time_scale", 1.0)))
  sync = parts.make_sync()
  shards = getattr(sync, "shards", [sync])
  if len(shards) > 1 and faults:
    raise ValueError(
        f"the threads runtime runs outer.sync_shards={len(shards)} without a fault schedule: "
        "run the faults on the virtual runtime or as gRPC processes (scripts/chaos_local.py)"
    )
  slots = [faulty_link.HostSlot(records.make_host(shard)) for shard in shards]
  slot = slots[0]
  links = [
      _link(
          parts,
          learners[m],
          [faulty_link.FaultyLink(s, m, clock, shared, InProcessLink) for s in slots],
      )
      for m in range(m_count)
  ]
  driver = records.driver = threads_chaos.Driver(
      clock=clock,
      slot=slot,
      shared=shared,
      recovery=recover,
      make_sync=parts.make_sync,
      make_host=records.make_host,
      learners=learners,
      links=links,
      steps=config.steps,
      # lockstep rounds wait for a crashed learner: it redoes them (recovery/crash_machine.py)
      lockstep=bool(config.outer.blocking and shards[0].policy.quorum.of_members),
      on_event=records.events.append,
  )
  if config.outer.sync_checkpoint_every:
    with slot.host.cond:
      driver.save_sync(sync)
  t0 = time.perf_counter()
  results = _run_threads(config, parts, learners, links, driver, absent_s)
  wall = time.perf_counter() - t0
  driver.finish()
  for link in links:
    link.close()
  for s in slots:
    s.host.close()
  if recover is not None:
    recover.close()
  sync = slot.host.sync if len(slots) == 1 else sync
  summary = {**_summary(config, learners, results, wall, sync), **records.summary(sync)}
  copies = [{k: v for g in l.global_copy for k, v in g.items()} for l in learners]
  return summary, sync.global_params(), copies


def _link(parts: build.Parts, learner: Learner, links: list):
  """Learner m's link: to the one host, or to every shard's host (routed by fragment)."""
  if len(links) == 1:
    return links[0]
  return sharded_link.ShardedLink(links, parts.owner_of, learner)


def _summary(
    config: ml_collections.ConfigDict, learners: list[Learner], results: list, wall: float, sync
) -> dict[str, Any]:
  tokens = sum(l.tokens for l in learners)
  work = metrics.learner_work(learners, sync)
  rows = [
      {
          **(r or {}),
          "steps": l.steps,
          **{k: v for k, v in work[str(m)].items() if k != "trained_steps"},
      }
      for m, (l, r) in enumerate(zip(learners, results))
  ]
  return {
      "mode": config.mode,
      "runtime": "threads",
      "learners": len(learners),
      "steps": max(l.steps for l in learners),
      "tokens": tokens,
      "wall_s": wall,
      "tokens_per_s": tokens / wall,
      "per_learner": rows,
      "merged_share": metrics.merged_share(rows),
      "merge_clock": sync.merge_clock_summary(),
  }


def _run_threads(
    config: ml_collections.ConfigDict,
    parts: build.Parts,
    learners: list[Learner],
    links: list,
    driver: threads_chaos.Driver,
    absent_s: float,
) -> list[dict | None]:
  """Each learner's loop in its own thread (restarted when it crashes); what each returned.

  An error in any thread stops them all and is raised here.
  """
  o = config.outer
  results: list[dict | None] = [None] * o.learners
  errors: list[BaseException] = []

  def work(m: int) -> None:
    try:
      while True:
        results[m] = learner_loop.run_learner(
            learners[m],
            links[m],
            lambda: next(parts.islands[m].data.train_iter),
            config.steps,
            overlap=o.overlap,
            blocking=o.blocking,
            heartbeat_s=min(0.5, absent_s / 4),
            stop=driver.stops[m],
            on_step=driver.on_step(m),
            seed=m,
        )
        driver.check_rejoin(m)
        if not driver.crashed(m) or driver.recover(m) is None:
          return
    except BaseException as err:  # surfaced in the main thread below
      errors.append(err)
      driver.abort.set()
      for s in driver.stops:
        s.set()

  threads = [
      threading.Thread(target=work, args=(m,), name=f"learner{m}") for m in range(o.learners)
  ]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  if errors:
    raise errors[0]
  return results


class _Records:
  """The synchronizer hosts of a run (one per incarnation) and what their logs said."""

  def __init__(self, shared: faulty_link.Shared, absent_s: float):
    self.shared, self.absent_s = shared, absent_s
    self.hosts: list[sync_host.SyncHost] = []
    self.merges: list[dict] = []
    self.rejected: collections.Counter = collections.Counter()
    self.events: list[dict] = []
    self.driver: threads_chaos.Driver | None = None

  def make_host(self, sync: Synchronizer) -> sync_host.SyncHost:
    host = sync_host.SyncHost(
        sync,
        absent_after_s=self.absent_s,
        on_log=self.on_log,
        on_checkpoint=lambda s: self.driver.on_checkpoint(s),
    )
    self.hosts.append(host)
    return host

  def on_log(self, record: dict) -> None:  # under the host's lock
    if record["event"] == "merge":
      self.merges.append({**record, "wall": time.monotonic()})
    elif record["event"] == "reject":
      self.rejected[record["code"]] += 1
    with self.shared.lock:
      self.shared.poisoned.follow(record)

  def summary(self, sync: Synchronizer) -> dict[str, Any]:
    refusals: collections.Counter = collections.Counter()
    for host in self.hosts:
      refusals.update(host.counts)
    for c in self.shared.stats.crashes:  # the others' merges while it was away; its own since
      crashed, back = c.pop("wall"), c.pop("rejoined_wall", None)
      c["merges_while_down"] = sum(
          crashed <= r["wall"] and (back is None or r["wall"] < back) for r in self.merges
      )
      c["merges_joined_after_rejoin"] = sum(
          back is not None and r["wall"] >= back and c["learner"] in r["learners"]
          for r in self.merges
      )
    return {
        "merges": len(self.merges),
        "refusals": dict(sorted(refusals.items())),
        "rejected": dict(sorted(self.rejected.items())),
        "merges_joined": [
            sum(m in r["learners"] for r in self.merges)
            for m in range(len(self.shared.stats.steps_lost))
        ],
        **threads_chaos.summary(self.driver, sync, self.events),
    }


def max_abs_diff(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
  """Largest |a − b| over two path-keyed dicts with the same keys."""
  if sorted(a) != sorted(b):
    raise ValueError("the two parameter dicts have different paths")
  return max(float(np.max(np.abs(np.asarray(a[k]) - np.asarray(b[k])))) for k in a)
