"""Lexical vetoes: the near-misses embeddings cannot tell apart."""

from __future__ import annotations

import pytest

from sdk.cache.rules import check


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("How many calories are in 2 eggs?", "How many calories are in 3 eggs?"),
        ("Is a salary of 50,000 good in Berlin?", "Is a salary of 80,000 good in Berlin?"),
        ("What happens in the first week of pregnancy?", "What happens in the second week of pregnancy?"),
        ("Why is Python slow?", "Why isn't Python slow?"),
        ("Can I eat eggs during pregnancy?", "Can I not eat eggs during pregnancy?"),
        ("Is Python faster than Java?", "Is Java faster than Python?"),
        ("How long is the flight from Paris to London?", "How long is the flight from London to Paris?"),
    ],
)
def test_near_misses_are_vetoed(a, b):
    assert check(a, b).veto


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("How do I reset my password?", "How can I reset my password?"),
        ("What is the best way to learn Python?", "What's the best way to learn python?"),
        ("How many calories are in 2 eggs?", "How many calories do 2 eggs have?"),
    ],
)
def test_paraphrases_are_not_vetoed(a, b):
    assert not check(a, b).veto
