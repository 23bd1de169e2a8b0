"""The synchronizer process: the gRPC service over a SyncHost, with orbax checkpoints.

Where it listens, TLS and limits come from the config's `deploy` section. It starts from the
newest checkpoint in WORKDIR/checkpoints/synchronizer if there is one (beginning a new generation,
see Synchronizer.restart), else from the config's initial parameters (and saves that as
checkpoint 0). When the state machine asks (every `outer.sync_checkpoint_every` merges) it saves
again on a thread of its own, off the host's lock, each save writing only the fragments merged
since the last, at most `outer.sync_save_share` of the time; and at shutdown. The bound port goes to WORKDIR/port; the run
ends when every learner finished, every merge was delivered and no learner is live any more (or on
SIGTERM), and writes WORKDIR/summary.json with wire and codec byte counts.
"""

import signal
import threading
import time
from typing import Any

import ml_collections
import numpy as np

from diloco import metrics, paths
from diloco.config import build, checks
from diloco.outer import memory, optimizers
from diloco.outer.codecs import kernels
from diloco.outer.sync.sync_state import arrays_digest
from diloco.outer.sync.synchronizer import Synchronizer
from diloco.recovery import sync_checkpoint
from diloco.rpc import limits as limits_lib, service, status_board, status_server
from diloco.runtime import preemption, sync_host
from diloco.watch import progress


def make_synchronizer(config: ml_collections.ConfigDict, shard: int = 0) -> Synchronizer:
  """The config's synchronizer (shard `shard` of `outer.sync_shards`: the fragments it owns),
  at the initial parameters every learner builds. It asks for a checkpoint after every merge
  unless `outer.sync_checkpoint_every` says less often; `run` saves in the background, at most
  `outer.sync_save_share` of the time (sync_checkpoint.BackgroundSaves), so a restart may lack
  merges that learners hold: they send what it lacks (`learner_machine.regressed`)."""
  return build.synchronizer_only(config).make_shard(shard, min_checkpoint_every=1)


def check_shard(config: ml_collections.ConfigDict, shard: int | None) -> int:
  """The shard this process serves; ValueError if `outer.sync_shards` needs one named."""
  shards = config.outer.sync_shards
  if shard is None and shards > 1:
    raise ValueError(
        f"outer.sync_shards={shards}: start one synchronizer per shard with --shard=0.."
        f"{shards - 1}, each with its own --workdir (scripts/launch_local.py starts them all)"
    )
  shard = shard or 0
  if not 0 <= shard < shards:
    raise ValueError(f"--shard={shard} is not in 0..{shards - 1} (outer.sync_shards={shards})")
  return shard


def _restore(
    sync: Synchronizer, ckpt: sync_checkpoint.SyncCheckpointer
) -> tuple[dict[str, Any], dict]:
  """Restarts `sync` from the newest checkpoint as a new generation (what was restored, for the
  summary; the learners' sessions it counted, `StatusBoard.sessions`), or saves its initial
  state as checkpoint 0."""
  if ckpt.latest_step() is None:
    ckpt.save(sync.merges, sync.state_dict())
    return {}, {}
  state = ckpt.restore(sync.state_dict())
  sync.restart(state, int(state["meta"]["generation"]) + 1)
  now = sync.state_dict()["arrays"]  # a restart changes only the generation bookkeeping
  restored = {
      "restored_digest": arrays_digest(state),
      "restored_arrays_equal": all(np.array_equal(now[k], v) for k, v in state["arrays"].items()),
  }
  return restored, state["meta"].get(SESSIONS, {})


SESSIONS = "learner_sessions"  # the meta key of a checkpoint's StatusBoard.sessions()


def _with_sessions(state: dict[str, Any], board: status_board.StatusBoard) -> dict[str, Any]:
  """`state` with the learners' sessions in its metadata: the steps each learner trained, so
  that the summary's shares after a restart count the work before it too."""
  return {"arrays": state["arrays"], "meta": {**state["meta"], SESSIONS: board.sessions()}}


def _write_port(workdir: str, port: int, name: str = "port") -> None:
  """WORKDIR/<name>, written whole: a reader sees all or none."""
  paths.write_text(paths.join(workdir, name), str(port))


def _serve_until_settled(
    host: sync_host.SyncHost, sync: Synchronizer, max_s: float, show: bool, name: str
) -> bool:
  """Returns once every learner finished and left and every merge went out, on SIGTERM, or after
  `max_s` seconds (True: SIGTERM); a progress bar of merges meanwhile (on a terminal, when
  `show`)."""
  stop = threading.Event()
  signal.signal(signal.SIGTERM, lambda *_: stop.set())
  t0 = time.monotonic()
  bar = progress.bar(show, desc=f"{name} gen {sync.generation}", unit="merge")
  while not stop.wait(0.2) and time.monotonic() - t0 < max_s:
    with host.cond:
      merges, live, finished = host.merges, len(sync.live), len(host.finished)
      done = host.settled() and not sync.live
    bar.update(merges - bar.n)  # the terminal is written outside the host's lock
    bar.set_postfix(live=live, finished=finished, refresh=False)
    if done:
      break
  bar.close()
  return stop.is_set()


