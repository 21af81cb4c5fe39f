"""The job state machine's task Lambda: one action per task state (docs/workflow.md). Thin: parse
the state's input, call ``WorkflowService``, return its answer to the state machine."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.typing import LambdaContext
from pydantic import BaseModel, ConfigDict, Field

from berth.domain.workflow import Failure
from berth.handlers import telemetry
from berth.handlers.runtime import cloud_dispatch_service, workflow_service

logger = Logger()


class TaskInput(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    action: str
    job_id: str = Field(min_length=1, max_length=64)
    task_token: str | None = None
    execution: str | None = None
    attempt: int = 0
    error: str | None = None
    cause: str | None = None


@logger.inject_lambda_context(clear_state=True)
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    task = TaskInput.model_validate(event)
    logger.append_keys(job_id=task.job_id, action=task.action, attempt=task.attempt)
    service = workflow_service()
    if task.action == "await_placement":
        assert task.task_token
        service.await_placement(task.job_id, task.task_token, task.execution)
        return {}
    if task.action == "dispatch_onprem":
        assert task.task_token
        service.dispatch_onprem(task.job_id, task.attempt, task.task_token)
        return {}
    if task.action == "dispatch_cloud":
        assert task.task_token
        cloud = cloud_dispatch_service()
        if cloud is None:
            # No cloud dispatcher in this deployment: the attempt fails and is re-placed elsewhere.
            service.tokens.fail(
                task.task_token, Failure.CLOUD_API.error_name, "no cloud dispatcher is deployed"
            )
            return {}
        cloud.dispatch(task.job_id, task.attempt, task.task_token)
        return {}
    if task.action == "classify_failure":
        result = service.classify_failure(task.job_id, task.attempt, task.error, task.cause)
        logger.info("attempt failed", extra={"error": task.error, **result})
        telemetry.attempt_classified(result)
        return result
    if task.action == "requeue":
        return service.requeue(task.job_id)
    if task.action == "finalize":
        return service.finalize(task.job_id, task.attempt)
    raise ValueError(f"unknown workflow action {task.action!r}")
