"""Documents for the tests: Python's own documentation topics (shipped with the interpreter)."""

from __future__ import annotations

from pydoc_data.topics import topics


def document(*names: str) -> str:
    return "\n\n".join(topics[name] for name in names)


FILLER = document("assert", "for", "with", "while", "try")
