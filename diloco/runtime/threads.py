"""The threads runtime: real time, one process, one thread per learner on its own sub-mesh.

Each learner thread runs `realtime.run_learner` over an in-process link that calls the shared
`realtime.SyncHost` directly (no serialization: the objects are handed over as they are). The
synchronizer state machine, learner step and fragment schedule are the ones the virtual runtime
drives; only time is real, so results agree with the virtual runtime whenever timing cannot change
them (quorum = all learners, blocking learners; see tests/test_threads.py).
"""

import threading
import time
import uuid
from typing import Any

import jax
import ml_collections
import numpy as np

from diloco import data as data_lib, fragments, island as island_lib, multi, policies, protocol
from diloco.learner import Learner
from diloco.runtime import realtime
from diloco.synchronizer import Synchronizer


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


def build(config: ml_collections.ConfigDict):
    """Islands on disjoint sub-meshes, learners (holding nothing yet) and the synchronizer."""
    o = config.outer
    splits = data_lib.load_splits(config.data)
    islands = [island_lib.build_island(config, devs, shard_index=m, num_shards=o.learners,
                                       splits=splits)
               for m, devs in enumerate(multi.split_devices(jax.devices(), o.learners))]
    params0 = fragments.flatten(jax.device_get(islands[0].init_state().params))
    frag = fragments.make(o.fragment_kind, params0, o.fragments)
    schedule = fragments.Schedule(o.fragments, o.inner_steps)
    learners = [Learner(m, isl, frag, schedule, o.codec, o.alpha,
                        config.batch_size * config.seq_len) for m, isl in enumerate(islands)]
    for learner in learners:  # joins with versions -1: the synchronizer sends every fragment
        learner.versions = [-1] * o.fragments
        learner.global_copy = [{} for _ in range(o.fragments)]
    sync = Synchronizer(params0, frag, policies.from_config(config), multi.make_outer(o),
                        downlink_codec=o.downlink_codec or o.codec)
    return islands, learners, sync


def run(config: ml_collections.ConfigDict, workdir: str | None = None) -> dict[str, Any]:
    """Trains every learner for `config.steps` inner steps in its own thread; a JSON-able summary."""
    del workdir  # the threads runtime keeps its records in the returned summary
    return train(config)[0]


def train(config: ml_collections.ConfigDict
          ) -> tuple[dict[str, Any], dict[str, np.ndarray], list[dict[str, np.ndarray]]]:
    """(summary, the synchronizer's global parameters, each learner's copy of them)."""
    islands, learners, sync = build(config)
    merges: list[dict] = []
    host = realtime.SyncHost(sync, absent_after_s=60.0,
                             on_log=lambda r: merges.append(r) if r["event"] == "merge" else None)
    stop = threading.Event()
    results: list[dict | None] = [None] * len(learners)
    errors: list[BaseException] = []

    def work(m: int) -> None:
        try:
            results[m] = realtime.run_learner(
                learners[m], InProcessLink(host, m), lambda: next(islands[m].data.train_iter),
                config.steps, overlap=config.outer.overlap, blocking=config.outer.blocking,
                stop=stop, seed=m)
        except BaseException as err:  # surfaced in the main thread below
            errors.append(err)
            stop.set()

    t0 = time.perf_counter()
    threads = [threading.Thread(target=work, args=(m,), name=f"learner{m}")
               for m in range(len(learners))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    host.close()
    if errors:
        raise errors[0]
    tokens = sum(l.tokens for l in learners)
    summary = {"mode": config.mode, "runtime": "threads", "learners": len(learners),
               "steps": max(l.steps for l in learners), "tokens": tokens, "wall_s": wall,
               "tokens_per_s": tokens / wall, "merges": len(merges),
               "refusals": dict(host.counts), "per_learner": results}
    copies = [{k: v for g in l.global_copy for k, v in g.items()} for l in learners]
    return summary, sync.global_params(), copies


def max_abs_diff(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    """Largest |a − b| over two path-keyed dicts with the same keys."""
    if sorted(a) != sorted(b):
        raise ValueError("the two parameter dicts have different paths")
    return max(float(np.max(np.abs(np.asarray(a[k]) - np.asarray(b[k])))) for k in a)
