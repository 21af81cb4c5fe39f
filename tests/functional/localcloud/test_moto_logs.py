"""moto_logs: a Lambda function's log stream keeps its newest events only (moto never applies a log
group's retention, and an idle local cloud's functions write all the time); the jobs' streams and
every other group keep all their events. Run in a fresh interpreter: the patch is process-wide."""

from __future__ import annotations

import subprocess
import sys

_SCRIPT = """
import time
from moto import mock_aws
import boto3
from berth_tools.localcloud import moto_logs

def stored(group, kept):
    logs = boto3.client("logs", region_name="us-east-1")
    logs.create_log_group(logGroupName=group)
    logs.create_log_stream(logGroupName=group, logStreamName="s")
    for batch in range(5):
        n = batch * 100
        now = int(time.time() * 1000)
        events = [{"timestamp": now + n + i, "message": f"line {n + i}"} for i in range(100)]
        logs.put_log_events(logGroupName=group, logStreamName="s", logEvents=events)
    got = logs.get_log_events(logGroupName=group, logStreamName="s", startFromHead=True, limit=10_000)
    got = got["events"]
    return [e["message"] for e in got]

moto_logs.FUNCTION_EVENTS_KEPT = 120
with mock_aws():
    before = stored("/aws/lambda/Berth-Api", 120)
undo = moto_logs.install()
assert moto_logs.install()() is None  # twice: one patch
with mock_aws():
    function = stored("/aws/lambda/Berth-Scheduler", 120)
    job = stored("/berth/jobs/vision", 120)
    # a group a function's LoggingConfig names (the CDK app's): bounded once the runtime names it
    mystery = stored("Berth-ApiFunctionLogGroup-X", 120)
    moto_logs.function_group("Berth-SchedulerFunctionLogGroup-Y")
    named = stored("Berth-SchedulerFunctionLogGroup-Y", 120)
undo()
with mock_aws():
    after = stored("/aws/lambda/Berth-Api2", 120)
print(len(before), len(function), function[0], function[-1], len(job), len(after), len(mystery), len(named))
"""


def test_a_functions_stream_keeps_its_newest_events_and_a_jobs_stream_all() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["500", "120", "line", "380", "line", "499", "500", "500", "500", "120"]
