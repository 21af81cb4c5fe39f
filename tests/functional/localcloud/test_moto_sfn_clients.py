"""moto's Step Functions build a Lambda task's SDK client once (`moto_sfn_clients`); the workflow
tests of the local cloud run every `lambda:invoke` task of Berth's state machines through it."""

from __future__ import annotations

import subprocess
import sys

_CHECK = """
import os
from moto.stepfunctions.parser.asl.component.state.exec.state_task import lambda_eval_utils
from berth_tools.localcloud import moto_sfn_clients

original = lambda_eval_utils.boto_client_for
undo = moto_sfn_clients.install()
assert lambda_eval_utils.boto_client_for is not original
moto_sfn_clients.install()()  # a second install is a no-op (and so is its undo)
build = lambda_eval_utils.boto_client_for

os.environ["MOTO_PORT"] = "5001"
one = build("us-east-1", "lambda", None)
assert build("us-east-1", "lambda", {"any": "credentials"}) is one  # the credentials are not used
assert build("us-west-2", "lambda", None) is not one  # another region: its own client
assert one.meta.region_name == "us-east-1" and one.meta.endpoint_url == "http://localhost:5001"
os.environ["MOTO_PORT"] = "5002"  # a later local cloud in this process: another server
two = build("us-east-1", "lambda", None)
assert two is not one and two.meta.endpoint_url == "http://localhost:5002"
assert moto_sfn_clients.stats == {"built": 3, "reused": 1}, moto_sfn_clients.stats

undo()
assert lambda_eval_utils.boto_client_for is original
"""


def test_a_client_is_built_once_per_region_and_endpoint_and_undo_restores() -> None:
    # In a fresh interpreter: a local cloud started earlier in this process keeps the patch in place.
    done = subprocess.run([sys.executable, "-c", _CHECK], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
