"""The gateway's one exception tree, translated into OpenAI-format error bodies by one handler.

    GatewayError                      500  server_error (never raised for client input)
     ├── InvalidRequestError          400  invalid_request_error   (malformed JSON, wrong shapes)
     │    └── ValidationFailedError   422  invalid_request_error   (well-formed JSON, wrong fields)
     ├── AuthenticationError          401  authentication_error    (missing/wrong key or admin token)
     ├── PermissionDeniedError        403  permission_error
     ├── NotFoundError                404  not_found_error         (unknown/finished episode, session, call)
     ├── ConflictError                409  invalid_request_error   (feedback too late for its session)
     ├── PayloadTooLargeError         413  invalid_request_error
     ├── UnsupportedMediaError        415  invalid_request_error   (a body in a content type the route does not read)
     ├── QuotaExceededError           429  rate_limit_exceeded (+ Retry-After)  a tenant's quota (gateway/quotas.py)
     ├── UpstreamError                (upstream's status)          forwarded upstream failures
     │    ├── UpstreamUnavailableError 502                          connection refused/reset after retries
     │    └── UpstreamTimeoutError    504
     └── ServiceUnavailableError      503  (+ Retry-After)
          ├── PausedError                                           weights updating, hold deadline passed
          └── RecordingError                                        neither the bus nor the spool took the event

Each exception carries its context (episode_id, call_seq, upstream) as attributes; the handlers of
``infra.http`` (the HTTP kit every service shares) put only ``message``/``type``/``code``/``param``
into the body.
"""

from __future__ import annotations

import math
from typing import Any

from infra.http import HttpError


class GatewayError(HttpError):
    """An :class:`infra.http.HttpError` that also names the episode and call it concerns."""

    def __init__(
        self,
        message: str,
        *,
        episode_id: str | None = None,
        call_seq: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(message, **kwargs)
        self.episode_id = episode_id
        self.call_seq = call_seq


class InvalidRequestError(GatewayError):
    status_code = 400
    error_type = "invalid_request_error"


class ValidationFailedError(InvalidRequestError):
    status_code = 422


class AuthenticationError(GatewayError):
    status_code = 401
    error_type = "authentication_error"


class PermissionDeniedError(GatewayError):
    status_code = 403
    error_type = "permission_error"


class NotFoundError(GatewayError):
    status_code = 404
    error_type = "not_found_error"


class ConflictError(GatewayError):
    status_code = 409
    error_type = "invalid_request_error"


class PayloadTooLargeError(GatewayError):
    status_code = 413
    error_type = "invalid_request_error"


class UnsupportedMediaError(GatewayError):
    status_code = 415
    error_type = "invalid_request_error"


class QuotaExceededError(GatewayError):
    """A tenant is at one of its quotas (``quota``: sessions, requests_per_minute, tokens_per_minute)."""

    status_code = 429
    error_type = "rate_limit_exceeded"

    def __init__(
        self, message: str, *, tenant: str, quota: str, retry_after_s: float = 1.0, **kwargs: Any
    ) -> None:
        super().__init__(message, **kwargs)
        self.tenant = tenant
        self.quota = quota
        self.headers.setdefault("Retry-After", str(max(1, math.ceil(retry_after_s))))


class UpstreamError(GatewayError):
    """The upstream answered with an error; ``status_code`` is the upstream's."""

    status_code = 502
    error_type = "upstream_error"

    def __init__(self, message: str, *, upstream: str = "", **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.upstream = upstream
        if self.status_code < 400:
            self.status_code = 502


class UpstreamUnavailableError(UpstreamError):
    status_code = 502


class UpstreamTimeoutError(UpstreamError):
    status_code = 504
    error_type = "timeout"


class ServiceUnavailableError(GatewayError):
    status_code = 503
    error_type = "service_unavailable"

    def __init__(self, message: str, *, retry_after_s: float = 1.0, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.headers.setdefault("Retry-After", str(max(1, round(retry_after_s))))


class PausedError(ServiceUnavailableError):
    pass


class RecordingError(ServiceUnavailableError):
    pass
