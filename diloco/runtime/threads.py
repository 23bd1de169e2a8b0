"""The threads runtime: real time, one process, one thread per learner on its own sub-mesh.

Each learner thread runs `realtime.run_learner` over an in-process link that calls the shared
`realtime.SyncHost` directly (no serialization: the objects are handed over as they are). The
synchronizer state machine, learner step and fragment schedule are the ones the virtual runtime
drives; only time is real, so results agree with the virtual runtime whenever timing cannot change
them (quorum = all learners, blocking learners; see tests/test_threads.py).

A fault schedule (the `chaos` section, as in the virtual runtime) applies in real time: each link
is an InProcessLink wrapped in a `faulty_link.FaultyLink` (delays, partitions, corrupted and
poisoned messages, a synchronizer that is down), and `threads_chaos.Driver` crashes and restarts
learners and the synchronizer from their checkpoints; see tests/test_threads_chaos.py.
"""

import collections
import tempfile
import threading
import time
import uuid
from typing import Any

import jax
import ml_collections
import numpy as np

from diloco.chaos import schedule as chaos
from diloco import data as data_lib
from diloco.outer import fragments
from diloco.inner import island as island_lib
from diloco.runners import islands as islands_lib
from diloco.outer import policies, protocol
from diloco.recovery import rejoin
from diloco.outer.learner import Learner
from diloco.runtime import faulty_link, realtime, threads_chaos
from diloco.outer.synchronizer import Synchronizer


class InProcessLink:
    """A learner's link to a SyncHost in the same process."""

    def __init__(self, host: realtime.SyncHost, learner: int):
        self.host, self.learner, self.session = host, learner, uuid.uuid4().hex
        self.acked = 0

    def join(self, versions, generations) -> None:
        _, self.acked = self.host.join(self.learner, self.session, versions, generations)

    def progress(self, finished: bool) -> bool:
        return self.host.progress(self.learner, self.session, finished)

    def upload(self, up: protocol.Upload) -> None:
        self.host.upload(self.learner, self.session, up)

    def poll(self, wait_s: float) -> list[protocol.Send]:
        got = self.host.poll(self.learner, self.session, self.acked, wait_s)
        if got:
            self.acked = got[-1][0]
        return [s for _, s in got]


def _parts(config: ml_collections.ConfigDict) -> dict[str, Any]:
    """Islands on disjoint sub-meshes and factories of learners (holding nothing yet) and of the
    synchronizer (as the virtual runtime builds it: outlier screen, quorum of members unless
    elastic, checkpoint interval)."""
    o = config.outer
    splits = data_lib.load_splits(config.data)
    islands = []
    for m, devs in enumerate(learner_devices(config)):
        islands.append(island_lib.build_island(
            config, devs, shard_index=m, num_shards=o.learners, splits=splits,
            init_params=islands[0].init_params if islands else None))
    params0 = fragments.flatten(jax.device_get(islands[0].init_state().params))
    frag = fragments.make(o.fragment_kind, params0, o.fragments)
    schedule = fragments.Schedule(o.fragments, o.inner_steps)
    screen = islands_lib.make_screen(o)

    def make_learner(m: int) -> Learner:  # joins with versions -1: it is sent every fragment
        learner = Learner(m, islands[m], frag, schedule, o.codec, o.alpha,
                          config.batch_size * config.seq_len)
        learner.versions = [-1] * o.fragments
        learner.global_copy = [{} for _ in range(o.fragments)]
        return learner

    def make_sync() -> Synchronizer:
        return Synchronizer(params0, frag, policies.from_config(config), islands_lib.make_outer(o),
                            downlink_codec=o.downlink_codec or o.codec, screen=screen,
                            quorum_of="members" if o.quorum == 0 and not o.elastic else "live",
                            checkpoint_every=o.sync_checkpoint_every)

    return dict(islands=islands, make_learner=make_learner, make_sync=make_sync)


def learner_devices(config: ml_collections.ConfigDict) -> list[list]:
    """Each learner's devices: the local devices split evenly, or `deploy.devices_per_learner`
    each (when set) from the first ones."""
    devices, m_count = jax.devices(), config.outer.learners
    per = int(config.deploy.get("devices_per_learner", 0))
    if per < 0 or per * m_count > len(devices):
        raise ValueError(f"deploy.devices_per_learner={per} x {m_count} learners does not fit "
                         f"{len(devices)} local devices")
    return islands_lib.split_devices(devices[:per * m_count] if per else devices, m_count)


def build(config: ml_collections.ConfigDict):
    """Islands on disjoint sub-meshes, learners (holding nothing yet) and the synchronizer."""
    parts = _parts(config)
    learners = [parts["make_learner"](m) for m in range(config.outer.learners)]
    return parts["islands"], learners, parts["make_sync"]()


def run(config: ml_collections.ConfigDict, workdir: str | None = None) -> dict[str, Any]:
    """Trains every learner for `config.steps` inner steps in its own thread; a JSON-able summary."""
    return train(config, workdir)[0]


