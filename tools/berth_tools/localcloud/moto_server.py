"""moto 5.2.5 as a threaded server on 127.0.0.1, configured for the local cloud."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import urllib.request
from typing import Any

from berth_tools.localcloud import (
    dynamodb_isolation,
    local_batch,
    metering,
    moto_asl,
    moto_compat,
    moto_dynamodb_conditions,
    moto_dynamodb_json,
    moto_dynamodb_query,
    moto_events,
    moto_faithful,
    moto_flask,
    moto_logs,
    moto_sfn_clients,
    moto_sqs,
    moto_streams,
)

LOCAL_HOST = "127.0.0.1"

#: moto's user config (what `POST /moto-api/config` sets). Step Functions executions only run with
#: `execute_state_machine`; Batch and Lambda never use docker here (there is no docker engine): Lambda
#: invocations run in worker processes (`berth_tools.localcloud.lambda_runtime`).
MOTO_CONFIG: dict[str, Any] = {
    "stepfunctions": {"execute_state_machine": True},
    "batch": {"use_docker": False},
    "lambda": {"use_docker": False},
}

#: Process environment moto reads at run time. DynamoDB streams need the account id endpoint mode
#: disabled; MOTO_PORT is set once the port is known (integrations call localhost:$MOTO_PORT).
MOTO_ENVIRONMENT = {"AWS_ACCOUNT_ID_ENDPOINT_MODE": "disabled"}


class MotoServer:
    """moto's ThreadedMotoServer bound to 127.0.0.1 (port 0 picks a free one), in this process."""

    def __init__(self, port: int = 0, config: dict[str, Any] | None = None) -> None:
        self._requested_port = port
        self._config = config if config is not None else MOTO_CONFIG
        self._server: Any = None  # moto's ThreadedMotoServer
        self._port: int | None = None

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("moto server not started")
        return self._port

    @property
    def endpoint_url(self) -> str:
        return f"http://{LOCAL_HOST}:{self.port}"

    def start(self) -> MotoServer:
        if self._server is not None:
            return self
        # Fail here, with every problem named, rather than half-patched in the middle of a request.
        moto_compat.check()
        for key, value in MOTO_ENVIRONMENT.items():
            os.environ.setdefault(key, value)
        # Werkzeug logs every request at INFO; the local cloud prints its own concise lines instead.
        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        moto_compat.untrack_instances()
        moto_compat.cache_module_list()
        moto_compat.cache_method_names()
        dynamodb_isolation.install()
        moto_faithful.install()
        moto_sqs.install()  # SQS without a walk of the whole queue per message (emulator hot paths)
        moto_streams.install()  # stream writes wake the stream pollers
        moto_events.install()  # EventBridge input paths compiled once
        moto_asl.install()  # a state machine's definition parsed once
        moto_sfn_clients.install()  # a Lambda task's SDK client built once
        moto_dynamodb_query.install()  # a Query reads its partition, not the whole table
        moto_dynamodb_json.install()  # DynamoDB attribute values serialised without the shape walk
        moto_dynamodb_conditions.install()  # a condition expression's text parsed once, not per item
        moto_flask.install()  # moto's Flask apps out of debug mode (it left every request to the gc)
        moto_logs.install()  # the functions' own log streams keep their newest events only
        server = moto_compat.threaded_moto_server()(
            ip_address=LOCAL_HOST, port=self._requested_port, verbose=False
        )
        server.start()  # a daemon thread: it never keeps the process alive on its own
        # Every AWS request through the server is metered; GET /_berth/meter reads the meter (metering).
        metering.wrap_server(server)
        metering.install_state_machine_hook()
        self._server = server
        self._port = int(server.get_host_and_port()[1])
        os.environ["MOTO_PORT"] = str(self._port)
        local_batch.install(self.endpoint_url)  # berth-* Batch queues run their jobs as host processes
        # moto's backends are process-global: start from an empty cloud even if this process ran one before.
        self.reset()
        self.configure(self._config)
        metering.METER.reset()  # the deployment and seeding of a previous cloud in this process do not count
        return self

    def reset(self) -> None:
        """Drop every resource moto holds in this process (`POST /moto-api/reset`)."""
        request = urllib.request.Request(f"{self.endpoint_url}/moto-api/reset", data=b"", method="POST")
        with urllib.request.urlopen(request, timeout=10):
            pass

    def configure(self, config: dict[str, Any]) -> dict[str, Any]:
        """Apply moto's user config the documented way (`POST /moto-api/config`) and return it."""
        request = urllib.request.Request(
            f"{self.endpoint_url}/moto-api/config",
            data=json.dumps(config).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            result: dict[str, Any] = json.loads(response.read() or b"{}")
        return result

    def stop(self, reset: bool = True) -> None:
        """Stop serving; `reset` first frees moto's state (skipped when the process is exiting anyway)."""
        server, self._server = self._server, None
        if server is not None:
            local_batch.stop_all()
            if reset:
                with contextlib.suppress(OSError):  # free the memory; a next local cloud starts empty anyway
                    self.reset()
            server.stop()
