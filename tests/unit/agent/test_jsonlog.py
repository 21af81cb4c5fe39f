import io
import json
import logging

from berth_agent import jsonlog


def test_one_json_object_per_line_with_extra_fields() -> None:
    stream = io.StringIO()
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        jsonlog.setup("debug", stream)
        logging.getLogger("berth_agent.test").info("claimed %s", "j-1", extra={"job_id": "j-1", "attempt": 2})
        try:
            raise ValueError("boom")
        except ValueError:
            logging.getLogger("x").exception("failed")
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert (
        first["msg"] == "claimed j-1" and first["level"] == "info" and first["logger"] == "berth_agent.test"
    )
    assert first["job_id"] == "j-1" and first["attempt"] == 2 and first["ts"].endswith("Z")
    assert second["level"] == "error" and "ValueError: boom" in second["exc"]
