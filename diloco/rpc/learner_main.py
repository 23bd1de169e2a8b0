"""A learner process: its own JAX program, training continuously against a remote synchronizer.

Its connection settings come from the config's `deploy` section (TLS trust, limits; see
diloco/config/deploy.py). It checkpoints into WORKDIR/checkpoints every
`outer.learner_checkpoint_every` inner steps (params, inner optimizer state, data iterator,
counters, the fragment versions it holds and its copy of them). A process that starts finds the
newest checkpoint there and continues from it, else it starts from the global parameters with a
fresh inner optimizer (it holds no fragment, so its Join fetches them all before it trains); either
way its Join tells the synchronizer the versions it holds and receives every newer fragment.

A learner may be a multi-process JAX job (`config.distributed`, or an explicit coordinator for
local tests): its mesh spans every process's devices, only process 0 talks to the synchronizer and
the others follow it operation by operation (diloco/rpc/multihost.py).
"""

import dataclasses
import io
import json
import os
import signal
import sys
import threading
import time
from typing import Any

import jax
import ml_collections
import numpy as np

from diloco import jsonl, metrics, paths
from diloco.config import build, checks, deploy as deploy_lib
from diloco.outer import integrity
from diloco.recovery.learner_checkpoint import LearnerCheckpointer
from diloco.rpc import client as client_lib, learner_faults, learner_rejoin, limits as limits_lib
from diloco.rpc import multihost, transport
from diloco.runtime import async_link, learner_loop, preemption, sharded_link
from diloco.watch import progress as progress_lib


@dataclasses.dataclass(frozen=True)
class Cluster:
  """How this process joins a multi-process learner (all empty: a single-process learner)."""

  coordinator: str = ""  # HOST:PORT of JAX process 0 (local tests); else auto-detected
  num_processes: int = 0
  process_id: int = -1
  heartbeat_s: int = multihost.HEARTBEAT_S  # a dead process is declared so after this


def talks_to_sync() -> bool:
  """Whether this JAX process is the one of its learner that talks to the synchronizer."""
  return jax.process_index() == 0


def loop_link_for(link, blocking: bool, fragments: int = 1):
  """The link the learner loop uses: for non-blocking learners, Joins, polls and uploads are
  made by threads (async_link.py), so a slow, cut or frozen link never holds up a step; one
  upload per fragment may be out at once (the machine decides no more)."""
  if blocking:
    return link
  return async_link.BackgroundLink(link, send_in_thread=True, max_outstanding=fragments)


def make_learner(config: ml_collections.ConfigDict, m: int) -> multihost.SpmdLearner:
  """Learner m on every device of its JAX job, holding nothing yet (its Join fetches them)."""
  parts = build.one_learner(
      config, m, jax.devices(), learner_cls=multihost.SpmdLearner, host_value=multihost.host_value
  )
  return parts.make_learner(m)


def restore(learner: multihost.SpmdLearner, ckpt: LearnerCheckpointer) -> int | None:
  """Continues from the newest checkpoint (its step), or None: the learner starts fresh."""
  return ckpt.restore_into(learner, learner.island.data.train_iter)


class _Progress:
  """Appends {step, loss, time, versions} every `log_every` steps to WORKDIR/progress.jsonl
  ({event: unreachable | reachable, target, code, step, time} to WORKDIR/link.jsonl as the
  synchronizer stops and starts answering),
  and one {time, pid, restored_step, versions} line per process start to WORKDIR/starts.jsonl;
  keeps the last loss for the heartbeats (the status page) and shows a bar on a terminal."""

  def __init__(self, config, workdir: str, learner_id: int, start: dict, step0: int):
    self.learner_id, self.log_every = learner_id, config.log_every
    self.last_loss: float | None = None
    self.seen: tuple[int, list[int]] = (step0, [])  # (steps, c_steps) as of the last step
    self.bar = progress_lib.bar(
        config.get("progress_bar", True),
        total=config.steps,
        initial=step0,
        desc=f"learner {learner_id}",
        unit="step",
    )
    with jsonl.open_append(paths.join(workdir, "starts.jsonl")) as f:
      f.write(json.dumps({"time": time.time(), "pid": os.getpid(), **start}) + "\n")
    self.f = jsonl.open_append(paths.join(workdir, "progress.jsonl"))
    self.links, self._lock = jsonl.open_append(paths.join(workdir, "link.jsonl")), threading.Lock()

  def write(self, record: dict) -> None:
    self.f.write(json.dumps({**record, "time": time.time()}) + "\n")
    self.f.flush()

  def link(self, event: dict) -> None:
    """A row of link.jsonl (from a link's threads: one at a time)."""
    with self._lock:
      if self.links is None:  # (closed: the run is over)
        return
      row = {**event, "step": self.seen[0], "time": time.time()}
      self.links.write(json.dumps(row) + "\n")
      self.links.flush()

  def __call__(self, lrn, device_metrics) -> None:
    self.seen = (lrn.steps, list(lrn.c_steps))  # (for the heartbeat thread: one step's pair)
    self.bar.update(lrn.steps - self.bar.n)
    if lrn.steps % self.log_every == 0:
      loss = float(jax.device_get(device_metrics)["loss"])
      if not np.isfinite(loss):
        raise FloatingPointError(f"learner {self.learner_id}: loss {loss} at step {lrn.steps}")
      self.last_loss = loss
      self.write({"step": lrn.steps, "loss": loss, "versions": lrn.versions})
      self.bar.set_postfix(loss=f"{loss:.3f}", refresh=False)

  def close(self) -> None:
    self.bar.close()
    self.f.close()
    with self._lock:
      self.links, links = None, self.links
    links.close()


