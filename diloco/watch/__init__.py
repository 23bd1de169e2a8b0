"""Watching a run: progress bars, the timeline picture, the status page and its metrics."""
