"""A learner: one island's train state plus what it knows of the global fragments.

Per fragment p it keeps its copy of the last global version it received (Θ_p, on the host), that
version number, and counters of inner steps and tokens since it received p. Uploads carry the
encoded outer gradient Θ_p − θ_p; a received fragment is mixed in as θ_p ← α·θ_p + (1−α)·Θ_p and
resets p's counters. With DyLU (outer.dylu) a received fragment may carry this learner's own
inner steps between syncs, H_m (see policies.Dylu): its schedule follows it from then on.

It also keeps the synchronizer generation of each fragment version it holds (see protocol), and
`accepts` decides whether a Send can be applied: intact, from a generation not older than one
already heard from that fragment's synchronizer shard (`owner_of`: shards restart, hence count
generations, on their own), and (for an update) based on exactly the version held.
`checkpoint_state`/`load_checkpoint_state` are what survives a crash of this learner.

What a merged fragment does to the local parameters is the delivery rule (`outer.delivery`):
- replace: θ_p is replaced by (mixed with, `alpha`) every version that arrives, and p's counters
  reset: progress since the learner's own last upload of p is lost when another learner's merge
  arrives first;
- rebase: the learner keeps the progress the version does not hold:
  θ_p ← Θ_new + (θ_p − Θ_held) + [the version merges its pending upload u] decode(u), its
  counters less u's steps and tokens. The synchronizer names u (`Send.own`), also in what it
  answers a Join with when the merge of u never reached the learner (a restart, a partition);
  a learner restored from before u no longer knows it, and takes the version as it is;
- at_own_sync: versions that arrive are held, θ_p untouched, and the newest is taken (mixed with
  `alpha`) only at the learner's own sync point: τ steps after its upload of p (`overlap`), once
  the version merging that upload has arrived (so that its next upload, built against the version
  θ_p started from, its base, never looks like a copy of the last). A refused upload is not
  followed by a take: its progress goes with the next upload.
With `anchor` global, an upload carries θ_p itself and the synchronizer forms the outer gradient
against its fragment as it is (policies.Policy.anchor).
"""

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from diloco.inner import island as island_lib, step as step_lib
from diloco.outer import fragments, protocol
from diloco.outer.codecs import compression
from diloco.outer.learner import learner_machine
from diloco.outer.outcomes import Code
from diloco.outer.protocol import Send, Upload
from diloco.outer.codecs.uplink import Uplink

DELIVERIES = ("replace", "rebase", "at_own_sync")  # what a merged fragment does (module doc)
GLOBAL_REBASE = (
    "rebase keeps the progress after an upload on top of the merge that holds it, which needs "
    "the outer gradient as the learner formed it; under the global anchor the synchronizer forms "
    "it against a version the learner may not have seen"
)
GLOBAL_CODECS = ("fp32", "bf16")  # a fragment's values, not a delta, travel under anchor=global


MERGED_KEPT = 256  # entries of `Learner.merged_own` kept per fragment (a restart lost fewer)