def _faults(config, learner_id: int, workdir: str) -> learner_faults.ProcessFaults:
  """This learner's chaos faults; a process started inside a crash's window waits out its end."""
  faults = learner_faults.ProcessFaults(
      build.faults(config),
      learner_id,
      workdir,
      config.deploy.chaos_time_scale,
      busy=config.deploy.straggle_busy,
  )
  if talks_to_sync():
    faults.wait_if_down()
  return faults


def _join_job(config: ml_collections.ConfigDict, cluster: Cluster) -> None:
  """Checks the deploy section, joins this learner's JAX job, and checks JAX's platform."""
  deploy_lib.check(config.deploy)
  multihost.initialize(
      config.get("distributed", False),
      cluster.coordinator,
      cluster.num_processes,
      cluster.process_id,
      cluster.heartbeat_s,
  )
  deploy_lib.check_platform(config.deploy, jax.default_backend())


def run(
    config: ml_collections.ConfigDict,
    workdir: str,
    *,
    learner_id: int,
    target: str,
    token: str,
    cluster: Cluster = Cluster(),
) -> dict[str, Any]:
  config = checks.prepare(config)
  targets = shard_targets(target, config.outer.sync_shards)
  _join_job(config, cluster)
  paths.makedirs(workdir)
  faults = _faults(config, learner_id, workdir)
  learner = make_learner(config, learner_id)
  learner.run_every = config.outer.overlap if config.outer.blocking else 0  # (multihost.py)
  ckpt = (
      LearnerCheckpointer(  # (shared by a job's processes: process 0 checks it, inner/checkpoint)
          paths.join(workdir, "checkpoints"),
          config.outer.learner_checkpoint_every,
          async_save=True,  # (one learner in this process: learner_checkpoint.py)
      )
  )
  restored = restore(learner, ckpt)
  if restored is not None:
    _load_unanswered(workdir, learner, restored)
  restored_state = {"restored_step": restored, "restored_versions": list(learner.versions)}

  def after_step(lrn) -> None:
    if ckpt.maybe_save(lrn, lrn.island.data.train_iter) and jax.process_count() > 1:
      lrn.count_collective()  # (orbax's save of a multi-process job syncs the processes)

  def next_batch():
    return next(learner.island.data.train_iter)

  if not talks_to_sync():
    counts = multihost.follow(learner, next_batch, after_step)
    ckpt.close()
    learner.whole_globals()  # (process 0 gathers them for its summary: every process takes part)
    return _finish(learner, workdir, {"role": "follower", "ops": counts, **restored_state})
  rejoin = learner_rejoin.for_process(config, learner, workdir, restored)
  progress = _Progress(config, workdir, learner_id, restored_state, learner.steps)
  link = connect(config, learner, targets, token, progress, lambda: rejoin.start_step)

  def on_step(lrn, device_metrics) -> None:
    progress(lrn, device_metrics)
    after_step(lrn)
    faults.after_step(lrn.steps)

  tokens0, t0 = learner.tokens, time.perf_counter()
  try:
    result = _train(config, learner, faults.link(link), next_batch, on_step, rejoin)
  except BaseException:
    progress.close()  # the rows so far (a bucket's wait in memory for their upload)
    if jax.process_count() == 1:  # (a multi-process save in flight needs the followers)
      try:
        ckpt.close()  # the save in flight commits rather than being cut off at exit
      except Exception:  # pylint: disable=broad-except  (the run's own error is the one to raise)
        pass
    raise
  wall = time.perf_counter() - t0
  result["rejoin"] = rejoin.record
  stopped = result["stopped_by"] == preemption.SIGNAL or result["undelivered_steps"]
  if stopped and jax.process_count() == 1:
    # Preempted, or its synchronizer stayed away: the progress since the last save is kept, for
    # a restart to deliver (a multi-process learner's save would need its followers, which the
    # stop has already released: it keeps its last one).
    result["saved_at_stop"] = ckpt.save_now(learner, learner.island.data.train_iter)
    if ckpt.latest_step() == learner.steps:
      _save_unanswered(workdir, learner)
  if result["undelivered_steps"] and result["stopped_by"] is None:
    _report_undelivered(config, learner, targets, result, ckpt.latest_step())
  progress.close()
  ckpt.close()
  held = learner.whole_globals()
  return _finish(
      learner,
      workdir,
      _summary(learner, held, link, workdir, result, wall, tokens0, restored_state),
  )


