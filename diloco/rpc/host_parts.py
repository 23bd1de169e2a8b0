"""A process's own part of a sharded array, kept on its host: the blocks its devices hold.

A multi-process learner keeps its copy of the global fragments this way (with at_own_sync's base
and the uplink's residuals), so the host memory they take per process falls with the processes
the parameters are sharded over. A part is the process's distinct blocks, each flattened, one
after the other in a fixed order (`Layout.blocks`); where the process's blocks make up the whole
array, the part is the array itself, in its shape. Elementwise arithmetic on parts of one layout
is the arithmetic on the whole, element for element, so a learner holding parts computes bit for
bit what a learner holding whole arrays does.
"""

import dataclasses
import math
from collections.abc import Collection

import jax
import numpy as np

Block = tuple[tuple[int, int], ...]  # (start, stop) per dimension


def _block(index: tuple[slice, ...], shape: tuple[int, ...]) -> Block:
  return tuple(s.indices(n)[:2] for s, n in zip(index, shape)) + tuple(
      (0, n) for n in shape[len(index) :]
  )


def _slices(block: Block) -> tuple[slice, ...]:
  return tuple(slice(a, b) for a, b in block)


def _size(block: Block) -> int:
  return math.prod(b - a for a, b in block)


@dataclasses.dataclass(frozen=True)
class Layout:
  """Which blocks of an array of `shape`, sharded by `sharding`, one process holds."""

  shape: tuple[int, ...]
  sharding: jax.sharding.Sharding
  blocks: tuple[Block, ...]  # distinct, sorted; disjoint for the shardings jax builds
  whole: bool  # the blocks make up the whole array: a part is the array, in its shape

  @classmethod
  def of(
      cls,
      shape: tuple[int, ...],
      sharding: jax.sharding.Sharding,
      devices: Collection[jax.Device] | None = None,
  ) -> "Layout":
    """The layout of this process's devices (or of `devices`: a test's stand-in for a process,
    the other devices standing for the rest of the job).

    `whole` is the job's: every process's blocks make up the array (each process decides it from
    the same map, so all of them take the same branches, gather or not, save a part or not)."""
    shape = tuple(shape)
    if devices is not None:
      mine = set(devices)
      owner = lambda d: -1 if d in mine else -2
    else:
      owner = lambda d: -1 if d.process_index == jax.process_index() else d.process_index
    held: dict[int, set[Block]] = {}
    for d, index in sharding.devices_indices_map(shape).items():
      held.setdefault(owner(d), set()).add(_block(index, shape))
    if -1 not in held:
      raise ValueError(f"no device of this process holds a block of an array of shape {shape}")
    whole = all(sum(_size(b) for b in bs) == math.prod(shape) for bs in held.values())
    return cls(shape, sharding, tuple(sorted(held[-1])), whole)

  @property
  def host_sharding(self) -> jax.sharding.Sharding:
    """The sharding in the devices' pinned host memory where they have one (a checkpoint's
    copy of a part then takes no accelerator memory), else the sharding itself."""
    device = next(iter(self.sharding.device_set))
    kinds = {m.kind for m in device.addressable_memories()}
    if "pinned_host" in kinds and hasattr(self.sharding, "with_memory_kind"):
      return self.sharding.with_memory_kind("pinned_host")
    return self.sharding

  @property
  def size(self) -> int:
    """Elements of a part."""
    return sum(_size(b) for b in self.blocks)

  def _offsets(self) -> dict[Block, int]:
    offsets, at = {}, 0
    for b in self.blocks:
      offsets[b] = at
      at += _size(b)
    return offsets

  def cut(self, full: np.ndarray) -> np.ndarray:
    """This process's part of the whole array `full` (`full` itself when the part is whole)."""
    full = np.asarray(full)
    if full.shape != self.shape:
      raise ValueError(f"an array of shape {full.shape} cut by a layout of shape {self.shape}")
    if self.whole:
      return full
    return np.concatenate([full[_slices(b)].ravel() for b in self.blocks])

  def block(self, part: np.ndarray, b: Block) -> np.ndarray:
    """Block `b` of a part, in its shape."""
    if self.whole:
      return part[_slices(b)]
    at = self._offsets()[b]
    return part[at : at + _size(b)].reshape([hi - lo for lo, hi in b])

  def part_of(self, x: jax.Array) -> np.ndarray:
    """This process's part of `x` (sharded like this layout), from its own devices: no
    cross-process call."""
    data = {_block(s.index, self.shape): s.data for s in x.addressable_shards}
    missing = [b for b in self.blocks if b not in data]
    if missing:
      raise ValueError(f"the array holds no block {missing[0]} on this process's devices")
    blocks = {b: np.asarray(jax.device_get(data[b])) for b in self.blocks}
    if not self.whole:
      return np.concatenate([blocks[b].ravel() for b in self.blocks])
    if len(self.blocks) == 1:
      return blocks[self.blocks[0]]
    full = np.empty(self.shape, next(iter(blocks.values())).dtype)
    for b, v in blocks.items():
      full[_slices(b)] = v
    return full

  def array(self, part: np.ndarray, dtype=None, sharding=None) -> jax.Array:
    """The jax.Array, sharded like this layout (or by `sharding`: the same blocks, e.g. in host
    memory), whose blocks on this process are `part`'s (every process passes its own part: no
    cross-process call)."""
    dtype = np.dtype(part.dtype if dtype is None else dtype)
    if not self.whole and part.shape != (self.size,):
      raise ValueError(f"a part of shape {part.shape}, expected ({self.size},)")
    return jax.make_array_from_callback(
        self.shape,
        self.sharding if sharding is None else sharding,
        lambda index: np.asarray(self.block(part, _block(index, self.shape)), dtype),
    )

  def gather(self, part: np.ndarray) -> np.ndarray:
    """The whole array on every process: a cross-process gather unless the part is whole (then
    every process calls it at the same point)."""
    if self.whole:
      return part
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(self.array(part), tiled=True))
