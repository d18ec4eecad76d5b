"""Places in a bounded resource that every team's requests share, each team its share past the bound.

Used where what every team's requests add is held until it is let go: the trace export's pending
traces and the access log's lines (one place an item, drained by one writer), and the request bodies
a serving process holds (`sdk/door/bodies.py`, one place a byte). Past `bound` places taken, a team
still takes places while it holds less than its share (`bound` over the teams holding some, itself
included), up to twice `bound` in all; otherwise it is refused (the caller drops and counts the
item, or refuses the request). A plain bound let the team whose traffic outran the writer take every
place, so every other team's items were dropped with its own.
Not thread-safe: the caller holds its own lock, or calls from one thread.
"""

from __future__ import annotations


class FairShares:
    def __init__(self, bound: int):
        self.bound = bound
        self.total = 0
        self._held: dict[str, int] = {}

    def take(self, team: str, amount: int = 1) -> bool:
        """`amount` places for `team`, or False when there are none for it (nothing taken)."""
        held = self._held.get(team, 0)
        total = self.total + amount
        if total > self.bound and (held + amount > self.share(team) or total > 2 * self.bound):
            return False
        self._held[team] = held + amount
        self.total = total
        return True

    def share(self, team: str) -> int:
        """`team`'s share past the bound: the bound over the teams holding places, `team` included."""
        return self.bound // (len(self._held) + (team not in self._held))

    def held(self, team: str) -> int:
        return self._held.get(team, 0)

    def give_back(self, team: str, amount: int = 1) -> None:
        """`amount` of `team`'s places are free again."""
        left = self._held[team] - amount
        if left:
            self._held[team] = left
        else:
            del self._held[team]
        self.total -= amount
