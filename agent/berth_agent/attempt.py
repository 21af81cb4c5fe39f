"""One claimed attempt, end to end on this host: claim, stage, run, sync, ship logs, report, clean up.

The daemon loop (``daemon.Daemon``) owns the queue, the heartbeat and drain; for every work message it
hands an ``AttemptRunner.run(message)`` to a thread, relays heartbeat directives with ``cancel``,
and reads ``running`` for its heartbeat's ``attempts``. All I/O an attempt does with its scoped
credentials goes through ``AttemptIO`` (built by ``io_for(credentials)``: botocore S3 and Logs
clients in production, fakes in tests), so this module holds the order of things and no AWS code.

Order and rules: the claim is answered before anything else (409 -> nothing runs); the attempt is
recorded in the ledger (with its ``BERTH_ATTEMPT_KEY`` marker) before it starts and removed only
after its final report; a staging failure is reported as ``staging`` and nothing starts; once the
process has started, it is supervised until all of it has ended whatever the control plane
answers (``reports``), and any error here first kills it and waits for its end; a
``Fenced`` answer to any report stops the job at once (the attempt is no longer ours); outputs
and checkpoints are synced while it runs and once more after it ends; the per-attempt directory
is removed at the end.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple, Protocol

from berth_agent import logship
from berth_agent.attempt_credentials import AttemptCredentials, CredentialsFile
from berth_agent.client import AgentApiError, AlreadyClaimed, Canceled, Fenced
from berth_agent.config import AgentConfig, ExecutorKind
from berth_agent.containment import new_attempt_key
from berth_agent.executors.base import Executor, FailureKind, JobResult, Launch, RunHandle, StartError
from berth_agent.gpus import Inventory
from berth_agent.jobs import Claim, ClaimError, build_launch, data_mounts
from berth_agent.ledger import AttemptEntry, AttemptLedger
from berth_agent.metricship import MetricsShipper
from berth_agent.outputs import DirSync, OutputKeys, PeriodicSync, restore
from berth_agent.reports import Answer, ReportApi, StartedReport, report_end
from berth_agent.staging import JobDirs, StagingError, parse_digest, stage_bundle
from berth_agent.usage import JobUsage, UsageSampler

log = logging.getLogger(__name__)

#: While an attempt stops (SIGTERM sent), its checkpoints are synced this often until the kill.
STOP_SYNC_S = 1.0
#: ... and once more this long before the executor's SIGKILL at the end of the grace.
PRE_KILL_SYNC_S = 0.5


def checkpoint_info(sync: DirSync) -> dict[str, Any]:
    """A checkpoint sync's last upload as the wire says it: ``{at, size_bytes}``."""
    assert sync.last_upload_at is not None
    return {"at": sync.last_upload_at.isoformat(), "size_bytes": sync.total_bytes}


class AgentApi(ReportApi, Protocol):
    """The part of ``client.AgentClient`` an attempt uses (its reports: ``reports.ReportApi``)."""

    def claim(self, job_id: str, attempt: int, fencing_token: str) -> Any: ...
    def credentials(self, job_id: str, attempt: int, fencing_token: str) -> Any: ...


class AttemptIO(Protocol):
    """What an attempt reads and writes with its own scoped credentials."""

    def fetch_bundle(self, tenant: str, digest: str, dest: Path) -> None: ...
    def stage_s3(self, uri: str, dest: Path) -> Path: ...
    def list_keys(self, prefix: str) -> Iterable[str]: ...
    def get(self, key: str, dest: Path) -> None: ...
    def put(self, fh: BinaryIO, key: str, size: int) -> None: ...
    def logs_client(self) -> logship.LogsClient: ...
    def secret_value(self, name: str) -> str: ...


def credential_env(creds: Mapping[str, Any], region: str) -> dict[str, str]:
    """The attempt's scoped STS credentials (the agent API's answer) as the job's AWS_* variables."""
    try:
        return {
            "AWS_ACCESS_KEY_ID": str(creds["AccessKeyId"]),
            "AWS_SECRET_ACCESS_KEY": str(creds["SecretAccessKey"]),
            "AWS_SESSION_TOKEN": str(creds["SessionToken"]),
            "AWS_REGION": region,
            "AWS_DEFAULT_REGION": region,
        }
    except KeyError as exc:
        raise ClaimError(f"the attempt's credentials lack {exc}") from exc


