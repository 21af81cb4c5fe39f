"""The named policies of ``berth sim``: the default ``berth`` and three baselines.

All four share the same spot rule and see the same offers and prices; they differ only in when
and where they place work. A policy file (YAML/JSON) may be given instead of a name.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from berth.scheduler.defaults import default_policy_document
from berth.scheduler.policy import SchedulingPolicy, load_policy

_SPOT = {"use": "checkpointing", "short_job_s": 3600.0}

BUILTIN: dict[str, dict[str, Any]] = {
    # The service's default policy, as shipped in the deployable core.
    "berth": default_policy_document(),
    # Never bursts: submit order, first fit on-prem.
    "fifo-onprem": {
        "name": "fifo-onprem",
        "burst": None,
        "spot": _SPOT,
        "fair_share": {"ordering": "fifo", "history_weight": 0.0},
        "preemption": {"reclaim": False, "priority": False, "max_per_pass": 0},
        "repatriation": {"enabled": False},
    },
    # The cheapest cloud offer as soon as on-prem is full.
    "burst-nowait": {
        "name": "burst-nowait",
        "burst": {"tenants": ["*"], "min_wait_s": 0.0, "wait_fraction": 0.0},
        "spot": _SPOT,
        "fair_share": {"ordering": "fifo", "history_weight": 0.0},
        "preemption": {"reclaim": False, "priority": False, "max_per_pass": 0},
        "repatriation": {"enabled": False},
    },
    # Always the cheapest cloud offer, never on-prem.
    "cloud-cheapest": {
        "name": "cloud-cheapest",
        "use_onprem": False,
        "burst": {"tenants": ["*"], "min_wait_s": 0.0, "wait_fraction": 0.0},
        "spot": _SPOT,
        "fair_share": {"ordering": "fifo", "history_weight": 0.0},
        "preemption": {"reclaim": False, "priority": False, "max_per_pass": 0},
        "repatriation": {"enabled": False},
    },
}

POLICY_NAMES = tuple(BUILTIN)


def resolve_policy(name_or_path: str) -> SchedulingPolicy:
    """A built-in policy by name, or a policy file (.yaml/.yml/.json)."""
    if name_or_path in BUILTIN:
        return load_policy(BUILTIN[name_or_path])
    path = Path(name_or_path)
    if not path.is_file():
        raise ValueError(
            f"unknown policy {name_or_path!r}: expected one of {', '.join(POLICY_NAMES)} or a file"
        )
    text = path.read_text(encoding="utf-8")
    data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a policy file is a mapping")
    return load_policy(data)
