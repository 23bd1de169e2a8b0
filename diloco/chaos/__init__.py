"""Faults as data: schedules and the statistics of what they did."""
