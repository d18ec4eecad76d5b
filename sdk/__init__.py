"""Slipstream's SDK: the pipeline, and the drop-in clients `from sdk import OpenAI, AsyncOpenAI, Anthropic, AsyncAnthropic`.

The drop-in clients are imported lazily (PEP 562), so code that only needs the pipeline (the proxy,
`sdk.types`, ...) does not pay for importing the official `openai` and `anthropic` packages.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sdk.dropin import Anthropic, AsyncAnthropic, AsyncOpenAI, OpenAI

__all__ = ["Anthropic", "AsyncAnthropic", "AsyncOpenAI", "OpenAI"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from sdk import dropin

        return getattr(dropin, name)
    raise AttributeError(f"module 'sdk' has no attribute {name!r}")
