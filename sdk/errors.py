"""Errors are answers: every failure becomes a provider-shaped error body.

Anthropic: {"type":"error","error":{"type":...,"message":...}}
OpenAI:    {"error":{"message":...,"type":...,"param":null,"code":...}}
"""

from __future__ import annotations

import re

import orjson

from sdk.types import Protocol

# Anthropic's error.type for each status (Anthropic's API docs, api/errors); OpenAI reuses its own codes.
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}
_OPENAI_TYPES = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("permission_error", None),
    404: ("invalid_request_error", "model_not_found"),
    413: ("invalid_request_error", "request_too_large"),
    429: ("rate_limit_error", "rate_limit_exceeded"),
}


class SlipstreamError(Exception):
    """An error Slipstream answers itself, shaped like the client's provider would shape it."""

    status: int = 500

    def __init__(self, message: str, *, status: int | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        self.headers = headers or {}

    def body(self, protocol: Protocol) -> bytes:
        return error_body(protocol, self.status, self.message)

    def sse_event(self, protocol: Protocol) -> bytes:
        """The error as a stream event, for failures after the first streamed byte."""
        return error_event(protocol, self.status, self.message)


class InvalidRequestError(SlipstreamError):
    status = 400


class InvalidParameterError(InvalidRequestError):
    """A 400 about one parameter, named as OpenAI names it (`param`, `code`) in an OpenAI-shaped body."""

    def __init__(self, message: str, param: str, code: str):
        super().__init__(message)
        self.param, self.code = param, code

    def body(self, protocol: Protocol) -> bytes:
        if protocol is Protocol.ANTHROPIC:
            return super().body(protocol)
        return orjson.dumps({"error": {"message": self.message, "type": "invalid_request_error", "param": self.param, "code": self.code}})


class AuthenticationError(SlipstreamError):
    status = 401


class NotFoundError(SlipstreamError):
    status = 404


class RequestTooLargeError(SlipstreamError):
    status = 413


class RateLimitedError(SlipstreamError):
    """A team or key limit of Slipstream's own (not the provider's); carries retry-after."""

    status = 429


class UpstreamUnreachableError(SlipstreamError):
    status = 502


class UpstreamTimeoutError(SlipstreamError):
    status = 504


class PolicyError(Exception):
    """A policy file is invalid; the message names the file, the key and what was expected."""


class UpstreamHTTPError(Exception):
    """A provider answered with an error status; its body and headers go back to the client as they are."""

    def __init__(self, status: int, body: bytes, headers: dict[str, str], route: str):
        super().__init__(f"{route} answered {status}")
        self.status = status
        self.body = body
        self.headers = headers
        self.route = route


def error_body(protocol: Protocol, status: int, message: str) -> bytes:
    if protocol is Protocol.ANTHROPIC:
        kind = _ANTHROPIC_TYPES.get(status, "api_error")
        return orjson.dumps({"type": "error", "error": {"type": kind, "message": message}})
    kind, code = _OPENAI_TYPES.get(status, ("server_error" if status >= 500 else "invalid_request_error", None))
    return orjson.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}})


def credentials_refused(protocol: Protocol, status: int, provider: str) -> bytes:
    """What a team's client gets for a provider's 401/403: the provider refused the gateway's own
    key, and its body can echo that key (masked or not), so the gateway answers instead. Every
    endpoint and both doors answer with it (gateway/proxy.py, sdk/passthrough/)."""
    message = (f"provider {provider!r} refused the gateway's upstream credentials ({status}); the gateway's "
               "operator must fix the provider key in the policy. Your team key was accepted.")
    return error_body(protocol, status, message)


def too_large_for_a_minute(body: bytes) -> bool:
    """Whether a provider's 429 says the request alone asked more than the key's per-minute limit:
    OpenAI's "Request too large for gpt-4o in organization … on tokens per min (TPM): Limit 30000,
    Requested 45000" (code rate_limit_exceeded). No wait makes it fit; an ordinary 429 ("Rate limit
    reached for …") and insufficient_quota are about the account."""
    try:
        error = orjson.loads(body).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        return False
    return isinstance(error, dict) and str(error.get("message", "")).startswith("Request too large for ")


def lacks_scope(body: bytes) -> bool:
    """Whether a provider's 401 refused a call outside a restricted key's scopes (OpenAI: "You have
    insufficient permissions for this operation. Missing scopes: api.responses.write"): the call
    asked for an API the key may not use; the key is good for the others."""
    try:
        error = orjson.loads(body).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        return False
    return isinstance(error, dict) and "Missing scopes:" in str(error.get("message", ""))


def account_limit_message(provider: str, too_large: bool = False, in_band: bool = False) -> str:
    """What a team is told of a provider's rate or quota limit on an account other teams share, in
    place of the provider's message (which names the account and how much of it every team used);
    `in_band`: in a stream's error event, which has no retry-after header."""
    if too_large:
        return (f"the request asks provider {provider!r} for more tokens than its key may take in a minute; "
                "reduce its input or output tokens (retrying does not help)")
    retry = "retry later" if in_band else "retry after the time the retry-after header gives"
    return f"provider {provider!r} is over a rate limit of the provider account that this gateway's teams share; {retry}"


def account_rate_limited(protocol: Protocol, body: bytes, provider: str) -> bytes:
    """A provider's 429 on an account other teams share, as a team's client gets it. Its message
    names the account and how much of its limit every team has used ("Rate limit reached for gpt-4o
    in organization org-…: Limit 10000, Used 9990"; "the rate limit for your organization (…)"),
    which a team is not told; the rest of the body (the error's type and code, which clients read)
    is the provider's."""
    message = account_limit_message(provider, too_large_for_a_minute(body))
    try:
        answer = orjson.loads(body)
    except orjson.JSONDecodeError:
        answer = None
    error = answer.get("error") if isinstance(answer, dict) else None
    if not isinstance(error, dict):
        return error_body(protocol, 429, message)
    return orjson.dumps({**answer, "error": {**error, "message": message}})


_URL = re.compile(r"[a-z][a-z0-9+.-]*://\S+", re.IGNORECASE)
_ADDRESS = re.compile(r"\s*\(?'[^']*', \d+\)?|\s*\b(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?|\s*\[[0-9a-f:]+\](?::\d+)?", re.IGNORECASE)


def naming_provider(exc: SlipstreamError, provider: str) -> SlipstreamError:
    """`exc`, raised by the upstream client with the upstream's URL in its message, as a client may
    see it: the same error naming the provider by its policy name, without URL, host or address
    (the operator finds those in the log and the exception's cause)."""
    named = f"provider {provider!r}"
    message = _ADDRESS.sub("", _URL.sub(lambda url: named + url.group()[len(url.group().rstrip(":,;.)'\"")):], exc.message))
    if named not in message:
        message = f"{named}: {message}"
    return type(exc)(message, status=exc.status, headers=exc.headers)


def error_event(protocol: Protocol, status: int, message: str) -> bytes:
    if protocol is Protocol.ANTHROPIC:
        return b"event: error\ndata: " + error_body(protocol, status, message) + b"\n\n"
    return b"data: " + error_body(protocol, status, message) + b"\n\n"


class ProviderUnavailableError(SlipstreamError):
    """A target cannot serve at all (no key, engine missing); the router moves to the next target."""

    status = 502
