"""Answers a Lambda sandbox keeps for a few seconds: ``KeptAnswers.get(key, read)``.

For reads whose answer changes only when an admin acts (a host's registration, a team's data grants)
and that a sandbox would otherwise repeat on every request. Only answers are kept: a read that raises
(a refusal, the store unavailable) is repeated by the next request. Each user says what the delay
means for it (``logic/host_identities.py``, ``logic/credentials.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

#: Past this many keys, the oldest half is dropped.
MAX_KEPT = 4096


@dataclass
class KeptAnswers(Generic[K, V]):
    """``read(key)``'s answer, reused for ``ttl_s`` seconds (0: read every time)."""

    ttl_s: float
    clock: Callable[[], float] = time.monotonic
    max_kept: int = MAX_KEPT
    _kept: dict[K, tuple[float, V]] = field(default_factory=dict, repr=False)

    def get(self, key: K, read: Callable[[K], V]) -> V:
        now = self.clock()
        hit = self._kept.get(key)
        if hit is not None and now < hit[0]:
            return hit[1]
        answer = read(key)
        if self.ttl_s > 0:
            if len(self._kept) >= self.max_kept:
                for old in sorted(self._kept, key=lambda k: self._kept[k][0])[: self.max_kept // 2]:
                    del self._kept[old]
            self._kept[key] = (now + self.ttl_s, answer)
        return answer

    def __len__(self) -> int:
        return len(self._kept)
