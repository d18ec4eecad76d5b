"""Containers OpenAI makes and bills for a request are the team's spend, whichever hosted tool asks for
one (docs/spend.md: the code interpreter's are tested in test_spend_beyond_tokens.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest

from emulator.testing import RunningEmulator
from gateway.testing import running_proxy
from tests.helpers import spend_report, wait_until, write_policy

PLAIN = "retry: {max_attempts: 1}\nprompt_cache: {enabled: false}\n"
PRICED = 'pricing: {"gpt-4.1*": {input: 2, output: 8, code_interpreter: 0.12}}\n'
SHELL: Any = [{"type": "shell", "environment": {"type": "container_auto"}}]
ASK = {"model": "gpt-4.1", "input": "Execute: echo 42", "tools": SHELL, "max_output_tokens": 200}


def test_a_hosted_shells_container_is_held_charged_and_refused_unpriced(tmp_path: Path, fresh_emulator: RunningEmulator,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The hosted shell tool's `container_auto` has OpenAI make a container for the request and bill it
    as the code interpreter's ($0.03 a session for 1 GB, up to $1.92 for 64 GB). The spend held and
    charged a container for a `code_interpreter` tool only: a request offering the shell held its tokens,
    was charged its tokens, and a budgeted team without a container price was let run it. It holds a
    container now (a request beside it is refused where the budget has room for one container only), is
    charged each container its `shell_call` items ran in, and is refused (403, nothing sent) unpriced."""
    monkeypatch.setattr(fresh_emulator.config, "per_output_token_ms", 20.0)  # still streaming when the hold is read
    write_policy(tmp_path, "tight", "sk-shell-tight", fresh_emulator.url, extra=PLAIN + PRICED + "budget: {usd: 0.1, period: day}\n")
    write_policy(tmp_path, "sheller", "sk-shell-roomy", fresh_emulator.url, extra=PLAIN + PRICED + "budget: {usd: 5, period: day}\n")
    write_policy(tmp_path, "frugal", "sk-shell-frugal", fresh_emulator.url, extra=PLAIN + "budget: {usd: 5, period: day}\n")
    with running_proxy([tmp_path]) as proxy:
        tight = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-shell-tight", max_retries=0)
        with tight.responses.create(**ASK, stream=True) as stream:  # admitted: nothing spent or held yet
            next(iter(stream))
            held = spend_report(proxy, "sk-shell-tight")["budget"]["held"]
            with pytest.raises(openai.RateLimitError, match="budget"):  # before: admitted beside it
                tight.responses.create(**ASK)
        assert held > 0.12  # a container and the tokens (before: the tokens alone, about $0.002)

        roomy = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-shell-roomy", max_retries=0)
        answer = roomy.responses.create(**ASK)
        assert [item.type for item in answer.output][:2] == ["shell_call", "shell_call_output"]
        assert answer.usage is not None
        tokens = (answer.usage.input_tokens * 2 + answer.usage.output_tokens * 8) / 1e6
        spent = wait_until(lambda: (total := spend_report(proxy, "sk-shell-roomy")["day"]["total"]) > 0 and total, "charged")
        assert spent == pytest.approx(tokens + 0.12, abs=2e-6)  # before: the tokens alone

        frugal = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-shell-frugal", max_retries=0)
        sent = fresh_emulator.stats()["requests_total"]
        with pytest.raises(openai.PermissionDeniedError, match="code_interpreter: USD_PER_CONTAINER"):
            frugal.responses.create(**ASK)
        assert fresh_emulator.stats()["requests_total"] == sent  # refused before anything was sent
        local = [{"type": "shell", "environment": {"type": "local"}}]  # the client runs it: no container
        assert frugal.responses.create(**{**ASK, "tools": local}).object == "response"
