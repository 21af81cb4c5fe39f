"""Make moto hold two AWS guarantees that Berth's data path relies on and moto 5.2.5 skips.

- **STS session policies and expiry.** moto authorises an assumed-role credential by the role's
  policies alone and never expires it. AWS grants the intersection of the role's policies and the
  session policy passed to AssumeRole, and refuses a credential past its expiration. Berth vends
  every job attempt's credentials as one job role narrowed by a session policy, so without this the
  local cloud (and the functional tests) would let a job read any tenant's data.
- **Secrets Manager resources.** moto authorises every Secrets Manager call against resource ``*``,
  so a policy naming secret ARNs (as a job's session policy does) can never match; AWS evaluates the
  secret's ARN. The patch gives moto's Secrets Manager the secret's ARN as the resource.
- **IAM wildcards.** moto turns a policy's ``*`` into a regex and leaves every other character a
  regex metacharacter (``.`` matches anything, ``?`` is an error). IAM matches ``*`` as any run and
  ``?`` as one character, all else literally; session policies name secrets as ``name-??????``.
- **Step Functions task failure causes.** moto's SendTaskFailure drops ``cause``; AWS hands it to
  the state's Catch as ``Cause``. Berth's workflow reads the failure's detail (an exit code, which
  host) from it.
- **S3 checksums.** moto stores whatever ``x-amz-checksum-sha256`` a PutObject claims. S3 refuses
  the upload (BadDigest) when the content does not hash to it; Berth's presigned bundle uploads
  depend on that to keep content-addressed bundles honest.
- **EC2 instance types.** moto's table of instance types (which its Batch checks compute
  environments against) has p3dn.24xlarge but not p3.2xlarge, p3.8xlarge and p3.16xlarge, which AWS
  sells and Berth's V100 compute environments hold. They are added, copied from p3dn.24xlarge with
  their own vCPUs, memory and GPU count (AWS's DescribeInstanceTypes figures).

All are patches of moto internals declared in ``moto_compat.SURFACES`` (checked at start-up: a moto
without them fails loudly); ``install()`` returns a function that undoes them (tests install and
undo around themselves).
"""

from __future__ import annotations

import base64
import copy
import hashlib
import re
from collections.abc import Callable
from typing import Any

from berth_tools.localcloud import moto_compat

_AC = "moto.iam.access_control"


def _bad_digest() -> Exception:
    error_type = moto_compat.surface("moto.s3.exceptions:S3ClientError")
    return error_type("BadDigest", "The SHA256 you specified did not match the calculated checksum.")


def _check_action_permitted(original: Callable[..., None]) -> Callable[..., None]:
    assumed_key = moto_compat.surface(f"{_AC}:AssumedRoleAccessKey")
    policy_type = moto_compat.surface(f"{_AC}:IAMPolicy")
    permitted = moto_compat.surface(f"{_AC}:PermissionResult").PERMITTED
    sts_backends = moto_compat.surface("moto.sts.models:sts_backends")
    utcnow = moto_compat.surface("moto.core.utils:utcnow")

    def check(self: Any, resource: str) -> None:
        key = self._access_key
        if isinstance(key, assumed_key):
            backend = sts_backends[key.account_id][key.partition]
            session = backend.get_assumed_role_from_access_key(key._access_key_id)
            if session is not None and session.expiration <= utcnow():
                self._raise_invalid_access_key("ExpiredToken")
            original(self, resource)
            scoped = session is not None and session.policy and self._action != "sts:GetCallerIdentity"
            if (
                scoped
                and policy_type(session.policy).is_action_permitted(self._action, resource) != permitted
            ):
                self._raise_access_denied()
            return
        original(self, resource)

    return check


def _get_checksum(original: Callable[..., tuple[str, str | None]]) -> Callable[..., tuple[str, str | None]]:
    def get_checksum(self: Any, response_headers: dict[str, Any]) -> tuple[str, str | None]:
        claimed = self.headers.get("x-amz-checksum-sha256")
        if claimed and self.method == "PUT":
            actual = base64.b64encode(hashlib.sha256(self.body or b"").digest()).decode()
            if claimed != actual:
                raise _bad_digest()
        return original(self, response_headers)

    return get_checksum


