"""A whole-run snapshot of the virtual runtime, taken at an event boundary, to resume bit for bit.

It holds, as host values in one pickle: every learner's train state (a stacked learner's row)
and what it knows of the global fragments (copies, versions, generations, counters, uplink
residuals and rng, schedule); the synchronizer's `state_dict()` and the rest of its state (who is
live and holds what, uploads not merged yet, rounds and timers in progress, DyLU); each
learner's data-iterator position and clock (its jitter rng included); the event queue with the
steps' metrics fetched; the simulated time, tokens started, bytes counters, epochs and timeline;
the stacks' wave counters; and what the runner adds (its logs, the metrics file's length).

`save` writes under a temporary name, then renames, so a kill in the middle of a save leaves the
previous snapshot. A snapshot names a digest of the config (preemption.config_digest), and
`load` refuses one of another config. Runs with faults (virtual_chaos.py)
are not snapshotted: the state of their fault component is not in here.
"""

import itertools
import pickle
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from absl import logging

from diloco import errors, paths
from diloco.outer.learner.learner import Learner
from diloco.outer.learner.stacked_learner import StackedLearner
from diloco.outer.sync.sharded import ShardedSynchronizer
from diloco.outer.sync.synchronizer import Synchronizer
from diloco.runtime import virtual

FILE = "virtual_run.pkl"  # under WORKDIR/checkpoints
FORMAT = 6  # 2: learners' protocol state in "machines" (was in the clocks); 3: sync "fragments";
# 4: learners' "sync_generations" per synchronizer shard; 5: learners' uploads since they last
# received each fragment and their bases (the delivery rules: rebase, at_own_sync); 6: the
# runtime's "epochs" (was "_epochs")
_LEARNER_FIELDS = (
    "global_copy",
    "versions",
    "generations",
    "owner_of",
    "sync_generations",
    "c_steps",
    "c_tokens",
    "steps",
    "tokens",
    "uplink",
    "schedule",
    "sent",
    "base_copy",
    "base_versions",
    "base_generations",
    "adopt_at",
    "own_merged",
)
# The synchronizer's configuration (rebuilt from the config), and the arrays of its state_dict.
_SYNC_BUILT = ("tx", "_cpu", "policy", "frag", "screen", "codec", "checkpoint_every", "owned")
_SYNC_ARRAYS = ("fragments",)  # restored by its state_dict
_RUNTIME_FIELDS = (
    "now",
    "tokens_started",
    "bytes_up",
    "bytes_down",
    "epochs",
    "_background",
    "trace",
    "started",
)


def path(workdir: str) -> str:
  return paths.join(workdir, "checkpoints", FILE)


def host_metrics(metrics: Mapping[str, Any]) -> dict[str, np.ndarray]:
  """A step's metrics on the host (a stacked learner's queued step runs now)."""
  return {k: np.asarray(v) for k, v in jax.device_get(dict(metrics)).items()}


def learner_state(learner: Learner) -> dict[str, Any]:
  state = {k: getattr(learner, k) for k in _LEARNER_FIELDS}
  state["train"] = [np.asarray(x) for x in jax.tree.leaves(jax.device_get(learner.state))]
  return state


def load_learner(learner: Learner, state: Mapping[str, Any]) -> None:
  isl = learner.island
  tree = jax.tree.unflatten(jax.tree.structure(isl.abstract_state()), state["train"])
  learner.state = jax.device_put(tree, isl.fns.state_shardings)
  for k in _LEARNER_FIELDS:
    setattr(learner, k, state[k])


def sync_state(sync: Synchronizer | ShardedSynchronizer) -> dict[str, Any]:
  """`state_dict()` and every other attribute that is not built from the config (of each
  shard, when sharded)."""
  if isinstance(sync, ShardedSynchronizer):
    return {"shards": [sync_state(shard) for shard in sync.shards]}
  rest = {k: v for k, v in vars(sync).items() if k not in _SYNC_BUILT + _SYNC_ARRAYS}
  return {"state_dict": sync.state_dict(), "rest": rest}