def _summary(
    sync: Synchronizer,
    board: status_board.StatusBoard,
    svc,
    port: int,
    restored_from,
    restored: dict,
    wall_s: float,
) -> dict[str, Any]:
  """The synchronizer process's summary keys (under the host's lock)."""
  return {
      "runtime": "grpc",
      "role": "synchronizer",
      "owned": list(sync.owned),
      "merges": sync.merges,
      "merge_clock": sync.merge_clock_summary(),
      "generation": sync.generation,
      "restored_from": restored_from,
      "versions": list(sync.versions),
      "digest": sync.digest(),
      **restored,
      "refusals": board.refusals(),
      # Each learner's inner steps, and those whose progress reached a merge of this process's
      # fragments (kept in the checkpoints: a restart keeps the count of the merges it kept).
      "learners": metrics.merged_shares(sync.merged_work(), board.trained_steps(), len(sync.owned)),
      "wall_s": wall_s,
      "wire_bytes_received": svc.bytes_received,
      "wire_bytes_sent": svc.bytes_sent,
      "codec_bytes_received": svc.codec_bytes_up,
      "codec_bytes_sent": svc.codec_bytes_down,
      "port": port,
  }


def watched_host(
    sync: Synchronizer, limits: limits_lib.Limits, on_log, on_checkpoint
) -> tuple[sync_host.SyncHost, status_board.StatusBoard]:
  """The synchronizer's host with the status board fed by its hooks (the board's `service` is
  set once the gRPC service exists)."""
  board = status_board.StatusBoard()

  def log(record: dict) -> None:
    on_log(record)
    board.log(record)

  host = sync_host.SyncHost(
      sync,
      absent_after_s=limits.absent_after_s,
      max_learners=limits.max_learners,
      progress_per_s=limits.progress_per_s,
      on_log=log,
      on_checkpoint=on_checkpoint,
      on_progress=board.report,
      on_upload=board.uploaded,
  )
  board.host = host
  return host, board


def _start_status(deploy, board, token: str, workdir: str):
  """The status service when `deploy.status_port` >= 0 (its port in WORKDIR/status_port)."""
  if deploy.status_port < 0:
    return None
  server = status_server.StatusServer(
      board,
      token,
      bind=deploy.bind,
      port=deploy.status_port,
      cert=deploy.cert,
      key=deploy.key,
      count=board.count,
  )
  _write_port(workdir, server.port, "status_port")
  return server


def run(
    config: ml_collections.ConfigDict,
    workdir: str,
    *,
    token: str,
    max_s: float = 3600.0,
    shard: int | None = None,
) -> dict[str, Any]:
  """Serves on config.deploy's bind:port (TLS when deploy.cert/key are set) until settled: the
  whole synchronizer, or shard `shard` of `outer.sync_shards` (its own workdir)."""
  config = checks.prepare(config)
  shard = check_shard(config, shard)
  memory.keep_freed_arrays()  # a merge round reuses the last one's arrays (outer/memory.py)
  deploy = config.deploy
  limits = limits_lib.Limits.from_deploy(deploy)
  paths.makedirs(workdir)
  sync = make_synchronizer(config, shard)
  if sync.codec == "fp4" and isinstance(sync.tx, optimizers.SGD):
    kernels.warm_up()  # its merges run the compiled commit: compile before serving, not mid-run
  ckpt = sync_checkpoint.SyncCheckpointer(paths.join(workdir, "checkpoints", "synchronizer"))
  t_restore = time.monotonic()
  restored_from = ckpt.latest_step()
  restored, sessions = _restore(sync, ckpt)
  restore_s = time.monotonic() - t_restore  # (checksums checked, arrays read, or checkpoint 0)
  # A restarted synchronizer appends to the log of the run before it.
  writer = metrics.MetricsWriter.for_run(
      config, workdir, resume_step=None if restored_from is None else 1 << 60
  )
  lock = threading.Lock()

  def on_log(record: dict) -> None:
    with lock:
      writer.write({"step": sync.merges, "wall_time": time.time(), **record}, prefix="sync/")

  host, board = watched_host(sync, limits, on_log, lambda s: None)
  snapshot = lambda: (sync.merges, _with_sessions(sync.state_dict(), board))
  saves = sync_checkpoint.BackgroundSaves(
      ckpt, host.cond, snapshot, config.outer.sync_save_share, on_saved=on_log
  )
  host.on_checkpoint = lambda s: saves.request()
  board.load_sessions(sessions)
  server, svc, bound = service.serve(
      host,
      token,
      port=deploy.port,
      bind=deploy.bind,
      limits=limits,
      cert=deploy.cert,
      key=deploy.key,
  )
  board.service = svc
  board.shard = shard if config.outer.sync_shards > 1 else None
  status = _start_status(deploy, board, token, workdir)
  _write_port(workdir, bound)
  t0 = time.monotonic()
  name = "synchronizer" if config.outer.sync_shards == 1 else f"synchronizer shard {shard}"
  signalled = _serve_until_settled(host, sync, max_s, config.get("progress_bar", True), name)
  if status is not None:
    status.close()
  server.stop(1.0).wait()
  host.close()
  saves.close()
  with host.cond:
    ckpt.save(sync.merges, _with_sessions(sync.state_dict(), board))
    summary = _summary(sync, board, svc, bound, restored_from, restored, time.monotonic() - t0)
    summary["restore_s"] = restore_s
    # The wall time of its clock's zero: a metrics row's time plus this is the row's wall time.
    summary["wall_t0"] = time.time() - host.now()
    summary["checkpoints"] = {
        "saves": ckpt.saves,
        "bytes_written": ckpt.bytes_written,
        "background_saves": saves.saves,
        "background_seconds": saves.seconds,
    }
    summary["shard"] = shard
    summary["stopped_by"] = preemption.SIGNAL if signalled else None  # saved above either way
  ckpt.close()
  writer.close()
  metrics.write_summary(workdir, summary)
  return summary