def train(config: ml_collections.ConfigDict, workdir: str | None = None
          ) -> tuple[dict[str, Any], dict[str, np.ndarray], list[dict[str, np.ndarray]]]:
    """(summary, the synchronizer's global parameters, each learner's copy of them).

    With a fault schedule (the `chaos` section) faults act in real time, schedule seconds x
    `deploy.chaos_time_scale` wall seconds after every learner took its first step (see
    threads_chaos.py and faulty_link.py); checkpoints then go to WORKDIR/checkpoints (a temporary
    directory without a workdir) and a learner silent for `deploy.absent_after_s` is absent.
    """
    o, m_count = config.outer, config.outer.learners
    parts = _parts(config)
    islands = parts["islands"]
    learners = [parts["make_learner"](m) for m in range(m_count)]
    faults = chaos.from_config(config.chaos, m_count, horizon_s=config.steps * config.sim.step_s)
    if any(f.kind == "sync_crash" for f in faults) and not o.sync_checkpoint_every:
        raise ValueError("sync_crash faults need synchronizer checkpoints: set "
                         "outer.sync_checkpoint_every > 0")
    recover = None
    if faults or o.learner_checkpoint_every or o.sync_checkpoint_every:
        workdir = workdir or tempfile.mkdtemp(prefix="threads-")
        recover = rejoin.Recovery(workdir, parts["make_learner"],
                                    [isl.data.train_iter for isl in islands],
                                    o.learner_checkpoint_every, o.sync_checkpoint_every)
    absent_s = float(config.deploy.absent_after_s) if faults else 60.0
    shared = faulty_link.Shared(m_count, config.chaos.seed)
    records = _Records(shared, absent_s)
    clock = faulty_link.FaultClock(faults, float(config.deploy.get("chaos_time_scale", 1.0)))
    sync = parts["make_sync"]()
    slot = faulty_link.HostSlot(records.make_host(sync))
    links = [faulty_link.FaultyLink(slot, m, clock, shared, InProcessLink) for m in range(m_count)]
    driver = records.driver = threads_chaos.Driver(
        clock=clock, slot=slot, shared=shared, recovery=recover, make_sync=parts["make_sync"],
        make_host=records.make_host, learners=learners, links=links, steps=config.steps,
        on_event=records.events.append)
    if o.sync_checkpoint_every:
        with slot.host.cond:
            driver.save_sync(sync)
    results: list[dict | None] = [None] * m_count
    errors: list[BaseException] = []

    def work(m: int) -> None:
        try:
            while True:
                results[m] = realtime.run_learner(
                    learners[m], links[m], lambda: next(islands[m].data.train_iter),
                    config.steps, overlap=o.overlap, blocking=o.blocking,
                    heartbeat_s=min(0.5, absent_s / 4), stop=driver.stops[m],
                    on_step=driver.on_step(m), seed=m)
                driver.check_rejoin(m)
                if not driver.crashed(m) or driver.recover(m) is None:
                    return
        except BaseException as err:  # surfaced in the main thread below
            errors.append(err)
            driver.abort.set()
            for s in driver.stops:
                s.set()

    t0 = time.perf_counter()
    threads = [threading.Thread(target=work, args=(m,), name=f"learner{m}")
               for m in range(m_count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    driver.finish()
    for link in links:
        link.close()
    slot.host.close()
    if recover is not None:
        recover.close()
    if errors:
        raise errors[0]
    tokens = sum(l.tokens for l in learners)
    summary = {"mode": config.mode, "runtime": "threads", "learners": m_count,
               "steps": max(l.steps for l in learners), "tokens": tokens, "wall_s": wall,
               "tokens_per_s": tokens / wall, "per_learner": results,
               **records.summary(slot.host.sync)}
    copies = [{k: v for g in l.global_copy for k, v in g.items()} for l in learners]
    return summary, slot.host.sync.global_params(), copies


class _Records:
    """The synchronizer hosts of a run (one per incarnation) and what their logs said."""

    def __init__(self, shared: faulty_link.Shared, absent_s: float):
        self.shared, self.absent_s = shared, absent_s
        self.hosts: list[realtime.SyncHost] = []
        self.merges: list[dict] = []
        self.rejected: collections.Counter = collections.Counter()
        self.events: list[dict] = []
        self.driver: threads_chaos.Driver | None = None

    def make_host(self, sync: Synchronizer) -> realtime.SyncHost:
        host = realtime.SyncHost(sync, absent_after_s=self.absent_s, on_log=self.on_log,
                                 on_checkpoint=lambda s: self.driver.on_checkpoint(s))
        self.hosts.append(host)
        return host

    def on_log(self, record: dict) -> None:  # under the host's lock
        if record["event"] == "merge":
            self.merges.append({**record, "wall": time.monotonic()})
        elif record["event"] == "reject":
            self.rejected[record["code"]] += 1
        threads_chaos.follow_poison(self.shared, record)

    def summary(self, sync: Synchronizer) -> dict[str, Any]:
        refusals: collections.Counter = collections.Counter()
        for host in self.hosts:
            refusals.update(host.counts)
        for c in self.shared.stats.crashes:  # the others' merges while it was away; its own since
            crashed, back = c.pop("wall"), c.pop("rejoined_wall", None)
            c["merges_while_down"] = sum(crashed <= r["wall"] and (back is None or r["wall"] < back)
                                         for r in self.merges)
            c["merges_joined_after_rejoin"] = sum(back is not None and r["wall"] >= back and
                                                  c["learner"] in r["learners"]
                                                  for r in self.merges)
        return {"merges": len(self.merges), "refusals": dict(sorted(refusals.items())),
                "rejected": dict(sorted(self.rejected.items())),
                "merges_joined": [sum(m in r["learners"] for r in self.merges)
                                  for m in range(len(self.shared.stats.steps_lost))],
                **threads_chaos.summary(self.driver, sync, self.events)}


def max_abs_diff(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    """Largest |a − b| over two path-keyed dicts with the same keys."""
    if sorted(a) != sorted(b):
        raise ValueError("the two parameter dicts have different paths")
    return max(float(np.max(np.abs(np.asarray(a[k]) - np.asarray(b[k])))) for k in a)
