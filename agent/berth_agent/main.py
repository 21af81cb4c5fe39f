"""``berth-agent``: wire the configuration to the daemon and run it (the systemd unit's ExecStart).

Exit status: 0 after a drain, 2 for a configuration error (the message names the field), 1 for
anything else, logged as JSON.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import botocore.session

from berth_agent import config as agent_config
from berth_agent import executors, gpus, isolation, jsonlog
from berth_agent.attempt import AttemptRunner
from berth_agent.awsio import BotocoreIO
from berth_agent.client import AgentClient
from berth_agent.daemon import Daemon, SqsQueue
from berth_agent.gpu_health import watcher_for
from berth_agent.ledger import AttemptLedger
from berth_agent.metricship import MetricsShipper
from berth_agent.staging import ObjectCache
from berth_agent.usage import UsageSampler

log = logging.getLogger("berth_agent")


def build(cfg: agent_config.AgentConfig, nvml: Any = None) -> Daemon:
    """Everything the daemon needs, from the configuration; ``nvml`` an initialised NVML module for
    the usage sampler (used only when the inventory itself came from NVML)."""
    if not (cfg.artifacts_bucket and cfg.data_bucket):
        raise agent_config.ConfigError("artifacts_bucket and data_bucket must be set")
    artifacts_bucket, data_bucket = cfg.artifacts_bucket, cfg.data_bucket
    inventory = gpus.discover(cfg.gpus, cfg.host_id)
    log.info(
        "GPUs discovered",
        extra={"source": inventory.source, "gpu_type": inventory.gpu_type, "gpus": inventory.healthy_uuids},
    )
    api = AgentClient.from_config(cfg, profile=cfg.aws_profile)
    cfg.work_dir.mkdir(parents=True, exist_ok=True)
    cache = ObjectCache(cfg.cache_dir, cfg.cache_max_bytes)
    ledger = AttemptLedger(cfg.work_dir)
    executor = executors.for_config(cfg, gpu_minors=inventory.minors)
    level, why = isolation.gpu_isolation(
        cfg.executor, device_rules=getattr(executor, "device_rules", None) is not None
    )
    (log.info if level == isolation.ENFORCED else log.warning)(
        f"GPU isolation: {level}", extra={"executor": cfg.executor.value, "why": why}
    )

    def io_for(creds: Mapping[str, Any]) -> BotocoreIO:
        return BotocoreIO.for_credentials(
            creds,
            region=cfg.region,
            cache=cache,
            artifacts_bucket=artifacts_bucket,
            data_bucket=data_bucket,
            endpoint_url=cfg.aws_endpoint_url,
        )

    runner = AttemptRunner(
        config=cfg,
        inventory=inventory,
        api=api,
        executor=executor,
        ledger=ledger,
        io_for=io_for,
        sampler=UsageSampler(nvml=nvml if inventory.source == "nvml" else None),
        sample_interval_s=cfg.metrics.sample_interval_s,
        metrics=MetricsShipper(
            api,
            send_interval_s=cfg.metrics.send_interval_s,
            buffer_max_samples=cfg.metrics.buffer_max_samples,
            batch_max_samples=cfg.metrics.batch_max_samples,
        ),
    )
    session = botocore.session.Session(profile=cfg.aws_profile)

    def queue_for(url: str) -> SqsQueue:
        client = session.create_client("sqs", region_name=cfg.region, endpoint_url=cfg.aws_endpoint_url)
        return SqsQueue(client, url)

    facts = {
        "cpu": cfg.host_cpu or os.cpu_count() or 1,
        "memory_gib": cfg.host_memory_gib or _memory_gib(),
    }
    health = watcher_for(
        inventory.source,
        inventory.healthy_uuids,
        nvml=nvml,
        faults_file=cfg.gpus.simulated.faults_file,
        poll_s=cfg.gpus.health_poll_s,
    )
    return Daemon(
        config=cfg,
        inventory=inventory,
        api=api,
        runner=runner,
        queue_for=queue_for,
        ledger=ledger,
        host_facts={**facts, "containment": executor.containment},
        gpu_isolation=level,
        cache_report=lambda: [c.model_dump(mode="json") for c in cache.cached_datasets()],
        health=health,
    )


def _memory_gib() -> int:
    try:
        text = Path("/proc/meminfo").read_text(encoding="ascii")
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // (1024 * 1024)
    return 0


def main() -> int:
    jsonlog.setup()
    # `kill -USR1 <agent>` writes every thread's stack to stderr (the journal): a stuck agent
    # can be looked at without stopping it.
    with contextlib.suppress(ValueError, OSError, AttributeError):  # stderr without a file: no dumps
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        cfg = agent_config.load()
        jsonlog.setup(cfg.log_level)
    except agent_config.ConfigError as exc:
        log.error(str(exc))
        return 2
    with gpus.nvml_session() as nvml:
        try:
            daemon = build(cfg, nvml)
        except agent_config.ConfigError as exc:
            log.error(str(exc))
            return 2
        try:
            daemon.run()
        except Exception:
            log.exception("agent stopped on an error")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
