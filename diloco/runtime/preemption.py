"""Stopping a run early and cleanly: SIGTERM (a Cloud TPU preemption notice), SIGINT, or
`config.stop_after_steps`.

`stop_on_signals()` installs SIGTERM and SIGINT handlers for the duration of a run and restores
the previous ones after (nested uses share one request; only the outermost clears it). A first
signal only records the request: runners poll `requested()` at their step (or event) boundaries,
save a checkpoint there and return a summary with `finished: False` and `stopped_by` ('signal'
or 'stop_after_steps'). A run whose main thread reaches no boundary within `STOP_GRACE_S` of the
signal (blocked in a collective waiting for a dead peer, or in a save's barrier: Python's
handlers only run between bytecodes) is ended by a watchdog with one line and EXIT_PREEMPTED. A
second signal while stopping raises KeyboardInterrupt, as Python does.

A main whose run stopped on a signal exits with EXIT_PREEMPTED (`exit_code`): 75, EX_TEMPFAIL of
sysexits.h, "stopped early, run the same command again" (the code the chaos crash fault of a
learner process uses too); `experiments.supervise` restarts it, and the same command resumes.
"""

import contextlib
import hashlib
import json
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

import ml_collections
from absl import logging

from diloco import paths
from diloco.config import keys
from diloco.inner import checkpoint

EXIT_PREEMPTED = 75  # EX_TEMPFAIL: stopped early with a checkpoint; restart me
# EX_IOERR: trained to the end, summary written, but the last checkpoint's save failed (a full
# disk); a rerun resumes from the last save that succeeded and trains those steps again
EXIT_SAVE_FAILED = 74
SIGNALS = (signal.SIGTERM, signal.SIGINT)
SIGNAL, STOP_AFTER_STEPS = "signal", "stop_after_steps"  # summary["stopped_by"]
ORBAX_TMP = "*.orbax-checkpoint-tmp*"

STOP_GRACE_S = 120.0  # a run that reaches no step boundary this long after a signal is ended

_received: list[int] = []  # signals received since the outermost stop_on_signals began
_depth = [0]
_grace_s = [STOP_GRACE_S]
_heard = threading.Event()  # a runner saw the request (at a boundary), or the run ended


def requested() -> bool:
  """Whether a stop signal arrived during the current run (a runner asking has seen it)."""
  if _received:
    _heard.set()
  return bool(_received)


def _handle(signum: int, frame: Any) -> None:
  del frame
  if _received:
    raise KeyboardInterrupt(f"signal {signum} again while stopping")
  _received.append(signum)
  logging.warning(
      "got %s: stopping at the next step boundary with a checkpoint (again: abort now)",
      signal.Signals(signum).name,
  )
  name, grace = signal.Signals(signum).name, _grace_s[0]
  threading.Thread(target=_watch, args=(name, grace), name="stop-watchdog", daemon=True).start()


def _watch(name: str, grace: float) -> None:
  """Ends the process when no runner saw the stop request within `grace` seconds: its main
  thread is blocked where signals are not seen (a collective waiting for a peer, a save in a
  barrier), and would never reach a boundary; the last saved checkpoint resumes the run."""
  if _heard.wait(grace):
    return
  print(
      f"error: got {name} {grace:.0f} s ago and reached no step boundary since (blocked in a "
      f"collective or a save?): exiting with {EXIT_PREEMPTED} without a new checkpoint; the "
      "same command resumes from the last one",
      file=sys.stderr,
      flush=True,
  )
  os._exit(EXIT_PREEMPTED)


@contextlib.contextmanager
def stop_on_signals(grace_s: float = STOP_GRACE_S) -> Iterator[None]:
  """SIGTERM and SIGINT request a stop while inside (outside the main thread: nothing installed);
  a run that reaches no step boundary within `grace_s` of the signal is ended (`_watch`)."""
  if _depth[0] == 0:
    _received.clear()
    _heard.clear()
    _grace_s[0] = grace_s
  main = threading.current_thread() is threading.main_thread()
  previous = {s: signal.signal(s, _handle) for s in SIGNALS} if main else {}
  _depth[0] += 1
  try:
    yield
  finally:
    _depth[0] -= 1
    if _depth[0] == 0:
      _heard.set()  # the run is over: nothing left to watch
    for s, handler in previous.items():
      signal.signal(s, handler)


@contextlib.contextmanager
def a_failed_save_ends_the_job() -> Iterator[None]:
  """A save that failed in a multi-process job (`checkpoint.SaveFailed`) ends this process at
  once with one line and EXIT_SAVE_FAILED: not through JAX's exit barrier, which would wait for
  the other processes, themselves waiting for this one (they stop when the coordination service
  misses its heartbeat: --heartbeat_timeout_s)."""
  try:
    yield
  except checkpoint.SaveFailed as e:
    print(f"error: {e}; the job stops (its last saved checkpoint resumes it)", file=sys.stderr)
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(EXIT_SAVE_FAILED)


def stop_reason(step: int, stop_at: int | None) -> str | None:
  """Why a runner stops after `step` ('signal', 'stop_after_steps'), or None to go on."""
  if requested():  # (the boundary saw it: the watchdog stands down)
    return SIGNAL
  if stop_at is not None and step >= stop_at:
    return STOP_AFTER_STEPS
  return None


def remove_orbax_tmp(workdir: str) -> list[str]:
  """Deletes orbax's unfinished saves (`*.orbax-checkpoint-tmp*`) under WORKDIR/checkpoints."""
  found = paths.glob(paths.join(workdir, "checkpoints", "**", ORBAX_TMP))
  for path in found:
    if paths.isdir(path):
      paths.rmtree(path)
    else:
      paths.remove(path)
  return found


def exit_code(summary: dict[str, Any]) -> int:
  """EXIT_PREEMPTED when the run stopped on a signal, or a learner could not deliver its
  progress to an absent synchronizer (restart me); EXIT_SAVE_FAILED when it trained to the end
  but its last checkpoint could not be saved (a full disk); else 0."""
  if summary.get("stopped_by") == SIGNAL or summary.get("undelivered_steps"):
    return EXIT_PREEMPTED
  failed = summary.get("final_checkpoint_failed") or summary.get("summary_write_failed")
  return EXIT_SAVE_FAILED if failed else 0


def json_digest(values: dict[str, Any]) -> str:
  """sha256 of a config's values (config.json) less the keys of an invocation (keys.INVOCATION)."""
  values = {k: v for k, v in values.items() if k not in keys.INVOCATION}
  return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()


def config_digest(config: ml_collections.ConfigDict) -> str:
  """`json_digest` of a config: equal for the stopped and the resuming invocation of a run."""
  return json_digest(json.loads(config.to_json()))