UNANSWERED = "unanswered.npz"


def _save_unanswered(workdir: str, learner) -> None:
  """WORKDIR/unanswered.npz: each fragment's last upload since it last received it, not refused
  (`Learner.sent`), as of the step just saved. If the synchronizer merged one that never
  came back, a restarted process rebases on it (learner_machine.Apply) instead of dropping what
  it trained after it."""
  sent = {str(p): np.frombuffer(transport.encode_message(up), np.uint8) for p, up in
          _last_sent(learner).items()}  # fmt: skip
  with paths.writing(paths.join(workdir, UNANSWERED), "wb") as f:
    np.savez(f, step=np.int64(learner.steps), **sent)


def _load_unanswered(workdir: str, learner, step: int) -> None:
  """Takes `_save_unanswered`'s uploads back if they were saved at `step` (the restored one)."""
  path = paths.join(workdir, UNANSWERED)
  if not paths.exists(path):
    return
  with np.load(io.BytesIO(paths.read_bytes(path))) as saved:
    if int(saved["step"]) != step:
      return
    learner.sent = {
        int(k): [transport.decode_message(saved[k].tobytes())] for k in saved.files if k != "step"
    }


def _last_sent(learner) -> dict:
  return {p: ups[-1] for p, ups in learner.sent.items() if ups}


def _report_undelivered(config, learner, targets: list[str], result: dict, saved) -> None:
  """One line on stderr: what the synchronizer never took, and where it is kept."""
  held = ", ".join(f"fragment {p}: {n} steps" for p, n in result["undelivered_steps"].items())
  kept = (
      f"saved at step {saved}: a restart delivers it"
      if saved == learner.steps
      else "no checkpoint holds it (outer.learner_checkpoint_every=0)"
  )
  print(
      f"learner {learner.index}: the synchronizer ({', '.join(targets)}) did not take this "
      f"progress within deploy.deliver_timeout_s={config.deploy.deliver_timeout_s:g} s: {held}; "
      f"{kept}; exiting {preemption.EXIT_PREEMPTED}",
      file=sys.stderr,
  )


def shard_targets(target: str, shards: int) -> list[str]:
  """HOST:PORT of each synchronizer shard, in shard order, from `--synchronizer` (one per shard,
  comma-separated); ValueError unless there are `outer.sync_shards` of them."""
  targets = [t.strip() for t in target.split(",") if t.strip()]
  if len(targets) != shards:
    raise ValueError(
        f"--synchronizer names {len(targets)} synchronizer(s) ({target!r}) but "
        f"outer.sync_shards={shards}: give one HOST:PORT per shard, in shard order"
    )
  return targets


def connect(config, learner, targets: list[str], token: str, progress: "_Progress", start):
  """The learner's link: to its synchronizer, or to every shard (`sharded_link.ShardedLink`).
  Its heartbeats report the learner as of its last step, and the step this process started
  training at (`start()`, after any resume)."""
  links = []
  for target in targets:
    link = client_lib.GrpcLink(
        target,
        learner.index,
        token,
        limits=limits_lib.Limits.from_deploy(config.deploy),
        ca_cert=config.deploy.ca_cert,
    )
    link.report = lambda: dict(
        total_steps=progress.seen[0],
        total_tokens=learner.tokens,
        loss=progress.last_loss,
        start_step=start(),
        c_steps=progress.seen[1],  # (where a restarted peer resumes: learner_rejoin.py)
    )
    link.on_link = lambda event, target=target: progress.link({**event, "target": target})
    links.append(link)
  if len(links) == 1:
    return links[0]
  return sharded_link.ShardedLink(
      links, learner.owner_of, learner, max_backoff_s=config.deploy.absent_after_s
  )


