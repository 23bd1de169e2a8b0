"""A TPU slice's devices on a machine without one: libtpu's topology description, compile-only.

`jax.experimental.topologies.get_topology_desc` gives devices whose programs the real TPU compiler
builds (and `memory_analysis`/`cost_analysis` describe), but that never run. Without a TPU, libtpu
asks the cloud metadata server for the accelerator type and worker hostnames and prints warnings
when it gets none, and writes its logs under /tmp/tpu_logs; `_quiet` names a type and this host,
keeps only fatal logs, sends the log directory to a temporary folder removed at exit, and lets
several compile-only processes load libtpu at once.
"""

import atexit
import importlib.util
import os
import shutil
import tempfile

import jax

from diloco.plan import tpu

INSTALL = (
    "libtpu is not installed, so nothing can be compiled for a TPU here: pip install -e '.[tpu]' "
    "(libtpu has wheels for Linux on x86-64 only)"
)


class LibtpuMissing(RuntimeError):
  """libtpu cannot be imported: a plan cannot compile."""


def libtpu_available() -> bool:
  return importlib.util.find_spec("libtpu") is not None


def _quiet(pod: tpu.PodType) -> None:
  """Env for a libtpu that runs on no TPU: no metadata queries, no warnings, no stray logs."""
  if os.environ.get("TPU_LOG_DIR") is None:
    logs = tempfile.mkdtemp(prefix="diloco-libtpu-")
    atexit.register(shutil.rmtree, logs, True)
    os.environ["TPU_LOG_DIR"] = logs
  os.environ.setdefault("TPU_MIN_LOG_LEVEL", "3")
  os.environ.setdefault("TPU_STDERR_LOG_LEVEL", "3")
  os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
  os.environ.setdefault("TPU_ACCELERATOR_TYPE", pod.name)
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
  # libtpu takes /tmp/libtpu_lockfile for its chips; a compile-only client uses none, so two plans
  # (a test and a launcher's dry run, two launchers) may run at once.
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


def slice_devices(pod: tpu.PodType, shape: tuple[int, ...] | None = None) -> list[jax.Device]:
  """The devices of one slice of `pod` (`shape`: its topology, default `tpu.default_topology`),
  one per chip, for compiling only; LibtpuMissing when libtpu is not installed."""
  if not libtpu_available():
    raise LibtpuMissing(INSTALL)
  chip = tpu.chip(pod)
  shape = shape or tpu.default_topology(pod)
  _quiet(pod)
  from jax.experimental import topologies  # pylint: disable=import-outside-toplevel

  desc = topologies.get_topology_desc(
      platform="tpu",
      topology_name=f"{chip.libtpu_name}:{'x'.join(map(str, shape))}",
      chip_config_name=chip.chip_config,
      chips_per_host_bounds=tpu.host_bounds(pod, shape),
      num_slices=1,
  )
  devices = list(desc.devices)
  if len(devices) != pod.chips:
    raise RuntimeError(
        f"libtpu described {len(devices)} devices for {pod.name} ({pod.chips} chips)"
    )
  return devices
