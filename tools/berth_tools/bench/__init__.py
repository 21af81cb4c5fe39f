"""Scheduler benchmark: a generated snapshot and one timed pass."""
