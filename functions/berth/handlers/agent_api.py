"""The agent API (``/v1/agent/*``, docs/agent-protocol.md): its own Lambda, answering host
identities only. Each route verifies the caller as a registered host (``TenantService.host``), then
calls one ``AgentService`` method; the host id always comes from the identity, never the body."""

from __future__ import annotations

import json
from typing import Annotated, Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response, content_types
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError
from aws_lambda_powertools.event_handler.openapi.params import Body
from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.utilities.typing import LambdaContext
from pydantic import BaseModel, ConfigDict

from berth.domain.errors import DomainError
from berth.domain.fleet import HostInventory
from berth.domain.identity import Identity
from berth.domain.observability import MetricsBatch
from berth.domain.workflow import AttemptRef, AttemptReport, HeartbeatRequest
from berth.handlers.errors import error_response, from_domain, from_validation
from berth.handlers.request_guard import body_problem, with_canonical_content_type
from berth.handlers.runtime import agent_service, host_identities
from berth.handlers.settings import settings
from berth.logic.agent import HostCaller

logger = Logger()
app = APIGatewayRestResolver(enable_validation=True)


class RegisterIn(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    inventory: HostInventory
    agent_version: str = ""


def _host() -> HostCaller:
    identity = app.current_event.request_context.identity
    host_id, principal = host_identities().host(Identity(arn=identity.user_arn, unique_id=identity.user))
    logger.append_keys(host_id=host_id)
    return HostCaller(host_id=host_id, principal=principal)


def _json(status: int, body: Any) -> Response[Any]:
    return Response(status_code=status, content_type=content_types.APPLICATION_JSON, body=body)


@app.post("/v1/agent/register")
def register(request: Annotated[RegisterIn, Body(embed=False)]) -> Response[Any]:
    return _json(200, agent_service().register(_host(), request.inventory))


@app.post("/v1/agent/heartbeat")
def heartbeat(request: Annotated[HeartbeatRequest, Body(embed=False)]) -> Response[Any]:
    return _json(200, agent_service().heartbeat(_host(), request))


@app.post("/v1/agent/claim")
def claim(request: Annotated[AttemptRef, Body(embed=False)]) -> Response[Any]:
    return _json(200, agent_service().claim(_host(), request))


@app.post("/v1/agent/report")
def report(request: Annotated[AttemptReport, Body(embed=False)]) -> Response[Any]:
    return _json(200, agent_service().report(_host(), request))


@app.post("/v1/agent/credentials")
def credentials(request: Annotated[AttemptRef, Body(embed=False)]) -> Response[Any]:
    return _json(200, agent_service().credentials(_host(), request))


@app.post("/v1/agent/metrics")
def metrics(request: Annotated[MetricsBatch, Body(embed=False)]) -> Response[Any]:
    return _json(200, agent_service().metrics(_host(), request))


@app.exception_handler(DomainError)
def _domain_error(exc: DomainError) -> Response[Any]:
    logger.info("agent request refused", extra={"code": exc.code, "error": exc.message})
    return from_domain(exc)


@app.exception_handler(RequestValidationError)
def _validation_error(exc: RequestValidationError) -> Response[Any]:
    return from_validation(exc)


@app.not_found
def _not_found(_exc: Exception) -> Response[Any]:
    return error_response(
        404, "NotFound", f"no route {app.current_event.http_method} {app.current_event.path}"
    )


@logger.inject_lambda_context(correlation_id_path=correlation_paths.API_GATEWAY_REST, clear_state=True)
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    problem = body_problem(event, settings().max_body_bytes)
    if problem is not None:
        resp = from_domain(problem)
        return {
            "statusCode": resp.status_code,
            "headers": {"Content-Type": "application/json"},
            "body": json.dumps(resp.body),
            "isBase64Encoded": False,
        }
    return app.resolve(with_canonical_content_type(event), context)
