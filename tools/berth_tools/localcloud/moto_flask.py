"""moto 5.2.5's server without Flask's debug mode, whose per-request class kept every request alive.

moto's ``create_backend_app`` sets ``backend_app.debug = True`` on the Flask app of each service. In
debug mode Flask's ``Request._load_form_data`` calls ``attach_enctype_error_multidict``, which defines a
new subclass of the request's ``files`` type per request whose ``__getitem__`` closes over the
request: request -> files -> class -> method -> closure -> request, a reference cycle through a class.
Reference counting never frees it; only the cyclic collector does, and the requests that live through
two young collections (long polls, Lambda invokes, any request under load) reach the oldest
generation, which Python collects in full only once the objects promoted since the last full
collection number a quarter of all long-lived ones. A local cloud that has run 1,000 jobs holds
millions of long-lived objects (its tables, histories, logs), so every request of an idle local cloud
(the scheduler's timer, the agents' heartbeats, the pollers) left its environ, body, parsed form,
socket reader and response behind for hours between full collections: the idle growth of about
10 MiB an hour (docs/local-cloud.md).

The patch (declared in ``moto_compat.SURFACES``) wraps ``DomainDispatcherApplication.__init__`` so the
apps its ``create_app`` makes run with ``debug`` off and ``PROPAGATE_EXCEPTIONS`` on (an exception in
a moto view still reaches the server as it did in debug mode). Nothing else of debug mode is used by
the local cloud (no templates are reloaded, no debugger is served).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from berth_tools.localcloud import moto_compat

_INIT = "moto.moto_server.werkzeug_app:DomainDispatcherApplication.__init__"


def quiet_app(app: Any) -> Any:
    """`app` (a moto backend's Flask app) out of debug mode, exceptions still propagated."""
    app.config["PROPAGATE_EXCEPTIONS"] = True
    app.debug = False
    return app


def _without_debug(create_app: Callable[..., Any]) -> Callable[..., Any]:
    if getattr(create_app, "_berth_no_debug", False):
        return create_app

    @functools.wraps(create_app)
    def create(*args: Any, **kwargs: Any) -> Any:
        return quiet_app(create_app(*args, **kwargs))

    create._berth_no_debug = True  # type: ignore[attr-defined]
    return create


def _init(original: Callable[..., None]) -> Callable[..., None]:
    def init(self: Any, create_app: Any, *args: Any, **kwargs: Any) -> None:
        original(self, _without_debug(create_app), *args, **kwargs)

    init._berth_no_debug = True  # type: ignore[attr-defined]
    return init


def install() -> Callable[[], None]:
    """Apply the patch (idempotent); returns the undo. Servers made before it keep their apps."""
    current = moto_compat.surface(_INIT)
    if getattr(current, "_berth_no_debug", False):
        return lambda: None
    return moto_compat.replace(_INIT, _init(current)).undo
