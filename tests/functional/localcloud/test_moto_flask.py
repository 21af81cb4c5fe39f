"""moto_flask: moto's Flask apps out of debug mode, so a served request is freed when it ends instead of
waiting, in a reference cycle, for the cyclic collector's next full collection (the idle local cloud's
memory growth, docs/local-cloud.md)."""

from __future__ import annotations

import subprocess
import sys

_SCRIPT = """
import gc
from werkzeug.test import EnvironBuilder
from moto.moto_server.werkzeug_app import DomainDispatcherApplication
from berth_tools.localcloud import moto_compat, moto_flask

HEADERS = {
    "Host": "sqs.us-east-1.amazonaws.com",
    "Content-Type": "application/x-www-form-urlencoded",
    "Authorization": "AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/sqs/aws4_request, "
    "SignedHeaders=host, Signature=0",
}

def requests_left_to_the_gc(n):
    app = moto_compat.moto_wsgi_app()
    statuses = []
    gc.collect()
    gc.disable()
    try:
        for _ in range(n):
            environ = EnvironBuilder(
                method="POST", path="/", headers=HEADERS, data="Action=ListQueues&Version=2012-11-05"
            ).get_environ()
            b"".join(app(environ, lambda status, headers, exc_info=None: statuses.append(status)))
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        left = sum(1 for o in gc.garbage if type(o).__name__ == "BackendRequest")
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.collect()
        gc.enable()
    assert statuses == ["200 OK"] * n, statuses
    return left

init = DomainDispatcherApplication.__init__
assert requests_left_to_the_gc(25) == 25  # moto as shipped: every request is cyclic garbage
undo = moto_flask.install()
assert DomainDispatcherApplication.__init__ is not init
moto_flask.install()()  # a second install is a no-op (and so is its undo)
assert requests_left_to_the_gc(25) == 0
app = moto_compat.moto_wsgi_app().get_application({"PATH_INFO": "/", "HTTP_HOST": HEADERS["Host"]})
assert app.debug is False and app.config["PROPAGATE_EXCEPTIONS"] is True
undo()
assert DomainDispatcherApplication.__init__ is init
assert requests_left_to_the_gc(5) == 5
print("ok")
"""


def test_a_served_request_is_freed_when_it_ends_not_left_to_the_cyclic_collector() -> None:
    # In a fresh interpreter: a local cloud started earlier in this process keeps the patch in place.
    done = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
