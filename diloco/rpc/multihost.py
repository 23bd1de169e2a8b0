"""One learner as a multi-process JAX job: process 0 talks to the synchronizer, the others follow.

Every process of the learner builds the same island over all processes' devices (its mesh spans
the job) and holds the same learner state. Only process 0 runs the learner loop against the
synchronizer (`learner_loop.run_learner`). The processes agree at sync points only: the step
boundaries where the fragment schedule can sync (every `Schedule.interval()` steps, e.g. H/P).
At a sync point process 0 broadcasts (`multihost_utils.broadcast_one_to_all`) each operation it
performs on the learner — apply a received fragment, compute an upload, end — and then one RUN
of the steps up to the next sync point, which every process takes without any other collective
than the train step's own, so no host waits on another between two sync points and every process
dispatches ahead of its devices. The learner loop keeps its operations to sync points
(`SpmdLearner.at_sync_point`; a fragment that arrives between two waits for the next). Received
fragments travel in the broadcast as the wire encoding of the Send, so every process applies
identical values at identical steps; each process feeds its step its own slice of the global
batch, and parameters that are not addressable from one process are gathered with
`process_allgather` (a collective, so every process reads them at the same point too).
Checkpoints are taken after steps in lockstep by every process (orbax coordinates a multi-process
save; the checkpoint directory must be shared by the processes: a bucket, or a shared mount).
Each cross-process call outside the train step is counted at the step it was made
(`SpmdLearner.collectives`), which the summary reports.
"""

import collections
import math
import os
import signal
import sys
import time
from collections.abc import Callable

import jax
import numpy as np
from absl import flags

from diloco.outer import fragments
from diloco.outer.learner.learner import Learner
from diloco.outer.protocol import Send
from diloco.rpc import host_parts, transport

FAILED_EXIT = 70  # process 0 ended inside a run of steps (EX_SOFTWARE): restart the whole job
NOOP, RUN, RECEIVE, UPLOAD, END, REBASE, NOT_MERGED, RESUME = range(8)
OP_NAMES = {NOOP: "noop", RUN: "run", RECEIVE: "receive", UPLOAD: "upload", END: "end"}
OP_NAMES[REBASE] = "rebase"  # a receive that keeps the progress after a merged upload
OP_NAMES[NOT_MERGED] = "not_merged"  # an upload refused or never sent (not for a rebase)
OP_NAMES[RESUME] = "resume"  # a restarted learner's step counter (recovery/crash_machine.py)


def define_cluster_flags(of: str) -> tuple:
  """--coordinator, --num_processes and --process_id: a multi-process job of `of` on one machine,
  where JAX cannot find its peers itself (the flags of experiments.train and experiments.learner).
  """
  coordinator = flags.DEFINE_string(
      "coordinator",
      "",
      f"HOST:PORT of JAX process 0 of {of} (several processes on one machine); empty: one process,"
      " or --config.distributed=True to let JAX find its peers.",
  )
  processes = flags.DEFINE_integer("num_processes", 0, f"With --coordinator: processes of {of}.")
  index = flags.DEFINE_integer("process_id", -1, "With --coordinator: this process's index.")
  heartbeat = flags.DEFINE_integer(
      "heartbeat_timeout_s",
      HEARTBEAT_S,
      f"A multi-process job: seconds without a heartbeat after which JAX's coordination service "
      f"declares a process of {of} dead and the others stop with an error (JAX's default).",
      lower_bound=1,
  )
  return coordinator, processes, index, heartbeat


HEARTBEAT_S = 100  # jax.distributed.initialize's heartbeat_timeout_seconds


def initialize(
    distributed: bool,
    coordinator: str = "",
    num_processes: int = 0,
    process_id: int = -1,
    heartbeat_s: int = HEARTBEAT_S,
) -> None:
  """`jax.distributed.initialize`, with an explicit coordinator for local multi-process tests.

  On CPU the cross-process collectives need gloo (set before the backend starts; the setting
  only concerns the CPU backend, so it is harmless on accelerators). `heartbeat_s` bounds how
  long the others wait for a process that died (SIGKILL, a lost host): the coordination service
  then declares it dead and every process's next call into it fails.
  """
  if not distributed and not coordinator:
    return
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  if coordinator:
    if num_processes < 1 or not 0 <= process_id < num_processes:
      raise ValueError(
          f"--coordinator needs --num_processes >= 1 and --process_id in "
          f"0..num_processes-1, got {num_processes} and {process_id}"
      )
    jax.distributed.initialize(
        coordinator_address=coordinator,
        num_processes=num_processes,
        process_id=process_id,
        heartbeat_timeout_seconds=heartbeat_s,
    )
  else:
    jax.distributed.initialize(heartbeat_timeout_seconds=heartbeat_s)


