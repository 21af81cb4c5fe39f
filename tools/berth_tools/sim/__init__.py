"""Discrete-event simulator that replays a workload trace through the real scheduler core."""
