"""The cloud branch's dispatch path in the home stack (docs/workflow.md, "The cloud branch"):

- ``BatchSubmitQueue`` (FIFO, one group per job, deduplicated per attempt) -> ``BatchSubmitFunction``
  (reserved concurrency ``submit_concurrency``, each instance at its share of ``submit_rate``);
  a throttled submit stays on the queue (partial batch responses), the DLQ keeps what 100 receives
  could not submit.
- The home bus's rule for ``aws.batch`` ``Batch Job State Change`` (each region's rule forwards them
  there) -> ``BatchEventsQueue`` -> ``BatchEventsFunction``.

Built in two steps because the workflow's functions need the submit queue's URL in their environment
before they exist, and this construct's functions need the workflow's environment.
"""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import Duration, Stack
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_lambda_event_sources as sources
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from berth.domain.cloud import ACTED_ON_STATUSES

#: Batch allows 50 SubmitJob calls a second per account; Berth keeps under it.
DEFAULT_SUBMIT_RATE = 40
DEFAULT_SUBMIT_CONCURRENCY = 2
SUBMIT_TIMEOUT_S = 120
#: Receives before a submit request goes to the DLQ: throttling alone never gets there (the
#: function's own backoff first, then SQS's redelivery).
SUBMIT_MAX_RECEIVES = 100
DEFAULT_RUNNABLE_TIMEOUT_S = 600
#: Where Berth-submitted Batch jobs' state changes come from.
BATCH_SOURCE = "aws.batch"
BATCH_DETAIL_TYPE = "Batch Job State Change"


@dataclass(frozen=True)
class CloudDispatchConfig:
    submit_role_arn: str = ""
    """``BatchSubmitRole`` (assumed with session tag berth:tenant); empty: the submit function's own
    credentials (no PassRole granted to it, so on AWS submits are refused until it is wired)."""
    submit_rate: int = DEFAULT_SUBMIT_RATE
    submit_concurrency: int = DEFAULT_SUBMIT_CONCURRENCY
    runnable_timeout_s: int = DEFAULT_RUNNABLE_TIMEOUT_S


class CloudDispatch(Construct):
    def __init__(
        self, scope: Construct, construct_id: str, *, bus: events.IEventBus, config: CloudDispatchConfig
    ) -> None:
        super().__init__(scope, construct_id)
        self.config = config
        stack = Stack.of(self).stack_name
        # Named: a FIFO queue's name must end in .fifo (CloudFormation adds it to a generated name; the
        # local cloud's CloudFormation does not).
        self.submit_dlq = sqs.Queue(
            self,
            "BatchSubmitDlq",
            queue_name=f"berth-batch-submit-dlq-{stack}.fifo",
            fifo=True,
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            retention_period=Duration.days(14),
        )
        self.submit_queue = sqs.Queue(
            self,
            "BatchSubmitQueue",
            queue_name=f"berth-batch-submit-{stack}.fifo",
            fifo=True,
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            visibility_timeout=Duration.seconds(6 * SUBMIT_TIMEOUT_S),
            retention_period=Duration.days(4),
            dead_letter_queue=sqs.DeadLetterQueue(
                queue=self.submit_dlq, max_receive_count=SUBMIT_MAX_RECEIVES
            ),
        )
        self.events_dlq = sqs.Queue(
            self,
            "BatchEventsDlq",
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            retention_period=Duration.days(14),
        )
        self.events_queue = sqs.Queue(
            self,
            "BatchEventsQueue",
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            visibility_timeout=Duration.seconds(6 * 60),
            dead_letter_queue=sqs.DeadLetterQueue(queue=self.events_dlq, max_receive_count=10),
        )
        self.rule = events.Rule(
            self,
            "BatchEventsRule",
            description="Batch Job State Change events forwarded from the Batch regions -> BatchEventsQueue",
            event_bus=bus,
            event_pattern=events.EventPattern(
                source=[BATCH_SOURCE],
                detail_type=[BATCH_DETAIL_TYPE],
                detail={"status": [str(s) for s in ACTED_ON_STATUSES]},
            ),
            targets=[targets.SqsQueue(self.events_queue)],
        )

    def environment(self) -> dict[str, str]:
        """What every control-plane function of the workflow reads about the cloud branch."""
        stack = Stack.of(self)
        env = {
            "BERTH_BATCH_SUBMIT_QUEUE_URL": self.submit_queue.queue_url,
            "BERTH_BATCH_SUBMIT_RATE": str(self.config.submit_rate),
            "BERTH_BATCH_SUBMIT_CONCURRENCY": str(self.config.submit_concurrency),
            "BERTH_RUNNABLE_TIMEOUT_S": str(self.config.runnable_timeout_s),
            "BERTH_ACCOUNT_ID": stack.account,
            "BERTH_PARTITION": stack.partition,
        }
        if self.config.submit_role_arn:
            env["BERTH_BATCH_SUBMIT_ROLE_ARN"] = self.config.submit_role_arn
        return env

    def event_sources(self) -> tuple[sources.SqsEventSource, sources.SqsEventSource]:
        """The submit function's and the events function's event sources."""
        return (
            sources.SqsEventSource(self.submit_queue, batch_size=10, report_batch_item_failures=True),
            sources.SqsEventSource(
                self.events_queue,
                batch_size=10,
                max_batching_window=Duration.seconds(1),
                report_batch_item_failures=True,
            ),
        )
