"""The default organisational policy, shipped as data next to this module (``default_policy.yaml``).

The service loads it until an admin stores another; ``berth sim`` replays it as the ``berth`` policy.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

import yaml

from berth.scheduler.policy import SchedulingPolicy, load_policy

DEFAULT_POLICY_RESOURCE = "default_policy.yaml"


def default_policy_document() -> dict[str, Any]:
    """The default policy as a document (shipped with the package, next to this module)."""
    text = resources.files("berth.scheduler").joinpath(DEFAULT_POLICY_RESOURCE).read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    if not isinstance(data, dict):  # pragma: no cover - the shipped file is a mapping
        raise ValueError(f"{DEFAULT_POLICY_RESOURCE}: a policy file is a mapping")
    return data


def default_policy() -> SchedulingPolicy:
    """The organisation's default policy: what the service loads until an admin stores another."""
    return load_policy(default_policy_document())