class _JournalLogs:
    """A ``logs`` client that writes each event to the agent's own JSON log (journald)."""

    def __init__(self, job_id: str, attempt: int) -> None:
        self._job = {"job_id": job_id, "attempt": attempt}

    def create_log_stream(self, **kwargs: Any) -> Any:
        return {}

    def put_log_events(self, **kwargs: Any) -> Any:
        for event in kwargs["logEvents"]:
            log.info(event["message"], extra={**self._job, "job_output": True})
        return {}


class NoCredentialsIO:
    """The attempt's I/O when the agent API vends no credentials (404 on ``/v1/agent/credentials``):
    a job that needs no bundle, S3 data or secret still runs; its output goes to the agent's journal
    and its outputs stay on the host until the attempt's directory is removed."""

    def __init__(self, job_id: str, attempt: int) -> None:
        self._logs = _JournalLogs(job_id, attempt)

    def _refuse(self, what: str) -> StagingError:
        return StagingError(f"{what} needs the attempt's credentials, which the agent API does not vend")

    def fetch_bundle(self, tenant: str, digest: str, dest: Path) -> None:
        raise self._refuse("a code bundle")

    def stage_s3(self, uri: str, dest: Path) -> Path:
        raise self._refuse(uri)

    def list_keys(self, prefix: str) -> Iterable[str]:
        return []

    def get(self, key: str, dest: Path) -> None:
        raise self._refuse(key)

    def put(self, fh: BinaryIO, key: str, size: int) -> None:
        return None

    def logs_client(self) -> logship.LogsClient:
        return self._logs

    def secret_value(self, name: str) -> str:
        raise self._refuse(f"secret {name}")


@dataclass(frozen=True, slots=True)
class Outcome:
    job_id: str
    attempt: int
    ran: bool
    result: JobResult | None
    reason: str = ""


class _Prepared(NamedTuple):
    """An attempt ready to start."""

    io: AttemptIO
    creds: Mapping[str, Any] | None
    creds_file: CredentialsFile | None
    keys: OutputKeys
    launch: Launch


def stop_and_wait(handle: RunHandle) -> None:
    """Kill the run now and wait until all of it has ended (the handle's result)."""
    handle.cancel(0)
    while handle.wait(1.0) is None:
        log.warning("waiting for a stopped job to end", extra={"pid": handle.pid})


def resolve_secrets(claim: Claim, io: AttemptIO) -> dict[str, str]:
    """Each ``ENV: berth/<tenant>/name`` resolved now, with the attempt's credentials (which can
    read only the tenant's own prefix); never written anywhere but the job's environment."""
    out = {}
    for env_name, secret_name in claim.spec.secrets.items():
        if not secret_name.startswith(f"berth/{claim.tenant}/"):
            raise ClaimError(f"secret {secret_name} is outside berth/{claim.tenant}/")
        try:
            out[env_name] = io.secret_value(secret_name)
        except Exception as exc:
            raise StagingError(f"secret {secret_name} could not be read: {exc}") from exc
    return out


def stage_inputs(claim: Claim, io: AttemptIO, dirs: JobDirs, keys: OutputKeys) -> None:
    code = claim.spec.code
    if code is not None:
        digest = parse_digest(code)
        if digest is None:
            raise StagingError(f"code {code} is not a sha256: bundle reference this agent can fetch")
        stage_bundle(
            lambda path: io.fetch_bundle(claim.tenant, digest, path),
            digest,
            dirs.base / "bundle",
            dirs.work,
        )
    if claim.attempt > 1:
        restore(dirs.checkpoints, keys.checkpoints, io.list_keys, io.get)