@dataclasses.dataclass
class Learner:
  index: int
  island: island_lib.Island
  frag: fragments.Fragmentation
  schedule: fragments.Schedule
  codec: str
  alpha: float
  tokens_per_step: int
  state: Any = None
  global_copy: list[dict[str, np.ndarray]] = dataclasses.field(default_factory=list)
  versions: list[int] = dataclasses.field(default_factory=list)
  generations: list[int] = dataclasses.field(default_factory=list)
  owner_of: tuple[int, ...] = ()  # each fragment's synchronizer shard; (): one synchronizer
  sync_generations: list[int] = dataclasses.field(default_factory=list)  # newest, per shard
  c_steps: list[int] = dataclasses.field(default_factory=list)
  c_tokens: list[int] = dataclasses.field(default_factory=list)
  steps: int = 0
  tokens: int = 0
  uplink: Uplink | None = None  # None: `codec`, log rounding, no error feedback
  holds_nothing: bool = False  # True: versions -1, no global copy (its Join fetches them all)
  start: dataclasses.InitVar[Mapping[str, np.ndarray] | None] = None  # held at version 0
  # Per fragment, its uploads since it last received that fragment, less those refused or never
  # sent (`not_merged`): the last is what a rebase takes as merged (encoded payloads, kept until
  # the fragment is received again).
  sent: dict[int, list[Upload]] = dataclasses.field(default_factory=dict)
  # Per fragment, (version, steps, tokens) of its uploads that versions received merged, newest
  # last: a restart that lost those versions has the next upload count them again (`receive`).
  merged_own: dict[int, list[tuple[int, int, int]]] = dataclasses.field(default_factory=dict)
  delivery: str = "replace"  # replace | rebase | at_own_sync (see the module doc)
  overlap: int = 0  # tau: at_own_sync takes the newest version tau steps after its upload
  anchor: str = "base"  # global: uploads carry θ_p, the synchronizer forms Θ_p − θ_p (policies)
  # On each restart from a merged model that holds its own upload: a fresh inner optimizer, and
  # the inner schedule at its own steps ("own") or at the steps all learners merged / `learners`
  # ("global", `Send.progress`), as Async Local-SGD's toy (outer.fresh_inner_optimizer,
  # outer.schedule_by; one fragment).
  fresh_optimizer: bool = False
  schedule_by: str = "own"
  learners: int = 1
  # at_own_sync only (the other rules' base is the newest version held, `_base`): per fragment
  # the version θ_p started from (copy, version, generation), the
  # step from which the newest version is taken (after an upload; -1: none due), and whether
  # the version merging that upload has arrived (1) or not (0).
  base_copy: list[dict[str, np.ndarray]] = dataclasses.field(default_factory=list)
  base_versions: list[int] = dataclasses.field(default_factory=list)
  base_generations: list[int] = dataclasses.field(default_factory=list)
  adopt_at: list[int] = dataclasses.field(default_factory=list)
  own_merged: list[int] = dataclasses.field(default_factory=list)

  def __post_init__(self, start: Mapping[str, np.ndarray] | None):
    if not 0.0 <= self.alpha <= 1.0:
      raise ValueError(f"alpha must be in [0, 1], got {self.alpha}")
    if self.delivery not in DELIVERIES:
      raise ValueError(f"delivery={self.delivery!r}: expected one of {DELIVERIES}")
    if self.anchor == "global" and self.delivery == "rebase":
      raise ValueError("delivery=rebase with anchor=global: " + GLOBAL_REBASE)
    n = self.frag.num_fragments
    self.versions, self.c_steps, self.c_tokens = [0] * n, [0] * n, [0] * n
    self.generations = [0] * n
    self.owner_of = tuple(self.owner_of) or (0,) * n
    if len(self.owner_of) != n:
      raise ValueError(f"owner_of names {len(self.owner_of)} fragments' shards, expected {n}")
    self.sync_generations = [0] * (max(self.owner_of) + 1)
    if self.holds_nothing:
      self.versions, self.global_copy = [-1] * n, [{} for _ in range(n)]
    if self.state is None:
      self.state = self.island.init_state()
    if self.uplink is None:
      self.uplink = Uplink(self.codec)
    if start is not None:  # its copy of the global fragments and its parameters are `start`
      self.global_copy = [
          {k: self._to_held(k, start[k]) for k in paths} for paths in self.frag.paths
      ]
      self.versions = [0] * n
      self._write({k: v for g in self.global_copy for k, v in g.items()})
    self.adopt_at, self.own_merged = [-1] * n, [0] * n
    self.base_copy = list(self.global_copy) if len(self.global_copy) == n else [{}] * n
    self.base_versions, self.base_generations = list(self.versions), list(self.generations)

  def heard_generation(self, p: int) -> int:
    """The newest generation heard from the synchronizer shard that owns fragment p."""
    return self.sync_generations[self.owner_of[p]]

  def host_params(self) -> dict[str, np.ndarray]:
    """All parameters as a path-keyed dict of host arrays."""
    return {
        k: np.asarray(v) for k, v in fragments.flatten(jax.device_get(self.state.params)).items()
    }

  def step(self, batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
    """One inner step (dispatched asynchronously); returns its metrics on device."""
    metrics = self._train(batch)
    self.steps += 1
    self.tokens += self.tokens_per_step
    for p in range(self.frag.num_fragments):
      self.c_steps[p] += 1
      self.c_tokens[p] += self.tokens_per_step
    for p in range(self.frag.num_fragments):
      self._maybe_adopt(p)
    return metrics

  def _train(self, batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
    self.state, metrics = self.island.fns.train(
        self.state, step_lib.put_batch(batch, self.island.fns.mesh)
    )
    return metrics

  def due(self) -> list[int]:
    """Fragments whose schedule says to sync after the step just taken, if they progressed.

    A fragment received during the step has no progress left to send (its counters are 0).
    """
    return [p for p in self.schedule.syncs_at(self.steps) if self.c_steps[p] > 0]

  def resume_at(self, steps: int) -> None:
    """Moves the step counter (a restarted learner's, to the phase of its peers' schedules)."""
    self.steps = steps

  def upload(self, p: int, sent_time: float, arrival_time: float, step_time: float) -> Upload:
    """The outer gradient of fragment p against the last global version received;
    FloatingPointError naming this learner when its fragment is no longer finite (a run whose
    loss went NaN between two log rows stops here, as at a logged NaN)."""
    local, (base, base_version, base_generation) = self._read(p), self._base(p)
    try:
      delta = (
          compression.encode_tree(self._whole(local), self.codec)
          if self.anchor == "global"
          else self.uplink.encode(p, base, local, whole=self._whole, cut=self._cut)
      )
    except compression.NonFiniteError as e:
      raise FloatingPointError(
          f"learner {self.index}: fragment {p} is not finite at step {self.steps} ({e}); stopping"
      ) from e
    up = Upload(
        learner=self.index,
        fragment=p,
        base_version=base_version,
        delta=delta,
        steps=self.c_steps[p],
        tokens=self.c_tokens[p],
        time=arrival_time,
        sent_time=sent_time,
        step_time=step_time,
        base_generation=base_generation,
        step=self.steps,
    )
    self.sent.setdefault(p, []).append(up)
    if self.delivery == "at_own_sync":  # its own sync point: the newest version, tau steps on
      self.adopt_at[p], self.own_merged[p] = self.steps + self.overlap, 0
    return up

  def _base(self, p: int) -> tuple[dict[str, np.ndarray], int, int]:
    """The version θ_p is anchored at (copy, version, generation): the newest held, except
    under at_own_sync."""
    if self.delivery == "at_own_sync":
      return self.base_copy[p], self.base_versions[p], self.base_generations[p]
    return self.global_copy[p], self.versions[p], self.generations[p]

  def _maybe_adopt(self, p: int) -> None:
    """at_own_sync: at its sync point θ_p takes the newest version held (mixed with `alpha`)."""
    if self.delivery != "at_own_sync":
      return
    if self.own_merged[p] and 0 <= self.adopt_at[p] <= self.steps:
      self._replace(p, self.global_copy[p])

  def sent_again(self, p: int, sent_time: float) -> Upload | None:
    """The last upload of p sent and not answered, as it was, stamped `sent_time` (a refusal of
    the copy leaves the original pending); None if there is none, or if it was made against the
    version held now (then a copy computed afresh, on the same base, carries more and is as
    safe: a duplicate if the upload was merged, its replacement if it is pending)."""
    if not self.sent.get(p) or self.sent[p][-1].key[:2] == (self.generations[p], self.versions[p]):
      return None
    copy = dataclasses.replace(self.sent[p][-1], sent_time=sent_time)
    self.sent[p].append(copy)
    return copy

  def not_merged(self, p: int, sent_time: float | None) -> None:
    """The upload of fragment p made at `sent_time` was not merged: refused, or never sent."""
    self.sent[p] = [u for u in self.sent.get(p, []) if u.sent_time != sent_time]
    if self.delivery == "at_own_sync":  # its progress stays, for the next upload
      self.adopt_at[p] = -1

  def accepts(self, send: Send) -> Code | None:
    """Why `send` cannot be applied (`learner_machine.verdict`), or None."""
    return learner_machine.verdict(send, self, self.frag.num_fragments)

  def receive(self, send: Send, rebase: bool = False) -> None:
    """Takes a new global version of a fragment; what it does to θ_p is the delivery rule (see
    the module doc). A first copy (the learner held nothing of p) is taken as it is.

    Under replace, `rebase` (learner_machine.Apply) says the version merged this learner's last
    upload of p neither refused nor dropped unsent (a copy sent again was refused as a
    duplicate), and the progress made after that upload is kept, as under the rebase rule. (With
    a lossy codec and error feedback, decode(u) is what the synchronizer saw, so the
    quantisation error may be sent twice.)
    A send that regressed (`learner_machine.regressed`: a restart lost merges the learner holds)
    becomes its base only, under every rule: θ and the counters stay, and the next upload
    carries the difference.
    """
    p = send.fragment
    if send.update is not None and send.version != self.versions[p] + 1:
      raise ValueError(
          f"learner {self.index} holds version {self.versions[p]} of fragment {p}"
          f" but got an update to version {send.version}"
      )
    held_nothing = self.versions[p] < 0
    keep_all = learner_machine.regressed(send, self)  # (see there)
    old, merged_up = self.global_copy[p], self._merged_upload(p, send, rebase or keep_all)
    new = protocol.apply_send(self.global_copy[p], send, cut=self._cut)
    self.global_copy[p], self.versions[p] = new, send.version
    self.generations[p] = send.generation
    s = self.owner_of[p]
    self.sync_generations[s] = max(self.sync_generations[s], send.generation)
    if send.inner_steps and send.inner_steps != self.schedule.inner_steps:
      self.schedule = fragments.Schedule(self.frag.num_fragments, send.inner_steps)
    if send.includes_own and (self.fresh_optimizer or self.schedule_by == "global"):
      at = send.progress // self.learners if self.schedule_by == "global" else None
      opt = step_lib.restarted(self.state.opt_state, at, self.fresh_optimizer)
      self.state = self.state._replace(opt_state=opt)
    if not keep_all and merged_up is not None:
      self.merged_own[p] = [*self.merged_own.get(p, [])[-MERGED_KEPT + 1 :],
                            (send.version, merged_up.steps, merged_up.tokens)]  # fmt: skip
    if keep_all:  # the new base only: the next upload carries what the restart lost
      self._credit_lost(p, send.version)
      self._rebased(p)
    elif held_nothing:
      self._replace(p, new, mix=False)  # nothing local worth keeping
    elif self.delivery == "at_own_sync":
      if send.generation > self.base_generations[p]:  # a restart may not know the old base
        self._replace(p, new)
      elif send.includes_own and self.adopt_at[p] >= 0:
        self.own_merged[p] = 1
        self._maybe_adopt(p)
    elif send.includes_own and merged_up is None:  # restored from before that upload: its
      self._replace(p, new)  # progress since the version held is in the merge
    elif self.delivery == "rebase" or (rebase and merged_up is not None):
      self._keep_progress(p, old, new, merged_up)
    else:
      self._replace(p, new)

  def _credit_lost(self, p: int, restored: int) -> None:
    """A restart restored fragment p at version `restored`, losing the later versions this
    learner held: its uploads merged into those come back into its counters, so that the next
    upload, which carries their effect (θ_p less the restored version), counts their steps and
    tokens as its work again."""
    kept, lost = [], []
    for entry in self.merged_own.get(p, []):
      (lost if entry[0] > restored else kept).append(entry)
    self.merged_own[p] = kept
    self.c_steps[p] += sum(e[1] for e in lost)
    self.c_tokens[p] += sum(e[2] for e in lost)

  def _merged_upload(self, p: int, send: Send, take: bool) -> Upload | None:
    """The upload of p that `send` merges, if known, forgetting the uploads it answers: under
    replace, every one sent since p was last received; under the other rules, only when the
    send merges one of this learner's uploads. The merged one is the upload with the send's
    key (`Send.own`; copies sent again after a restart share the base, and their steps tell
    them apart), else with `take` the last sent."""
    if self.delivery == "replace" or take or send.includes_own:
      sent = self.sent.pop(p, [])
      if send.includes_own:
        return next((u for u in reversed(sent) if u.key == send.own), None)
      if sent and take:
        return sent[-1]
    return None

  def _keep_progress(self, p: int, old: dict, new: dict, merged_up: Upload | None) -> None:
    """θ_p ← Θ_new + ((θ_p − Θ_old) + decode(u)), decode(u) when the version merges this
    learner's upload u (whose steps and tokens leave its counters), else 0."""
    local = self._read(p)
    kept = {k: local[k] - old[k] for k in new}  # θ_p − Θ_old
    if merged_up is not None:  # + decode(u): fl(θ − Θ) + fl(Θ − θ) is exactly 0
      merged = self._cut(compression.decode_tree(merged_up.delta))
      kept = {k: kept[k] + merged[k] for k in kept}
      self.c_steps[p] = max(self.c_steps[p] - merged_up.steps, 0)
      self.c_tokens[p] = max(self.c_tokens[p] - merged_up.tokens, 0)
    self._write({k: new[k] + kept[k] for k in new})
    self._rebased(p)

  def _replace(self, p: int, values: dict, mix: bool = True) -> None:
    """θ_p ← values (mixed with `alpha`), its base the newest version, its counters reset."""
    if self.alpha > 0 and mix:
      local = self._read(p)
      values = {k: self.alpha * local[k] + (1 - self.alpha) * values[k] for k in values}
    self._write(values)
    self.c_steps[p] = self.c_tokens[p] = 0
    self._rebased(p)

  def _rebased(self, p: int) -> None:
    """θ_p is anchored at the newest version held from now on."""
    if self.delivery != "at_own_sync":
      return  # (`_base` is the newest version held)
    self.base_copy[p] = self.global_copy[p]
    self.base_versions[p], self.base_generations[p] = self.versions[p], self.generations[p]
    self.adopt_at[p], self.own_merged[p] = -1, 0

  # What survives a crash: its train state and, on the host, its counters, the fragment versions
  # it holds and its copy of them (with at_own_sync's base and the uplink's residuals), in the held
  # form it keeps them (`save_form`).

  def checkpoint_state(self) -> dict[str, Any]:
    """What a crash must not lose: {'train': TrainState, 'host': name -> np.ndarray}."""
    host = {
        "versions": self.versions,
        "generations": self.generations,
        "c_steps": self.c_steps,
        "c_tokens": self.c_tokens,
        "counters": [self.steps, self.tokens, *self.sync_generations],
    }
    own_base = self.delivery == "at_own_sync"  # (the base is the newest version otherwise)
    if own_base:
      host.update(
          bases=self.base_versions + self.base_generations + self.adopt_at + self.own_merged
      )
    host = {k: np.asarray(v, np.int64) for k, v in host.items()}
    for p in range(self.frag.num_fragments):
      for i, k in enumerate(self.frag.paths[p]):
        host[f"global.{p}.{i}"] = self.save_form(k, self.global_copy[p][k])
        if own_base:
          host[f"base.{p}.{i}"] = self.save_form(k, self.base_copy[p][k])
      if self.uplink.error_feedback:
        shapes = {k: self.global_copy[p][k].shape for k in self.frag.paths[p]}
        res = self.uplink.residual_of(p, shapes)
        host.update(
            {
                f"residual.{p}.{i}": self.save_form(k, res[k])
                for i, k in enumerate(self.frag.paths[p])
            }
        )
    return {"train": self.state, "host": host}

  def checkpoint_like(self) -> dict[str, Any]:
    """The shapes of `checkpoint_state()` (a restore target), from this learner's island."""
    n, params = self.frag.num_fragments, fragments.flatten(self.island.abstract_state().params)
    host = {k: np.zeros(n, np.int64) for k in ("versions", "generations", "c_steps", "c_tokens")}
    host["counters"] = np.zeros(2 + len(self.sync_generations), np.int64)
    own_base = self.delivery == "at_own_sync"
    if own_base:
      host["bases"] = np.zeros(4 * n, np.int64)
    for p in range(n):
      for i, k in enumerate(self.frag.paths[p]):
        host[f"global.{p}.{i}"] = self.save_like(k, params[k])
        if own_base:
          host[f"base.{p}.{i}"] = self.save_like(k, params[k])
        if self.uplink.error_feedback:
          host[f"residual.{p}.{i}"] = self.save_like(k, params[k])
    return {"train": self.island.abstract_state(), "host": host}

  def load_checkpoint_state(self, saved: Mapping[str, Any]) -> None:
    """Continues from `checkpoint_state()` output (restored onto this learner's island)."""
    host, n = saved["host"], self.frag.num_fragments
    self.state = saved["train"]
    self.versions, self.generations = (
        [int(x) for x in host[k]] for k in ("versions", "generations")
    )
    self.c_steps, self.c_tokens = ([int(x) for x in host[k]] for k in ("c_steps", "c_tokens"))
    self.steps, self.tokens, *gens = (int(x) for x in host["counters"])
    self.sync_generations = gens
    self.global_copy = [
        {k: self.from_saved(k, host[f"global.{p}.{i}"]) for i, k in enumerate(self.frag.paths[p])}
        for p in range(n)
    ]
    self.base_copy = list(self.global_copy)
    self.base_versions, self.base_generations = list(self.versions), list(self.generations)
    self.adopt_at, self.own_merged = [-1] * n, [0] * n
    if "bases" in host:
      bases = [int(x) for x in host["bases"]]
      self.base_versions, self.base_generations = bases[:n], bases[n : 2 * n]
      self.adopt_at, self.own_merged = bases[2 * n : 3 * n], bases[3 * n :]
      self.base_copy = [
          {k: self.from_saved(k, host[f"base.{p}.{i}"]) for i, k in enumerate(paths)}
          for p, paths in enumerate(self.frag.paths)
      ]
    if self.uplink.error_feedback:
      self.uplink.residuals = {
          p: {k: self.from_saved(k, host[f"residual.{p}.{i}"]) for i, k in enumerate(paths)}
          for p, paths in enumerate(self.frag.paths)
      }

  # How the host copies are held (whole arrays here; a multi-process learner holds its own part
  # of each, rpc/host_parts.py): elementwise arithmetic is the same on both.

  def _to_held(self, k: str, full: np.ndarray) -> np.ndarray:
    """The held form of the whole value `full` of parameter k (float32, a new array)."""
    return np.array(full, np.float32)

  def _cut(self, tree: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
    """Whole values in their held form (for arithmetic with held ones)."""
    return tree

  def _whole(self, tree: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
    """Held values whole (an upload is encoded whole)."""
    return tree

  def whole_globals(self) -> list[Mapping[str, np.ndarray]]:
    """Each fragment's global copy, whole (a multi-process learner: every process calls it)."""
    return [self._whole(g) for g in self.global_copy]

  def save_form(self, k: str, held: np.ndarray) -> Any:
    """A held array of parameter k as a checkpoint stores it."""
    return np.asarray(held, np.float32)

  def save_like(self, k: str, like: Any) -> Any:
    """The restore target of `save_form` for parameter k (shaped like `like`)."""
    return np.zeros(like.shape, np.float32)

  def from_saved(self, k: str, saved: Any) -> np.ndarray:
    """A restored array of parameter k in its held form."""
    return np.array(saved, np.float32)

  def _read(self, p: int) -> dict[str, np.ndarray]:
    flat = fragments.leaves(self.state.params, self.frag.paths[p])
    return {k: np.asarray(jax.device_get(v)) for k, v in flat.items()}

  def _write(self, values: Mapping[str, np.ndarray]) -> None:
    old = fragments.leaves(self.state.params, list(values))
    new = {
        k: jax.device_put(np.asarray(v, old[k].dtype), old[k].sharding) for k, v in values.items()
    }
    self.state = self.state._replace(params=fragments.replace(self.state.params, new))
