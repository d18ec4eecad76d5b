"""The kinds the field table is made of (fields.py): a field's fate, and its entry."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class Fate(StrEnum):
    TRANSLATED = "translated"
    DROPPED = "dropped"
    REFUSED = "refused"


@dataclass(frozen=True, slots=True)
class Field:
    fate: Fate
    note: str
    neutral: tuple[Any, ...] = ()  # values that change nothing: dropped whatever the fate


T, D, R = Fate.TRANSLATED, Fate.DROPPED, Fate.REFUSED
