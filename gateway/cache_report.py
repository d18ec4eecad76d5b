"""Plain-text rendering of a team's prompt-cache summary for `slipstream cache report`."""

from __future__ import annotations

from typing import Any


def format_report(summary: dict[str, Any]) -> str:
    lines = [
        f"team {summary['team']}: {summary['requests']} requests",
        f"  hit rate            {summary['hit_rate']:.1%} of responses read from cache",
        f"  cached token share  {summary['cached_token_share']:.1%} of {summary['input_tokens']} input tokens "
        f"(read {summary['cache_read_tokens']}, written {summary['cache_write_tokens']})",
        f"  expected reads      {summary['expected_read_tokens']} tokens; {summary['expected_misses']} responses read less",
        f"  saved ${summary['saved_usd']:.4f} (at the team's prices)",
        f"  volatile lines      {summary['volatile_moved']} moved, {summary['volatile_advice']} left in place (advice)",
        f"  markers repaired    {summary['markers_repaired']}",
        f"  canonicalized       {summary['canonicalized']} requests (tool schema/input key order varied)",
    ]
    causes = summary.get("top_miss_causes") or []
    lines.append("  top miss causes" + ("" if causes else "     none"))
    for cause in causes:
        lines.append(f"    {cause['count']:>6}  {cause['cause']}  {cause['example']}")
    return "\n".join(lines)
