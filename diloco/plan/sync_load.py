"""The synchronizer a plan's M learners need: its state, its merge load at a measured merge rate,
the shards and cores that keep up, RAM per shard, its saves and its restore.

Each learner uploads each of the P fragments once per H inner steps, so M learners send
M x P / (H x step) uploads a second, each a fragment of 4N/P bytes once decoded (N parameters,
balanced fragments). A merge round reads every upload it holds, so the merge work is the bytes of
uploads merged per second over the rate one core merges them at: `MergeRate`, measured once on
this machine by a merge round of the real synchronizer (one thread, M = 8 uploads of a 64 MiB
fragment in the uplink codec, Nesterov, downlink fp4) and cached like the CPU peak (plan/peak.py).
Cores needed = that work x `HEADROOM`; shards = cores needed / cores per shard host. The state is
three float32 copies of the parameters (globals, outer momentum, downlink residual); a round adds
its new state and merged update (4 fragments) and holds its uploads. Saves (recovery/
sync_checkpoint.py) write at most `outer.sync_save_share` of the time at the disk's bandwidth;
a restore reads the state back and checks each file's sha256.
"""

import dataclasses
import math
import time

import numpy as np

from diloco import timing
from diloco.plan import peak

HEADROOM = 2.0  # a shard's cores at most half busy merging: polls, saves and bursts have the rest
RATE_CACHE = "diloco/sync_merge_rate.json"  # under $XDG_CACHE_HOME, else ~/.cache
RATE_MBYTES, RATE_UPLOADS = 64, 8
DISK_BYTES_PER_S = 1.2e9  # a Hyperdisk Balanced volume's default throughput cap is lower;
# pass --disk_gbps for the synchronizer host's disk (GB/s, read and write)
SHA256_BYTES_PER_S = 1.0e9  # one core hashing a checkpoint's files on restore (manifest check)


@dataclasses.dataclass(frozen=True)
class MergeRate:
  """Bytes of decoded uploads one core merges per second, and where the figure comes from."""

  bytes_per_s: float
  source: str


def measure_merge_rate(
    uplink: str, rule: str, mbytes: int = RATE_MBYTES, uploads: int = RATE_UPLOADS
) -> float:
  """Bytes of uploads merged per second by one thread: the fastest of three merge rounds of the
  synchronizer after a warm-up one (what scripts/bench_sync.py times) on one fragment of `mbytes`
  MiB."""
  from diloco.outer import parallel
  from diloco.outer.sync import merge_round

  threads = parallel.THREADS
  parallel.set_threads(1)
  try:
    round_ = merge_round.MergeRound(merge_round.make_fragment(mbytes), uploads, uplink, rule)
    (best,) = timing.best_seconds([round_], 3)
  finally:
    parallel.set_threads(threads)
  return uploads * round_.fragment_bytes / best


def merge_rate(uplink: str, rule: str, measure=measure_merge_rate) -> MergeRate:
  """This machine's merge rate for `uplink` uploads merged by `rule`: measured once, then read
  from the cache."""
  key = f"{peak.machine_key()} / uplink {uplink} / {rule}"
  rate = peak.cached_figure(RATE_CACHE, key, lambda: measure(uplink, rule))
  return MergeRate(
      rate,
      f"one core of this machine, {RATE_UPLOADS} {uplink} uploads of a {RATE_MBYTES} MiB "
      f"fragment per round, {rule} ({RATE_CACHE})",
  )


