"""Tables that fit the terminal: ids whole, columns dropped by priority, free text ellipsised,
``--wide`` whole; ``berth ls`` filters and the pages it reads; the quota and events tables."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from berth_tools.cli import jobs_cmd, output
from berth_tools.cli.listing import MAX_FILTERED_PAGES, read_jobs, since_param
from berth_tools.cli.main import app
from berth_tools.cli.tables import Column, fit, show

JOB_ID = "j-01m8mqx5p4cmnjzq2zgpbtrdbm"
TASK_ID = "j-01m8mqx5p4cmnjzq2zgpbtrdbn:1234"
LONG_REASON = (
    "waiting for placement: no host with 8 free V100 GPUs (0 of 32 free, largest free block 0); " * 2
)


def _job(
    job_id: str = JOB_ID, name: str = "resnet50-imagenet-baseline-long-name", **kw: Any
) -> dict[str, Any]:
    return {
        "id": job_id,
        "tenant": "vision",
        "owner": "o",
        "status": "QUEUED",
        "reason": LONG_REASON,
        "spec": {"name": name, "resources": {"gpus": 8, "gpu_type": "V100"}},
        "created_at": "2026-12-03T16:58:01.123Z",
        "updated_at": "2026-12-03T16:58:01.123Z",
        "site": None,
        "placement": None,
        "attempts": 0,
        "cost_usd": 0.0,
        **kw,
    }


class FakeClient:
    def __init__(self, pages: list[dict[str, Any]]) -> None:
        self.pages = pages
        self.calls: list[dict[str, Any]] = []

    def list(
        self, status: str | None, limit: int, next_token: str | None, array: str | None = None, **f: Any
    ) -> Any:
        self.calls.append({"status": status, "limit": limit, "next_token": next_token, "array": array, **f})
        return self.pages[len(self.calls) - 1]

    def get_quota(self, tenant: str) -> Any:
        return {
            "gpus": {"V100": {"guaranteed": 64, "borrow_limit": 32}},
            "weight": 2.0,
            "monthly_cloud_budget_usd": 5000.0,
            "max_active_jobs": 1000,
        }

    def events(self, job_id: str) -> Any:
        return {
            "events": [
                {"at": "2026-12-03T16:58:01.123Z", "from": None, "to": "QUEUED", "reason": LONG_REASON}
            ]
        }


@pytest.fixture
def width(monkeypatch: pytest.MonkeyPatch) -> Any:
    def set_width(w: int) -> None:
        monkeypatch.setattr(output.console, "_width", w)
        monkeypatch.setenv("COLUMNS", str(w))  # a pipe is fitted only when the width is given

    return set_width


def _run(monkeypatch: pytest.MonkeyPatch, client: FakeClient, *args: str) -> Any:
    monkeypatch.setattr(jobs_cmd, "client_for", lambda api_url, profile: client)
    return CliRunner().invoke(app, list(args))


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


@pytest.mark.parametrize("columns", [80, 120, 200])
def test_ls_fits_the_terminal_and_never_cuts_an_id(
    monkeypatch: pytest.MonkeyPatch, width: Any, columns: int
) -> None:
    width(columns)
    client = FakeClient([{"jobs": [_job(), _job(TASK_ID, name="t")], "next_token": None}])
    result = _run(monkeypatch, client, "ls")
    assert result.exit_code == 0, result.output
    assert JOB_ID in result.output and TASK_ID in result.output
    assert all(len(line) <= columns for line in _lines(result.output)), result.output
    header = _lines(result.output)[0]
    assert "ID" in header and "NAME" in header and "STATUS" in header
    if columns == 80:
        assert "CREATED" not in header and "COST USD" not in header and "…" in result.output
    if columns == 200:
        assert "CREATED" in header and "2026-12-03T16:58:01.123Z" in result.output


def test_ls_wide_shows_every_column_whole(monkeypatch: pytest.MonkeyPatch, width: Any) -> None:
    width(80)
    result = _run(monkeypatch, FakeClient([{"jobs": [_job()], "next_token": None}]), "ls", "--wide")
    assert result.exit_code == 0
    assert "…" not in result.output
    assert LONG_REASON.strip() in result.output and "resnet50-imagenet-baseline-long-name" in result.output
    assert "CREATED" in result.output and "COST USD" in result.output


def test_ls_json_carries_what_the_table_shows(monkeypatch: pytest.MonkeyPatch) -> None:
    result = _run(monkeypatch, FakeClient([{"jobs": [_job()], "next_token": "tok"}]), "ls", "-o", "json")
    data = json.loads(result.output)
    assert data["jobs"][0]["id"] == JOB_ID and data["jobs"][0]["reason"] == LONG_REASON
    assert data["next_token"] == "tok"


def test_ls_filters_go_to_the_api(monkeypatch: pytest.MonkeyPatch) -> None:
    client = FakeClient([{"jobs": [], "next_token": None}])
    result = _run(
        monkeypatch,
        client,
        "ls",
        "--all-tenants",
        "--since",
        "2026-12-01",
        "--name",
        "resnet-*",
        "--site",
        "cloud",
    )
    assert result.exit_code == 0, result.output
    (call,) = client.calls
    assert call["all_tenants"] == "true" and call["since"] == "2026-12-01T00:00:00.000Z"
    assert call["name"] == "resnet-*" and call["site"] == "cloud" and call["tenant"] is None


def test_ls_with_a_tenant_shows_the_tenant_column(monkeypatch: pytest.MonkeyPatch, width: Any) -> None:
    width(120)
    client = FakeClient([{"jobs": [_job()], "next_token": None}])
    result = _run(monkeypatch, client, "ls", "--tenant", "vision")
    assert "TENANT" in _lines(result.output)[0] and client.calls[0]["tenant"] == "vision"


def test_a_bad_since_or_site_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    client = FakeClient([])
    assert _run(monkeypatch, client, "ls", "--since", "last tuesday").exit_code == 2
    assert _run(monkeypatch, client, "ls", "--site", "moon").exit_code == 2
    assert client.calls == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2h", "2026-12-03T15:00:00.000Z"),
        ("30m", "2026-12-03T16:30:00.000Z"),
        ("1d", "2026-12-02T17:00:00.000Z"),
        ("1w", "2026-11-26T17:00:00.000Z"),
        ("2026-12-01", "2026-12-01T00:00:00.000Z"),
        ("2026-12-01T10:00:00Z", "2026-12-01T10:00:00.000Z"),
        ("2026-12-01T10:00:00+01:00", "2026-12-01T09:00:00.000Z"),
    ],
)
def test_since_takes_a_time_ago_or_a_date(text: str, expected: str) -> None:
    assert since_param(text, now=datetime(2026, 12, 3, 17, 0, tzinfo=UTC)) == expected


def test_since_refuses_anything_else() -> None:
    with pytest.raises(typer.BadParameter):
        since_param("yesterday")


def test_a_filtered_listing_reads_on_until_it_has_limit_rows() -> None:
    pages = [
        {"jobs": [], "next_token": "a"},
        {"jobs": [_job()], "next_token": "b"},
        {"jobs": [_job()], "next_token": "c"},
    ]
    client = FakeClient(pages)
    got = read_jobs(lambda t: client.list(None, 2, t), 2, None, all_pages=False, filtered=True)
    assert len(got["jobs"]) == 2 and got["next_token"] == "c" and len(client.calls) == 3
    unfiltered = FakeClient(pages)
    got = read_jobs(lambda t: unfiltered.list(None, 2, t), 2, None, all_pages=False, filtered=False)
    assert got["jobs"] == [] and got["next_token"] == "a"


def test_a_filtered_listing_stops_after_a_bounded_number_of_pages() -> None:
    client = FakeClient([{"jobs": [], "next_token": f"t{i}"} for i in range(MAX_FILTERED_PAGES + 5)])
    got = read_jobs(lambda t: client.list(None, 2, t), 2, None, all_pages=False, filtered=True)
    assert len(client.calls) == MAX_FILTERED_PAGES and got["next_token"] == f"t{MAX_FILTERED_PAGES - 1}"


def test_fit_drops_by_priority_then_ellipsises_but_keeps_keys() -> None:
    columns = [
        Column("ID", key=True),
        Column("NAME", flexible=True, min_width=6),
        Column("LOW", priority=5),
        Column("MID", priority=2),
    ]
    rows = [["x" * 30, "n" * 40, "l" * 10, "m" * 10]]
    assert fit(columns, rows, 200).shown == (0, 1, 2, 3)
    narrow = fit(columns, rows, 60)
    assert narrow.shown == (0, 1, 3) and narrow.widths[0] == 30 and narrow.total <= 60
    tiny = fit(columns, rows, 20)  # the id alone is wider: it stays whole, the table is wider
    assert tiny.shown == (0, 1) and tiny.widths[0] == 30


def test_output_that_is_not_a_terminal_is_never_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    console = Console(width=40, force_terminal=False)
    with console.capture() as out:
        show(console, [Column("ID", key=True), Column("X", flexible=True, min_width=4)], [["j-1", "x" * 80]])
    assert "x" * 80 in out.get() and "…" not in out.get()


def test_show_prints_an_id_whole_even_when_the_terminal_is_narrower(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "20")
    console = Console(width=20)
    with console.capture() as out:
        show(console, [Column("ID", key=True), Column("X", flexible=True)], [["j-" + "a" * 26, "text"]])
    assert "j-" + "a" * 26 in out.get()


def test_quota_is_a_table_not_json(monkeypatch: pytest.MonkeyPatch, width: Any) -> None:
    width(100)
    result = _run(monkeypatch, FakeClient([]), "quota", "vision")
    assert result.exit_code == 0, result.output
    assert "{" not in result.output
    assert "weight 2" in result.output and "$5,000.00" in result.output
    row = next(line for line in result.output.splitlines() if "V100" in line)
    assert "64" in row and "32" in row


def test_events_fit_and_keep_the_time_whole(monkeypatch: pytest.MonkeyPatch, width: Any) -> None:
    width(80)
    result = _run(monkeypatch, FakeClient([]), "events", JOB_ID)
    assert "2026-12-03T16:58:01.123Z" in result.output and "…" in result.output
    assert all(len(line) <= 80 for line in _lines(result.output))


def test_the_submit_output_says_which_resources_were_defaulted(capsys: pytest.CaptureFixture[str]) -> None:
    resources = {"gpu_type": "A100", "gpus": 1, "cpu": 4.0, "memory_gib": 16.0, "nodes": 1}
    jobs_cmd.defaults_note({"spec": {"resources": resources}, "defaults_applied": ["resources"]})
    assert "resources not given: using 1 x A100, 4 CPU, 16 GiB" in capsys.readouterr().err
    jobs_cmd.defaults_note({"spec": {"resources": resources}, "defaults_applied": ["resources.gpu_type"]})
    assert "gpu_type not given: using 1 x A100" in capsys.readouterr().err
    jobs_cmd.defaults_note({"spec": {"resources": resources}, "defaults_applied": []})
    jobs_cmd.defaults_note({"spec": {"resources": resources}})  # an older API: nothing to say
    assert capsys.readouterr().err == ""


def test_a_spec_error_is_printed_once_per_problem(capsys: pytest.CaptureFixture[str]) -> None:
    from berth_tools.client import ClientError

    one = [{"field": "comand", "message": "comand: unknown field 'comand': did you mean 'command'?"}]
    with pytest.raises(typer.Exit) as done:
        output.fail(output.OutputFormat.TABLE, ClientError(422, "ValidationError", one[0]["message"], one))
    assert done.value.exit_code == 2
    assert capsys.readouterr().err.count("did you mean 'command'?") == 1
    two = [*one, {"field": "resources.gpus", "message": "resources.gpus: must be at least 1 (got 0)"}]
    with pytest.raises(typer.Exit):
        output.fail(output.OutputFormat.TABLE, ClientError(422, "ValidationError", "a; b", two))
    err = capsys.readouterr().err
    assert "  - comand:" in err and "  - resources.gpus: must be at least 1" in err


def test_a_narrow_table_says_which_columns_it_left_out(monkeypatch: pytest.MonkeyPatch, width: Any) -> None:
    width(80)
    out = _run(monkeypatch, FakeClient([{"jobs": [_job()], "next_token": None}]), "ls").output
    assert "not shown at this width:" in out and "CREATED" in out.split("not shown at this width:")[1]
    width(250)
    out = _run(monkeypatch, FakeClient([{"jobs": [_job()], "next_token": None}]), "ls").output
    assert "not shown" not in out
