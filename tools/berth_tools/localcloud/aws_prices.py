"""AWS list prices (us-east-1) and the bill of a meter snapshot (`metering.Meter.snapshot()`).

Sources: AWS's public pricing pages below (the figures as published there; recorded 2026-12-01 from an
offline machine, so recheck them before quoting). No free tier is applied, as for a production account:
- Step Functions Standard: $0.025 per 1,000 state transitions (https://aws.amazon.com/step-functions/pricing/).
- Lambda (x86): $0.0000166667 per GB-second and $0.20 per 1M requests (https://aws.amazon.com/lambda/pricing/).
- DynamoDB on-demand, Standard table class: $0.625 per million write request units and $0.125 per million
  read request units, the prices since the on-demand price cut of 2024-11-01
  (https://aws.amazon.com/dynamodb/pricing/on-demand/, "What's New" of 2024-11-14).
- SQS Standard: $0.40 per million requests, each 64 KB chunk of a payload one request
  (https://aws.amazon.com/sqs/pricing/).
- EventBridge custom events: $1.00 per million events, each 64 KB chunk one event
  (https://aws.amazon.com/eventbridge/pricing/).
- API Gateway REST APIs: $3.50 per million requests, first tier (https://aws.amazon.com/api-gateway/pricing/).
- CloudWatch Logs ingestion (Standard log class): $0.50 per GB (https://aws.amazon.com/cloudwatch/pricing/).
"""

from __future__ import annotations

from typing import Any

PRICES_DATE = "2026-12-01"
REGION = "us-east-1"

#: USD per unit, by what is billed.
PRICES: dict[str, float] = {
    "stepfunctions_state_transition": 0.025 / 1_000,
    "lambda_gb_second": 0.0000166667,
    "lambda_request": 0.20 / 1_000_000,
    "dynamodb_write_request_unit": 0.625 / 1_000_000,
    "dynamodb_read_request_unit": 0.125 / 1_000_000,
    "sqs_request": 0.40 / 1_000_000,
    "eventbridge_event": 1.00 / 1_000_000,
    "apigateway_rest_request": 3.50 / 1_000_000,
    "logs_ingested_gb": 0.50,
}
GB = 1024**3


def bill(snapshot: dict[str, Any]) -> dict[str, Any]:
    """`{"per_service_usd": {...}, "total_usd": ...}` for a meter snapshot, at list prices."""
    p = PRICES
    ddb = snapshot.get("dynamodb", {})
    lam = snapshot.get("lambda", {})
    per_service = {
        "stepfunctions": snapshot.get("stepfunctions", {}).get("state_transitions", 0)
        * p["stepfunctions_state_transition"],
        "lambda": lam.get("gb_seconds", 0.0) * p["lambda_gb_second"]
        + lam.get("invocations", 0) * p["lambda_request"],
        "dynamodb": ddb.get("write_units", 0.0) * p["dynamodb_write_request_unit"]
        + ddb.get("read_units", 0.0) * p["dynamodb_read_request_unit"],
        "sqs": snapshot.get("sqs", {}).get("billed_requests", 0) * p["sqs_request"],
        "eventbridge": snapshot.get("events", {}).get("billed_events", 0) * p["eventbridge_event"],
        "apigateway": snapshot.get("apigateway", {}).get("requests", 0) * p["apigateway_rest_request"],
        "logs": snapshot.get("logs", {}).get("ingested_bytes", 0) / GB * p["logs_ingested_gb"],
    }
    return {
        "per_service_usd": per_service,
        "total_usd": sum(per_service.values()),
        "prices": {"region": REGION, "date": PRICES_DATE},
    }


def cost_per_1000_jobs(bill_: dict[str, Any], jobs: int) -> float:
    """What the metered bill of `jobs` jobs comes to per 1,000 jobs (USD)."""
    if jobs <= 0:
        raise ValueError("jobs must be positive")
    return float(bill_["total_usd"]) * 1000 / jobs
