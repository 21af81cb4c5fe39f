"""Berth's on-prem agent: the host-side pieces a GPU host runs (see ``docs/agent.md``).

Modules, one concern each: ``config`` (file + env), ``gpus`` (NVML discovery or a simulated
inventory), ``usage`` (per-job GPU/CPU/RSS sampling), ``executors`` (process, docker/podman,
kubernetes), ``staging`` (datasets, S3 object cache, code bundles), ``logship`` (CloudWatch Logs),
``sdnotify`` (systemd readiness and watchdog), ``client`` (the SigV4-signed agent API),
``jsonlog`` (structured logs to stdout/journald).
"""

__version__ = "0.1.0"
