"""Checkpoints of learners and the synchronizer, and how a run restores them."""
