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
        ("How many calories are in 2 eggs?", "How many calories are in eggs?"),
        ("Is it safe to take one pill a day?", "Is it safe to take two pills a day?"),
        ("Why is Python slow?", "Why isn't Python slow?"),
        ("Can I eat eggs during pregnancy?", "Can I not eat eggs during pregnancy?"),
        ("Is Python faster than Java?", "Is Java faster than Python?"),
        ("How long is the flight from Paris to London?", "How long is the flight from London to Paris?"),
        ("Are tigers afraid of cats?", "Are cats afraid of tigers?"),
        ("How do I upgrade from Windows 7 to Windows 10?", "How do I upgrade from Windows 10 to Windows 7?"),
        ("Is it possible to have mental illness and not be insane?", "Is it possible to not have mental illness and be insane?"),
        ("Is it healthy to skip dinner?", "Is it unhealthy to skip dinner?"),
        ("How many calories does running 5 miles burn?", "How many calories does running 5 kilometers burn?"),
        ("What is 100 dollars in rupees?", "What is 100 € in rupees?"),
        ("What movies are releasing in March?", "What movies are releasing in May?"),
        ("Will there be a recession next year?", "Will there be a recession this year?"),
        ("How do I get a work visa for Canada?", "How do I get a work visa for Australia?"),
        ("What is the capital of Australia?", "What is the capital of Austria?"),
        # Found among wrong hits on held-out QQP: the roles moved, not the word order around one relation.
        ("What products should I import from India and sell in Canada?", "What products should I import from Canada and sell in India?"),
        ("In a war between the Muggles and Wizards, what can the Muggles use?", "In a war between the Muggles and Wizards, what can the Wizards use?"),
        ("In a war between Russia and China, what could China do to stop Russia?", "In a war between Russia and China, what could Russia do to stop China?"),
        ("Do Indian women find Pakistani men attractive?", "Do Pakistani women find Indian men attractive?"),
        ("What are the least effective ways to fight corruption?", "What are the most effective ways to fight corruption?"),
        ("Can you get pregnant the day before your period?", "Can you get pregnant the day after your period?"),
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
        # "one" and "first" are mostly not counts.
        ("How can one get over a fear of flying?", "How do I get over a fear of flying?"),
        ("Which one is the best MacBook?", "What is the best MacBook?"),
        ("How do I help someone cope with the death of a loved one?", "How can I help someone cope with the death of someone they love?"),
        ("Which is better, Java or Python?", "Which is better, Python or Java?"),
        ("Why did Modi ban 500 and 1000 notes?", "Why did Modi ban 1000 and 500 notes?"),
        ("Should cow slaughter be banned in India?", "Should cow slaughter be banned in India or not?"),
        ("What is India's national language?", "What is the national language of India?"),
        ("How can I earn money fast online?", "How can I earn money online fast?"),
        ("What are the best places to visit in March?", "Which places are best to visit in March?"),
        ("What is the best way to get online leads?", "What is the best way to get leads online?"),
        ("What is the difference between natural products and herbal products?", "What is the difference between herbal products and natural products?"),
    ],
)
def test_paraphrases_are_not_vetoed(a, b):
    assert not check(a, b).veto
