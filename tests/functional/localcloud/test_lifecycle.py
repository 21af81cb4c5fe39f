"""Starting and stopping a local cloud of its own (not the module-scoped one)."""

from __future__ import annotations

import socket
from pathlib import Path

from berth_tools.localcloud.cloud import LocalCloud, load_template

from .conftest import MINI_TEMPLATE


def _port_open(url: str) -> bool:
    host, port = url.split("//", 1)[1].split("/", 1)[0].split(":")
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex((host, int(port))) == 0


def test_env_file_exists_while_running_and_is_removed_on_stop(tmp_path: Path) -> None:
    state = tmp_path / "state"
    cloud = LocalCloud(template=load_template(MINI_TEMPLATE), state_dir=state, seed_writer=lambda *a: None)
    with cloud:
        assert (state / "env").exists()
        assert cloud.probe_status == 200
        api, endpoint = cloud.api_url, cloud.endpoint_url
        assert _port_open(api) and _port_open(endpoint)
        assert api.startswith("http://127.0.0.1:")
        assert cloud.ready_seconds < 15
    assert not (state / "env").exists()
    assert (state / "aws" / "credentials").exists()
    assert not _port_open(api) and not _port_open(endpoint)
