"""Fixtures: one emulator per module (reset before every test) and official clients bound to it."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import openai
import pytest

from emulator.testing import RunningEmulator, running_emulator

KEY = "sk-test-emulator"


@pytest.fixture(scope="module")
def _server() -> Iterator[RunningEmulator]:
    with running_emulator() as emu:
        yield emu


@pytest.fixture()
def emu(_server: RunningEmulator) -> RunningEmulator:
    _server.reset()
    return _server


# Clients live per module (creating one costs ~50 ms); requesting them resets the emulator.
@pytest.fixture(scope="module")
def _anth(_server: RunningEmulator) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=_server.url, api_key=KEY, max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def _oai(_server: RunningEmulator) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=_server.openai_url, api_key=KEY, max_retries=0) as c:
        yield c


@pytest.fixture()
def anth(emu: RunningEmulator, _anth: anthropic.Anthropic) -> anthropic.Anthropic:
    return _anth


@pytest.fixture()
def oai(emu: RunningEmulator, _oai: openai.OpenAI) -> openai.OpenAI:
    return _oai
