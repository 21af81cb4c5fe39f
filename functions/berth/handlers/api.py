"""The public HTTP API Lambda (API Gateway REST, AWS_IAM): the routers composed, errors mapped.

Each resource's routes live in their own module under ``berth.handlers.routes`` (one Powertools
``Router`` each, returning its pydantic response model from ``berth.handlers.schemas``). This module
only composes them into the resolver (validation on), maps domain and validation errors to the API's
error body, and is the Lambda entry point. The OpenAPI document in ``docs/openapi.json`` is generated
from the composed app (``python -m berth.handlers.openapi``).
"""

import json
import re
import warnings
from typing import Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError
from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.utilities.typing import LambdaContext

from berth.domain.errors import DomainError, InvalidRequest
from berth.domain.job_spec import FIELD_CHOICES, FIELD_FORMS, JobSpec
from berth.domain.storage import DataGrants, Dataset
from berth.domain.tenancy import Quota
from berth.handlers import idempotent_submit, telemetry
from berth.handlers.errors import BodyModel, error_response, from_domain, from_validation
from berth.handlers.request_guard import body_problem, with_canonical_content_type
from berth.handlers.routes import data, fleet, job_output, jobs, policy, tenants, usage
from berth.handlers.settings import settings

logger = Logger()
tracer = Tracer()
metrics = Metrics(namespace="Berth")
app = APIGatewayRestResolver(enable_validation=True)
app.configure_openapi(
    title="Berth API",
    version="1.0.0",
    summary="Hybrid-cloud GPU allocation for ML training jobs",
    description="Every route is signed with AWS SigV4 (service `execute-api`). Errors are "
    '`{"error": {"code", "message", "details"}}`.',
)
for _routes in (jobs, job_output, fleet, policy, tenants, data, usage):
    app.include_router(_routes.router)

# Reads publish no business metrics; that is expected, not worth a warning per request.
warnings.filterwarnings("ignore", "No application metrics to publish", UserWarning)


# -- errors ---------------------------------------------------------------------------------------
@app.exception_handler(DomainError)
def _domain_error(exc: DomainError) -> Response[Any]:
    if not isinstance(exc, (InvalidRequest,)):
        logger.info("request refused", extra={"code": exc.code, "error": exc.message})
    return from_domain(exc)


#: Bodies whose validation errors are told in their model's words, by method and path.
_BODIES: list[tuple[str, re.Pattern[str], BodyModel]] = [
    ("POST", re.compile(r"^/v1/jobs/?$"), (JobSpec, FIELD_FORMS, FIELD_CHOICES)),
    ("PUT", re.compile(r"^/v1/tenants/[^/]+/quota/?$"), (Quota, {}, {})),
    ("PUT", re.compile(r"^/v1/datasets/[^/]+/?$"), (Dataset, {}, {})),
    ("PUT", re.compile(r"^/v1/tenants/[^/]+/grants/?$"), (DataGrants, {}, {})),
]


@app.exception_handler(RequestValidationError)
def _validation_error(exc: RequestValidationError) -> Response[Any]:
    event = app.current_event
    body = next((b for m, path, b in _BODIES if m == event.http_method and path.match(event.path)), None)
    return from_validation(exc, body)


@app.not_found
def _not_found(_exc: Exception) -> Response[Any]:
    return error_response(
        404, "NotFound", f"no route {app.current_event.http_method} {app.current_event.path}"
    )


# -- entry point ----------------------------------------------------------------------------------
def _plain(resp: Response[Any]) -> dict[str, Any]:
    return {
        "statusCode": resp.status_code,
        "headers": {"Content-Type": "application/json"},
        "body": json.dumps(resp.body),
        "isBase64Encoded": False,
    }


@logger.inject_lambda_context(correlation_id_path=correlation_paths.API_GATEWAY_REST, clear_state=True)
@tracer.capture_lambda_handler(capture_response=False)  # responses carry job specs, env included
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    try:
        problem = body_problem(event, settings().max_body_bytes)
        if problem is not None:
            response = _plain(from_domain(problem))
        else:
            idempotent_submit.config().register_lambda_context(context)
            response = app.resolve(with_canonical_content_type(event), context)
    except Exception:
        telemetry.api_request(event, 500)  # unhandled: API Gateway answers 502
        raise
    telemetry.api_request(event, int(response.get("statusCode") or 500))
    return response