def load_sync(sync: Synchronizer | ShardedSynchronizer, state: Mapping[str, Any]) -> None:
  if isinstance(sync, ShardedSynchronizer):
    for shard, sub in zip(sync.shards, state["shards"], strict=True):
      load_sync(shard, sub)
    return
  sync.load_state_dict(state["state_dict"])
  for k, v in state["rest"].items():
    setattr(sync, k, v)


def _queue(queue: list[tuple]) -> list[tuple]:
  """The event queue with each finished step's metrics on the host."""
  out = []
  for time, order, seq, kind, payload, owner, epoch, background in queue:
    if kind == "step_done":
      m, metrics, duration = payload
      payload = (m, host_metrics(metrics), duration)
    out.append((time, order, seq, kind, payload, owner, epoch, background))
  return out


def _stacks(learners: Sequence[Learner]) -> list[Any]:
  """The distinct stacks of stacked learners, in learner order."""
  found = {id(l.stack): l.stack for l in learners if isinstance(l, StackedLearner)}
  return list(found.values())


def take(
    digest: str,
    runtime: virtual.VirtualRuntime,
    data_iters: Sequence[Any],
    extra: Mapping[str, Any],
) -> dict[str, Any]:
  """The snapshot of a runtime stopped at an event boundary (`digest`: its config's
  `preemption.config_digest`; `extra`: the runner's state)."""
  seq = next(runtime._seq)
  runtime._seq = itertools.count(seq)  # what it would have numbered next
  return {
      "format": FORMAT,
      "config": digest,
      "runtime": {k: getattr(runtime, k) for k in _RUNTIME_FIELDS},
      "seq": seq,
      "queue": _queue(runtime.queue),
      "clocks": list(runtime.clocks),
      "machines": [m.state() for m in runtime.machines],
      "learners": [learner_state(l) for l in runtime.learners],
      "sync": sync_state(runtime.sync),
      "data": [it.get_state() for it in data_iters],
      "stacks": [(s.waves, s.steps) for s in _stacks(runtime.learners)],
      "extra": dict(extra),
  }


def restore(runtime: virtual.VirtualRuntime, data_iters: Sequence[Any], snap: Mapping) -> None:
  """Puts `snap` into a runtime built as for a fresh run (same config), before `run()`."""
  for k, v in snap["runtime"].items():
    setattr(runtime, k, v)
  runtime._seq = itertools.count(snap["seq"])
  runtime.queue = list(snap["queue"])  # a heap already
  runtime.clocks[:] = snap["clocks"]
  for machine, state in zip(runtime.machines, snap["machines"], strict=True):
    machine.load_state(state)
  for learner, state in zip(runtime.learners, snap["learners"], strict=True):
    load_learner(learner, state)
  load_sync(runtime.sync, snap["sync"])
  for it, state in zip(data_iters, snap["data"], strict=True):
    it.set_state(state)
  for stack, (waves, steps) in zip(_stacks(runtime.learners), snap["stacks"], strict=True):
    stack.waves, stack.steps = waves, steps


def save(workdir: str, snap: Mapping[str, Any]) -> str:
  """Writes `snap` whole or not at all; returns its path."""
  target = path(workdir)
  paths.write_bytes(target, pickle.dumps(dict(snap), protocol=pickle.HIGHEST_PROTOCOL))
  return target


def load(workdir: str, digest: str) -> dict[str, Any] | None:
  """The workdir's snapshot, or None; ValueError if it was taken with another config (another
  `preemption.config_digest`, `digest` being this run's)."""
  target = path(workdir)
  if not paths.exists(target):
    return None
  snap = pickle.loads(paths.read_bytes(target))
  if snap.get("format") != FORMAT or snap.get("config") != digest:
    raise errors.InputError(
        f"{target} is the snapshot of a run with another config (or format); run this config"
        " in another workdir, or delete the snapshot to start over"
    )
  logging.warning("resumed from the snapshot %s", target)
  return snap


def remove(workdir: str) -> None:
  """Deletes the snapshot (the run finished: a rerun starts over, as before)."""
  paths.remove(path(workdir))
