"""What every OpenAI endpoint shares: response headers (C.7), the error shape (C.6), the
authentication/JSON preamble and the pre-response fault handling."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from . import streaming
from .asgi import Call, Headers
from .faults import FaultSet
from .paging import limit_of, page

if TYPE_CHECKING:
    from .app import Emulator

_NO_KEY = (
    "You didn't provide an API key. You need to provide your API key in an Authorization header "
    "using Bearer auth (i.e. Authorization: Bearer YOUR_KEY), or as the password field (with "
    "blank username) if you're accessing the API from your browser and are prompted for a "
    "username and password. You can obtain an API key from https://platform.openai.com/account/api-keys."
)
_BAD_JSON = (
    "We could not parse the JSON body of your request. (HINT: This likely means you aren't using "
    "your HTTP library correctly. The OpenAI API expects a JSON payload, but what was sent was not "
    "valid JSON. If you have trouble figuring out how to fix this, please contact us through our "
    "help center at help.openai.com.)"
)
SERVER_ERROR = "The server had an error while processing your request. Sorry about that!"
OVERLOADED = "The server is overloaded or not ready yet."

# C.7: limits, remaining and reset durations (static plausible values).
_RL: Headers = [
    (b"openai-organization", b"org-emulator"),
    (b"openai-version", b"2020-10-01"),
    (b"openai-processing-ms", b"1"),
    (b"x-ratelimit-limit-requests", b"10000"),
    (b"x-ratelimit-limit-tokens", b"30000000"),
    (b"x-ratelimit-remaining-requests", b"9999"),
    (b"x-ratelimit-remaining-tokens", b"29999000"),
    (b"x-ratelimit-reset-requests", b"6ms"),
    (b"x-ratelimit-reset-tokens", b"2ms"),
]

Problem = tuple[str, "str | None", "str | None"]  # (message, param, code) of a 400


def headers(call: Call) -> Headers:
    h = [(b"x-request-id", call.request_id.encode())]
    h.extend(_RL)
    return h


def err_obj(message: str, etype: str = "invalid_request_error", param: str | None = None,
            code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": etype, "param": param, "code": code}}


async def error(emu: Emulator, call: Call, status: int, obj: dict[str, Any],
                extra: Headers | None = None) -> None:
    h = headers(call)
    if extra:
        h.extend(extra)
    emu.count_status(status)
    await call.json(status, obj, h)


async def bad(emu: Emulator, call: Call, message: str, param: str | None = None,
              code: str | None = None) -> None:
    await error(emu, call, 400, err_obj(message, param=param, code=code))


async def not_found(emu: Emulator, call: Call, message: str, param: str | None = None,
                    code: str | None = None) -> None:
    await error(emu, call, 404, err_obj(message, param=param, code=code))


async def ok(emu: Emulator, call: Call, obj: Any) -> None:
    emu.count_status(200)
    await call.json(200, obj, headers(call))


async def answer_page(emu: Emulator, call: Call, rows: list[dict[str, Any]], default: int = 20,
                      most: int = 100) -> None:
    """A list endpoint's answer: the page of `rows` that the query's `limit` (1..most) and `after`
    cursor pick, or the 400 for a `limit` out of range."""
    q = call.query()
    n = limit_of(q, default, most)
    if n is None:
        await bad(emu, call, f"Invalid 'limit': expected an integer between 1 and {most}.", "limit",
                  "invalid_value")
        return
    await ok(emu, call, {"object": "list", **page(rows, n, q.get("after"))})


def fault_body(status: int, model: str | None) -> dict[str, Any]:
    if status == 429:
        return err_obj(
            f"Rate limit reached for {model or 'default'} in organization org-emulator on requests "
            "per min (RPM): Limit 10000, Used 10000, Requested 1. Please try again in 1s. Visit "
            "https://platform.openai.com/account/rate-limits to learn more.",
            "requests", "requests", "rate_limit_exceeded")
    if status == 503:
        return err_obj(OVERLOADED, "server_error")
    if status >= 500:
        return err_obj(SERVER_ERROR, "server_error")
    if status == 401:
        return err_obj("Incorrect API key provided.", code="invalid_api_key")
    return err_obj(f"Emulated error {status}.")


async def over_the_minute(emu: Emulator, call: Call, key: str, model: str, requested: int) -> bool:
    """OpenAI's 429 for a request that alone asks more tokens than the key's per-minute limit
    (EmulatorConfig.openai_tpm_limits): no wait makes it fit. True once answered."""
    limit = emu.config.openai_tpm_limits.get(key)
    if limit is None or requested <= limit:
        return False
    await error(emu, call, 429, err_obj(
        f"Request too large for {model} in organization org-emulator on tokens per min (TPM): Limit {limit}, "
        f"Requested {requested}. The input or output tokens must be reduced in order to run successfully. "
        "Visit https://platform.openai.com/account/rate-limits to learn more.", "tokens", None, "rate_limit_exceeded"))
    return True


async def authenticate(emu: Emulator, call: Call) -> str | None:
    """The Bearer key, or None after answering 401."""
    call.request_id = emu.new_id("req_")
    auth = call.headers.get("authorization", "")
    key = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
    if not key:
        await error(emu, call, 401, err_obj(_NO_KEY))
        return None
    keys = emu.config.api_keys
    if keys is not None and key not in keys:
        shown = key[:3] + "*" * 3 + key[-4:] if len(key) > 8 else "***"
        await error(emu, call, 401, err_obj(
            f"Incorrect API key provided: {shown}. You can find your API key at "
            "https://platform.openai.com/account/api-keys.", code="invalid_api_key"))
        return None
    scopes = emu.config.openai_key_scopes.get(key)
    if scopes is not None and (needed := scope_of(call.path)) not in scopes:
        await error(emu, call, 401, err_obj(
            f"You have insufficient permissions for this operation. Missing scopes: {needed}. Check that you have "
            "the correct role in your organization (Reader, Writer, Owner) and project (Member, Owner), and if "
            "you're using a restricted API key, that it has the necessary scopes."))
        return None
    return key


def scope_of(path: str) -> str:
    """The scope a restricted key needs for `path` (one per API, as OpenAI names them)."""
    api = path.removeprefix("/v1/").split("/")[0]
    return {"chat": "model.request", "completions": "model.request", "embeddings": "model.request",
            "models": "api.model.read", "batches": "api.batch.write"}.get(api, f"api.{api}.write")


async def json_body(emu: Emulator, call: Call) -> dict[str, Any] | None:
    """The request body as a JSON object, or None after answering 400."""
    try:
        body = orjson.loads(call.body)
    except orjson.JSONDecodeError:
        await bad(emu, call, _BAD_JSON)
        return None
    if not isinstance(body, dict):
        await bad(emu, call, "Invalid type for request body: expected an object.", code="invalid_type")
        return None
    return body


async def preamble(emu: Emulator, call: Call) -> tuple[dict[str, Any], str] | None:
    """(body, key) for a JSON POST, or None once an error has been answered."""
    key = await authenticate(emu, call)
    if key is None:
        return None
    body = await json_body(emu, call)
    return None if body is None else (body, key)


async def pre_faults(emu: Emulator, call: Call, model: str | None,
                     stream: bool) -> tuple[bool, FaultSet | None]:
    """(handled, faults): faults that answer before the first byte are applied here."""

    async def bad_spec(message: str) -> None:
        await bad(emu, call, message)

    async def send_fault(status: int, extra: Headers) -> None:
        status = 503 if status == 529 else status
        if status == 429:
            extra.append((b"x-ratelimit-remaining-requests", b"0"))
        await error(emu, call, status, fault_body(status, model), extra)

    return await streaming.pre_faults(emu, call, model, stream, bad_spec, send_fault)


@dataclass(slots=True)
class Request:
    """A generation request that passed auth, faults and validation."""

    body: dict[str, Any]
    key: str
    model: str  # "" where the endpoint allows no model (input_tokens)
    stream: bool
    faults: FaultSet | None


def model_missing(model: str) -> dict[str, Any]:
    return err_obj(f"The model `{model}` does not exist or you do not have access to it.",
                   code="model_not_found")


async def begin(emu: Emulator, call: Call, validate: Callable[[dict[str, Any]], Problem | None],
                known: Callable[[str], bool]) -> Request | None:
    """Auth, JSON, pre-response faults, `validate`, then the model if any (`known`, else 404);
    None once an answer has been sent."""
    pre = await preamble(emu, call)
    if pre is None:
        return None
    body, key = pre
    model = body.get("model") if isinstance(body.get("model"), str) else None
    stream = body.get("stream") is True
    handled, faults = await pre_faults(emu, call, model, stream)
    if handled:
        return None
    err = validate(body)
    if err:
        await bad(emu, call, *err)
        return None
    if model is not None and not known(model):
        await error(emu, call, 404, model_missing(model))
        return None
    return Request(body, key, model or "", stream, faults)


def check_tool_choice(tc: Any, names: list[str], named: Any) -> Problem | None:
    """`tool_choice` is none/auto/required or an object; a named function must be in `tools`."""
    if isinstance(tc, str):
        if tc not in ("none", "auto", "required"):
            return (f"Invalid value: '{tc}'. Supported values are: 'none', 'auto', and 'required'.",
                    "tool_choice", "invalid_value")
    elif isinstance(tc, dict):
        if tc.get("type") == "function" and named not in names:
            return (f"Invalid value for 'tool_choice': tool '{named}' is not in 'tools'.",
                    "tool_choice", "invalid_value")
    else:
        return "Invalid type for 'tool_choice'.", "tool_choice", "invalid_type"
    return None


SAMPLING = (("temperature", 0, 2), ("top_p", 0, 1))
PENALTIES = (("presence_penalty", -2, 2), ("frequency_penalty", -2, 2))


def check_ranges(body: dict[str, Any], *specs: tuple[str, float, float]) -> Problem | None:
    """The first (name, lo, hi) decimal parameter out of range, if any."""
    for name, lo, hi in specs:
        r = check_range(body, name, lo, hi)
        if r:
            return r
    return None


def check_range(body: dict[str, Any], name: str, lo: float, hi: float) -> Problem | None:
    v = body.get(name)
    if v is None:
        return None
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return (f"Invalid type for '{name}': expected a decimal, but got {type(v).__name__} instead.",
                name, "invalid_type")
    if v > hi:
        return (f"Invalid '{name}': decimal above maximum value. Expected a value <= {hi:g}, but got "
                f"{v} instead.", name, "decimal_above_max_value")
    if v < lo:
        return (f"Invalid '{name}': decimal below minimum value. Expected a value >= {lo:g}, but got "
                f"{v} instead.", name, "decimal_below_min_value")
    return None


def check_int(body: dict[str, Any], name: str, lo: int) -> Problem | None:
    v = body.get(name)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool):
        return f"Invalid type for '{name}': expected an integer.", name, "invalid_type"
    if v < lo:
        return (f"Invalid '{name}': integer below minimum value. Expected a value >= {lo}, but "
                f"got {v} instead.", name, "integer_below_min_value")
    return None


def midstream_message(faults: FaultSet | None) -> str:
    otype = faults.midstream_type if faults else "overloaded_error"
    return OVERLOADED if otype == "overloaded_error" else SERVER_ERROR


def midstream_error(faults: FaultSet | None, model: str | None) -> dict[str, Any]:
    """The error a `midstream_error` fault sends in band: a rate limit's (type rate_limit_error or
    rate_limit_exceeded: the 429's body, naming the organization), else a server error."""
    if faults is not None and faults.midstream_type in ("rate_limit_error", "rate_limit_exceeded"):
        return fault_body(429, model)
    return err_obj(midstream_message(faults), "server_error")


async def admit(emu: Emulator, call: Call) -> str | None:
    """Authentication and pre-response faults for a request without a JSON body to read first:
    the API key, or None once an answer has been sent."""
    key = await authenticate(emu, call)
    if key is None:
        return None
    handled, _ = await pre_faults(emu, call, None, False)
    return None if handled else key


def served_tier(body: dict[str, Any]) -> str:
    """The `service_tier` an answer reports it was served on: the one asked for when it is `priority` or
    `flex` (the emulator always has the capacity), else `default` (`auto` included); OpenAI bills by it."""
    tier = body.get("service_tier")
    return tier if tier in ("priority", "flex") else "default"
