"""The agent API's host identity cache (berth.logic.host_identities): accepted identities are kept for
a while, refusals never, and the key is the signer's ARN and unique id together."""

from __future__ import annotations

import pytest

from berth.domain.errors import Forbidden
from berth.domain.identity import Identity
from berth.logic.host_identities import HostIdentities
from berth.logic.kept_answers import MAX_KEPT

ARN = "arn:aws:sts::123456789012:assumed-role/berth-host-h0/i-0abc"
UID = "AROAEXAMPLEEXAMPLE01:i-0abc"


class Registry:
    """``TenantService.host`` over a dict of (arn, unique id) -> host id, counting its reads."""

    def __init__(self) -> None:
        self.hosts: dict[tuple[str | None, str | None], str] = {(ARN, UID): "h0"}
        self.reads = 0

    def host(self, identity: Identity) -> tuple[str, str]:
        self.reads += 1
        found = self.hosts.get((identity.arn, identity.unique_id))
        if found is None:
            raise Forbidden("not a registered Berth host")
        return found, str(identity.arn)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_accepted_identity_is_read_once_for_its_ttl_and_again_after() -> None:
    reg, clock = Registry(), Clock()
    cache = HostIdentities(reg.host, ttl_s=30, clock=clock)
    for _ in range(5):
        assert cache.host(Identity(ARN, UID)) == ("h0", ARN)
    assert reg.reads == 1
    clock.now += 29.9
    cache.host(Identity(ARN, UID))
    assert reg.reads == 1
    clock.now += 0.2
    cache.host(Identity(ARN, UID))
    assert reg.reads == 2


def test_a_removed_host_is_refused_once_its_entry_expires() -> None:
    reg, clock = Registry(), Clock()
    cache = HostIdentities(reg.host, ttl_s=30, clock=clock)
    cache.host(Identity(ARN, UID))
    del reg.hosts[(ARN, UID)]
    clock.now += 31
    with pytest.raises(Forbidden):
        cache.host(Identity(ARN, UID))


def test_a_refusal_is_never_kept() -> None:
    reg, clock = Registry(), Clock()
    cache = HostIdentities(reg.host, ttl_s=30, clock=clock)
    stranger = Identity("arn:aws:iam::123456789012:user/mallory", "AIDAEXAMPLEEXAMPLE99")
    for _ in range(3):
        with pytest.raises(Forbidden):
            cache.host(stranger)
    assert reg.reads == 3
    reg.hosts[(stranger.arn, stranger.unique_id)] = "h9"  # registered now: accepted at once
    assert cache.host(stranger) == ("h9", stranger.arn)


def test_the_same_name_with_another_unique_id_is_read_and_refused() -> None:
    """A host role deleted and recreated under its name signs with a new unique id: not the kept one."""
    reg, clock = Registry(), Clock()
    cache = HostIdentities(reg.host, ttl_s=30, clock=clock)
    cache.host(Identity(ARN, UID))
    with pytest.raises(Forbidden):
        cache.host(Identity(ARN, "AROAOTHEROTHEROTHER1:i-0abc"))
    assert reg.reads == 2


def test_ttl_zero_reads_every_time() -> None:
    reg = Registry()
    cache = HostIdentities(reg.host, ttl_s=0, clock=Clock())
    cache.host(Identity(ARN, UID))
    cache.host(Identity(ARN, UID))
    assert reg.reads == 2


def test_the_kept_identities_stay_bounded() -> None:
    reg, clock = Registry(), Clock()
    for i in range(MAX_KEPT + 10):
        reg.hosts[(f"arn-{i}", "u")] = f"h{i}"
    cache = HostIdentities(reg.host, ttl_s=30, clock=clock)
    for i in range(MAX_KEPT + 10):
        clock.now += 0.001
        cache.host(Identity(f"arn-{i}", "u"))
    assert len(cache._kept) <= MAX_KEPT
    reads = reg.reads
    cache.host(Identity(f"arn-{MAX_KEPT + 9}", "u"))  # the newest is still kept
    assert reg.reads == reads
