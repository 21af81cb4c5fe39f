"""Berth on a user's or developer's machine: the CLI and its client, the simulator, benchmarks,
the demo and the embedded local cloud. Never deployed; the deployable package is ``berth``."""