def _iam_match(pattern: str, string: str) -> re.Match[str] | None:
    regex = re.escape(pattern).replace(r"\*", ".*").replace(r"\?", ".")
    return re.match(f"^{regex}$", string, flags=re.DOTALL)


def _secret_resource(self: Any) -> str:
    secret_id = self._get_param("SecretId")
    if not secret_id:
        return "*"
    secret = self.backend.secrets.get(secret_id)
    if secret is not None:
        return str(secret.arn)
    # Unknown secret: an ARN-shaped name that matches only policies for that name (AWS answers
    # AccessDenied or ResourceNotFound depending on the caller's rights; both refuse).
    return f"arn:aws:secretsmanager:{self.region}:{self.current_account}:secret:{secret_id}"


def _send_task_failure(self: Any) -> Any:
    self.stepfunction_backend.send_task_failure(
        self._get_param("taskToken"), error=self._get_param("error"), cause=self._get_param("cause")
    )
    return moto_compat.surface("moto.core.responses:EmptyResult")()


#: (vCPUs, memory MiB, V100s) of the p3 sizes moto 5.2.5 does not list (AWS DescribeInstanceTypes).
MISSING_INSTANCE_TYPES = {
    "p3.2xlarge": (8, 62464, 1),
    "p3.8xlarge": (32, 249856, 4),
    "p3.16xlarge": (64, 499712, 8),
}


def _add_instance_types(table: dict[str, Any]) -> list[str]:
    """Add the missing p3 sizes (modelled on p3dn.24xlarge); the names added, for the undo."""
    added = []
    model = table.get("p3dn.24xlarge")
    for name, (vcpus, memory_mib, gpus) in MISSING_INSTANCE_TYPES.items():
        if name in table or model is None:
            continue
        entry = copy.deepcopy(model)
        entry["InstanceType"] = name
        entry["VCpuInfo"] = {**entry.get("VCpuInfo", {}), "DefaultVCpus": vcpus, "DefaultCores": vcpus // 2}
        entry["MemoryInfo"] = {"SizeInMiB": memory_mib}
        gpu = entry["GpuInfo"]["Gpus"][0]
        entry["GpuInfo"] = {
            "Gpus": [{**gpu, "Count": gpus, "LogicalGpuCount": gpus}],
            "TotalGpuMemoryInMiB": gpus * gpu["MemoryInfo"]["SizeInMiB"],
        }
        entry.pop("InstanceStorageInfo", None)
        entry["InstanceStorageSupported"] = False
        table[name] = entry
        added.append(name)
    return added


def install() -> Callable[[], None]:
    """Apply the patches; returns the undo."""
    instance_types = moto_compat.surface("moto.ec2.models.instance_types:INSTANCE_TYPES")
    added_types = _add_instance_types(instance_types)
    check = moto_compat.surface(f"{_AC}:IAMRequestBase.check_action_permitted")
    checksum = moto_compat.surface("moto.s3.responses:S3Response._get_checksum")
    sm_owner = moto_compat.surface("moto.secretsmanager.responses:SecretsManagerResponse")
    had_resource = "_determine_resource" in vars(sm_owner)
    statement = moto_compat.surface(f"{_AC}:IAMPolicyStatement")
    match = vars(statement)["_match"]  # the staticmethod object itself, to put back as it was
    patches = [
        moto_compat.replace(f"{_AC}:IAMRequestBase.check_action_permitted", _check_action_permitted(check)),
        moto_compat.replace("moto.s3.responses:S3Response._get_checksum", _get_checksum(checksum)),
        moto_compat.replace(f"{_AC}:IAMPolicyStatement._match", staticmethod(_iam_match)),
        moto_compat.replace(
            "moto.stepfunctions.responses:StepFunctionResponse.send_task_failure", _send_task_failure
        ),
    ]
    sm_owner._determine_resource = _secret_resource

    def undo() -> None:
        for name in added_types:
            instance_types.pop(name, None)
        for patch in reversed([*patches[:2], patches[3]]):
            patch.undo()
        statement._match = match
        if not had_resource:
            del sm_owner._determine_resource

    return undo
