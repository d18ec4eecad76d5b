"""Lexical checks for near-misses that sentence embeddings barely see.

MiniLM places "flights from Paris to London" and "... from London to Paris", or "under $50" and
"under $500", within a few hundredths of cosine. These differences are hard vetoes, because serving
a cached answer across them is wrong whatever the model says:

- different numbers (digits or number words: "2 eggs" / "3 eggs", "10 lakh" / "10 crore");
- a negation on one side only, or the same negation over another word ("have X and not be Y" /
  "not have X and be Y"), a word against its un- antonym ("healthy" / "unhealthy"), or against its
  opposite from a short list ("least" / "most", "before" / "after", "male" / "female");
- swapped arguments: two shared words in the other order around the same relation ("tigers afraid
  of cats" / "cats afraid of tigers", "PDF to Word" / "Word to PDF"), unless joined symmetrically
  ("Java or Python", "between X and Y": on QQP those are mostly true duplicates); two shared words
  whose prepositions changed places ("import from India and sell in Canada" / "from Canada ... in
  India"); one mention moved from one named thing to another both sides name ("a war between the
  Muggles and Wizards: what can the Muggles use" / "... the Wizards use"); two words exchanged word for
  word with others between them ("what could China do to stop Russia" / "... Russia ... China");
- other units or currencies ("5 miles" / "5 km", "$100" / "€100"), both sides naming one;
- other dates (months, weekdays, seasons, holidays, today / tomorrow, next / last), both naming one;
- other named entities: a name (a word with a capital letter, past the first) on each side that
  the other side does not mention at all ("visa for Canada" / "visa for Australia").

Softer differences (overlap, words on one side only, length) are features of the learned verifier.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import numpy as np

_WORD = re.compile(r"[A-Za-z]+(?:'[a-z]+)?|\d+(?:[.,]\d+)*|[$€£¥₹%]")
_NUMBER_WORDS = {
    "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5", "six": "6", "seven": "7",
    "eight": "8", "nine": "9", "ten": "10", "eleven": "11", "twelve": "12", "twenty": "20", "thirty": "30",
    "forty": "40", "fifty": "50", "hundred": "100", "thousand": "1000", "million": "1000000", "billion": "1000000000",
    "lakh": "100000", "lakhs": "100000", "crore": "10000000", "crores": "10000000", "dozen": "12",
    "first": "1", "second": "2", "third": "3", "half": "0.5", "double": "2x", "twice": "2x", "once": "1x",
}  # fmt: skip
_WEAK_NUMBER_WORDS = frozenset({"one", "once", "first"})
_NEGATIONS = frozenset({"not", "no", "never", "none", "nobody", "nothing", "neither", "nor", "without", "cannot", "cant", "dont", "doesnt", "isnt", "arent", "wasnt", "werent", "wont", "shouldnt", "couldnt", "wouldnt", "didnt", "havent", "hasnt"})
_STOP = frozenset(
    "a an the is are was were be been being am do does did can could should would will shall may might must i me my "
    "you your we our he she it its they them their his her him hers this that these those what which who whom whose how why when where "
    "of in on at to for from by with about as into than then so and or but if there here some any all best good way ways "
    "get make much many more most very just also really".split()
)
_DIRECTIONAL = frozenset({"to", "from", "than", "into", "over", "against", "before", "after"})
_OPPOSITE_PAIRS = (
    ("more", "less"), ("most", "least"), ("best", "worst"), ("better", "worse"), ("good", "bad"), ("before", "after"),
    ("buy", "sell"), ("buying", "selling"), ("increase", "decrease"), ("gain", "lose"), ("start", "stop"), ("easiest", "hardest"),
    ("love", "hate"), ("male", "female"), ("men", "women"), ("boy", "girl"), ("boys", "girls"), ("husband", "wife"),
)  # fmt: skip
_OPPOSITES = {**dict(_OPPOSITE_PAIRS), **{b: a for a, b in _OPPOSITE_PAIRS}}
_PREPOSITIONS = frozenset({"from", "to", "in", "into", "on", "at", "for", "by", "with", "than", "over", "against", "of", "about", "like", "as"})
_SYMMETRIC = frozenset({"and", "or", "vs", "versus", "between", "&", "/", "compared", "both"})
_UNITS = {
    **dict.fromkeys(("mile", "miles", "mi", "mph"), "mile"), **dict.fromkeys(("km", "kms", "kilometer", "kilometers", "kilometre", "kilometres"), "km"),
    **dict.fromkeys(("meter", "meters", "metre", "metres", "m"), "m"), **dict.fromkeys(("foot", "feet", "ft"), "foot"),
    **dict.fromkeys(("inch", "inches"), "inch"), **dict.fromkeys(("yard", "yards"), "yard"), **dict.fromkeys(("cm", "centimeter", "centimeters", "mm"), "cm"),
    **dict.fromkeys(("kg", "kgs", "kilogram", "kilograms", "kilo", "kilos"), "kg"), **dict.fromkeys(("pound", "pounds", "lb", "lbs"), "pound"),
    **dict.fromkeys(("gram", "grams", "g"), "gram"), **dict.fromkeys(("ounce", "ounces", "oz"), "ounce"), **dict.fromkeys(("ton", "tons", "tonne", "tonnes"), "ton"),
    **dict.fromkeys(("carat", "carats"), "carat"), **dict.fromkeys(("liter", "liters", "litre", "litres", "l", "ml"), "liter"),
    **dict.fromkeys(("gallon", "gallons"), "gallon"), **dict.fromkeys(("cup", "cups"), "cup"),
    **dict.fromkeys(("acre", "acres"), "acre"), **dict.fromkeys(("hectare", "hectares"), "hectare"),
    **dict.fromkeys(("celsius", "centigrade"), "celsius"), "fahrenheit": "fahrenheit", "kelvin": "kelvin",
    **dict.fromkeys(("second", "seconds", "sec", "secs"), "second"), **dict.fromkeys(("minute", "minutes", "min", "mins"), "minute"),
    **dict.fromkeys(("hour", "hours", "hr", "hrs"), "hour"), **dict.fromkeys(("day", "days"), "day"), **dict.fromkeys(("night", "nights"), "night"),
    **dict.fromkeys(("week", "weeks"), "week"), **dict.fromkeys(("month", "months"), "month"), **dict.fromkeys(("year", "years"), "year"),
    **dict.fromkeys(("kb", "kilobyte", "kilobytes"), "kb"), **dict.fromkeys(("mb", "megabyte", "megabytes"), "mb"),
    **dict.fromkeys(("gb", "gigabyte", "gigabytes"), "gb"), **dict.fromkeys(("tb", "terabyte", "terabytes"), "tb"),
    "mbps": "mbps", "gbps": "gbps", "kbps": "kbps", "mah": "mah", "wh": "wh", "kwh": "kwh", "watt": "watt", "watts": "watt",
    "knot": "knot", "knots": "knot", "parsec": "parsec", "parsecs": "parsec", "light": "light",
    **dict.fromkeys(("dollar", "dollars", "usd", "$"), "dollar"), **dict.fromkeys(("euro", "euros", "eur", "€"), "euro"),
    **dict.fromkeys(("rupee", "rupees", "inr", "rs", "₹"), "rupee"), **dict.fromkeys(("yen", "¥"), "yen"), "£": "pound", "gbp": "pound",
    **dict.fromkeys(("bitcoin", "bitcoins", "btc"), "bitcoin"), "%": "percent", "percent": "percent",
}  # fmt: skip
_DATES = frozenset(
    "january february march april may june july august september october november december jan feb mar apr jun jul aug sep sept oct nov dec "
    "monday tuesday wednesday thursday friday saturday sunday weekday weekend weekends "
    "spring summer autumn fall winter monsoon morning afternoon evening tonight today tomorrow yesterday "
    "christmas diwali holi eid easter thanksgiving halloween valentine valentine's mother's father's new year's "
    "next last previous upcoming ago".split()
)  # fmt: skip
_RELATIVE_TO = frozenset("year month week weekend morning evening night summer winter spring autumn season semester quarter".split())
_NOT_DATES = frozenset({"may", "march", "fall"})  # also common verbs: a date only next to a number or "in"/"of"/"on"


@dataclass(frozen=True, slots=True)
class RuleCheck:
    numbers_differ: bool
    negation_differs: bool
    swapped: bool
    jaccard: float  # content-word overlap
    only_a: int  # content words only on one side
    only_b: int
    entity_diff: int  # capitalised words (names, places, products) on one side only
    length_ratio: float
    units_differ: bool = False
    dates_differ: bool = False
    entity_swapped: bool = False

    @property
    def veto(self) -> bool:
        return self.numbers_differ or self.negation_differs or self.swapped or self.units_differ or self.dates_differ or self.entity_swapped

    def vector(self) -> np.ndarray:
        return np.array(
            [self.numbers_differ, self.negation_differs, self.swapped, self.jaccard, min(self.only_a, 5) / 5, min(self.only_b, 5) / 5, min(self.entity_diff, 3) / 3, self.length_ratio],
            dtype=np.float32,
        )


def _tokens(text: str) -> list[str]:
    return _WORD.findall(text)


def _numbers(words: list[str]) -> tuple[Counter[str], Counter[str]]:
    """(numbers, pronoun-like number words): "one", "once" and "first" are mostly not counts ("how can
    one learn", "which one", "a loved one", "the first time"), so they count only against each other."""
    found: Counter[str] = Counter()
    weak: Counter[str] = Counter()
    for word in words:
        low = word.lower()
        if low[0].isdigit():
            found[low.replace(",", "")] += 1
        elif low in _WEAK_NUMBER_WORDS:
            weak[_NUMBER_WORDS[low]] += 1
        elif low in _NUMBER_WORDS:
            found[_NUMBER_WORDS[low]] += 1
    return found, weak


def _numbers_differ(wa: list[str], wb: list[str]) -> bool:
    """Other numbers: "2 eggs" / "3 eggs", "2 eggs" / "eggs", "first week" / "second week" (but "how
    does one learn chess" / "how do I learn chess" asks the same)."""
    (strong_a, weak_a), (strong_b, weak_b) = _numbers(wa), _numbers(wb)
    return strong_a != strong_b or (bool(weak_a) and bool(weak_b) and weak_a != weak_b)


def _is_negation(word: str) -> bool:
    low = word.lower()
    return low.replace("'", "") in _NEGATIONS or low.endswith("n't")


def _negation_scopes(words: list[str]) -> Counter[str]:
    """Each negation with the first content word after it: what it negates. A closing "or not" ("should
    X be banned or not?") asks the same question as without it."""
    scopes: Counter[str] = Counter()
    for i, word in enumerate(words):
        if _is_negation(word) and not (i > 0 and words[i - 1].lower() == "or" and not any(_is_content(w) for w in words[i + 1 :])):
            scopes[next((w.lower() for w in words[i + 1 :] if _is_content(w)), "")] += 1
    return scopes


def _opposite_words(la: list[str], lb: list[str]) -> bool:
    """A word on one side only whose opposite is on the other side only: "the least painful" / "the
    most painful", "before my period" / "after my period", "male teens" / "female teens"."""
    only_a, only_b = set(la) - set(lb), set(lb) - set(la)
    return any(_OPPOSITES.get(word) in only_b for word in only_a)


def _antonym_by_prefix(sa: set[str], sb: set[str]) -> bool:
    """"healthy" against "unhealthy", "likely" against "unlikely"."""
    return any(("un" + w) in sb or ("in" + w) in sb or ("dis" + w) in sb for w in sa) or any(("un" + w) in sa or ("dis" + w) in sa for w in sb)


def _is_content(word: str) -> bool:
    return word[0].isalpha() and word.lower() not in _STOP and not _is_negation(word)


def _content(words: list[str]) -> list[str]:
    return [w.lower() for w in words if _is_content(w)]


def _bare(word: str) -> str:
    return word.lower().split("'")[0]


def _entities(words: list[str]) -> set[str]:
    # Words with a capital letter past the first: the first word of a question is capitalised anyway.
    return {_bare(w) for w in words[1:] if any(c.isupper() for c in w) and w[0].isalpha() and w.lower() not in _STOP and w.lower() not in _DATES and w.lower() not in _UNITS}


def _mentioned(entity: str, words: set[str]) -> bool:
    """The same name or a form of it: "India" / "India's" / "Indian", "Colombia" / "Colombian" (not "Austria" / "Australia")."""
    return any(w == entity or (min(len(w), len(entity)) >= 4 and (w.startswith(entity) or entity.startswith(w))) for w in words)


def _entity_swapped(wa: list[str], wb: list[str]) -> bool:
    """Each side names something the other never mentions, and the rest of the question is (mostly) the same."""
    ea, eb = _entities(wa), _entities(wb)
    bare_a, bare_b = {_bare(w) for w in wa}, {_bare(w) for w in wb}
    only_a, only_b = {e for e in ea if not _mentioned(e, bare_b)}, {e for e in eb if not _mentioned(e, bare_a)}
    if not (only_a and only_b):
        return False
    rest_a, rest_b = {_bare(w) for w in _content(wa)} - ea - eb, {_bare(w) for w in _content(wb)} - ea - eb
    return len(rest_a & rest_b) >= 0.5 * len(rest_a | rest_b)


def _units(words: list[str]) -> Counter[str]:
    return Counter(_UNITS[w.lower()] for w in words if w.lower() in _UNITS)


def _dates(words: list[str]) -> Counter[str]:
    found: Counter[str] = Counter()
    for i, word in enumerate(words):
        low = word.lower()
        if low in ("this", "current") and i + 1 < len(words) and words[i + 1].lower() in _RELATIVE_TO:
            found["this"] += 1  # "this year" against "next year"
        if low in _DATES:
            before = words[i - 1].lower() if i else ""
            after = words[i + 1] if i + 1 < len(words) else ""
            if low in _NOT_DATES and not (before in ("in", "of", "on", "by", "since", "until") or after[:1].isdigit()):
                continue
            found[low] += 1
    return found


def _order_swapped(wa: list[str], wb: list[str]) -> bool:
    """Two words both sides share once each, in the other order, with the same relation between them (a
    shared word between them on both sides, at most one new content word) and nothing symmetric
    ("and", "or", "vs", "between") joining them: the arguments of one relation swapped. Adjacent words in
    another order ("earn money fast online" / "online fast") are phrasing, not a swap."""
    la, lb = [w.lower() for w in wa], [w.lower() for w in wb]
    ca, cb = _content(wa), _content(wb)
    shared = [w for w in dict.fromkeys(ca) if ca.count(w) == 1 and cb.count(w) == 1]
    for i, x in enumerate(shared):
        for y in shared[i + 1 :]:
            xa, ya, xb, yb = la.index(x), la.index(y), lb.index(x), lb.index(y)
            if (xa < ya) == (xb < yb):
                continue
            span_a = la[min(xa, ya) + 1 : max(xa, ya)]
            span_b = lb[min(xb, yb) + 1 : max(xb, yb)]
            if not set(span_a) & set(span_b) or _SYMMETRIC & (set(span_a) | set(span_b)):
                continue
            # Words that only moved (both questions have them) do not change the relation; new words might.
            if len((set(_content(span_a)) ^ set(_content(span_b))) - (set(ca) & set(cb))) <= 1:
                return True
    if _roles_exchanged(la, lb, shared) or _mention_moved(ca, cb) or _exchanged(la, lb):
        return True
    # "from 7 to 10" / "from 10 to 7" (but "500 and 1000" / "1000 and 500" is the same pair of notes)
    numbers_a, numbers_b = [w for w in la if w[0].isdigit()], [w for w in lb if w[0].isdigit()]
    if numbers_a == numbers_b or sorted(numbers_a) != sorted(numbers_b):
        return False
    between = la[la.index(numbers_a[0]) + 1 : len(la) - la[::-1].index(numbers_a[-1]) - 1]
    return bool(_DIRECTIONAL & set(between)) and not _SYMMETRIC & set(between)


def _roles_exchanged(la: list[str], lb: list[str], shared: list[str]) -> bool:
    """Two shared words whose prepositions changed places, however far apart: "import from India and
    sell in Canada" / "import from Canada and sell in India". Symmetric joins ("between X and Y") do not
    assign roles."""
    role_a, role_b = _prepositions_before(la, shared), _prepositions_before(lb, shared)
    both = [w for w in role_a if w in role_b and role_a[w] != role_b[w]]
    return any(role_a[x] == role_b[y] and role_a[y] == role_b[x] for i, x in enumerate(both) for y in both[i + 1 :])


def _prepositions_before(words: list[str], shared: list[str]) -> dict[str, str]:
    """Each shared word (there once) that follows a preposition, with that preposition."""
    return {w: words[i - 1] for w in shared if (i := words.index(w)) > 0 and words[i - 1] in _PREPOSITIONS}


def _mention_moved(ca: list[str], cb: list[str]) -> bool:
    """Both questions name X and Y, and one mention changed from X to Y, nothing else: "a war between the
    Muggles and Wizards, what can the Muggles use" / "... what can the Wizards use"."""
    more, fewer = Counter(ca) - Counter(cb), Counter(cb) - Counter(ca)
    return sum(more.values()) == 1 and sum(fewer.values()) == 1 and all(w in ca and w in cb for w in (*more, *fewer))


def _exchanged(la: list[str], lb: list[str]) -> bool:
    """Word for word the same but for two content words exchanged, with words between them that do not
    join them symmetrically: "between Russia and China, what could China do to stop Russia" / "...
    could Russia do to stop China" (each named twice, so neither check above sees it), but not "Java or
    Python" / "Python or Java"."""
    if len(la) != len(lb):
        return False
    differ = [i for i, (x, y) in enumerate(zip(la, lb, strict=True)) if x != y]
    words = {la[i] for i in differ}
    if len(differ) < 2 or len(differ) % 2 or len(words) != 2 or {lb[i] for i in differ} != words or not all(map(_is_content, words)):
        return False
    return any(j - i > 1 and not _SYMMETRIC & set(la[i + 1 : j]) for i, j in zip(differ[::2], differ[1::2], strict=True))  # adjacent: phrasing


def check(a: str, b: str) -> RuleCheck:
    wa, wb = _tokens(a), _tokens(b)
    ca, cb = _content(wa), _content(wb)
    sa, sb = set(ca), set(cb)
    union = sa | sb
    entities_a, entities_b = _entities(wa), _entities(wb)
    entity_diff = len({e for e in entities_a ^ entities_b if e not in sa or e not in sb})
    negated_a, negated_b = _negation_scopes(wa), _negation_scopes(wb)
    units_a, units_b = _units(wa), _units(wb)
    dates_a, dates_b = _dates(wa), _dates(wb)
    return RuleCheck(
        numbers_differ=_numbers_differ(wa, wb),
        negation_differs=bool(negated_a) != bool(negated_b) or negated_a != negated_b or _antonym_by_prefix(sa, sb) or _opposite_words([w.lower() for w in wa], [w.lower() for w in wb]),
        swapped=_order_swapped(wa, wb),
        jaccard=len(sa & sb) / len(union) if union else 1.0,
        only_a=len(sa - sb),
        only_b=len(sb - sa),
        entity_diff=entity_diff,
        length_ratio=min(len(wa), len(wb)) / max(len(wa), len(wb), 1),
        units_differ=bool(units_a) and bool(units_b) and set(units_a) != set(units_b),
        dates_differ=bool(dates_a) and bool(dates_b) and set(dates_a) != set(dates_b),
        entity_swapped=_entity_swapped(wa, wb),
    )
