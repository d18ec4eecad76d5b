"""Places in a bounded queue that every team's items share, each team its share past the bound.

Used where one writer drains what every team's requests add (the trace export's pending traces,
the access log's lines): past `bound` items waiting, an item is still taken while its team holds
less than its share (`bound` over the teams holding some, itself included), up to twice `bound` in
all; otherwise it is refused (the caller drops and counts it). A plain bound let the team whose
traffic outran the writer take every place, so every other team's items were dropped with its own.
Not thread-safe: the caller holds its own lock, or calls from one thread.
"""

from __future__ import annotations


class FairShares:
    def __init__(self, bound: int):
        self.bound = bound
        self.total = 0
        self._held: dict[str, int] = {}

    def take(self, team: str) -> bool:
        """A place for one of `team`'s items, or False when there is none for it."""
        held = self._held.get(team, 0)
        if self.total >= self.bound and (held >= self.bound // (len(self._held) + (team not in self._held))
                                         or self.total >= 2 * self.bound):
            return False
        self._held[team] = held + 1
        self.total += 1
        return True

    def give_back(self, team: str) -> None:
        """One of `team`'s items left the queue."""
        left = self._held[team] - 1
        if left:
            self._held[team] = left
        else:
            del self._held[team]
        self.total -= 1
