"""JSON output (`response_format` json_object / json_schema, Responses `text.format`) for an Anthropic target.

Anthropic's structured outputs (`output_config.format: {type: json_schema, schema}`) constrain the
answer to a schema; a json_schema request to a model that has them (Claude 4.5 and later) gets them,
its schema brought to the subset they take (`claude_schema`). They have no "any object": every object
must close its properties, so a json_object request, and a json_schema request to an older model, gets
an instruction in the system prompt (with the schema, if any) and, for a model that takes an assistant
prefill (those before 4.6), an assistant turn that opens the object (`{`). The prefill is re-attached
to the answer, which is then validated as JSON: an answer that is not JSON (and was not cut by
max_tokens, where OpenAI's JSON mode too returns what was written) is a 502, never passed on as if it were.
Claude 4.6 and later, which take no prefill, often wrap such an answer in a Markdown code fence (```json …
```) despite the instruction: one fence around the whole answer is taken off (`unfenced`, and `Unfencer`
for a stream), so the client gets the bare JSON that OpenAI's JSON mode gives.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

from sdk.errors import InvalidRequestError, SlipstreamError
from sdk.routing.backoff import TranslationRefused

PREFILL = "{"
# Claude models without structured outputs (those before Claude 4.5); they accept an assistant prefill,
# which 4.6 and later reject.
_LEGACY = re.compile(r"^claude-(instant|2|3)|^claude-(opus|sonnet)-4(-0|-1|-2025|$)")
# Claude models that take an assistant prefill: those before 4.6 (4.6 and later answer one with a 400).
_PREFILLS = re.compile(r"^claude-(instant|2|3)|^claude-(opus|sonnet|haiku)-4(-[015]|-2025|$)")


@dataclass(frozen=True, slots=True)
class JsonMode:
    schema: dict[str, Any] | None  # json_schema's schema; None for json_object
    native: bool  # Anthropic's structured outputs (json_schema, a model that has them); else an instruction
    prefill: str  # the assistant turn opening the object, for a model that takes one; else ""

    def apply(self, out: dict[str, Any], system: str | list[dict[str, Any]],
              messages: list[dict[str, Any]]) -> tuple[str | list[dict[str, Any]], list[dict[str, Any]]]:
        """`out` (an Anthropic body being built), its system prompt (text or text blocks) and messages, asking for JSON."""
        if self.native:
            out.setdefault("output_config", {})["format"] = {"type": "json_schema", "schema": claude_schema(self.schema)}
            return system, messages
        instruction = "Answer with one JSON object and nothing else: no prose, no code fence."
        if self.schema is not None:
            instruction += " It must validate against this JSON Schema: " + orjson.dumps(self.schema).decode()
        return instructed(system, instruction), [*messages, {"role": "assistant", "content": [{"type": "text", "text": self.prefill}]}] if self.prefill else messages


def beta_format(body: dict[str, Any]) -> dict[str, Any]:
    """A Messages `body` with `output_format`, the structured-outputs beta's name of `output_config.format` (beta header
    structured-outputs-2025-11-13, which clients written for the beta still send; the anthropic SDK calls it deprecated
    and sends it as output_config.format), as output_config.format. Both at once is the client's error, in the SDK's words."""
    fmt = body.get("output_format")
    if fmt is None:
        return body
    config = body.get("output_config")
    if isinstance(config, dict) and config.get("format") is not None:
        raise InvalidRequestError("Both output_format and output_config.format were provided. "
                                  "Please use only output_config.format (output_format is deprecated).")
    rest = {key: value for key, value in body.items() if key != "output_format"}
    return {**rest, "output_config": {**(config if isinstance(config, dict) else {}), "format": fmt}}


def instructed(system: str | list[dict[str, Any]], instruction: str) -> str | list[dict[str, Any]]:
    """A system prompt (text, or text blocks) with `instruction` after it."""
    if isinstance(system, list):  # blocks carrying the client's breakpoints: the instruction follows them
        return [*system, {"type": "text", "text": f"\n\n{instruction}"}]
    return f"{system}\n\n{instruction}" if system else instruction


# OpenAI's `verbosity` (gpt-5: how long and detailed the answer is; Codex CLI sends `low` on every
# request) has no Claude setting: it is asked for the way one asks Claude, in the system prompt.
VERBOSITY = {"low": "Be concise: answer in as few words as the task needs.", "high": "Be thorough: answer in full detail."}


# Claude's structured outputs take a subset of JSON Schema (Anthropic's structured-outputs docs, "JSON Schema
# limitations"): every object with `additionalProperties: false`; no numeric, string-length or object-size
# constraints; `minItems` 0 or 1 only; a 400 otherwise. OpenAI takes all of these (a non-strict schema need
# not close its objects), so a client's schema is brought to Claude's subset as Anthropic's own SDK brings
# one (anthropic `transform_schema`): a constraint Claude cannot enforce moves into the description.
_UNSUPPORTED = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minLength", "maxLength",
                "maxItems", "minProperties", "maxProperties")


def claude_schema(schema: Any) -> Any:
    """`schema` within Claude's structured-outputs subset (its sub-schemas too)."""
    if not isinstance(schema, dict):
        return schema
    out = {key: value for key, value in schema.items() if key not in _UNSUPPORTED}
    moved = {key: schema[key] for key in _UNSUPPORTED if key in schema}
    if schema.get("minItems", 0) not in (0, 1):
        moved["minItems"] = out.pop("minItems")
    for key in ("properties", "$defs", "definitions"):
        if isinstance(schema.get(key), dict):
            out[key] = {name: claude_schema(sub) for name, sub in schema[key].items()}
    for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
        if isinstance(schema.get(key), list):
            out[key] = [claude_schema(sub) for sub in schema[key]]
    if "items" in schema:
        out["items"] = claude_schema(schema["items"])
    if schema.get("type") == "object" or "properties" in schema:
        out["additionalProperties"] = False
    if moved:
        note = "{" + ", ".join(f"{key}: {orjson.dumps(value).decode()}" for key, value in moved.items()) + "}"
        out["description"] = f"{schema['description']}\n\n{note}" if schema.get("description") else note
    return out


