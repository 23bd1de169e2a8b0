"""Property-based test of the synchronizer: random interleavings of every kind of event under random
policies, with the invariants of tests/sync_machine.py checked after every step."""

from hypothesis import HealthCheck, settings

import sync_machine

TestSynchronizerMachine = sync_machine.SyncMachine.TestCase
TestSynchronizerMachine.settings = settings(
    max_examples=300,
    stateful_step_count=40,
    deadline=None,
    derandomize=True,  # the same examples on every run of the suite; scripts/fuzz_sync.py draws new ones
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
