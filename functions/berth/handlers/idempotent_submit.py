"""``POST /v1/jobs`` with an ``Idempotency-Key``: Powertools Idempotency over the submit use case.

The same key and body give the same job (or array); the same key with another body is refused
(``IdempotencyMismatch``, 409); a key whose first request is still running answers 429.
"""

from __future__ import annotations

from contextvars import ContextVar
from functools import cache
from typing import Any

from aws_lambda_powertools.utilities.idempotency import (
    DynamoDBPersistenceLayer,
    IdempotencyConfig,
    idempotent_function,
)
from aws_lambda_powertools.utilities.idempotency.exceptions import (
    IdempotencyAlreadyInProgressError,
    IdempotencyValidationError,
)

from berth.domain.errors import IdempotencyMismatch, InvalidRequest, RequestInProgress
from berth.domain.job_spec import JobSpec
from berth.domain.tenancy import Caller, Role
from berth.handlers import services
from berth.handlers.settings import settings

IDEMPOTENCY_KEY_MAX = 128

#: The job (or array) ``submit_once`` created or found in this request: the answer, without reading
#: it again. Unset when Powertools answered from its record (a replay), which reads it afresh.
_submitted: ContextVar[Any] = ContextVar("submitted", default=None)


@cache
def _idempotent_submit() -> tuple[Any, IdempotencyConfig]:
    cfg = settings()
    config = IdempotencyConfig(
        event_key_jmespath="[tenant, key]",
        payload_validation_jmespath="spec",
        expires_after_seconds=cfg.idempotency_ttl_s,
        raise_on_no_idempotency_key=True,
    )
    store = DynamoDBPersistenceLayer(table_name=cfg.idempotency_table)

    @idempotent_function(data_keyword_argument="request", persistence_store=store, config=config)
    def submit_once(request: dict[str, Any]) -> dict[str, Any]:
        caller = Caller(
            principal=request["principal"],
            tenant=request["tenant"],
            role=Role(request["role"]),
            actor=request["actor"],
        )
        spec = JobSpec.model_validate(request["spec"])
        if spec.array is not None:
            created: Any = services.arrays().submit(caller, spec, request["key"])
        else:
            created = services.jobs().submit(caller, spec, request["key"])
        _submitted.set(created)
        return {"job_id": created.id}

    return submit_once, config


def config() -> IdempotencyConfig:
    """The idempotency config (the entry point registers each invocation's Lambda context on it)."""
    return _idempotent_submit()[1]


def submit(caller: Caller, spec: JobSpec, key: str) -> Any:
    """The job or array this key names: created now, or the one its first request created."""
    if not key or len(key) > IDEMPOTENCY_KEY_MAX or not key.isprintable():
        raise InvalidRequest(f"Idempotency-Key must be 1..{IDEMPOTENCY_KEY_MAX} printable characters")
    submit_once, _config = _idempotent_submit()
    request = {
        "tenant": caller.tenant,
        "key": key,
        "principal": caller.principal,
        "role": str(caller.role),
        "actor": caller.actor,
        "spec": spec.model_dump(mode="json"),
    }
    _submitted.set(None)
    try:
        job_id = submit_once(request=request)["job_id"]
    except IdempotencyValidationError as exc:
        raise IdempotencyMismatch(
            "this Idempotency-Key was already used with a different job spec; use a new key"
        ) from exc
    except IdempotencyAlreadyInProgressError as exc:
        raise RequestInProgress(
            "a request with this Idempotency-Key is still in progress; retry shortly"
        ) from exc
    created = _submitted.get()
    _submitted.set(None)
    return created if created is not None and created.id == job_id else services.job_or_array(caller, job_id)