class AttemptRunner:
    def __init__(
        self,
        *,
        config: AgentConfig,
        inventory: Inventory,
        api: AgentApi,
        executor: Executor,
        ledger: AttemptLedger,
        io_for: Callable[[Mapping[str, Any]], AttemptIO],
        sync_interval_s: float = 30.0,
        tick_s: float = 0.2,
        sampler: UsageSampler | None = None,
        sample_interval_s: float = 15.0,
        metrics: MetricsShipper | None = None,
        started_retry_s: float = 5.0,
    ) -> None:
        self.started_retry_s = started_retry_s
        self.config, self.inventory, self.api, self.executor = config, inventory, api, executor
        self.ledger, self.io_for = ledger, io_for
        self.sync_interval_s, self.tick_s = sync_interval_s, tick_s
        self.sampler, self.sample_interval_s = sampler, sample_interval_s
        #: The latest usage sample per running attempt; every sample also goes to ``metrics``
        #: (the agent API's /v1/agent/metrics).
        self.usage: dict[tuple[str, int], JobUsage] = {}
        self.metrics = metrics
        self._lock = threading.Lock()
        self._running: dict[tuple[str, int], tuple[str, RunHandle | None]] = {}
        self._cancel: dict[tuple[str, int], float] = {}
        self._fenced: set[tuple[str, int]] = set()
        #: The spec's ``checkpoint.grace_seconds`` per attempt (None: the agent's ``cancel_grace_s``).
        self._grace: dict[tuple[str, int], float | None] = {}
        #: When the executor kills a stopping attempt (monotonic): its last checkpoint sync is just before.
        self._kill_at: dict[tuple[str, int], float] = {}
        #: Each running attempt's checkpoint sync (its last upload: time and size).
        self._ckpt: dict[tuple[str, int], DirSync] = {}

    # -- what the daemon's heartbeat needs ---------------------------------------------------------
    def running(self) -> list[dict[str, Any]]:
        with self._lock:
            return [
                {"job_id": j, "attempt": a, "fencing_token": t} for (j, a), (t, _) in self._running.items()
            ]

    def checkpoints(self) -> list[dict[str, Any]]:
        """Each running attempt's last synced checkpoint, for the heartbeat's ``checkpoints``."""
        with self._lock:
            out = []
            for key, sync in self._ckpt.items():
                entry = self._running.get(key)
                if entry is None or sync.last_upload_at is None:
                    continue
                out.append(
                    {
                        "job_id": key[0],
                        "attempt": key[1],
                        "fencing_token": entry[0],
                        **checkpoint_info(sync),
                    }
                )
            return out

    def cancel(self, job_id: str, attempt: int, grace_s: float | None = None) -> None:
        """A cancel/stop directive: the job gets SIGTERM now (or as soon as it starts) and SIGKILL
        after its grace: ``grace_s``, else the spec's ``checkpoint.grace_seconds``, else the agent's
        ``cancel_grace_s``. Its checkpoints are synced while it stops and once more before the kill."""
        key = (job_id, attempt)
        with self._lock:
            spec_grace = self._grace.get(key)
        default = self.config.cancel_grace_s if spec_grace is None else spec_grace
        grace = float(default if grace_s is None else grace_s)
        with self._lock:
            self._cancel[key] = grace
            entry = self._running.get(key)
        if entry is not None and entry[1] is not None:
            self._stop(entry[1], key, grace)

    def _stop(self, handle: RunHandle, key: tuple[str, int], grace: float) -> None:
        """SIGTERM now, SIGKILL after ``grace`` (the executor's); the supervision loop syncs the
        checkpoints while it stops and once more just before the kill."""
        if grace > 0:
            with self._lock:
                due = time.monotonic() + grace
                self._kill_at[key] = min(self._kill_at.get(key, due), due)
        handle.cancel(grace)

    # -- one attempt --------------------------------------------------------------------------
    def run(self, message: Mapping[str, Any], on_claim_answered: Callable[[], None] | None = None) -> Outcome:
        """Run the attempt ``message`` names. ``on_claim_answered`` is called once the claim got an
        answer (200 or 409): the moment the work message may be deleted. A claim that got no answer
        (``Unreachable`` raised from here) leaves the message to be delivered again."""
        job_id, attempt, token = (
            str(message["job_id"]),
            int(message["attempt"]),
            str(message["fencing_token"]),
        )
        try:
            answer = self.api.claim(job_id, attempt, token)
        except AgentApiError as exc:
            # 409 (another claim won, fenced, canceled) and 404 (not this host's attempt, or no such
            # job) are final answers: the message goes, nothing runs. Anything else (no answer,
            # 403, ...) leaves it for redelivery.
            if not isinstance(exc, (Fenced, AlreadyClaimed, Canceled)) and exc.status != 404:
                raise
            if on_claim_answered is not None:
                on_claim_answered()
            log.info(
                "claim refused; not running", extra={"job_id": job_id, "attempt": attempt, "code": exc.code}
            )
            return Outcome(job_id, attempt, False, None, exc.code)
        if on_claim_answered is not None:
            on_claim_answered()
        try:
            claim = Claim.parse(answer)
        except ClaimError as exc:
            report_end(self.api, job_id, attempt, token, JobResult(None, FailureKind.AGENT_ERROR, str(exc)))
            return Outcome(job_id, attempt, False, None, "bad claim")
        key = (job_id, attempt)
        policy = claim.spec.checkpoint
        with self._lock:
            self._grace[key] = None if policy is None else float(policy.grace_seconds)
        entry = AttemptEntry(
            job_id,
            attempt,
            token,
            self.config.executor.value,
            f"berth-{job_id}-{attempt}",
            attempt_key=new_attempt_key(job_id, attempt),
        )
        self.ledger.record(entry)
        with self._lock:
            self._running[key] = (token, None)
        dirs: JobDirs | None = None
        try:
            dirs = JobDirs.create(self.config.work_dir, job_id, attempt)
            result, ran = self._run_claimed(claim, token, entry, dirs)
            with self._lock:
                fenced = key in self._fenced
            if fenced:  # no longer ours: the control plane has moved on, nothing more to say
                return Outcome(job_id, attempt, ran, result, "Fenced")
            if self.metrics is not None:  # while the token still admits them
                self.metrics.flush(key)
            with self._lock:
                ckpt = self._ckpt.get(key)
            last = None if ckpt is None or ckpt.last_upload_at is None else checkpoint_info(ckpt)
            report_end(self.api, job_id, attempt, token, result, checkpoint=last)
            return Outcome(job_id, attempt, ran, result)
        finally:
            with self._lock:
                self._running.pop(key, None)
                self._cancel.pop(key, None)
                self._fenced.discard(key)
                self._grace.pop(key, None)
                self._kill_at.pop(key, None)
                self._ckpt.pop(key, None)
            if self.metrics is not None:
                self.metrics.forget(key)
            self.ledger.remove(entry)
            if dirs is not None:
                dirs.remove()

    def _prepare(self, claim: Claim, token: str, dirs: JobDirs) -> _Prepared:
        """Everything before the start: credentials, inputs staged, secrets, the launch (raises
        ``StagingError``, ``ClaimError`` or ``AgentApiError``: nothing runs)."""
        gpu_uuids = claim.check_gpus(self.inventory)
        creds: Mapping[str, Any] | None = claim.credentials
        if creds is None:  # the claim came without them: ask (404: this deployment vends none)
            try:
                creds = self.api.credentials(claim.job_id, claim.attempt, token)
            except AgentApiError as exc:
                if exc.status != 404:
                    raise
                creds = None
        io: AttemptIO = (
            self.io_for(creds) if creds is not None else NoCredentialsIO(claim.job_id, claim.attempt)
        )
        creds_file: CredentialsFile | None = None
        job_creds: dict[str, str] = {}
        if creds is not None:
            job_creds = credential_env(creds, self.config.region)
            if self.config.executor == ExecutorKind.PROCESS:
                # refreshable for the job's SDK: a credential_process file, not fixed values
                creds_file = CredentialsFile(dirs.work, self.config.region)
        keys = OutputKeys.of(claim.tenant, claim.job_id)
        stage_inputs(claim, io, dirs, keys)
        if creds_file is not None and creds is not None:
            try:
                creds_file.write(creds)
            except OSError as exc:
                raise StagingError(f"the job's credentials file could not be written: {exc}") from exc
            job_creds = creds_file.env()
        mounts = data_mounts(claim.spec, self.config.datasets, dirs, stage_s3=io.stage_s3)
        launch = build_launch(
            claim,
            self.config,
            dirs,
            mounts,
            gpu_uuids=gpu_uuids,
            credentials=job_creds,
            secrets=resolve_secrets(claim, io),
        )
        return _Prepared(io, creds, creds_file, keys, launch)

    def _run_claimed(
        self, claim: Claim, token: str, entry: AttemptEntry, dirs: JobDirs
    ) -> tuple[JobResult, bool]:
        key = (claim.job_id, claim.attempt)
        try:
            io, creds, creds_file, keys, launch = self._prepare(claim, token, dirs)
        except (StagingError, ClaimError, AgentApiError) as exc:
            failure = FailureKind(exc.failure) if isinstance(exc, StagingError) else FailureKind.AGENT_ERROR
            return JobResult(None, failure, str(exc)), False
        shipper = logship.LogShipper(
            io.logs_client(),
            logship.log_group(claim.tenant, self.config.logs.group_prefix),
            logship.log_stream(claim.job_id, claim.attempt),
            settings=self.config.logs,
        )
        shipper.start()
        current = {"io": io}  # replaced when the credentials are refreshed

        def put(fh: BinaryIO, key: str, size: int) -> None:
            current["io"].put(fh, key, size)

        ckpt = DirSync(dirs.checkpoints, keys.checkpoints, put)
        with self._lock:
            self._ckpt[key] = ckpt
        syncs = PeriodicSync([DirSync(dirs.outputs, keys.outputs, put), ckpt], self.sync_interval_s)
        refresher: AttemptCredentials | None = None
        if creds is not None:

            def refreshed(fresh: Mapping[str, Any]) -> None:
                current["io"] = self.io_for(fresh)
                shipper.set_client(current["io"].logs_client())
                if creds_file is not None:
                    creds_file.write(fresh)

            refresher = AttemptCredentials(
                creds,
                lambda: self.api.credentials(claim.job_id, claim.attempt, token),
                on_refresh=refreshed,
            )
        try:
            try:
                marked = replace(launch, attempt_key=entry.attempt_key)
                handle = self.executor.start(marked, shipper.emit_line)
            except StartError as exc:
                return JobResult(None, exc.failure, str(exc)), False
            try:
                result = self._run_started(handle, token, entry, syncs, launch.gpu_uuids, refresher)
            except BaseException:
                # whatever broke here, the process has started: it ends before the GPUs are freed
                log.exception("attempt supervision failed: stopping the job", extra={"job_id": key[0]})
                stop_and_wait(handle)
                raise
        finally:
            syncs.final()
            shipper.close(timeout_s=30)
        return result, True

    def _run_started(
        self,
        handle: RunHandle,
        token: str,
        entry: AttemptEntry,
        syncs: PeriodicSync,
        gpus: tuple[str, ...],
        refresher: AttemptCredentials | None,
    ) -> JobResult:
        key = (entry.job_id, entry.attempt)
        with self._lock:
            self._running[key] = (token, handle)
            pending_cancel = self._cancel.get(key)
        if handle.pid is not None:
            self.ledger.started(entry, handle.pid, cgroup=handle.cgroup_path)
        if pending_cancel is not None:
            self._stop(handle, key, pending_cancel)
        started = StartedReport(
            lambda: self.api.report(entry.job_id, entry.attempt, token, "started"),
            retry_s=self.started_retry_s,
            what=entry.file_name,
        )
        self._act_on(started.send(), handle, key)
        return self._supervise(handle, syncs, key, gpus, refresher, started)

    def _act_on(self, answer: Answer, handle: RunHandle, key: tuple[str, int]) -> None:
        """What the ``started`` report's answer means for the running job (started_report)."""
        if answer is Answer.NOT_OURS:
            with self._lock:
                self._fenced.add(key)
            handle.cancel(0)
        elif answer is Answer.CANCELED:
            self.cancel(*key)

    def _supervise(
        self,
        handle: RunHandle,
        syncs: PeriodicSync,
        key: tuple[str, int],
        gpus: tuple[str, ...],
        refresher: AttemptCredentials | None = None,
        started: StartedReport | None = None,
    ) -> JobResult:
        next_sample = time.monotonic()
        next_stop_sync = 0.0
        try:
            while (result := handle.wait(self.tick_s)) is None:
                now = time.monotonic()
                with self._lock:
                    kill_at = self._kill_at.get(key)
                if kill_at is not None:
                    last = now >= kill_at - PRE_KILL_SYNC_S
                    if last or now >= next_stop_sync:
                        # Stopping: what the job checkpoints in its grace is uploaded as it lands,
                        # and once more just before the kill.
                        syncs.now()
                        next_stop_sync = now + STOP_SYNC_S
                    if last:
                        with self._lock:
                            self._kill_at.pop(key, None)
                if started is not None and started.retry_due():
                    self._act_on(started.send(), handle, key)
                if refresher is not None:
                    try:
                        refresher.maybe_refresh()
                    except Fenced:  # no longer ours: stop now, say nothing more
                        with self._lock:
                            self._fenced.add(key)
                        handle.cancel(0)
                        refresher = None
                    except Exception as exc:  # a refresh that breaks must not orphan the job
                        log.warning("credential refresh error", extra={"job_id": key[0], "error": str(exc)})
                syncs.tick()
                if self.sampler is not None and handle.pid is not None and now >= next_sample:
                    self._sample(key, handle.pid, list(gpus))
                    next_sample = now + self.sample_interval_s
            return result
        finally:
            self.usage.pop(key, None)
            if self.sampler is not None and handle.pid is not None:
                self.sampler.forget(handle.pid)

    def _sample(self, key: tuple[str, int], pgid: int, gpus: list[str]) -> None:
        assert self.sampler is not None
        try:
            usage = self.sampler.sample(pgid, gpus)
        except Exception as exc:  # NVML hiccups never stop a job
            log.warning("usage sample failed", extra={"job_id": key[0], "error": str(exc)})
            return
        self.usage[key] = usage
        log.info("usage", extra={"job_id": key[0], "attempt": key[1], "usage": usage.as_dict()})
        if self.metrics is not None:
            with self._lock:
                entry = self._running.get(key)
            if entry is not None:
                self.metrics.add(key, entry[0], usage)