def summed(counts: list[int]) -> list[int]:
  """Per-process counts summed over the processes (a collective: every process calls it)."""
  if jax.process_count() == 1:
    return list(counts)
  from jax.experimental import multihost_utils

  every = np.asarray(multihost_utils.process_allgather(np.asarray(counts, np.int64)))
  return [int(x) for x in every.reshape(jax.process_count(), -1).sum(0)]


def host_value(x) -> np.ndarray:
  """The full value of one array on this host (gathered from every process if sharded)."""
  if not isinstance(x, jax.Array) or x.is_fully_addressable:
    return np.asarray(jax.device_get(x))
  if x.is_fully_replicated:
    return np.asarray(x.addressable_data(0))
  from jax.experimental import multihost_utils

  return np.asarray(multihost_utils.process_allgather(x, tiled=True))


class SpmdLearner(Learner):
  """A learner whose parameters may span processes; on process 0 it announces its operations.

  `announce` is None on the other processes (they are driven by `follow`) and on single-process
  learners, which then behave exactly like `Learner`. Process 0 announces a RUN of steps at the
  first step after a sync point (to the next one, or to `run_until`), and any other operation
  only between runs (`at_sync_point`): one in the middle of a run is a RuntimeError, as the
  followers are not listening then.
  """

  announce: Callable[[int, int, bytes], None] | None = None
  run_until: int | None = None  # process 0: the run's last step (a RUN never goes past it)
  run_every: int = 0  # process 0: a further bound on the sync points (see `sync_interval`)
  run_left: int = 0  # steps of the announced RUN not taken yet
  _collectives: collections.Counter | None = None
  _layouts: dict | None = None

  @property
  def collectives(self) -> collections.Counter:
    """Step -> cross-process calls made there outside the train step (broadcasts, gathers)."""
    if self._collectives is None:
      self._collectives = collections.Counter()
    return self._collectives

  @property
  def at_sync_point(self) -> bool:
    """Whether the learner may be changed other than by a step (no RUN under way)."""
    return self.run_left == 0

  def sync_interval(self) -> int:
    """Steps between two sync points: the schedule's interval (every sync step is a multiple of
    it), and with a blocking learner's overlap tau the gcd with tau too (`run_every`), so that a
    learner that must wait for a merge tau steps after its upload is at a sync point then."""
    return math.gcd(self.schedule.interval(), self.run_every)

  def next_run(self) -> int:
    """Steps from here to the next sync point (or to `run_until`), at least 1."""
    k = self.sync_interval()
    n = k - self.steps % k
    if self.run_until is not None and self.run_until > self.steps:
      n = min(n, self.run_until - self.steps)
    return n

  def count_collective(self) -> None:
    self.collectives[self.steps] += 1

  def host_params(self) -> dict[str, np.ndarray]:
    return {k: self._host(v) for k, v in fragments.flatten(self.state.params).items()}

  def _host(self, x) -> np.ndarray:
    if isinstance(x, jax.Array) and not x.is_fully_addressable and not x.is_fully_replicated:
      self.count_collective()
    return host_value(x)

  # The host copies (global fragments, at_own_sync's base, residuals) as this process's parts of
  # the parameters' shardings (host_parts.py): no gather but an upload's and the end's.

  def layout(self, k: str) -> host_parts.Layout:
    """How this process holds parameter k on its host."""
    if self._layouts is None:
      self._layouts = {
          path: host_parts.Layout.of(x.shape, x.sharding)
          for path, x in fragments.flatten(self.state.params).items()
      }
    return self._layouts[k]

  def copy_bytes(self) -> tuple[int, int]:
    """(bytes this process holds of its copy of the global fragments, bytes of the whole copy)."""
    held = [(v.nbytes, k) for g in self.global_copy for k, v in g.items()]
    return sum(n for n, _ in held), sum(4 * int(np.prod(self.layout(k).shape)) for _, k in held)

  def _to_held(self, k: str, full: np.ndarray) -> np.ndarray:
    return self.layout(k).cut(np.asarray(full, np.float32)).astype(np.float32, copy=True)

  def _cut(self, tree):
    return {k: self.layout(k).cut(v) for k, v in tree.items()}

  def _whole(self, tree):
    out = {}
    for k, v in tree.items():
      if not self.layout(k).whole:
        self.count_collective()
      out[k] = self.layout(k).gather(v)
    return out

  def save_form(self, k: str, held: np.ndarray):
    lay = self.layout(k)  # (a part saved whole would lose the others' blocks)
    if lay.whole:
      return np.asarray(held, np.float32)
    return lay.array(held, np.float32, lay.host_sharding)  # (in host memory where there is one)

  def save_like(self, k: str, like):
    lay = self.layout(k)
    if lay.whole:
      return np.zeros(like.shape, np.float32)
    return jax.ShapeDtypeStruct(lay.shape, np.float32, sharding=lay.host_sharding)

  def from_saved(self, k: str, saved) -> np.ndarray:
    if isinstance(saved, jax.Array) and not saved.is_fully_addressable:
      return self.layout(k).part_of(saved).astype(np.float32, copy=True)
    return self._to_held(k, np.asarray(saved))

  def _read(self, p: int) -> dict[str, np.ndarray]:
    flat = fragments.leaves(self.state.params, self.frag.paths[p])
    return {
        k: np.asarray(jax.device_get(v)) if v.is_fully_addressable else self.layout(k).part_of(v)
        for k, v in flat.items()
    }

  def _write(self, values) -> None:
    old = fragments.leaves(self.state.params, list(values))
    new = {
        k: (
            jax.device_put(np.asarray(v, old[k].dtype), old[k].sharding)
            if self.layout(k).whole
            else self.layout(k).array(v, old[k].dtype)
        )
        for k, v in values.items()
    }
    self.state = self.state._replace(params=fragments.replace(self.state.params, new))

  def _announce(self, op: int, arg: int, payload: bytes) -> None:
    if self.announce is None:
      return
    if op != RUN and not self.at_sync_point:
      raise RuntimeError(
          f"learner {self.index}: {OP_NAMES.get(op, op)} at step {self.steps}, inside a run of "
          f"steps ({self.run_left} left): the followers take it only at a sync point"
      )
    self.announce(op, arg, payload)

  def step(self, batch):
    if self.announce is not None:
      if self.run_left == 0:
        self.run_left = self.next_run()
        self._announce(RUN, self.run_left, b"")
      self.run_left -= 1
    return super().step(batch)

  def receive(self, send: Send, rebase: bool = False) -> None:
    self._announce(REBASE if rebase else RECEIVE, send.fragment, transport.encode_message(send))
    super().receive(send, rebase)

  def upload(self, p: int, sent_time: float, arrival_time: float, step_time: float):
    self._announce(UPLOAD, p, np.float64(sent_time).tobytes())
    return super().upload(p, sent_time, arrival_time, step_time)

  def not_merged(self, p: int, sent_time: float | None) -> None:
    self._announce(NOT_MERGED, p, np.float64(-1.0 if sent_time is None else sent_time).tobytes())
    super().not_merged(p, sent_time)

  def resume_at(self, steps: int) -> None:
    """With followers, by whole sync intervals towards `steps` only (they agree at sync points)."""
    if self.announce is not None:
      k = self.sync_interval()
      steps = self.steps + (steps - self.steps) // k * k
      if steps == self.steps:
        return
      self._announce(RESUME, steps, b"")
    super().resume_at(steps)