@dataclasses.dataclass(frozen=True)
class SyncLoad:
  """The synchronizer of M learners of N parameters, P fragments, H inner steps of `step_s`."""

  params: int
  learners: int
  fragments: int
  inner_steps: int
  step_s: float
  quorum: int
  merge_clock: str
  uplink_ratio: float  # an upload's bytes over its fragment's float32 bytes
  shards: int  # outer.sync_shards
  rate: MergeRate
  cores_per_shard: int
  save_share: float
  disk_bytes_per_s: float = DISK_BYTES_PER_S

  @property
  def state_bytes(self) -> int:
    return 3 * 4 * self.params

  @property
  def fragment_bytes(self) -> float:
    return 4 * self.params / self.fragments

  @property
  def uploads_per_s(self) -> float:
    return self.learners * self.fragments / (self.inner_steps * self.step_s)

  @property
  def merges_per_s(self) -> float:
    """Once per fragment per period under the period clock; by arrival, up to one per K
    uploads (K = 1: nearly every upload is its own merge)."""
    if self.merge_clock == "period":
      return self.fragments / (self.inner_steps * self.step_s)
    return self.uploads_per_s / self.quorum

  @property
  def merge_busy(self) -> float:
    """Core-seconds of merging per second of the run, all shards together."""
    return self.uploads_per_s * self.fragment_bytes / self.rate.bytes_per_s

  @property
  def cores_needed(self) -> int:
    return max(math.ceil(self.merge_busy * HEADROOM), 1)

  @property
  def shards_needed(self) -> int:
    return math.ceil(self.cores_needed / self.cores_per_shard)

  @property
  def keeps_up(self) -> bool:
    return self.shards >= self.shards_needed

  @property
  def ram_per_shard(self) -> float:
    """The shard's state, plus a round's new state and merged update and its uploads."""
    per_merge = self.uploads_per_s / self.merges_per_s
    round_bytes = (4 + per_merge * self.uplink_ratio) * self.fragment_bytes
    return self.state_bytes / self.shards + round_bytes

  @property
  def save_s(self) -> float:
    """A shard's save of every fragment (all merge between saves at these rates)."""
    return self.state_bytes / self.shards / self.disk_bytes_per_s

  @property
  def save_bytes_per_s(self) -> float:
    return self.save_share * self.disk_bytes_per_s

  @property
  def restore_s(self) -> float:
    """Read a shard's state back and check its sha256 manifest, one after the other."""
    size = self.state_bytes / self.shards
    return size / self.disk_bytes_per_s + size / SHA256_BYTES_PER_S


def lines(load: SyncLoad) -> list[str]:
  """The plan's synchronizer section."""
  gb = 1e9
  busy = load.merge_busy / (load.shards * load.cores_per_shard)
  verdict = "keeps up" if load.keeps_up else "CANNOT KEEP UP"
  return [
      f"synchronizer: state {load.state_bytes / gb:.1f} GB (globals, outer momentum, downlink "
      f"residual: 3 x float32 of {load.params:,} parameters); fragments of "
      f"{load.fragment_bytes / gb:.3f} GB",
      f"  {load.uploads_per_s:.2f} uploads/s (M={load.learners} x P={load.fragments} per "
      f"H={load.inner_steps} steps of {load.step_s:.3f} s), {load.merges_per_s:.2f} merges/s "
      f"({load.merge_clock} clock, K={load.quorum})",
      f"  merging: {load.merge_busy:.2f} core-seconds per second at {load.rate.bytes_per_s / gb:.2f}"
      f" GB/s of uploads per core ({load.rate.source})",
      f"  with headroom x{HEADROOM:g}: {load.cores_needed} cores, {load.shards_needed} shard(s) of "
      f"{load.cores_per_shard} cores; outer.sync_shards={load.shards}: {verdict} "
      f"({busy:.0%} of the shards' cores busy merging)",
      f"  RAM per shard {load.ram_per_shard / gb:.1f} GB; saves at share {load.save_share:g} of a"
      f" {load.disk_bytes_per_s / gb:.2f} GB/s disk: {load.save_bytes_per_s / gb:.2f} GB/s, a "
      f"whole shard every {load.save_s / load.save_share:.0f} s "
      f"({load.save_bytes_per_s / (load.merges_per_s / load.shards) / 2**20:.0f} MiB per merge); "
      f"restore about {load.restore_s:.0f} s",
  ]


def figures(load: SyncLoad) -> dict:
  names = ("state_bytes", "fragment_bytes", "uploads_per_s", "merges_per_s", "merge_busy")
  names += ("cores_needed", "shards_needed", "keeps_up", "ram_per_shard", "save_bytes_per_s")
  out = {n: getattr(load, n) for n in names + ("restore_s",)}
  out.update(merge_rate_bytes_per_s=load.rate.bytes_per_s, shards=load.shards)
  return out


def load(plan, config, cores_per_shard: int, disk_bytes_per_s: float = DISK_BYTES_PER_S):
  """The synchronizer of a plan's M learners (`report.Plan`), for `config` as resolved."""
  from diloco.outer.codecs import compression

  o, n = config.outer, plan.learner.param_count
  return SyncLoad(
      params=n,
      learners=plan.learners,
      fragments=max(o.fragments, 1),
      inner_steps=o.inner_steps,
      step_s=plan.predicted_step_s,
      quorum=plan.quorum,
      merge_clock=o.merge_clock,
      uplink_ratio=compression.encoded_nbytes(o.codec, 1 << 20) / (4 << 20),
      shards=o.sync_shards,
      rate=merge_rate(o.codec, o.merge),
      cores_per_shard=cores_per_shard,
      save_share=o.sync_save_share,
      disk_bytes_per_s=disk_bytes_per_s,
  )
