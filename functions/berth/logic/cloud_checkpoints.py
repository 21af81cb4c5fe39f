"""A cloud attempt's last checkpoint, read when its Batch job ends (docs/cloud.md, "Checkpoints").

The launcher syncs ``$BERTH_CHECKPOINT_DIR`` to the job's checkpoint prefix every 30 s and once at its
end, but has no channel back to the control plane (an on-prem agent reports its syncs in heartbeats).
So the Batch events handler reads the prefix once, on the attempt's SUCCEEDED or FAILED, and keeps
what it finds on the job's run state by the rule every reporter shares
(``RunState.with_checkpoint``: only when newer than the stored one), so ``berth status`` shows what a
retry resumes from. Best effort: a read or write that fails is logged and the event goes on without
it (the job's outcome matters more than its checkpoint's figures).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from berth.domain.cloud import BatchJob
from berth.domain.errors import StoreUnavailable
from berth.domain.job import Job
from berth.domain.ports import CheckpointStore, JobRepository
from berth.domain.storage import job_checkpoint_prefix
from berth.domain.workflow import CheckpointInfo
from berth.logic.job_update import Decision, JobKeptChanging, JobMissing, Keep, Update, update_job

log = logging.getLogger(__name__)


def note_cloud_checkpoint(
    jobs: JobRepository, store: CheckpointStore, job: Job, bj: BatchJob, clock: Callable[[], datetime]
) -> Job:
    """Record the checkpoint under ``job``'s prefix as its current attempt's, once ``bj`` (that
    attempt's Batch job) ended. Returns the job as stored afterwards when it is still that attempt
    in the same status, else ``job`` as given. An attempt that never started (no ``startedAt``) wrote
    nothing: nothing is read."""
    if not bj.status.is_terminal or bj.started_at is None:
        return job
    prefix = job_checkpoint_prefix(job.tenant, job.id)
    try:
        ckpt = store.last_checkpoint(prefix)
    except StoreUnavailable as exc:
        log.warning("checkpoint not read", extra={"job_id": job.id, "prefix": prefix, "error": exc.message})
        return job
    if ckpt is None:
        return job
    return _record(jobs, job, job.attempts, ckpt, clock)


def _record(
    jobs: JobRepository, job: Job, attempt: int, ckpt: CheckpointInfo, clock: Callable[[], datetime]
) -> Job:
    def record(current: Job) -> Decision:
        run = current.run.with_checkpoint(attempt, ckpt, clock())
        if run is None:
            return Keep()  # the stored one is as new or newer
        return Update(current.updated(current.updated_at, run=run))

    try:
        after = update_job(jobs, job.id, record, doing="recording its checkpoint", current=job).after
    except (JobMissing, JobKeptChanging, StoreUnavailable) as exc:
        log.warning("checkpoint not recorded", extra={"job_id": job.id, "error": exc.message})
        return job
    same = (after.attempts, after.status) == (job.attempts, job.status)
    return after if same else job


__all__ = ["note_cloud_checkpoint"]
