"""A learner process: its own JAX program, training continuously against a remote synchronizer.

Multi-host learners (one learner = one multi-host JAX job after `jax.distributed.initialize()`):
only the process with `jax.process_index() == 0` may talk to the synchronizer (`talks_to_sync`).
This loop keeps the learner's copy of the global fragments on the host of that process, so it runs
learners of one process; a multi-host learner is refused with a clear error rather than letting its
processes diverge (the other processes would have to receive every send through a broadcast from
process 0, which is not built yet).
"""

import json
import os
import signal
import threading
import time
from typing import Any

import jax
import ml_collections
import numpy as np

from diloco import data as data_lib, fragments, island as island_lib, integrity, metrics
from diloco.learner import Learner
from diloco.rpc import client as client_lib, limits as limits_lib
from diloco.runtime import realtime


def talks_to_sync() -> bool:
    """Whether this JAX process is the one of its learner that talks to the synchronizer."""
    return jax.process_index() == 0


def make_learner(config: ml_collections.ConfigDict, m: int) -> Learner:
    """Learner m on every local device, holding nothing yet (its Join fetches every fragment)."""
    o = config.outer
    if not 0 <= m < o.learners:
        raise ValueError(f"learner_id={m} is outside 0..{o.learners - 1} (outer.learners)")
    isl = island_lib.build_island(config, jax.local_devices(), shard_index=m,
                                  num_shards=o.learners, splits=data_lib.load_splits(config.data))
    params0 = fragments.flatten(jax.device_get(isl.init_state().params))
    frag = fragments.make(o.fragment_kind, params0, o.fragments)
    learner = Learner(m, isl, frag, fragments.Schedule(o.fragments, o.inner_steps), o.codec,
                      o.alpha, config.batch_size * config.seq_len)
    learner.versions = [-1] * o.fragments
    learner.global_copy = [{} for _ in range(o.fragments)]
    return learner


def run(config: ml_collections.ConfigDict, workdir: str, *, learner_id: int, target: str,
        token: str, ca_cert: str = "", limits: limits_lib.Limits = limits_lib.Limits()
        ) -> dict[str, Any]:
    if config.get("distributed", False):
        jax.distributed.initialize()
    if jax.process_count() > 1:
        raise ValueError(f"learner {learner_id} spans {jax.process_count()} JAX processes; only "
                         "process 0 may talk to the synchronizer and the others cannot follow it "
                         "yet: run one process per learner")
    if not talks_to_sync():
        raise ValueError("only JAX process 0 of a learner talks to the synchronizer")
    os.makedirs(workdir, exist_ok=True)
    learner = make_learner(config, learner_id)
    link = client_lib.GrpcLink(target, learner_id, token, limits=limits, ca_cert=ca_cert)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    progress_path = os.path.join(workdir, "progress.jsonl")
    progress = open(progress_path, "a", encoding="utf-8")

    def on_step(lrn: Learner, device_metrics) -> None:
        if lrn.steps % config.log_every == 0:
            loss = float(jax.device_get(device_metrics)["loss"])
            if not np.isfinite(loss):
                raise FloatingPointError(f"learner {learner_id}: loss {loss} at step {lrn.steps}")
            progress.write(json.dumps({"step": lrn.steps, "loss": loss, "time": time.time(),
                                       "versions": lrn.versions}) + "\n")
            progress.flush()

    t0 = time.perf_counter()
    result = realtime.run_learner(
        learner, link, lambda: next(learner.island.data.train_iter), config.steps,
        overlap=config.outer.overlap, blocking=config.outer.blocking,
        heartbeat_s=limits.absent_after_s / 4, stop=stop, on_step=on_step, seed=learner_id,
        settle_timeout_s=120.0)
    wall = time.perf_counter() - t0
    progress.close()
    link.close()
    held = {f"{p}/{k}": v for p, g in enumerate(learner.global_copy) for k, v in g.items()}
    np.savez(os.path.join(workdir, "global_copy.npz"), **held)
    summary = {**result, "runtime": "grpc", "role": "learner", "learner": learner_id,
               "wall_s": wall, "tokens_per_s": learner.tokens / wall,
               "versions": learner.versions, "generations": learner.generations,
               "global_crc": integrity.tree_crc(held),
               "wire_bytes_sent": link.bytes_sent, "wire_bytes_received": link.bytes_received,
               "codec_bytes_sent": link.codec_bytes_sent,
               "codec_bytes_received": link.codec_bytes_received}
    metrics.write_summary(workdir, summary)
    return summary
