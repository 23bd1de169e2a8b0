"""Ray: the synchronizer and M learners as Ray tasks, each group restarted when it fails.

The driver (experiments.launch_ray) submits the synchronizer (with outer.sync_shards=S, one task
per shard, roles sync0..sync<S-1>, each restarted on its own), waits for its address, then one task
per learner, or on TPU one task per host of a slice through Ray's TPU support
(`ray.util.tpu.run_on_slice`), each learner a multi-host JAX job (--config.distributed=True) on a
slice of its own. When a task fails (its process died or was killed, its node went away, or it
raised), the driver cancels the rest of its group and submits the group again after a backoff
(supervisor.Policy: doubling from deploy.restart_backoff_s, at most deploy.max_restarts times); a
learner resumes from its checkpoint and rejoins, a synchronizer restores its own and comes back on
the node and port the learners know. Tasks are one per process (`max_calls=1`): a restart is a
fresh process. The driver writes WORKDIR/ray_state.json (processes, restarts, events) as it goes and
WORKDIR/ray_report.json at the end.
"""

import dataclasses
import json
import os
import time

from diloco.config import checks
from diloco.launch import ray_tasks, supervisor
from diloco.plan import tpu as tpu_types

NODE_RESOURCE = "diloco_sync"  # `ray start --resources='{"diloco_sync": 1}'` marks the sync's node


@dataclasses.dataclass(frozen=True)
class Plan:
  """What the driver schedules, decided from the config before Ray is touched."""

  learners: int
  shards: int = 1  # outer.sync_shards: one synchronizer task per shard
  hosts_per_learner: int = 1
  topology: str = ""  # on TPU, with the generation: where run_on_slice places a learner
  generation: str = ""
  policy: supervisor.Policy = supervisor.Policy()


def plan(config, learners: int, tpu: bool) -> Plan:
  """The Plan for `learners` learners of `config`; ValueError naming a bad setting."""
  checks.prepare(config)  # the whole config, before any task starts
  d = config.deploy
  if learners < 1:
    raise ValueError(f"--learners must be >= 1, got {learners}")
  if learners != config.outer.learners:
    raise ValueError(
        f"--learners={learners} but outer.learners={config.outer.learners} in the config "
        "(set both, e.g. with the `learners=` variant)"
    )
  policy = supervisor.Policy(d.max_restarts, d.restart_backoff_s, max(300.0, d.restart_backoff_s))
  shards = config.outer.sync_shards
  if not tpu:
    return Plan(learners, shards, policy=policy)
  pod = tpu_types.parse(d.tpu.accelerator_type)
  if not d.tpu.topology:
    raise ValueError("deploy.tpu.topology is required with --tpu (e.g. 2x2x1 for v4-8)")
  topology = tpu_types.check_topology(pod, d.tpu.topology)
  return Plan(learners, shards, pod.hosts, topology, pod.generation, policy)


@dataclasses.dataclass
class Group:
  """One role's tasks (the synchronizer, or every host of one learner) and its restart state."""

  role: str
  refs: list = dataclasses.field(default_factory=list)
  started: float = 0.0
  restarts: int = 0
  delay: float = 0.0
  due: float | None = None  # when a failed group is submitted again
  done: bool = False
  result: dict | None = None


