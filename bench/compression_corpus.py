"""Real prose for the compression benchmark, and the needle facts planted in it.

Sources (prose nobody wrote for this benchmark; whatever the machine lacks is skipped and reported):
- `pydoc`: Python's reference documentation topics (`pydoc_data.topics`, shipped with the
  interpreter; PSF licence).
- `docstrings`: docstrings of standard-library modules, classes and functions (`inspect.getdoc`).
- `man`: manual pages under /usr/share/man, rendered by `man` (Debian packages' own licences).
- `licenses`: the licence texts in /usr/share/common-licenses (GPL, Apache, MPL, ...).

Needles are short invented facts (names, figures and codes no source contains), each with a question
that paraphrases it: the question shares at most the fact's name or code, never its wording. Half the
templates name the subject in the question ("named"); the others ask with none of the needle's words
("unnamed"), so only the needle's figure or code can single it out.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import random
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

SOURCES = ("pydoc", "docstrings", "man", "licenses")

# (needle, paraphrasing question, kind). Slots: {name} {city} {n} {code} {version} {date} {time}.
TEMPLATES = [
    ("The {name} gateway revokes service tokens after {n} minutes of inactivity.", "How long can a credential from the {name} gateway sit unused before it stops working?", "named"),
    ("Backups of the {name} cluster are copied to cold storage every {n} hours.", "How often does the {name} cluster's data get archived?", "named"),
    ("The {name} team limits each tenant to {n} requests per second during the migration.", "What per-customer throughput cap did the {name} group set while moving systems?", "named"),
    ("Firmware {version} fixed the overheating fault reported by the {name} lab.", "Which release solved the thermal problem found by the {name} lab?", "named"),
    ("The annual licence for the {name} plug-in costs ${n} per seat.", "What is the yearly price per user of the {name} extension?", "named"),
    ("Incident {code} was traced to an expired certificate on the load balancer.", "What caused the outage tracked as {code}?", "named"),
    ("The warehouse in {city} keeps at most {n} pallets of spare parts.", "How much replacement stock can the {city} depot hold?", "named"),
    ("Dr. {name} approved the change to the retention schedule on {date}.", "When did {name} sign off on the new record-keeping timetable?", "named"),
    ("The {name} sensor reports humidity with a tolerance of {n}%.", "How accurate is the {name} device at measuring moisture?", "named"),
    ("The {name} contract renews automatically unless cancelled {n} days before expiry.", "How much notice is needed to stop the {name} agreement from rolling over?", "named"),
    ("Build agents in the {name} pool have {n} GiB of memory each.", "How much RAM does each worker in the {name} pool get?", "named"),
    ("The fire drill for the {city} office is scheduled for {time} on the first Monday of each quarter.", "At what hour does the {city} office practise evacuating?", "named"),
    ("Employees in {city} receive a commuting allowance of €{n} per month.", "How much travel subsidy do staff based in {city} get?", "named"),
    ("Only {name} may rotate the signing keys stored in vault {code}.", "Who is allowed to replace the keys kept in {code}?", "named"),
    ("Refurbished units sold after {date} carry a warranty of {n} months.", "How long are reconditioned devices covered?", "unnamed"),
    ("Log files older than {n} days are deleted from the audit volume.", "After how long do audit records get purged?", "unnamed"),
    ("Customer accounts migrated before {date} must reset their passwords.", "Which users need new login secrets?", "unnamed"),
    ("The nightly export job writes its results to bucket {code}.", "Where does the overnight dump end up?", "unnamed"),
    ("Orders above ${n} ship free of charge within the country.", "From what purchase amount is domestic delivery free?", "unnamed"),
    ("Error {code} means the upload exceeded the {n} MB attachment limit.", "What failure is reported when a file sent is too big?", "unnamed"),
    ("The airport shuttle leaves every {n} minutes after six in the evening.", "How frequently does the bus to the terminal run at night?", "unnamed"),
    ("Visitors must collect their badges at least {n} minutes before the tour starts.", "How early should guests pick up their passes?", "unnamed"),
    ("Reactor coolant pumps are overhauled after {n} operating hours.", "How often do the cooling circulators get serviced?", "unnamed"),
    ("Trainees earn a stipend of ${n} for each completed module.", "How much are apprentices paid per finished unit?", "unnamed"),
]
NAMES = ("Halvorsen", "Quillfeather", "Marrowby", "Okonkwo", "Vantrell", "Esquivel", "Thornbury", "Kasprzak", "Lindqvist", "Abernathy", "Nakagawa", "Brightwater")
CITIES = ("Tromsø", "Ljubljana", "Valparaíso", "Dunedin", "Tampere", "Rosario", "Kraków", "Hobart")


@dataclass(frozen=True)
class Needle:
    sentence: str
    question: str
    kind: str  # "named" | "unnamed"


def needle(rng: random.Random, kinds: tuple[str, ...] = ("named", "unnamed")) -> Needle:
    template, question, kind = rng.choice([t for t in TEMPLATES if t[2] in kinds])
    values = {
        "name": rng.choice(NAMES),
        "city": rng.choice(CITIES),
        "n": str(rng.choice((7, 12, 18, 25, 36, 45, 90, 120, 250, 480, 1200))),
        "code": f"{rng.choice(('INC', 'BKT', 'ERR', 'VLT'))}-{rng.randrange(1000, 9999)}",
        "version": f"{rng.randrange(1, 9)}.{rng.randrange(0, 20)}.{rng.randrange(0, 9)}",
        "date": f"2025-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}",
        "time": f"{rng.randrange(8, 17)}:{rng.choice(('00', '15', '30', '45'))}",
    }
    return Needle(template.format(**values), question.format(**values), kind)


def plant(document: str, sentence: str, rng: random.Random) -> str:
    """`sentence` inserted at a random sentence boundary of a random prose paragraph (never inside
    an indented or fenced block)."""
    paragraphs = document.split("\n\n")
    prose = [i for i, p in enumerate(paragraphs) if p[:1].isalpha() and "```" not in p and len(p) > 40]
    i = rng.choice(prose) if prose else len(paragraphs) - 1
    boundaries = [m.end() for m in re.finditer(r"(?<=[a-z][.!?]) (?=[A-Z])", paragraphs[i])]
    if boundaries:
        at = rng.choice(boundaries)
        paragraphs[i] = paragraphs[i][:at] + sentence + " " + paragraphs[i][at:]
    else:
        paragraphs.insert(i + 1, sentence)
    return "\n\n".join(paragraphs)


@functools.cache
def sections(source: str) -> tuple[str, ...]:
    """The source's texts (topics, docstrings, pages, licences), each at least a few paragraphs long."""
    texts = {"pydoc": _pydoc, "docstrings": _docstrings, "man": _man, "licenses": _licenses}[source]()
    return tuple(t for t in texts if len(t) > 1500)


