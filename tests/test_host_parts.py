"""A process's part of a sharded array (rpc/host_parts.py), on the 8 CPU devices of one process:
groups of devices stand in for the processes of a job."""

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from diloco.rpc import host_parts


def _mesh(shape=(8,), names=("fsdp",)):
  return jax.sharding.Mesh(np.array(jax.devices()).reshape(shape), names)


def test_a_process_holds_its_rows_flattened_in_order():
  # (4, 2) over 4 devices by rows: the "process" of devices 2 and 3 holds rows 2 and 3.
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]), ("fsdp",))
  full = np.arange(8, dtype=np.float32).reshape(4, 2)
  lay = host_parts.Layout.of(full.shape, NamedSharding(mesh, P("fsdp")), jax.devices()[2:4])
  assert lay.blocks == (((2, 3), (0, 2)), ((3, 4), (0, 2))) and not lay.whole
  np.testing.assert_array_equal(lay.cut(full), [4, 5, 6, 7])
  np.testing.assert_array_equal(lay.block(lay.cut(full), lay.blocks[1]), [[6, 7]])
  x = jax.device_put(full, NamedSharding(mesh, P("fsdp")))
  np.testing.assert_array_equal(lay.part_of(x), [4, 5, 6, 7])  # read from its own devices


@pytest.mark.parametrize("processes", [1, 2, 4])
def test_parts_fall_as_one_over_the_processes_and_make_up_the_whole(processes):
  mesh = _mesh((2, 4), ("data", "fsdp"))
  full = np.random.default_rng(0).normal(size=(8, 6)).astype(np.float32)
  # By columns of the mesh (fsdp), so each group holds a different quarter, half or all.
  groups = np.array(jax.devices()).reshape(2, 4).T.reshape(processes, -1)
  sharded, replicated = NamedSharding(mesh, P("fsdp")), NamedSharding(mesh, P())
  seen = np.zeros(full.shape, int)
  for group in groups:
    lay = host_parts.Layout.of(full.shape, sharded, list(group))
    part = lay.cut(full)
    assert part.size == full.size // processes and lay.whole == (processes == 1)
    for b in lay.blocks:
      np.testing.assert_array_equal(lay.block(part, b), full[tuple(slice(*r) for r in b)])
      seen[tuple(slice(*r) for r in b)] += 1
    # Elementwise arithmetic on parts is the arithmetic on the whole, element for element.
    other = full[::-1] * np.float32(0.37)
    np.testing.assert_array_equal(
        np.float32(0.9) * part + np.float32(0.1) * lay.cut(other),
        lay.cut(np.float32(0.9) * full + np.float32(0.1) * other),
    )
    rep = host_parts.Layout.of(full.shape, replicated, list(group))
    assert rep.whole and rep.cut(full) is full  # replicated: every process holds it all
  assert (seen == 1).all()


def test_whole_is_the_jobs_so_that_every_process_gathers_alike():
  # Columns of a (2, 4) mesh, P("fsdp"): a "process" of row 0 and one device of row 1 holds every
  # column, the other devices (the rest of the job) three of the four: no process skips a gather
  # the others make, so neither holds its part whole.
  mesh = _mesh((2, 4), ("data", "fsdp"))
  devices = np.array(jax.devices()).reshape(2, 4)
  sharded = NamedSharding(mesh, P("fsdp"))
  lay = host_parts.Layout.of((8, 6), sharded, [*devices[0], devices[1, 0]])
  assert len(lay.blocks) == 4 and lay.size == 48 and not lay.whole
  rest = host_parts.Layout.of((8, 6), sharded, list(devices[1, 1:]))
  assert len(rest.blocks) == 3 and not rest.whole
  full = np.arange(48, dtype=np.float32).reshape(8, 6)
  np.testing.assert_array_equal(lay.cut(full), full.ravel())  # flat, rows in order


def test_the_whole_process_round_trips_through_a_jax_array():
  mesh = _mesh((2, 4), ("data", "fsdp"))
  full = np.arange(48, dtype=np.float32).reshape(8, 6)
  lay = host_parts.Layout.of(full.shape, NamedSharding(mesh, P("fsdp", "data")))
  assert lay.whole and len(lay.blocks) == 8  # one process: every block is its own
  x = lay.array(lay.cut(full), np.float32)
  assert x.sharding == lay.sharding
  np.testing.assert_array_equal(np.asarray(x), full)
  np.testing.assert_array_equal(lay.part_of(x), full)
  # A checkpoint's copy goes to the devices' pinned host memory (the CPU has one too).
  host = lay.array(lay.cut(full), np.float32, lay.host_sharding)
  assert host.sharding.memory_kind == "pinned_host"
  np.testing.assert_array_equal(lay.part_of(host), full)
  assert lay.gather(full) is full  # nothing to gather


def test_a_layout_that_no_device_of_the_process_holds_is_refused():
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]), ("fsdp",))
  with pytest.raises(ValueError, match="no device of this process"):
    host_parts.Layout.of((4,), NamedSharding(mesh, P("fsdp")), jax.devices()[4:])
  lay = host_parts.Layout.of((4, 2), NamedSharding(mesh, P("fsdp")), jax.devices()[:2])
  with pytest.raises(ValueError, match="shape"):
    lay.cut(np.zeros((2, 4), np.float32))
