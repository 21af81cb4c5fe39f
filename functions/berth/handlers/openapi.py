"""Print the OpenAPI document generated from the API routes (committed as docs/openapi.json)."""

from __future__ import annotations

import json
import os


def document() -> str:
    # Building the schema needs no AWS; placeholders satisfy the settings if they're unset.
    for name in ("JOBS_TABLE", "JOB_EVENTS_TABLE", "TENANTS_TABLE", "IDEMPOTENCY_TABLE"):
        os.environ.setdefault(f"BERTH_{name}", "unset")
    from berth.handlers.api import app

    return json.dumps(json.loads(app.get_openapi_json_schema()), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    print(document(), end="")