def _pydoc() -> list[str]:
    from pydoc_data.topics import topics

    return [text for _, text in sorted(topics.items())]


_MODULES = (
    "argparse", "asyncio", "collections", "concurrent.futures", "contextlib", "csv", "dataclasses", "datetime",
    "decimal", "email", "functools", "http.client", "imaplib", "inspect", "ipaddress", "json", "logging",
    "multiprocessing", "pathlib", "pickle", "queue", "random", "re", "shutil", "smtplib", "socket", "sqlite3",
    "ssl", "statistics", "string", "subprocess", "tarfile", "tempfile", "textwrap", "threading", "typing",
    "unittest", "urllib.parse", "uuid", "zipfile",
)


def _docstrings() -> list[str]:
    texts = []
    for name in _MODULES:
        module = importlib.import_module(name)
        docs = [inspect.getdoc(module) or ""]
        for _, member in sorted(vars(module).items()):
            if (inspect.isclass(member) or inspect.isfunction(member)) and getattr(member, "__module__", "") == name:
                docs.append(inspect.getdoc(member) or "")
        texts.append("\n\n".join(d for d in docs if len(d) > 200))
    return texts


def _man() -> list[str]:
    root = Path("/usr/share/man")
    pages = sorted(p for section in ("man1", "man5", "man8") for p in (root / section).glob("*.gz")) if root.is_dir() else []
    texts = []
    for page in pages:
        if page.stat().st_size < 6000:  # short pages are mostly option lists
            continue
        try:
            rendered = subprocess.run(["man", "-P", "cat", str(page)], capture_output=True, text=True, timeout=20,
                                      env={**os.environ, "MANWIDTH": "1000", "MAN_KEEP_FORMATTING": ""}, check=False).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
        lines = [line.strip() for line in rendered.splitlines()[1:-1]]  # the first and last lines are the page's header and footer
        texts.append(re.sub(r"\n{3,}", "\n\n", "\n".join(lines)))
        if len(texts) >= 60:
            break
    return texts


def _licenses() -> list[str]:
    root = Path("/usr/share/common-licenses")
    if not root.is_dir():
        return []
    texts = []
    for path in sorted(root.iterdir()):
        if path.is_file() and not path.is_symlink():
            raw = path.read_text(errors="replace")
            # Licence files are hard-wrapped at ~72 columns; join each paragraph's lines.
            texts.append("\n\n".join(" ".join(line.strip() for line in p.splitlines()) for p in re.split(r"\n\s*\n", raw)))
    return texts
