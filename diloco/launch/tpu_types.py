"""Cloud TPU accelerator types ("v5p-16", "v5litepod-8"): chips, hosts, and Ray's topology check.

The number after the generation counts TensorCores for v2, v3, v4 and v5p (two per chip, four
chips per host) and chips for v5litepod (v5e) and v6e (a slice of at most 8 chips is one host;
larger slices have four chips per host), as in Cloud TPU's naming.
"""

import dataclasses
import math
import re

CORE_COUNTED = ("v2", "v3", "v4", "v5p")  # the count is TensorCores, 2 per chip
CHIP_COUNTED = ("v5litepod", "v6e")  # the count is chips
GENERATIONS = CORE_COUNTED + CHIP_COUNTED
CHIPS_PER_HOST = 4


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
  if not match or match.group(1) not in GENERATIONS:
    raise ValueError(
        f"{key}={accelerator_type!r} is not a Cloud TPU accelerator type (GENERATION-COUNT with "
        f"GENERATION one of {', '.join(GENERATIONS)}, e.g. v5p-16 or v5litepod-8)"
    )
  generation, count = match.group(1), int(match.group(2))
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
