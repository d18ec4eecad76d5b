"""Offline stand-in for the Anthropic and OpenAI HTTP APIs (one port), with prompt-cache
accounting, a latency model, fault injection and counters. See docs/emulator.md."""

from .app import Emulator, EmulatorConfig, create_app, serve

__all__ = ["Emulator", "EmulatorConfig", "create_app", "serve"]
