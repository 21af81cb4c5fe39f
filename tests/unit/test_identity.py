"""Who a caller really is: unique ids, actors, refused principal kinds, strict ARN patterns."""

from __future__ import annotations

import pytest

from berth.domain.errors import Forbidden, Unauthenticated
from berth.domain.identity import Identity, PrincipalKind, canonical_principal, resolve_principal
from berth.domain.tenancy import Caller, Role
from berth.logic.tenants import TenantService
from tests.unit.fakes import FakeTenants

ACCOUNT = "123456789012"
ROLE = f"arn:aws:iam::{ACCOUNT}:role/vision-team"
ROLE_ID = "AROAVISIONTEAM0000001"
SESSION = f"arn:aws:sts::{ACCOUNT}:assumed-role/vision-team/alice@example.com"


def test_assumed_role_session_maps_to_role_with_actor() -> None:
    p = resolve_principal(Identity(SESSION, f"{ROLE_ID}:alice@example.com"))
    assert (p.arn, p.unique_id, p.kind, p.actor) == (ROLE, ROLE_ID, PrincipalKind.ROLE, "alice@example.com")


def test_iam_user_keeps_its_arn_and_name() -> None:
    arn = f"arn:aws:iam::{ACCOUNT}:user/ci/deployer"
    p = resolve_principal(Identity(arn, "AIDADEPLOYER000000001"))
    assert (p.arn, p.unique_id, p.kind) == (arn, "AIDADEPLOYER000000001", PrincipalKind.USER)
    assert p.actor == "deployer"


@pytest.mark.parametrize(
    "arn",
    [
        f"arn:aws:iam::{ACCOUNT}:root",
        f"arn:aws:sts::{ACCOUNT}:federated-user/alice",
        f"arn:aws-us-gov:sts::{ACCOUNT}:federated-user/alice",
    ],
)
def test_root_and_federated_users_are_refused(arn: str) -> None:
    with pytest.raises(Forbidden):
        resolve_principal(Identity(arn, "AIDAANYTHING000000001"))


@pytest.mark.parametrize(
    "arn",
    [
        f"arn:aws:sts::{ACCOUNT}:assumed-role/vision-team/alice\n",  # trailing newline ($ would pass it)
        f"arn:aws:sts::{ACCOUNT}:assumed-role/vision-team/alice/extra",
        f"arn:aws:sts::{ACCOUNT}:assumed-role/vision-t\u0435am/alice",  # Cyrillic small ie
        "arn:aws:sts::١٢٣٤٥٦٧٨٩٠١٢:assumed-role/vision-team/alice",  # Arabic-Indic digits match \\d
        f"arn:aws:iam::{ACCOUNT}:group/admins",
        f"arn:aws:iam::{ACCOUNT}:user/",
        f"xarn:aws:iam::{ACCOUNT}:user/alice",
    ],
)
def test_arn_patterns_are_ascii_full_matches(arn: str) -> None:
    with pytest.raises(Forbidden):
        resolve_principal(Identity(arn, f"{ROLE_ID}:alice"))
    assert canonical_principal(arn) == arn  # nothing odd is ever reduced to a role


def test_unique_id_must_match_the_session() -> None:
    with pytest.raises(Forbidden):
        resolve_principal(Identity(SESSION, f"{ROLE_ID}:mallory"))
    with pytest.raises(Forbidden):
        resolve_principal(Identity(SESSION, None))
    with pytest.raises(Unauthenticated):
        resolve_principal(Identity(None, None))


def test_recreated_role_is_refused_until_re_registered() -> None:
    tenants = FakeTenants()
    tenants.put_member(ROLE, "vision", "admin", ROLE_ID)
    svc = TenantService(tenants)
    assert svc.caller(Identity(SESSION, f"{ROLE_ID}:alice@example.com")).role is Role.ADMIN
    recreated = "AROAVISIONTEAM0000002"  # same name, new role: AWS gives it a new unique id
    with pytest.raises(Forbidden, match="register it again"):
        svc.caller(Identity(SESSION, f"{recreated}:alice@example.com"))
    tenants.put_member(ROLE, "vision", "member", recreated)
    assert svc.caller(Identity(SESSION, f"{recreated}:alice@example.com")).role is Role.MEMBER


def test_membership_without_unique_id_is_refused() -> None:
    tenants = FakeTenants()
    tenants.put_member(ROLE, "vision", "member")
    with pytest.raises(Forbidden):
        TenantService(tenants).caller(Identity(SESSION, f"{ROLE_ID}:alice@example.com"))


def test_caller_name_falls_back_to_the_principal() -> None:
    assert Caller(ROLE, "vision", Role.MEMBER).name == "vision-team"
    assert Caller(ROLE, "vision", Role.MEMBER, actor="alice").name == "alice"
