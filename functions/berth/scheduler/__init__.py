"""Berth's scheduler core: a pure function from a snapshot to decisions (no I/O, clock injected)."""

from berth.scheduler.adapter import pending_from_spec
from berth.scheduler.core import schedule
from berth.scheduler.decisions import CloudAssignment, Decisions, OnPremAssignment, Preemption, Repatriation
from berth.scheduler.explain import JobExplanation, explain_job
from berth.scheduler.feasibility import Infeasible, check_feasible
from berth.scheduler.policy import SchedulingPolicy, load_policy
from berth.scheduler.snapshot import (
    CircuitRecord,
    CloudOffer,
    Host,
    PendingJob,
    RunningJob,
    Snapshot,
    TenantState,
)

__all__ = [
    "CircuitRecord",
    "CloudAssignment",
    "CloudOffer",
    "Decisions",
    "Host",
    "Infeasible",
    "JobExplanation",
    "OnPremAssignment",
    "PendingJob",
    "Preemption",
    "Repatriation",
    "RunningJob",
    "SchedulingPolicy",
    "Snapshot",
    "TenantState",
    "check_feasible",
    "explain_job",
    "load_policy",
    "pending_from_spec",
    "schedule",
]