def openai_strict(schema: Any) -> bool:
    """Whether OpenAI's strict Structured Outputs take `schema` (a Messages request's, for an OpenAI target):
    every object lists all its properties in `required` and is closed. Claude's own structured outputs
    also take optional properties, which strict mode answers with a 400 ("'required' is required to be
    supplied and to be an array including every key in properties"); such a schema goes non-strict."""
    if not isinstance(schema, dict):
        return True
    props = schema.get("properties")
    if (schema.get("type") == "object" or isinstance(props, dict)) and (
            schema.get("additionalProperties") is not False or set(props or {}) - set(schema.get("required") or ())):
        return False
    inner = [*(props or {}).values(), *(schema.get("$defs") or {}).values(), *(schema.get("anyOf") or ()), schema.get("items")]
    return all(openai_strict(sub) for sub in inner)


def json_mode(body: dict[str, Any]) -> JsonMode | None:
    """The JSON output a Chat Completions body asks for (None: text)."""
    fmt = body.get("response_format")
    kind = fmt.get("type") if isinstance(fmt, dict) else fmt
    if kind in (None, "text"):
        return None
    if kind not in ("json_object", "json_schema") or not isinstance(fmt, dict):
        raise TranslationRefused(f"response_format {kind!r} cannot be translated for an Anthropic target")
    schema = None
    if kind == "json_schema":
        schema = (fmt.get("json_schema") or {}).get("schema")
        if not isinstance(schema, dict):
            raise TranslationRefused("response_format.json_schema.schema: an object is required for an Anthropic target")
    model = str(body.get("model") or "")
    native = schema is not None and not _LEGACY.match(model) and not _open_object(schema)
    return JsonMode(schema, native, "" if native or not _PREFILLS.match(model) else PREFILL)


def _open_object(schema: Any) -> bool:
    """Whether `schema` has a map (an object whose `additionalProperties` is a schema or true: pydantic's
    `dict[str, int]`). Claude's structured outputs close every object, which would force such a map to be
    `{}`; the schema goes as an instruction instead, the answer validated as JSON."""
    if isinstance(schema, list):
        return any(_open_object(sub) for sub in schema)
    if not isinstance(schema, dict):
        return False
    extra = schema.get("additionalProperties")
    if extra is True or isinstance(extra, dict):
        return True
    return any(_open_object(value) for key, value in schema.items() if key not in ("additionalProperties", "enum", "const", "default", "examples"))


# One Markdown code fence around a whole answer: an opening ``` (with an info string such as `json`) on
# its own line, the closing ``` last; whitespace around either.
_FENCED = re.compile(r"\s*```[\w-]*[ \t]*\n(.*?)\n?[ \t]*```\s*", re.DOTALL)


def unfenced(text: str) -> str:
    """`text` without one code fence around all of it (the text as it is, if there is none)."""
    match = _FENCED.fullmatch(text)
    return match.group(1) if match else text


class Unfencer:
    """Takes one code fence around a streamed answer off as the text arrives: the start is held until it
    is clearly a fence's opening line or not one; once a fence was opened, trailing whitespace and
    backticks (a closing fence, maybe) are held until more text follows or the answer ends."""

    def __init__(self) -> None:
        self.head = ""  # the answer's start, until it is known whether it opens a fence
        self.fenced: bool | None = None  # None: not known yet
        self.tail = ""  # held: it may be the closing fence

    def feed(self, text: str) -> str:
        """What of `text` can be sent now."""
        if self.fenced is None:
            self.head += text
            start = self.head.lstrip()
            if start.startswith("```") and "\n" in start:
                self.fenced, text = True, start.split("\n", 1)[1]
            elif "```".startswith(start[:3]) and "\n" not in start:
                return ""  # still maybe a fence's opening line
            else:
                self.fenced, text = False, self.head
        if not self.fenced:
            return text
        text = self.tail + text
        kept = text.rstrip(" \t\r\n`")
        self.tail = text[len(kept):]
        return kept

    def flush(self) -> str:
        """What is held, once the answer has ended: a closing fence is left out."""
        held = self.head if self.fenced is None else "" if self.tail.strip() in ("```", "") else self.tail
        self.head = self.tail = ""
        return held


def validated(text: str, truncated: bool) -> str:
    """`text` (prefill re-attached), without a code fence around it, if it is JSON; a 502 if not, unless the
    answer was cut at max_tokens."""
    text = unfenced(text)
    if not truncated:
        try:
            orjson.loads(text)
        except orjson.JSONDecodeError:
            raise SlipstreamError("the model's answer to a JSON-mode request is not valid JSON", status=502) from None
    return text
