"""JSON output (`response_format` json_object / json_schema, Responses `text.format`) for an Anthropic target.

Anthropic's structured outputs (`output_config.format: {type: json_schema, schema}`) constrain the
answer to a schema; models that have them (Claude 4.5 and later) get them: a json_schema request its
schema, a json_object request the schema of any object. Older models have no structured outputs but
accept an assistant prefill: they get an instruction in the system prompt (with the schema, if any)
and an assistant turn that opens the object (`{`). The prefill is re-attached to the answer, which
is then validated as JSON: an answer that is not JSON (and was not cut by max_tokens, where OpenAI's
JSON mode too returns what was written) is a 502, never passed on as if it were.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

from sdk.errors import SlipstreamError
from sdk.routing.backoff import TranslationRefused

PREFILL = "{"
# Claude models without structured outputs (those before Claude 4.5); they accept an assistant prefill,
# which 4.6 and later reject.
_LEGACY = re.compile(r"^claude-(instant|2|3)|^claude-(opus|sonnet)-4(-0|-1|-2025|$)")


@dataclass(frozen=True, slots=True)
class JsonMode:
    schema: dict[str, Any] | None  # json_schema's schema; None for json_object
    native: bool  # Anthropic's structured outputs; else instruction + prefill

    @property
    def prefill(self) -> str:
        return "" if self.native else PREFILL

    def apply(self, out: dict[str, Any], system: str | list[dict[str, Any]],
              messages: list[dict[str, Any]]) -> tuple[str | list[dict[str, Any]], list[dict[str, Any]]]:
        """`out` (an Anthropic body being built), its system prompt (text or text blocks) and messages, asking for JSON."""
        if self.native:
            out.setdefault("output_config", {})["format"] = {"type": "json_schema", "schema": self.schema or {"type": "object"}}
            return system, messages
        instruction = "Answer with one JSON object and nothing else: no prose, no code fence."
        if self.schema is not None:
            instruction += " It must validate against this JSON Schema: " + orjson.dumps(self.schema).decode()
        if isinstance(system, list):  # blocks carrying the client's breakpoints: the instruction follows them
            system = [*system, {"type": "text", "text": f"\n\n{instruction}"}]
        else:
            system = f"{system}\n\n{instruction}" if system else instruction
        return system, [*messages, {"role": "assistant", "content": [{"type": "text", "text": PREFILL}]}]


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
    native = not _LEGACY.match(str(body.get("model") or ""))
    return JsonMode(schema, native)


def validated(text: str, truncated: bool) -> str:
    """`text` (prefill re-attached) if it is JSON; a 502 if not, unless the answer was cut at max_tokens."""
    if not truncated:
        try:
            orjson.loads(text)
        except orjson.JSONDecodeError:
            raise SlipstreamError("the model's answer to a JSON-mode request is not valid JSON", status=502) from None
    return text