def broadcast(op: int, arg: int, payload: bytes) -> tuple[int, int, bytes]:
  """(op, arg, payload) of process 0 on every process (the others pass anything)."""
  from jax.experimental import multihost_utils

  header = np.asarray(
      multihost_utils.broadcast_one_to_all(np.array([op, arg, len(payload)], np.int64))
  )
  op, arg, n = (int(v) for v in header)
  if not n:
    return op, arg, b""
  buf = np.frombuffer(payload, np.uint8) if jax.process_index() == 0 else np.zeros(n, np.uint8)
  if buf.size != n:
    raise ValueError(f"broadcast payload of {buf.size} bytes, header says {n}")
  return op, arg, np.asarray(multihost_utils.broadcast_one_to_all(buf)).astype(np.uint8).tobytes()


def lead(learner: SpmdLearner, run_until: int | None = None, overlap: int = 0) -> None:
  """Makes process 0's learner announce its operations to the followers; its runs of steps end
  at `run_until` at the latest (the run's last step); `overlap`: a blocking learner's tau."""
  if jax.process_index() != 0:
    raise ValueError("only process 0 of a learner leads it")

  def announce(op: int, arg: int, payload: bytes) -> None:
    learner.count_collective()
    broadcast(op, arg, payload)

  learner.announce, learner.run_until, learner.run_every = announce, run_until, overlap


