"""Drivers of learners and the synchronizer: the virtual clock, threads, their fault drivers, links, the synchronizer host."""
