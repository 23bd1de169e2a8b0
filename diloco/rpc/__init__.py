"""gRPC runtime: the synchronizer service and client, the learner and synchronizer processes,
their launch on this machine (on loopback, or each on its own host in a network namespace)."""
