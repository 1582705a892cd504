"""The one table from raftmq's error codes to HTTP statuses, and the JSON error body.

Every failure the API reports is `{"error": CODE_NAME, "message": text}` with the status
`HTTP_STATUS` gives the code: a client in any language branches on the status first and
on `error` (the same names `wire.protocol.Code` uses, so the SDK's documentation of each
code applies) when it needs to. Retriable codes are 503 with `Retry-After`: nothing was
written, or writing again is safe. A write whose outcome is unknown is 504: it may have
been stored, so the caller checks before resending, as with the SDK's
`OutcomeUnknownError`.
"""

from __future__ import annotations

from starlette.responses import JSONResponse

from raftmq.client.errors import OutcomeUnknownError
from wire.protocol import Code, RequestError

__all__ = ["HTTP_STATUS", "RETRY_AFTER_S", "error_response", "status_of"]

RETRY_AFTER_S = 1  # seconds: about one election

HTTP_STATUS: dict[Code, int] = {
    Code.MALFORMED: 400,
    Code.INVALID_NAME: 400,
    Code.UNKNOWN_OP: 400,
    Code.FRAME_TOO_LARGE: 413,
    Code.MESSAGE_TOO_LARGE: 413,
    Code.UNAUTHENTICATED: 401,
    Code.FORBIDDEN: 403,
    Code.UNKNOWN_TOPIC: 404,
    Code.UNKNOWN_QUEUE: 404,
    Code.UNKNOWN_GROUP: 404,
    Code.NOT_FOUND: 404,
    Code.TX_UNKNOWN: 404,
    Code.NOT_A_MEMBER: 404,
    Code.TOPIC_EXISTS: 409,
    Code.TX_DECIDED: 409,
    Code.TX_FENCED: 409,
    Code.STALE_RECEIPT: 409,
    Code.MEMBERSHIP_REFUSED: 409,
    Code.STALE_REQUEST: 409,
    Code.OFFSET_TOO_SMALL: 416,
    Code.OFFSET_TOO_LARGE: 416,
    Code.TX_LIMIT: 422,
    Code.INTERNAL: 500,
    Code.NOT_COORDINATOR: 503,
    # retriable (Code.retriable): 503 with Retry-After
    Code.NOT_LEADER: 503,
    Code.TIMEOUT: 503,
    Code.BUSY: 503,
    Code.PROPOSAL_DROPPED: 503,
    Code.SEQUENCE_GAP: 503,
    Code.UNAVAILABLE: 503,
    Code.CONNECTION_LOST: 503,
    Code.TX_PENDING: 503,
}
"""Status by code; a code missing here (a newer one) is a 500."""

OUTCOME_UNKNOWN = 504


def status_of(exc: RequestError) -> int:
    if isinstance(exc, OutcomeUnknownError):
        return OUTCOME_UNKNOWN
    return HTTP_STATUS.get(exc.code, 500)


def error_response(status: int, error: str, message: str, *,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    """The API's one shape of failure."""
    extra = dict(headers or {})
    if status == 503:
        extra.setdefault("Retry-After", str(RETRY_AFTER_S))
    if status == 401:
        extra.setdefault("WWW-Authenticate", 'Basic realm="raftmq", charset="UTF-8"')
    return JSONResponse({"error": error, "message": message}, status_code=status,
                        headers=extra)


def request_error_response(exc: RequestError) -> JSONResponse:
    status = status_of(exc)
    name = "OUTCOME_UNKNOWN" if status == OUTCOME_UNKNOWN else exc.code.name
    return error_response(status, name, exc.message)
