"""One learner's inner loop: mesh and sharding, the pure jitted step, island, evaluation, checkpoints, warm start."""
