"""The agent API's verified host identities, kept in the sandbox for a short while.

Every agent request (claim, credentials, reports, heartbeats, metrics) first maps its signer to a
registered host: one GetItem of the signer's ``PRINCIPAL#`` item (``TenantService.host``). A host
makes several such requests per job, and the mapping changes only when an admin registers or removes
a host, so a sandbox keeps each *accepted* identity for ``ttl_s`` seconds, as API Gateway's authorizer
cache does for its callers:

- the key is the signer's ARN **and** unique id: a role deleted and recreated under the same name
  signs with a new unique id, misses, and is read (and refused) at once;
- a refusal is never kept: an unknown or wrongly registered signer is read again on every request;
- what the cache can delay is a removal: a host whose ``PRINCIPAL#`` item is deleted or changed keeps
  its identity in a warm sandbox for at most ``ttl_s`` more. Nothing about an attempt is kept: its
  fencing token, placement and claim are checked against the job on every request, so a removed
  host's attempts still stop as soon as the fleet reaper or an operator ends them.

``ttl_s`` 0 reads every time (docs/agent-protocol.md, "Who is calling").
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from berth.domain.identity import Identity
from berth.logic.kept_answers import KeptAnswers


@dataclass
class HostIdentities:
    """``host(identity)`` as ``TenantService.host`` answers it, reusing an accepted answer for ``ttl_s``."""

    #: The uncached lookup: ``TenantService(tenants).host``; raises Forbidden for anyone not a host.
    lookup: Callable[[Identity], tuple[str, str]]
    ttl_s: float = 30.0
    clock: Callable[[], float] = time.monotonic
    _kept: KeptAnswers[Identity, tuple[str, str]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._kept = KeptAnswers(self.ttl_s, self.clock)

    def host(self, identity: Identity) -> tuple[str, str]:
        """(host id, principal) of a verified host identity; Forbidden (not kept) for anyone else.
        Kept by the whole identity: its ARN and its unique id."""
        return self._kept.get(identity, self.lookup)
