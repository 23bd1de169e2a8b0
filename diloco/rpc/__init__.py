"""gRPC runtime: the synchronizer service and client, the learner and synchronizer processes."""
