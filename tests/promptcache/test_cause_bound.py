"""What the prompt-cache report remembers of a team's miss causes is bounded, through the proxy."""

from __future__ import annotations

import anthropic

from gateway.testing import running_proxy
from tests.helpers import write_policy

KEY = "sk-prompt-cache-causes"
STATIC = "You are the support assistant.\n" + "Answer from the manual and cite the section. " * 150


def test_a_teams_miss_causes_are_kept_within_a_bound(tmp_path, fresh_emulator, monkeypatch):
    """The report counts each miss by its cause, `KIND@PATH` (`system_changed@system.7`), and keeps the
    latest excerpt of the changed text for each: one entry per path the team's prompts changed at, in the
    process every team shares, never let go. A team whose prompts change at ever new places (a system
    prompt of many blocks, a long conversation's turns, many tools) grew both without end: here one
    entry per changed block, 40. They are kept to MAX_CAUSES labels a team now (8 for this test); a
    later new place is counted under its kind alone (`system_changed`), so the counts still add up."""
    from sdk.promptcache import stats

    monkeypatch.setattr(stats, "MAX_CAUSES", 8, raising=False)  # absent on the old code: it kept all
    write_policy(tmp_path, "shifter", KEY, fresh_emulator.url)
    blocks = 40
    with running_proxy([tmp_path], watch_interval_s=None) as proxy:
        client = anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0)
        for changed in range(blocks + 1):
            # Each request changes one more block than the one before, so it shares the earlier's prefix
            # up to the block it changes next: a miss at a new path every time.
            system = [{"type": "text", "text": STATIC}] + [
                {"type": "text", "text": f"Rule {j}: {'amended' if j < changed else 'original'} wording " * 40}
                for j in range(blocks)
            ]
            client.messages.create(model="claude-sonnet-5", max_tokens=4, system=system,
                                   messages=[{"role": "user", "content": "How do I reset it?"}])
        team = stats.team_stats("shifter")
        missed = sum(team.causes.values())
    assert missed >= blocks - 2  # a miss for (nearly) every change: the test does what it says
    assert len(team.causes) <= 8 + 4 and len(team.examples) <= 8 + 4  # before: one per changed block
    assert sum(team.causes.values()) == missed
