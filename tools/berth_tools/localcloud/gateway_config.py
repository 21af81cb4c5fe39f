"""What the deployed template says about the API beyond its routes: its gateway responses and its
resource policy, read from the very template that goes to AWS.

moto's CloudFormation drops both (``AWS::ApiGateway::GatewayResponse`` is not implemented and the
RestApi's ``Policy`` is not passed on), so the front door takes them from the template, resolving the
few intrinsic functions they use (Ref to pseudo parameters and to the API, Fn::Join, Fn::Sub).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from werkzeug.wrappers import Response

#: API Gateway's default status for each gateway response type it can send (AWS docs, "Gateway
#: response types"); types that fall back to DEFAULT_4XX or DEFAULT_5XX by this status.
DEFAULT_STATUS: dict[str, int] = {
    "ACCESS_DENIED": 403,
    "API_CONFIGURATION_ERROR": 500,
    "BAD_REQUEST_BODY": 400,
    "BAD_REQUEST_PARAMETERS": 400,
    "EXPIRED_TOKEN": 403,
    "INTEGRATION_FAILURE": 504,
    "INTEGRATION_TIMEOUT": 504,
    "INVALID_SIGNATURE": 403,
    "MISSING_AUTHENTICATION_TOKEN": 403,
    "QUOTA_EXCEEDED": 429,
    "REQUEST_TOO_LARGE": 413,
    "RESOURCE_NOT_FOUND": 404,
    "THROTTLED": 429,
    "UNAUTHORIZED": 401,
    "UNSUPPORTED_MEDIA_TYPE": 415,
}


@dataclass(frozen=True)
class GatewayResponse:
    status: int | None
    templates: dict[str, str]
    headers: dict[str, str]


@dataclass(frozen=True)
class GatewayConfig:
    """The gateway responses (by type) and the resource policy of one deployed REST API."""

    responses: dict[str, GatewayResponse] = field(default_factory=dict)
    policy: dict[str, Any] | None = None

    def refusal(
        self,
        response_type: str,
        message: str,
        *,
        status: int | None = None,
        error_type: str | None = None,
    ) -> Response:
        """A refusal as API Gateway sends it: the type's own gateway response, else DEFAULT_4XX/5XX,
        else API Gateway's built-in ``{"message": ...}``; status from the response if it sets one."""
        base = status or DEFAULT_STATUS.get(response_type, 500)
        fallback = self.responses.get("DEFAULT_4XX" if base < 500 else "DEFAULT_5XX")
        specific = self.responses.get(response_type)
        chosen = specific or fallback
        code = (specific.status if specific else None) or (fallback.status if fallback else None) or base
        template = chosen.templates.get("application/json") if chosen else None
        body = _render(template, response_type, message) if template else json.dumps({"message": message})
        response = Response(body, status=code, content_type="application/json")
        for name, value in (chosen.headers if chosen else {}).items():
            response.headers[name] = value
        if error_type:
            response.headers["x-amzn-ErrorType"] = error_type
        return response


def _render(template: str, response_type: str, message: str) -> str:
    # The variables Berth's templates use; messageString is the JSON-quoted message.
    return (
        template.replace("$context.error.messageString", json.dumps(message))
        .replace("$context.error.message", message)
        .replace("$context.error.responseType", response_type)
    )


def from_template(
    template: dict[str, Any], rest_api_logical_id: str, rest_api_id: str, account: str, region: str
) -> GatewayConfig:
    resources: dict[str, Any] = template.get("Resources", {})
    partition = "aws-cn" if region.startswith("cn-") else "aws"
    refs = {
        "AWS::AccountId": account,
        "AWS::Region": region,
        "AWS::Partition": partition,
        "AWS::URLSuffix": "amazonaws.com.cn" if partition == "aws-cn" else "amazonaws.com",
        rest_api_logical_id: rest_api_id,
    }
    responses: dict[str, GatewayResponse] = {}
    for resource in resources.values():
        if resource.get("Type") != "AWS::ApiGateway::GatewayResponse":
            continue
        props = resource.get("Properties", {})
        if props.get("RestApiId") != {"Ref": rest_api_logical_id}:
            continue
        headers = {
            name.removeprefix("gatewayresponse.header."): str(value).strip("'")
            for name, value in (props.get("ResponseParameters") or {}).items()
        }
        status = props.get("StatusCode")
        responses[props["ResponseType"]] = GatewayResponse(
            status=int(status) if status else None,
            templates=dict(props.get("ResponseTemplates") or {}),
            headers=headers,
        )
    policy = resources.get(rest_api_logical_id, {}).get("Properties", {}).get("Policy")
    resolved = _resolve(policy, refs) if policy is not None else None
    if isinstance(resolved, str):
        resolved = json.loads(resolved)
    return GatewayConfig(responses=responses, policy=resolved)


_SUB = re.compile(r"\$\{([^}!][^}]*)\}")


def _resolve(value: Any, refs: dict[str, str]) -> Any:
    """Resolve Ref, Fn::Join and Fn::Sub; anything else in a policy is refused (fail closed)."""
    if isinstance(value, list):
        return [_resolve(v, refs) for v in value]
    if not isinstance(value, dict):
        return value
    if set(value) == {"Ref"}:
        if value["Ref"] not in refs:
            raise ValueError(f"cannot resolve Ref {value['Ref']!r} in the API's resource policy")
        return refs[value["Ref"]]
    if set(value) == {"Fn::Join"}:
        sep, parts = value["Fn::Join"]
        return sep.join(str(_resolve(p, refs)) for p in parts)
    if set(value) == {"Fn::Sub"}:
        text, extra = (value["Fn::Sub"], {}) if isinstance(value["Fn::Sub"], str) else value["Fn::Sub"]
        names = {**refs, **{k: str(_resolve(v, refs)) for k, v in extra.items()}}

        def sub(m: re.Match[str]) -> str:
            if m[1] not in names:
                raise ValueError(f"cannot resolve ${{{m[1]}}} in the API's resource policy")
            return names[m[1]]

        return _SUB.sub(sub, text)
    if any(key.startswith("Fn::") for key in value):
        raise ValueError(f"unsupported intrinsic {sorted(value)} in the API's resource policy")
    return {k: _resolve(v, refs) for k, v in value.items()}
