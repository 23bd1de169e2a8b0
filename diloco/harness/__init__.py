"""Downstream benchmarks through EleutherAI's lm-evaluation-harness: our decoder as its model, its
tasks (named, or local folders) on a finished run or during training, and a held-out Shakespeare
task our scale can move."""
