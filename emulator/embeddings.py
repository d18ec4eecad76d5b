"""OpenAI embeddings: POST /v1/embeddings.

Vectors are deterministic unit vectors drawn from a hash of (model, input): the same input
always gives the same vector, different inputs give (almost surely) different ones, and a
request for `dimensions=d` gets the first d components of the full vector renormalised, which is
how text-embedding-3 shortening works. Nothing semantic: similar texts are not close.
"""

from __future__ import annotations

import base64
import hashlib
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from . import openai_wire as wire
from .asgi import JSON_CT, Call
from .models import EMBEDDING_MODELS
from .streaming import respond_after
from .text import count_tokens

if TYPE_CHECKING:
    from .app import Emulator

MAX_INPUTS = 2048
_CACHE: dict[tuple[str, bytes, int], np.ndarray] = {}  # load tests repeat inputs
_CACHE_MAX = 4096


def vector(model: str, key: bytes, dims: int) -> np.ndarray:
    """The unit vector (float32) for one input (`key` is its text or packed token ids)."""
    ck = (model, key, dims)
    v = _CACHE.get(ck)
    if v is None:
        native = EMBEDDING_MODELS[model]
        raw = hashlib.shake_256(model.encode() + b"\x00" + key).digest(4 * native)
        full = np.frombuffer(raw, dtype="<i4")[:dims].astype(np.float64)
        v = (full / np.linalg.norm(full)).astype(np.float32)
        if len(_CACHE) >= _CACHE_MAX:
            _CACHE.clear()
        _CACHE[ck] = v
    return v


def _inputs(inp: Any) -> list[tuple[bytes, int]] | wire.Problem:
    """(hash key, token count) per input, or the 400 for a malformed `input`."""
    bad = ("'$.input' is invalid. Please check the API reference: "
           "https://platform.openai.com/docs/api-reference.", "input", "invalid_value")
    if isinstance(inp, str):
        return [(inp.encode(), count_tokens(inp))] if inp else bad
    if not isinstance(inp, list) or not inp or len(inp) > MAX_INPUTS:
        return bad
    if all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in inp):
        return [(b"t" + np.asarray(inp, dtype="<u4").tobytes(), len(inp))]
    out = []
    for x in inp:
        if isinstance(x, str) and x:
            out.append((x.encode(), count_tokens(x)))
        elif (isinstance(x, list) and x
              and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in x)):
            out.append((b"t" + np.asarray(x, dtype="<u4").tobytes(), len(x)))
        else:
            return bad
    return out


def _validate(body: dict[str, Any]) -> wire.Problem | None:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        return "you must provide a model parameter", None, None
    if body.get("input") is None:
        return "Missing required parameter: 'input'.", "input", "missing_required_parameter"
    fmt = body.get("encoding_format")
    if fmt is not None and fmt not in ("float", "base64"):
        return (f"Invalid value: '{fmt}'. Supported values are: 'float' and 'base64'.",
                "encoding_format", "invalid_value")
    d = body.get("dimensions")
    if d is not None:
        if model == "text-embedding-ada-002":
            return "This model does not support specifying dimensions.", "dimensions", None
        if not isinstance(d, int) or isinstance(d, bool) or d < 1:
            return (f"Invalid 'dimensions': integer below minimum value. Expected a value >= 1, but "
                    f"got {d} instead.", "dimensions", "integer_below_min_value")
        native = EMBEDDING_MODELS.get(model)
        if native is not None and d > native:
            return (f"This model's maximum dimensions is {native}, but you requested {d}.",
                    "dimensions", None)
    return None


async def embeddings(emu: Emulator, call: Call) -> None:
    req = await wire.begin(emu, call, _validate, EMBEDDING_MODELS.__contains__)
    if req is None:
        return
    body, model = req.body, req.model
    inputs = _inputs(body["input"])
    if not isinstance(inputs, list):
        await wire.bad(emu, call, *inputs)
        return
    dims = body.get("dimensions") or EMBEDDING_MODELS[model]
    as_b64 = body.get("encoding_format") == "base64"
    data = []
    for i, (key, _) in enumerate(inputs):
        v = vector(model, key, dims)
        emb: Any = base64.b64encode(v.tobytes()).decode() if as_b64 else v
        data.append({"object": "embedding", "index": i, "embedding": emb})
    tokens = sum(n for _, n in inputs)
    out = {"object": "list", "data": data, "model": model,
           "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
    headers = wire.headers(call)
    headers.append(JSON_CT)
    delay = emu.config.ttft_seconds(tokens, 0)
    payload = orjson.dumps(out, option=orjson.OPT_SERIALIZE_NUMPY)
    await respond_after(emu, call, delay, 200, payload, headers, lambda: None)