class KeepFollowers:
  """Process 0's link, announcing a NOOP every `every_s` while process 0 only waits on the
  synchronizer (a blocking learner waiting for a merge, or rejoining after a restart of the
  synchronizer), so the followers' pending broadcast never waits without bound.

  The loop calls join and poll from its own thread only, the one that announces operations, so
  the NOOPs stay in order with them.
  """

  def __init__(self, link, learner: SpmdLearner, every_s: float = 10.0):
    self.link, self.learner, self.every_s = link, learner, every_s
    self.last = time.monotonic()
    announce = learner.announce

    def timed(op, arg, payload):
      self.last = time.monotonic()
      announce(op, arg, payload)

    learner.announce = timed

  def _keep(self) -> None:
    if self.learner.announce is not None and time.monotonic() - self.last > self.every_s:
      self.learner.announce(NOOP, 0, b"")

  def join(self, versions, generations):
    self._keep()
    return self.link.join(versions, generations)

  def join_nowait(self, versions, generations):
    self._keep()  # (a blocking learner's plain link joins at once)
    return getattr(self.link, "join_nowait", self.link.join)(versions, generations)

  def poll(self, wait_s: float):
    self._keep()
    return self.link.poll(wait_s)

  def progress(self, finished: bool) -> bool:
    return self.link.progress(finished)  # from the heartbeat thread too: no broadcast here

  def upload(self, up) -> None:
    self.link.upload(up)

  def take_refused(self) -> list[int]:
    take = getattr(self.link, "take_refused", None)
    return take() if take is not None else []

  def take_returned(self) -> list:
    take = getattr(self.link, "take_returned", None)
    return take() if take is not None else []


def _time(payload: bytes) -> float:
  return float(np.frombuffer(payload, np.float64)[0]) if payload else 0.0


def end(learner: SpmdLearner) -> None:
  """Process 0: tells the followers the run is over. The loop stops at a sync point; ending in
  the middle of a RUN (an error in process 0) cannot be told, as the followers are in its steps'
  collectives: process 0 then exits at once (FAILED_EXIT) so that its supervisor restarts the
  whole job, instead of waiting on a broadcast no follower takes."""
  if learner.announce is None:
    return
  if not learner.at_sync_point:
    print(
        f"learner {learner.index}: process 0 stopped at step {learner.steps} inside a run of "
        f"steps ({learner.run_left} left); exiting {FAILED_EXIT} so that the job is restarted",
        file=sys.stderr,
        flush=True,
    )
    os._exit(FAILED_EXIT)  # pylint: disable=protected-access
  learner.announce(END, 0, b"")


def follow(
    learner: SpmdLearner,
    next_batch: Callable[[], dict],
    after_step: Callable[[Learner], None] = lambda lrn: None,
) -> dict[str, int]:
  """A process other than 0: performs process 0's operations until it ends; counts of each."""
  if jax.process_index() == 0:
    raise ValueError("process 0 leads; it does not follow")
  # A stop (SIGTERM) is process 0's to decide: it ends at a sync point and says END; a follower
  # that died at once would leave process 0 in the steps of a run. SIGKILL still ends it.
  signal.signal(signal.SIGTERM, lambda *_: None)
  counts = {name: 0 for name in (*OP_NAMES.values(), "step")}
  while True:
    learner.count_collective()
    op, arg, payload = broadcast(NOOP, 0, b"")
    if op not in OP_NAMES:
      raise ValueError(f"process {jax.process_index()} got unknown operation {op}")
    counts[OP_NAMES[op]] += 1
    if op == END:
      return counts
    if op == RUN:  # `arg` steps with no collective but the step's own
      for _ in range(arg):
        learner.step(next_batch())
        after_step(learner)
      counts["step"] += arg
    elif op in (RECEIVE, REBASE):
      send = transport.decode_message(payload)
      if not isinstance(send, Send) or send.fragment != arg:
        raise ValueError(f"process {jax.process_index()} got a bad broadcast send")
      learner.receive(send, rebase=op == REBASE)
    elif op == UPLOAD:  # (at process 0's time: a refusal names its upload by it)
      learner.upload(arg, _time(payload), 0.0, 0.0)
    elif op == NOT_MERGED:
      learner.not_merged(arg, _time(payload))
    elif op == RESUME:
      learner.resume_at(arg)
