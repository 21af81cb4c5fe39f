"""The synthesised Berth template (cdk.out) deployed into the local cloud, with the real API handler."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from berth_tools.localcloud.cloud import LocalCloud, load_template

from .conftest import REAL_TEMPLATE

pytestmark = pytest.mark.usefixtures("real_template")  # missing: an error that says `make synth`


def _cold_start_handlers() -> None:
    """Like a fresh Lambda sandbox: drop module-level caches other tests in this process may have filled."""
    for name, module in list(sys.modules.items()):
        if name.startswith("berth.handlers") and module is not None:
            for value in list(vars(module).values()):
                if callable(getattr(value, "cache_clear", None)):
                    value.cache_clear()


@pytest.fixture(scope="module")
def real_cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCloud]:
    _cold_start_handlers()
    with LocalCloud(
        template=load_template(REAL_TEMPLATE), state_dir=tmp_path_factory.mktemp("state")
    ) as cloud:
        yield cloud
    _cold_start_handlers()


def test_real_template_deploys_and_verifies(real_cloud: LocalCloud) -> None:
    stack = real_cloud.stack
    assert stack is not None
    for key in (
        "ApiUrl",
        "ApiId",
        "JobsTableName",
        "JobEventsTableName",
        "TenantsTableName",
        "ApiFunctionName",
    ):
        assert stack.outputs.get(key), key
    assert "None" not in stack.outputs["ApiUrl"]
    assert real_cloud.api_url.endswith("/" + stack.outputs["ApiUrl"].rstrip("/").rsplit("/", 1)[1])
    lam = real_cloud.session().client("lambda", endpoint_url=real_cloud.endpoint_url)
    config = lam.get_function_configuration(FunctionName=stack.outputs["ApiFunctionName"])
    assert config["Handler"] == "berth.handlers.api.lambda_handler"


def test_real_handler_answers_through_the_front_door(real_cloud: LocalCloud) -> None:
    assert real_cloud.probe_status == 200
    status, body = real_cloud.request("GET", "/v1/jobs", profile="bob")
    assert status == 200, body
    assert isinstance(body, dict) and body["jobs"] == []
    status, _ = real_cloud.request("GET", "/v1/jobs")
    assert status == 403


def test_tenants_are_seeded_in_the_tenants_table(real_cloud: LocalCloud) -> None:
    ddb = real_cloud.session().client("dynamodb", endpoint_url=real_cloud.endpoint_url)
    items = ddb.scan(TableName=real_cloud.output("TenantsTableName"))["Items"]
    keys = {item["pk"]["S"] for item in items}
    assert {
        "PRINCIPAL#arn:aws:iam::123456789012:user/alice",
        "PRINCIPAL#arn:aws:iam::123456789012:user/bob",
        "PRINCIPAL#arn:aws:iam::123456789012:user/admin",
    } <= keys


def test_cdk_out_path_is_the_repo_one() -> None:
    assert Path(__file__).resolve().parents[3] / "cdk.out" / "Berth.template.json" == REAL_TEMPLATE


def test_operations_resources_exist_locally(real_cloud: LocalCloud) -> None:
    """The alarms (created through the CloudWatch API), the dashboard and the alarm topic."""
    stack = real_cloud.stack
    assert stack is not None
    session = real_cloud.session()
    cloudwatch = session.client("cloudwatch", endpoint_url=real_cloud.endpoint_url)
    alarms = cloudwatch.describe_alarms(AlarmNamePrefix="Berth-", MaxRecords=100)["MetricAlarms"]
    by_name = {a["AlarmName"]: a for a in alarms}
    assert "Berth-OldestQueuedJob" in by_name and "Berth-SchedulerTriggerDlqDepth" in by_name
    assert all(a["AlarmActions"] == [stack.outputs["AlarmTopicArn"]] for a in alarms)
    dlq = {d["Name"]: d["Value"] for d in by_name["Berth-SchedulerTriggerDlqDepth"]["Dimensions"]}
    queues = session.client("sqs", endpoint_url=real_cloud.endpoint_url)
    assert queues.get_queue_url(QueueName=dlq["QueueName"])["QueueUrl"]
    errors = {d["Name"]: d["Value"] for d in by_name["Berth-SchedulerErrors"]["Dimensions"]}
    lam = session.client("lambda", endpoint_url=real_cloud.endpoint_url)
    assert lam.get_function(FunctionName=errors["FunctionName"])["Configuration"]["Handler"] == (
        "berth.handlers.scheduler.lambda_handler"
    )
    body = cloudwatch.get_dashboard(DashboardName=stack.outputs["DashboardName"])["DashboardBody"]
    assert "arn:aws:cloudwatch:" in body and ":alarm:Berth-OldestQueuedJob" in body
    assert "AWS::CloudWatch::Alarm" not in stack.skipped_types