def _summary(
    learner, held, link, workdir: str, result: dict, wall: float, tokens0: int, restored_state
) -> dict[str, Any]:
  """Saves the global fragments this learner holds (`held`, whole: global_copy.npz); its summary
  keys."""
  held = {f"{p}/{k}": v for p, g in enumerate(held) for k, v in g.items()}
  with paths.writing(paths.join(workdir, "global_copy.npz"), "wb") as f:
    np.savez(f, **held)
  return {
      **result,
      "role": "learner",
      "wall_s": wall,
      **restored_state,
      "tokens_per_s": (learner.tokens - tokens0) / wall,  # this process's own
      "versions": learner.versions,
      "generations": learner.generations,
      "global_crc": integrity.tree_crc(held),
      "wire_bytes_sent": link.bytes_sent,
      "wire_bytes_received": link.bytes_received,
      "codec_bytes_sent": link.codec_bytes_sent,
      "codec_bytes_received": link.codec_bytes_received,
      "shards_down": list(getattr(link, "downs", [])),  # times each shard was found down
  }


# A learner process sent this stops training at its next sync point, delivers what it holds,
# settles and exits 0, as if its steps were done (a scavenged learner handed back, a time-boxed
# run's end); SIGTERM stops it without delivering (a preemption: it saves and exits 75).
LEAVE_SIGNAL = signal.SIGUSR1


def _train(config, learner, link, next_batch, on_step, rejoin) -> dict[str, Any]:
  """The learner loop over `link` until SIGTERM, LEAVE_SIGNAL or `config.steps`; the followers
  are told the end.

  Non-blocking learners join, poll and upload in threads (`loop_link_for`); a multi-process
  learner's link keeps its followers in step.
  """
  loop_link = outer_link = loop_link_for(link, config.outer.blocking, len(learner.versions))
  if jax.process_count() > 1:
    multihost.lead(learner, run_until=config.steps, overlap=learner.run_every)
    loop_link = multihost.KeepFollowers(loop_link, learner)
  stop, leave = threading.Event(), threading.Event()
  signal.signal(signal.SIGTERM, lambda *_: stop.set())
  signal.signal(LEAVE_SIGNAL, lambda *_: leave.set())
  try:
    result = learner_loop.run_learner(
        learner,
        loop_link,
        next_batch,
        config.steps,
        overlap=config.outer.overlap,
        blocking=config.outer.blocking,
        heartbeat_s=config.deploy.absent_after_s / 4,
        stop=stop,
        leave=leave,
        on_step=on_step,
        seed=learner.index,
        settle_timeout_s=config.deploy.deliver_timeout_s,
        rejoin=rejoin,
    )
    return {
        **result,
        "stopped_by": preemption.SIGNAL if stop.is_set() else None,
        "left_at": learner.steps if leave.is_set() else None,  # (SIGUSR1: its steps end here)
    }
  finally:
    multihost.end(learner)
    outer_link.close()  # a BackgroundLink closes the gRPC link too


def _finish(learner: multihost.SpmdLearner, workdir: str, summary: dict) -> dict[str, Any]:
  """Writes the summary (process 0) and, in a multi-process learner, each process's params."""
  summary = {
      **summary,
      "runtime": "grpc",
      "learner": learner.index,
      "steps": learner.steps,
      "tokens": learner.tokens,
      "process": jax.process_index(),
      "processes": jax.process_count(),
      "devices": jax.device_count(),
  }
  if jax.process_count() > 1:  # every process: the parameters it ended with
    # Where each cross-process call outside the train step was made (step -> calls): at sync
    # points only, every `sync_interval` steps (the final gather below is counted too).
    summary["sync_interval"] = learner.sync_interval()
    params = learner.host_params()
    summary["collectives"] = {str(k): v for k, v in sorted(learner.collectives.items())}
    with paths.writing(paths.join(workdir, f"params.process{jax.process_index()}.npz"), "wb") as f:
      np.savez(f, **params)
    summary["params_crc"] = integrity.tree_crc(params)
    summary["global_copy_bytes"], summary["global_copy_whole_bytes"] = learner.copy_bytes()
    summary["params_sharded"] = sum(
        not x.is_fully_replicated  # over the processes' devices
        for x in jax.tree.leaves(learner.state.params)
    )
  if talks_to_sync():
    metrics.write_summary(workdir, summary)
  else:
    name = f"summary.process{jax.process_index()}.json"
    paths.write_text(paths.join(workdir, name), json.dumps(summary, indent=2))
  return summary
