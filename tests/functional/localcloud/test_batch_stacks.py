"""The synthesised per-region Batch stacks (cdk.out/Berth-batch-<region>) deployed into the local cloud
next to the Berth stack: queues come up VALID/ENABLED in every region, and a Batch job state change
put on a region's default bus reaches the home bus (the regional forwarding rule), others do not."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from berth_tools.localcloud.cloud import LocalCloud, load_batch_templates, load_template

from .conftest import REAL_TEMPLATE

BATCH_TEMPLATES = sorted(REAL_TEMPLATE.parent.glob("Berth-batch-*.template.json"))

pytestmark = pytest.mark.usefixtures("real_template")  # and the Berth-batch-<region> ones beside it


@pytest.fixture(scope="module")
def batch_cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCloud]:
    with LocalCloud(
        template=load_template(REAL_TEMPLATE),
        batch_templates=load_batch_templates(REAL_TEMPLATE),
        state_dir=tmp_path_factory.mktemp("state"),
        example_hosts=False,
        scheduled_rules=False,
    ) as cloud:
        yield cloud


def test_every_region_has_its_instance_type_queues_valid_and_enabled(batch_cloud: LocalCloud) -> None:
    regions = json.loads(batch_cloud.output("CloudRegions"))
    assert (
        {r["region"] for r in regions}
        == set(batch_cloud.batch_stacks)
        == {p.name[len("Berth-batch-") : -len(".template.json")] for p in BATCH_TEMPLATES}
    )
    for entry in regions:
        region = entry["region"]
        by_type = entry["queues"]
        assert sorted(by_type) == sorted(entry["instance_types"])
        batch = batch_cloud.session(region).client("batch", endpoint_url=batch_cloud.endpoint_url)
        queues = {q["jobQueueName"]: q for q in batch.describe_job_queues()["jobQueues"]}
        # One queue per (instance type, purchase type): berth-<region>-<family>_<size>-<ondemand|spot>.
        assert set(queues) == {
            f"berth-{region}-{t.replace('.', '_')}-{k}" for t in by_type for k in ("ondemand", "spot")
        }
        assert set(queues) == {q for names in by_type.values() for q in (names["ondemand"], names["spot"])}
        for queue in queues.values():
            assert (queue["state"], queue["status"]) == ("ENABLED", "VALID")
            assert queue["jobQueueArn"].startswith(f"arn:aws:batch:{region}:")
        environments = {
            c["computeEnvironmentName"]: c
            for c in batch.describe_compute_environments()["computeEnvironments"]
        }
        assert set(environments) == set(queues)
        outputs = batch_cloud.batch_stacks[region].outputs
        for instance_type, names in by_type.items():
            spot = environments[names["spot"]]["computeResources"]
            ondemand = environments[names["ondemand"]]["computeResources"]
            assert spot["type"] == "SPOT" and ondemand["type"] == "EC2"
            # Only that type: Batch never runs the job on another GPU model or another size.
            assert spot["instanceTypes"] == ondemand["instanceTypes"] == [instance_type]
            family, size = instance_type.split(".")
            prefix = family.capitalize() + size.capitalize()
            assert outputs[f"{prefix}SpotQueueArn"] == queues[names["spot"]]["jobQueueArn"]
            assert outputs[f"{prefix}OnDemandQueueArn"] == queues[names["ondemand"]]["jobQueueArn"]


def test_state_dir_lists_the_batch_stacks(batch_cloud: LocalCloud) -> None:
    assert batch_cloud.state_dir is not None
    stacks = json.loads((batch_cloud.state_dir / "batch-stacks.json").read_text())
    assert set(stacks) == set(batch_cloud.batch_stacks)
    assert all(outputs["P548xlargeOnDemandQueueArn"] for outputs in stacks.values())


def test_batch_state_changes_of_berth_queues_reach_the_home_bus(batch_cloud: LocalCloud) -> None:
    home = batch_cloud.session()
    sqs = home.client("sqs", endpoint_url=batch_cloud.endpoint_url)
    events = home.client("events", endpoint_url=batch_cloud.endpoint_url)
    bus = batch_cloud.output("EventBusName")
    queue_url = sqs.create_queue(QueueName="batch-forwarding-probe")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    events.put_rule(Name="probe", EventBusName=bus, EventPattern=json.dumps({"source": ["aws.batch"]}))
    events.put_targets(Rule="probe", EventBusName=bus, Targets=[{"Id": "probe", "Arn": queue_arn}])
    sent = set()
    for region in batch_cloud.batch_stacks:
        regional = batch_cloud.session(region).client("events", endpoint_url=batch_cloud.endpoint_url)
        for queue in (f"berth-{region}-p5_48xlarge-spot", "someone-elses-queue"):
            arn = f"arn:aws:batch:{region}:123456789012:job-queue/{queue}"
            regional.put_events(
                Entries=[
                    {
                        "Source": "aws.batch",
                        "DetailType": "Batch Job State Change",
                        "Detail": json.dumps(
                            {"jobQueue": arn, "jobId": f"{region}-{queue}", "status": "RUNNING"}
                        ),
                    }
                ]
            )
            if queue.startswith("berth-"):
                sent.add(arn)
    received: set[str] = set()
    deadline = time.monotonic() + 10
    while received != sent and time.monotonic() < deadline:
        for message in sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1).get(
            "Messages", []
        ):
            received.add(json.loads(message["Body"])["detail"]["jobQueue"])
    assert received == sent
