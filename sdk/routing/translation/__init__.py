"""Cross-protocol translation: Anthropic-shaped requests served by OpenAI targets and back."""

from sdk.routing.translation.provider import TranslatingProvider

__all__ = ["TranslatingProvider"]
