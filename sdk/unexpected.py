"""The last line of defence: an exception nobody expected becomes a provider-shaped 500.

Both doors call this for anything that is not a `SlipstreamError` or an upstream answer. The
client gets the provider's error shape with a request id; the log gets the traceback under the
same id (never the request body); `slipstream_errors_total{kind="internal"}` counts it.
"""

from __future__ import annotations

import logging
import secrets

from sdk.errors import SlipstreamError
from sdk.observability import metrics

log = logging.getLogger("slipstream.internal")


def unexpected_error(exc: BaseException, team: str | None, request_id: str | None = None) -> SlipstreamError:
    """`request_id`: the request's own (its access-log line's) once it has one."""
    request_id = request_id or secrets.token_hex(8)
    log.error("internal error in request %s (team %s): %s", request_id, team or "-", type(exc).__name__, exc_info=exc)
    metrics.ERRORS.labels(team or "none", "internal").inc()
    return SlipstreamError(f"internal error in Slipstream (request id {request_id}); the request was not completed", status=500,
                           headers={"x-slipstream-request-id": request_id})
