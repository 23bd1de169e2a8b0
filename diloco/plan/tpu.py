"""Cloud TPU accelerator types ("v5p-16", "v5litepod-8") and their chips: one table, sourced.

The number after the generation counts TensorCores for v2, v3, v4 and v5p (two per chip, four
chips per host) and chips for v5litepod (v5e) and v6e (a slice of at most 8 chips is one host;
larger slices have four chips per host), as in Cloud TPU's naming. `v5e-N` is read as
`v5litepod-N`.

`CHIPS` holds what a plan needs of each generation it can compile for: HBM per chip, peak bf16
FLOP/s, HBM bandwidth and the name libtpu's topology descriptions take. Every number is from the
generation's Cloud TPU system-architecture page (the `source` of its row, "Key specifications"
table, read 2026-12-04); the pages say GB for v5e, v5p and v6e and GiB for v4, kept as written.
"""

import dataclasses
import math
import re

CORE_COUNTED = ("v2", "v3", "v4", "v5p")  # the count is TensorCores, 2 per chip
CHIP_COUNTED = ("v5litepod", "v6e")  # the count is chips
GENERATIONS = CORE_COUNTED + CHIP_COUNTED
ALIASES = {"v5e": "v5litepod"}
CHIPS_PER_HOST = 4
GB, GiB = 1e9, float(2**30)


@dataclasses.dataclass(frozen=True)
class Chip:
  """One TPU generation's chip, as its Cloud TPU page states it."""

  generation: str  # as in accelerator types
  libtpu_name: str  # the prefix of libtpu's topology names ("v5e:2x4")
  hbm_bytes: float
  peak_bf16_flops: float  # per chip, dense
  hbm_bytes_per_s: float
  torus_dims: int  # 3 (v4, v5p) or 2 (v5e, v6e)
  chip_config: str  # libtpu's chip configuration: one JAX device per chip
  source: str


CHIPS: dict[str, Chip] = {
    "v4": Chip(
        "v4", "v4", 32 * GiB, 275e12, 1200 * GB, 3, "megacore", "cloud.google.com/tpu/docs/v4"
    ),
    "v5litepod": Chip(
        "v5litepod", "v5e", 16 * GB, 197e12, 819 * GB, 2, "default", "cloud.google.com/tpu/docs/v5e"
    ),
    "v5p": Chip(
        "v5p", "v5p", 95 * GB, 459e12, 2765 * GB, 3, "default", "cloud.google.com/tpu/docs/v5p"
    ),
    "v6e": Chip(
        "v6e", "v6e", 32 * GB, 918e12, 1638 * GB, 2, "default", "cloud.google.com/tpu/docs/v6e"
    ),
}


@dataclasses.dataclass(frozen=True)
class PodType:
  """One accelerator type: `generation`-`count`, with its chips and hosts."""

  name: str
  generation: str
  chips: int
  hosts: int

  @property
  def chips_per_host(self) -> int:
    return self.chips // self.hosts


def parse(accelerator_type: str, key: str = "deploy.tpu.accelerator_type") -> PodType:
  """The PodType of `accelerator_type`; ValueError naming `key` when it is not one."""
  match = re.fullmatch(r"(v\d+[a-z]*)-(\d+)", accelerator_type or "")
  generation = ALIASES.get(match.group(1), match.group(1)) if match else ""
  if generation not in GENERATIONS:
    raise ValueError(
        f"{key}={accelerator_type!r} is not a Cloud TPU accelerator type (GENERATION-COUNT with "
        f"GENERATION one of {', '.join(GENERATIONS)}, e.g. v5p-16 or v5litepod-8)"
    )
  count = int(match.group(2))
  if generation in CORE_COUNTED:
    if count < 8 or count % 8:
      raise ValueError(
          f"{key}={accelerator_type!r}: {generation} counts TensorCores, a multiple of 8"
      )
    chips = count // 2
    return PodType(accelerator_type, generation, chips, max(1, chips // CHIPS_PER_HOST))
  if count in (1, 4, 8):
    return PodType(accelerator_type, generation, count, 1)
  if count % CHIPS_PER_HOST or count < 16:
    raise ValueError(
        f"{key}={accelerator_type!r}: {generation} slices have 1, 4 or 8 chips, or a multiple "
        f"of {CHIPS_PER_HOST} from 16"
    )
  return PodType(accelerator_type, generation, count, count // CHIPS_PER_HOST)


def check_topology(pod: PodType, topology: str, key: str = "deploy.tpu.topology") -> str:
  """`topology` ("2x2x2") if its chips are the pod's; ValueError naming both keys otherwise."""
  if not re.fullmatch(r"\d+(x\d+){1,2}", topology or ""):
    raise ValueError(f"{key}={topology!r} is not a TPU topology such as 2x2x1 or 4x4")
  chips = math.prod(int(d) for d in topology.split("x"))
  if chips != pod.chips:
    raise ValueError(
        f"{key}={topology} has {chips} chips but deploy.tpu.accelerator_type={pod.name} has "
        f"{pod.chips}"
    )
  return topology


def chip(pod: PodType) -> Chip:
  """The chip of `pod`'s generation; ValueError naming the generations a plan knows."""
  if pod.generation not in CHIPS:
    raise ValueError(
        f"{pod.name}: no chip figures for {pod.generation}; plans cover "
        f"{', '.join(CHIPS)} (v5e is v5litepod)"
    )
  return CHIPS[pod.generation]


def default_topology(pod: PodType) -> tuple[int, ...]:
  """The slice's usual shape (Cloud TPU's tables): 3-D tori are 2x2x1 or 2x2x2, then double the
  last, the middle and the first axis in turn (2x2x4, 2x4x4, 4x4x4, 4x4x8, ...); 2-D tori are
  1x1 or 2x2, then double the second axis and the first in turn (2x4, 4x4, 4x8, ...)."""
  n, dims = pod.chips, chip(pod).torus_dims
  if dims == 3:
    shape = [2, 2, 2] if n >= 8 else [2, 2, 1]
  else:
    shape = [2, 2] if n >= 4 else [1, 1]
  axis = dims - 1
  while math.prod(shape) < n:
    shape[axis] *= 2
    axis = axis - 1 if axis > 0 else dims - 1
  if math.prod(shape) != n:
    raise ValueError(
        f"{pod.name}: {n} chips is not a slice with a default shape; name it with "
        "deploy.tpu.topology (e.g. 2x2x6)"
    )
  return tuple(shape)


def host_bounds(pod: PodType, shape: tuple[int, ...]) -> tuple[int, int, int]:
  """Chips per host along each axis, as libtpu's topology description takes them."""
  full = (*shape, 1, 1)[:3]
  if pod.hosts == 1:
    return full  # a single-host slice: its whole shape
  return (2, 2, 1)  # four chips per host on every multi-host slice
