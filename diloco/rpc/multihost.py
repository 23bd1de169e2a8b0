"""One learner as a multi-process JAX job: process 0 talks to the synchronizer, the others follow.

Every process of the learner builds the same island over all processes' devices (its mesh spans
the job) and holds the same learner state. Only process 0 runs the learner loop against the
synchronizer (`learner_loop.run_learner`); every operation that loop performs on the learner — take a
step, apply a received fragment, compute an upload, end — is first broadcast from process 0
(`multihost_utils.broadcast_one_to_all`) and the other processes perform the same operation in the
same order (`follow`). Received fragments travel in the broadcast as the wire encoding of the Send,
so every process applies identical values at identical steps; each process feeds its step its own
slice of the global batch, and parameters that are not addressable from one process are gathered
with `process_allgather` (a collective, so every process reads them at the same point too).
Checkpoints are taken after steps in lockstep by every process (orbax coordinates a multi-process
save; the checkpoint directory must be shared by the processes).
"""

import time
from collections.abc import Callable

import jax
import numpy as np
from absl import flags

from diloco.outer import fragments
from diloco.outer.learner import Learner
from diloco.outer.protocol import Send
from diloco.rpc import transport

NOOP, STEP, RECEIVE, UPLOAD, END, REBASE, NOT_MERGED = range(7)
OP_NAMES = {NOOP: "noop", STEP: "step", RECEIVE: "receive", UPLOAD: "upload", END: "end"}
OP_NAMES[REBASE] = "rebase"  # a receive that keeps the progress after a merged upload
OP_NAMES[NOT_MERGED] = "not_merged"  # an upload refused or never sent (not for a rebase)


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
  return coordinator, processes, index


def initialize(
    distributed: bool, coordinator: str = "", num_processes: int = 0, process_id: int = -1
) -> None:
  """`jax.distributed.initialize`, with an explicit coordinator for local multi-process tests.

  On CPU the cross-process collectives need gloo (set before the backend starts; the setting
  only concerns the CPU backend, so it is harmless on accelerators).
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
        coordinator_address=coordinator, num_processes=num_processes, process_id=process_id
    )
  else:
    jax.distributed.initialize()


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
  """A learner whose parameters may span processes; on process 0 it announces every operation.

  `announce` is None on the other processes (they are driven by `follow`) and on single-process
  learners, which then behave exactly like `Learner`.
  """

  announce: Callable[[int, int, bytes], None] | None = None

  def host_params(self) -> dict[str, np.ndarray]:
    return {k: host_value(v) for k, v in fragments.flatten(self.state.params).items()}

  def _read(self, p: int) -> dict[str, np.ndarray]:
    flat = fragments.leaves(self.state.params, self.frag.paths[p])
    return {k: host_value(v) for k, v in flat.items()}

  def step(self, batch):
    if self.announce is not None:
      self.announce(STEP, 0, b"")
    return super().step(batch)

  def receive(self, send: Send, rebase: bool = False) -> None:
    if self.announce is not None:
      self.announce(REBASE if rebase else RECEIVE, send.fragment, transport.encode_message(send))
    super().receive(send, rebase)

  def upload(self, p: int, sent_time: float, arrival_time: float, step_time: float):
    if self.announce is not None:
      self.announce(UPLOAD, p, np.float64(sent_time).tobytes())
    return super().upload(p, sent_time, arrival_time, step_time)

  def not_merged(self, p: int, sent_time: float | None) -> None:
    if self.announce is not None:
      self.announce(NOT_MERGED, p, np.float64(-1.0 if sent_time is None else sent_time).tobytes())
    super().not_merged(p, sent_time)


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


def lead(learner: SpmdLearner) -> None:
  """Makes process 0's learner announce its operations to the followers."""
  if jax.process_index() != 0:
    raise ValueError("only process 0 of a learner leads it")
  learner.announce = lambda op, arg, payload: broadcast(op, arg, payload)


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

  def join(self, versions, generations) -> None:
    self._keep()
    self.link.join(versions, generations)

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


def _time(payload: bytes) -> float:
  return float(np.frombuffer(payload, np.float64)[0]) if payload else 0.0


def end(learner: SpmdLearner) -> None:
  """Process 0: tells the followers the run is over."""
  if learner.announce is not None:
    learner.announce(END, 0, b"")


def follow(
    learner: SpmdLearner,
    next_batch: Callable[[], dict],
    after_step: Callable[[Learner], None] = lambda lrn: None,
) -> dict[str, int]:
  """A process other than 0: performs process 0's operations until it ends; counts of each."""
  if jax.process_index() == 0:
    raise ValueError("process 0 leads; it does not follow")
  counts = {name: 0 for name in OP_NAMES.values()}
  while True:
    op, arg, payload = broadcast(NOOP, 0, b"")
    if op not in OP_NAMES:
      raise ValueError(f"process {jax.process_index()} got unknown operation {op}")
    counts[OP_NAMES[op]] += 1
    if op == END:
      return counts
    if op == STEP:
      learner.step(next_batch())
      after_step(learner)
    elif op in (RECEIVE, REBASE):
      send = transport.decode_message(payload)
      if not isinstance(send, Send) or send.fragment != arg:
        raise ValueError(f"process {jax.process_index()} got a bad broadcast send")
      learner.receive(send, rebase=op == REBASE)
    elif op == UPLOAD:  # (at process 0's time: a refusal names its upload by it)
      learner.upload(arg, _time(payload), 0.0, 0.0)
    elif op == NOT_MERGED:
      learner.not_merged(arg, _time(payload))