class Driver:
  """Submits, watches and restarts the run's tasks on a connected Ray."""

  def __init__(self, spec, overrides, workdir, token, p: Plan, runtime_env=None):
    import ray  # pylint: disable=import-outside-toplevel

    self.ray, self.spec, self.overrides = ray, spec, overrides
    self.workdir, self.token, self.plan = workdir, token, p
    self.events, self.target, self.slices = [], "", {}
    task = dict(max_retries=0, max_calls=1, runtime_env=runtime_env or {})
    self._sync_fn = ray.remote(**task)(ray_tasks.synchronizer)
    self._learner_fn = ray.remote(**task)(ray_tasks.learner)
    self.directory = ray.remote(ray_tasks.Directory).options(num_cpus=0).remote()
    roles = ["sync"] if p.shards == 1 else [f"sync{s}" for s in range(p.shards)]
    self.syncs = [Group(role, delay=p.policy.backoff_s) for role in roles]
    self.learners = [Group(f"learner{m}", delay=p.policy.backoff_s) for m in range(p.learners)]
    placement = self._sync_placement()
    self.sync_options = {role: dict(placement) for role in roles}  # pinned once each listens
    self.sync_ports: dict[str, str] = {}  # role -> the port its restarts bind

  def _sync_placement(self) -> dict:
    """On the node marked with NODE_RESOURCE when the cluster has one, else anywhere (the first
    start's node is then kept for restarts: the learners know its address)."""
    if self.ray.cluster_resources().get(NODE_RESOURCE):
      return {"resources": {NODE_RESOURCE: 0.01}}
    return {}

  def _event(self, kind: str, role: str, **extra) -> None:
    self.events.append({"time": time.time(), "event": kind, "role": role, **extra})

  def _submit(self, g: Group) -> None:
    g.started, g.due = time.monotonic(), None
    self._event("submit", g.role, restarts=g.restarts)
    if g.role.startswith("sync"):
      shard = None if g.role == "sync" else int(g.role[len("sync") :])
      port = (
          (f"--config.deploy.port={self.sync_ports[g.role]}",) if g.role in self.sync_ports else ()
      )
      g.refs = [
          self._sync_fn.options(num_cpus=1, **self.sync_options[g.role]).remote(
              self.spec,
              (*self.overrides, *port),
              os.path.join(self.workdir, g.role),
              self.token,
              self.directory,
              shard,
          )
      ]
      return
    m = int(g.role[len("learner") :])
    args = (
        self.spec,
        (*self.overrides, *(("--config.distributed=True",) if self.plan.topology else ())),
        os.path.join(self.workdir, g.role),
        m,
        self.target,
        self.token,
        self.directory,
    )
    if self.plan.topology:
      g.refs = self._on_slice(g.role, args)
    else:
      g.refs = [self._learner_fn.options(num_cpus=1).remote(*args)]

  def _on_slice(self, role: str, args: tuple) -> list:
    """One task per host of the learner's slice; the slice is reserved once (Ray places it again
    when a host is lost) and reused by every restart."""
    from ray.util import tpu  # pylint: disable=import-outside-toplevel

    if role not in self.slices:
      self.slices[role] = tpu.slice_placement_group(self.plan.topology, self.plan.generation)
    return tpu.run_on_slice(self._learner_fn, *args, tpu_slice=self.slices[role])

  def _failed(self, g: Group, err: Exception) -> None:
    """Cancels the rest of the group and schedules it again (or gives up: RuntimeError)."""
    for ref in g.refs:
      self.ray.cancel(ref, force=True)
    g.refs = []
    self._event("failed", g.role, error=type(err).__name__, detail=str(err)[:300])
    limit = self.plan.policy.max_restarts
    if 0 <= limit <= g.restarts:
      raise RuntimeError(f"{g.role} failed {g.restarts + 1} times; giving up: {err}")
    if time.monotonic() - g.started >= self.plan.policy.reset_after_s:
      g.delay = self.plan.policy.backoff_s
    g.due, g.restarts = time.monotonic() + g.delay, g.restarts + 1
    g.delay = min(2 * g.delay, self.plan.policy.max_backoff_s)

  def _pin_sync(self, state: dict) -> bool:
    """Once a synchronizer process listens, its restarts reuse its port and (unless a node is
    marked for it) its node; once every one does, their addresses (in shard order) go to the
    learners. Whether they all do."""
    from ray.util.scheduling_strategies import (  # pylint: disable=import-outside-toplevel
        NodeAffinitySchedulingStrategy,
    )

    addresses = state["sync_addresses"]
    for g in self.syncs:
      if g.role in self.sync_ports or g.role not in addresses:
        continue
      self.sync_ports[g.role] = addresses[g.role].rsplit(":", 1)[1]
      if not self.sync_options[g.role]:
        node = state["procs"][g.role]["node_id"]
        self.sync_options[g.role] = {
            "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=node, soft=False)
        }
      self._event("sync_address", g.role, address=addresses[g.role])
    if len(self.sync_ports) < len(self.syncs):
      return False
    self.target = ",".join(addresses[g.role] for g in self.syncs)
    return True

  def _groups(self) -> list[Group]:
    return [*self.syncs, *self.learners]

  def _poll(self) -> None:
    """Collects finished and failed tasks; submits groups whose restart is due."""
    owner = {ref: g for g in self._groups() for ref in g.refs}
    ready, _ = (
        self.ray.wait(list(owner), num_returns=len(owner), timeout=0.2) if owner else ([], [])
    )
    for ref in ready:
      g = owner[ref]
      if ref not in g.refs:
        continue  # its group failed earlier in this batch
      try:
        result = self.ray.get(ref)
      except self.ray.exceptions.RayError as err:
        self._failed(g, err)
        continue
      g.refs.remove(ref)
      g.result = g.result or result  # host 0's summary comes first on a slice
      if not g.refs:
        g.done = True
        self._event("finished", g.role)
    now = time.monotonic()
    for g in self._groups():
      if g.due is not None and g.due <= now and (g.role.startswith("sync") or self.target):
        self._submit(g)

  def write_state(self) -> dict:
    state = self.ray.get(self.directory.state.remote())
    out = {
        **state,
        "restarts": {g.role: g.restarts for g in self._groups()},
        "done": {g.role: g.done for g in self._groups()},
        "events": self.events,
    }
    tmp = os.path.join(self.workdir, "ray_state.json.tmp")
    with open(tmp, "w") as f:
      json.dump(out, f, indent=1)
    os.replace(tmp, os.path.join(self.workdir, "ray_state.json"))
    return out

  def run(self, max_s: float) -> dict:
    """Runs until the synchronizer and every learner finished; the report."""
    os.makedirs(self.workdir, exist_ok=True)
    t0 = time.monotonic()
    for g in self.syncs:
      self._submit(g)
    try:
      while not all(g.done for g in self._groups()):
        if time.monotonic() - t0 > max_s:
          raise TimeoutError(f"the run did not finish in {max_s} s")
        self._poll()
        state = self.write_state()
        if not self.target and self._pin_sync(state):
          for g in self.learners:
            self._submit(g)
    finally:
      for g in self._groups():
        for ref in g.refs:
          self.ray.cancel(ref, force=True)
    return self._report(time.monotonic() - t0)

  def _report(self, wall_s: float) -> dict:
    report = {
        "wall_s": round(wall_s, 1),
        "restarts": {g.role: g.restarts for g in self._groups()},
        "sync": self.syncs[0].result if len(self.syncs) == 1 else None,
        "shards": [g.result for g in self.syncs],
        "learners": [g.result for g in self.learners],
        "events": self.events,
    }
    with open(os.path.join(self.workdir, "ray_report.json"), "w") as f:
      json.dump(report, f, indent=1, default=str)
    return report
