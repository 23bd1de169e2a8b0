"""Checkpoints of learners and the synchronizer, how a run restores them, and whose run a workdir
holds."""
