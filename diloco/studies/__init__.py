"""Studies of many runs through train_and_evaluate: the chaos suite."""
