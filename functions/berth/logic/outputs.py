"""Where a job's outputs and checkpoints are, and presigned GETs for them (``GET /v1/jobs/{id}/outputs``).

A job writes ``$BERTH_OUTPUT_DIR`` and ``$BERTH_CHECKPOINT_DIR``; its executor uploads them to
``<tenant>/jobs/<job>/outputs/`` and ``.../checkpoints/`` in the data bucket with the attempt's own
credentials (docs/data.md). The caller gets that location and, per object, a GET URL valid for a few
minutes, signed by the API for that one key: the prefix comes from the job record the tenant check
returned (another tenant's job answers 404 before anything is listed), so a member can never be handed
another tenant's objects, and the caller needs no S3 rights of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from berth.domain.errors import InvalidRequest
from berth.domain.ports import OutputStore
from berth.domain.storage import job_output_prefix

#: How long a presigned GET is valid.
GET_URL_TTL_S = 900
MAX_LIMIT = 1000
#: A page token is the key (relative to the job's prefix) the next page starts after.
MAX_TOKEN_CHARS = 1024


def output_prefix(tenant: str, job_id: str, is_array: bool) -> str:
    """A job's (or an array task's) prefix; an array's id: every task's (``<array id>:<i>/``)."""
    prefix = job_output_prefix(tenant, job_id)
    return prefix[:-1] + ":" if is_array else prefix


@dataclass(frozen=True)
class OutputService:
    store: OutputStore
    url_ttl_s: int = GET_URL_TTL_S

    def list(
        self, tenant: str, job_id: str, is_array: bool, limit: int, next_token: str | None
    ) -> dict[str, Any]:
        """The objects under the job's prefix, key order; ``tenant`` and ``job_id`` are the job
        record's (already tenant-checked by the caller)."""
        prefix = output_prefix(tenant, job_id, is_array)
        if next_token is not None and (
            not next_token or len(next_token) > MAX_TOKEN_CHARS or not next_token.isprintable()
        ):
            raise InvalidRequest("next_token is not one this route gave out")
        page = self.store.list_presigned(
            prefix, None if next_token is None else prefix + next_token, min(limit, MAX_LIMIT), self.url_ttl_s
        )
        location = f"s3://{self.store.bucket}/{prefix}"
        return {
            "job_id": job_id,
            "location": location,
            # An array's tasks each have their own (``<i>/outputs/``, ``<i>/checkpoints/``).
            "outputs": None if is_array else location + "outputs/",
            "checkpoints": None if is_array else location + "checkpoints/",
            "objects": [
                {
                    "key": o.key,
                    "path": o.key[len(prefix) :],
                    "size": o.size,
                    "last_modified": o.last_modified.isoformat(),
                    "url": o.url,
                }
                for o in page.objects
            ],
            "url_expires_in_s": self.url_ttl_s,
            "next_token": None if page.last_key is None else page.last_key[len(prefix) :],
        }
