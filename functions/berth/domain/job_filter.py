"""Filters of a job listing (``GET /v1/jobs``) beside ``status``: what each costs decides where it runs.

``since`` is a key condition on the listing's index (its sort key starts with the creation time), so
it costs nothing extra and pages stay full. ``name`` and ``site`` are not in the keys-only index:
they are applied to each page after it is read, as a DynamoDB filter expression would be, so a page
may hold fewer than ``limit`` jobs (even none) while ``next_token`` says there is more.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from berth.domain.placement import Site

#: Characters that make ``name`` a glob rather than a substring.
GLOB_CHARS = frozenset("*?[")
#: What ``name`` may hold: job-name characters and the glob's.
NAME_FILTER_RE = r"^[a-z0-9*?\[\]!-]{1,64}$"


@dataclass(frozen=True, slots=True)
class JobFilter:
    since: datetime | None = None
    """Only jobs created at or after this time."""
    name: str | None = None
    """A substring of the job's name, or a glob over the whole name when it has ``*``, ``?`` or ``[``."""
    site: Site | None = None
    """Only jobs placed at this site (a job not placed yet, or an array's parent, has none)."""

    @property
    def filters_page(self) -> bool:
        """Whether some rows of a page read may be left out (pages then hold at most ``limit``)."""
        return self.name is not None or self.site is not None

    def matches(self, job: Any) -> bool:
        """``job``: a job or an array (anything with ``spec.name`` and, for a job, ``site``)."""
        if self.name is not None and not name_matches(self.name, job.spec.name):
            return False
        return self.site is None or getattr(job, "site", None) is self.site


def name_matches(pattern: str, name: str) -> bool:
    if GLOB_CHARS & set(pattern):
        return fnmatch.fnmatchcase(name, pattern)
    return pattern in name
