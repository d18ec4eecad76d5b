"""How much text the provider extracts from a file sent inline that is not a PDF.

The Responses API's `input_file` takes any document as base64 `file_data` (a data URL): text and code
files, Word, PowerPoint and spreadsheet files. For each one that is not a PDF the provider extracts its
text and bills it as input tokens (OpenAI's file inputs guide, "How it works": "Non-PDF document and
text files (for example, .docx, .pptx, .txt, and code files): the API extracts text only"). A budget's
hold and an estimate count that text by its length, as they count any text past what they tokenize:
a plain file's decoded bytes, and an Office file (a zip archive: .docx, .pptx, .xlsx, OpenDocument) its
members' uncompressed sizes, read from the archive's directory without inflating anything (markup
included: a bound, never below the text). A zip that cannot be read, that lists more than `MAX_MEMBERS`
members (not read: each would be an object in the process every team shares), or that says more than
`MAX_CHARS`, counts `MAX_CHARS`: a crafted archive cannot undercut it.
"""

from __future__ import annotations

import base64
import binascii
import io
import zipfile

MAX_CHARS = 3_000_000  # the text of the largest context window read (1M tokens) at 3 characters a token
_ZIP = b"PK\x03\x04"
_MEMBER = b"PK\x01\x02"  # a central directory entry's signature
MAX_MEMBERS = 10_000  # an Office file has tens to hundreds; a 32 MiB archive could list 700,000 (about 300 MB read)


def decoded(value: str) -> tuple[str, bytes]:
    """The base64 in `value` (base64, or a data URL) and its bytes (b"" where it cannot be decoded)."""
    if value.startswith("data:"):
        value = value.partition(",")[2]
    try:
        return value, base64.b64decode(value)  # characters outside the alphabet are skipped, as lenient decoders do
    except (binascii.Error, ValueError):
        return value, b""


def extracted_chars(value: str) -> int:
    """About the characters of text a provider extracts from the file in `value` (base64, or a data URL)."""
    value, data = decoded(value)
    if not data.startswith(_ZIP):
        return min(max(len(data), len(value) * 3 // 4), MAX_CHARS)
    if data.count(_MEMBER) > MAX_MEMBERS:  # not read: each member is an object of its own in the process every team shares
        return MAX_CHARS
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            return min(sum(member.file_size for member in archive.infolist()), MAX_CHARS)
    except Exception:  # any archive its reader cannot walk (a bad directory, an unknown version) counts the most
        return MAX_CHARS
