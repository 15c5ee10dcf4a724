"""HTTP errors in the shape vLLM's OpenAI server uses: ``{"error": {message, type,
param, code}}`` with the HTTP status as ``code``, so a client sees one error format
whether the ingress or the engine refused the request."""

from __future__ import annotations

import json

from starlette.responses import Response

#: Seconds a client should wait before retrying an overloaded or draining server.
RETRY_AFTER_S = 1
#: ... and before retrying a model whose replicas are all restarting (engine load is slow).
REPLICA_RETRY_AFTER_S = 10


def error_response(
    status: int,
    message: str,
    err_type: str,
    *,
    param: str | None = None,
    retry_after: int | None = None,
) -> Response:
    """A JSON error response; ``retry_after`` adds the ``Retry-After`` header."""
    body = {"error": {"message": message, "type": err_type, "param": param, "code": status}}
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return Response(
        json.dumps(body), status_code=status, media_type="application/json", headers=headers
    )


def bad_request(message: str, param: str | None = None) -> Response:
    return error_response(400, message, "BadRequestError", param=param)


def model_not_found(model: object) -> Response:
    # vLLM's own wording (OpenAIServing._check_model), so clients match one message.
    return error_response(404, f"The model `{model}` does not exist.", "NotFoundError")


def unauthorized(message: str) -> Response:
    return error_response(401, message, "AuthenticationError")


def unavailable(message: str, retry_after: int = RETRY_AFTER_S) -> Response:
    return error_response(503, message, "ServiceUnavailableError", retry_after=retry_after)


def internal_error() -> Response:
    """A 500 that names nothing internal (the cause is logged by the caller)."""
    return error_response(500, "internal server error", "InternalServerError")


def sse_error(status: int, message: str, err_type: str) -> bytes:
    """An error event that ends an SSE stream, then ``[DONE]`` (as vLLM ends one)."""
    body = {"error": {"message": message, "type": err_type, "param": None, "code": status}}
    return b"data: " + json.dumps(body).encode() + b"\n\ndata: [DONE]\n\n"
