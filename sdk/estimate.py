"""Token estimates for answers the provider never reported usage for, and for budget reservations.

A stream that ends before its usage event (the client left, the upstream cut it; a hosted Chat
Completions stream always asks for its usage chunk, sdk/providers/base.py) is still charged: input from the request body, output from
the text the client was sent (`StreamTally`, sdk/stream_tally.py). Counts use tiktoken's offline cl100k encoding, which
is OpenAI's tokenizer for the gpt-4/gpt-3.5 families and close for the newer ones. Claude's
tokenizer is not public; Anthropic counts are cl100k × `ANTHROPIC_FACTOR` (1.2), rounded up — on
English prose Claude's tokenizer yields more tokens than cl100k, so the estimate leans high
(docs/spend.md). Only so much text is tokenized on the event loop (`EXACT_CHARS`); past it, text is
counted at `CHARS_PER_TOKEN`, again leaning high.

Media are not text: a base64 PDF counts its pages (sdk/pdf_pages.py), at `PDF_PAGE_WORST` tokens a page
in a budget's hold and `PDF_PAGE_TOKENS` in an estimate; any other image or file `image_worst` in a hold
(the most the model reading it bills an image: `WorstInput` keeps them apart from the text, so the hold
prices them per target) and `IMAGE_TOKENS` in an estimate; a PDF named by file id or URL, whose pages are
not in the request, the provider's page limit a request in a hold (`PDF_PAGES_PER_REQUEST`) and
`IMAGE_TOKENS` in an estimate; another document sent inline (a Responses `input_file`'s `file_data`: text,
code, Office files) the text the provider extracts from it, by length (sdk/file_text.py), in both; audio (an
`input_audio` clip, an earlier answer's audio named by id) by its length (sdk/audio_tokens.py).
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sdk.audio_tokens import ANSWER_TYPICAL, ANSWER_WORST, clip_tokens
from sdk.file_text import extracted_chars
from sdk.pdf_pages import is_pdf, pdf_pages
from sdk.promptcache.tokens import IMAGE_TOKENS, load_encoding
from sdk.types import Endpoint, LLMRequest, Protocol, Usage

ANTHROPIC_FACTOR = 1.2
EXACT_CHARS = 64 * 1024  # tokenized exactly (a few ms at most); beyond, counted by length
CHARS_PER_TOKEN = 3.0  # below cl100k's ~4 on English prose: a length-based count leans high
DEFAULT_OUTPUT_TOKENS = 4096  # what a reservation assumes when the request sets no output limit
DEFAULT_SEARCHES = 5  # calls of a hosted tool billed per call a reservation assumes when a request allows them without a cap
# A hosted tool loop (docs/spend.md, "Hosted tool loops"): the provider samples the model once per server tool
# call and once more after the last, each step reading the prompt, what the model wrote so far and every
# result so far, and bills the sum (Anthropic's usage adds up its `iterations`). A result's size is not known
# before it runs: a hold counts each at TOOL_RESULT_TOKENS (a web search's results, a fetched page cut to its
# tool's `max_content_tokens`), a documented assumption as the 4,096-token output default is.
TOOL_RESULT_TOKENS = 10_000
# Server tools the provider runs in a loop: Anthropic's by type (each up to its `max_uses`), the Responses
# API's built-in tools (all together up to the request's `max_tool_calls`)
_ANTHROPIC_LOOPED = ("web_search", "web_fetch", "code_execution", "tool_search_tool")
_RESPONSES_LOOPED = frozenset({"web_search", "web_search_preview", "file_search", "code_interpreter", "image_generation",
                               "mcp", "tool_search"})

# A PDF page: its text and its image (Anthropic's PDF support guide: 1,500 to 3,000 tokens a page, by how
# dense it is; OpenAI sends each page's text and an image of it too).
PDF_PAGE_TOKENS = 2_000  # a typical page: what an estimate charges
PDF_PAGE_WORST = 3_000  # a dense one: what a budget's hold counts
# The most an image may cost, what a budget's hold counts, by the provider reading it: Claude resizes an
# image to at most about 1,600 tokens (1,568 px on the long edge), Opus 4.7 to 2,576 px (about 4,800
# tokens, ⌈w/28⌉ × ⌈h/28⌉); OpenAI's gpt-4o tiles cost up to 1,445 (high detail: 8 tiles of 512 px, 170
# each, plus 85), its patch-billed models up to 1,536 patches × 2.46 (gpt-4.1-nano's multiplier), 3,779.
IMAGE_WORST = {Protocol.ANTHROPIC: 4_800, Protocol.OPENAI: 3_800}
# Models whose image costs more than their provider's IMAGE_WORST (first glob that matches). OpenAI's
# vision guide, "Calculating costs" (platform.openai.com/docs/guides/images-vision#calculating-costs):
# gpt-4o-mini bills 2,833 tokens an image plus 5,667 a tile, so 8 tiles at high detail are 48,169 tokens,
# at its $0.15 per million about twice gpt-4o's image in USD (held as 3,800 tokens, it was a 13th of it).
IMAGE_WORST_BY_MODEL: tuple[tuple[str, int], ...] = (("gpt-4o-mini*", 2_833 + 8 * 5_667),)
# A PDF named by file id or URL: its pages are not in the request, so a hold counts the most pages the
# provider reads in one request, less those of its base64 PDFs, at PDF_PAGE_WORST: Anthropic's PDF support
# guide (platform.claude.com/docs/en/build-with-claude/pdf-support), 600 pages a request (100 on models
# with a 200k-token context window); OpenAI's file inputs guide (platform.openai.com/docs/guides/pdf-files),
# 100 pages and 32 MB a request across its files. Never more than the largest context window reads.
PDF_PAGES_PER_REQUEST = {Protocol.ANTHROPIC: 600, Protocol.OPENAI: 100}
MAX_INPUT_TOKENS = 1_000_000  # Claude's 1M-token context window, the largest either provider's models read
# A document named by file id or URL need not be a PDF: the Responses API reads a text, code or Office file as
# its extracted text, billed as tokens, which a page limit does not bound. Where the model's context window is
# known and larger than what the page limit holds, it is held at the window (first glob that matches):
# gpt-4.1's 1,047,576 tokens (OpenAI's model pages), gpt-5.4's 1,050,000 (its model page: a 1M+ window).
CONTEXT_WINDOW_BY_MODEL: tuple[tuple[str, int], ...] = (("gpt-4.1*", 1_047_576), ("gpt-5.4*", 1_050_000))

# Keys whose string values are not text the model reads as tokens (ids, switches, names).
_NOT_TEXT = frozenset({"model", "role", "type", "id", "tool_call_id", "tool_use_id", "cache_control", "stream_options",
                       "metadata", "prompt_cache_key", "prompt_cache_retention", "user", "safety_identifier",
                       "previous_response_id", "service_tier", "media_type", "detail", "encoding_format", "format",
                       "reasoning_effort", "truncation", "tool_choice", "status", "signature"})
# Keys whose values are media (base64 or URLs): a fixed cost each, not their length.
_MEDIA = frozenset({"data", "file_data", "image_url", "url", "file_id", "file_url"})
_REFERENCES = frozenset({"url", "file_id", "file_url"})  # media named, not sent
# Blocks holding a document: Anthropic's `document`, the Responses API's `input_file` (and Chat's `file`
# part's `file`; an Anthropic source of type `file` may be an image's)
_DOCUMENTS = frozenset({"document", "input_file"})


def count_texts(texts: list[str], protocol: Protocol, exact: int = EXACT_CHARS) -> int:
    """Tokens in `texts`: exact up to `exact` characters, by length beyond; scaled for Anthropic."""
    encode = load_encoding().encode_ordinary
    left, n, rest = exact, 0, 0
    for text in texts:
        if len(text) <= left:
            left -= len(text)
            n += len(encode(text)) if text else 0
        else:
            rest += len(text)
    return scaled(n + math.ceil(rest / CHARS_PER_TOKEN), protocol)


@dataclass(slots=True)
class Media:
    """A request's media: PDFs (base64) by their pages, and every other image or file."""

    images: int = 0  # images, and files that are neither a base64 PDF nor a document named by reference
    pages: int = 0  # the pages of its base64 PDFs
    pdf_chars: int = 0  # the length of their base64
    documents: int = 0  # documents (PDFs) named by file id or URL: their pages are not in the request
    file_text: int = 0  # characters of text extracted from inline documents that are not PDFs (sdk/file_text.py)
    file_chars: int = 0  # the length of their base64
    token_ids: int = 0  # integers in lists: a prompt or input sent as token ids, each a token
    audio: int = 0  # the tokens of its input_audio clips, at their worst (sdk/audio_tokens.py)
    audio_typical: int = 0  # the same at a typical bitrate, for an estimate
    audio_chars: int = 0  # the length of their base64
    audio_ids: int = 0  # earlier spoken answers it names by audio id, read again as input

    def add(self, key: str, item: object, media_type: object, document: bool) -> None:
        if isinstance(item, str) and is_pdf(item, media_type):
            self.pages += pdf_pages(item)  # decoded only here: a request without a PDF decodes nothing
            self.pdf_chars += len(item)
        elif document and key in _REFERENCES:
            self.documents += 1
        elif document and key == "file_data" and isinstance(item, str):
            # Another document sent inline (a Responses input_file: text, code, Office files): its text is
            # extracted and billed as tokens, so it counts as that text does, not as one image
            self.file_text += extracted_chars(item)
            self.file_chars += len(item)
        else:
            self.images += 1

    def add_audio(self, part: dict[str, Any]) -> None:
        """An input_audio part's clip (`{"data", "format"}`), billed by its duration, not as an image."""
        data = part.get("data")
        if isinstance(data, str):
            self.audio += clip_tokens(data, worst=True)
            self.audio_typical += clip_tokens(data, worst=False)
            self.audio_chars += len(data)

    def text_tokens(self, worst: bool = True) -> int:
        """The tokens of the text extracted from its inline non-PDF documents, counted by length, of the
        prompts it sends as token ids, and of its audio (at the worst, for a hold; else typical)."""
        audio = self.audio + self.audio_ids * ANSWER_WORST if worst else self.audio_typical + self.audio_ids * ANSWER_TYPICAL
        return math.ceil(self.file_text / CHARS_PER_TOKEN) + self.token_ids + audio


def _texts(value: Any, media: Media, document: bool = False) -> Iterator[str]:
    """The text in `value`, its media counted in `media`; `document`: inside a document's block."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        document = document or value.get("type") in _DOCUMENTS
        # Anthropic's plain-text document source ({"type": "text", "media_type": "text/plain", "data": TEXT}) is
        # billed as its text: its `data` is text, not media (a fixed 1,000 tokens let a team send documents uncounted)
        text_source = value.get("type") == "text"
        for key, item in value.items():
            if key in ("input_audio", "audio") and isinstance(item, dict):
                # a clip by its duration, an earlier spoken answer named by id read again (sdk/audio_tokens.py)
                if key == "input_audio":
                    media.add_audio(item)
                elif isinstance(item.get("id"), str):
                    media.audio_ids += 1
                else:  # a request's audio output settings
                    yield from _texts(item, media, document)
            elif key in _MEDIA and not isinstance(item, list) and not (text_source and key == "data"):
                media.add(key, item, value.get("media_type"), document)
            elif key not in _NOT_TEXT:
                yield from _texts(item, media, document or key == "file")
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, int) and not isinstance(item, bool):
                media.token_ids += 1  # a prompt or input given as token ids (a completion's, embeddings'): one token each
            else:
                yield from _texts(item, media, document)


def media_of(request: LLMRequest) -> Media:
    """The request's media, its body walked (for a large body, off the loop: the limits stage keeps it in
    `request.media` for `input_tokens`)."""
    media = Media()
    for _ in _texts(request.body, media):
        pass
    return media


def image_worst(model: str, protocol: Protocol) -> int:
    """The most one image costs `model`, read over `protocol` (its provider's), in tokens."""
    return next((tokens for glob, tokens in IMAGE_WORST_BY_MODEL if fnmatch.fnmatchcase(model, glob)), IMAGE_WORST[protocol])


def context_window(model: str) -> int:
    """`model`'s context window in tokens where CONTEXT_WINDOW_BY_MODEL knows it (above a page limit's hold), else 0."""
    return next((tokens for glob, tokens in CONTEXT_WINDOW_BY_MODEL if fnmatch.fnmatchcase(model, glob)), 0)


@dataclass(frozen=True, slots=True)
class WorstInput:
    """A request's input at its worst, for a budget's hold: what depends on the target apart (`on`): its
    text as cl100k counts it (Claude's tokenizer yields more: `ANTHROPIC_FACTOR`), its images (OpenAI's
    models bill them differently) and its documents named by reference (each provider's page limit)."""

    text: int  # cl100k's count (exact up to a point, by length beyond)
    fixed: int = 0  # tokens no tokenizer changes: base64 PDF pages, a large body counted by its size
    images: int = 0
    documents: int = 0  # PDFs named by file id or URL
    pages: int = 0  # of its base64 PDFs (in `fixed`): a request's page limit counts them too

    def on(self, model: str, protocol: Protocol) -> int:
        documents = 0
        if self.documents:
            pages = max(self.documents, PDF_PAGES_PER_REQUEST[protocol] - self.pages)
            # a PDF's pages, or another file's text up to the model's context window where that is known and larger
            documents = max(min(pages * PDF_PAGE_WORST, MAX_INPUT_TOKENS), context_window(model))
        return scaled(self.text, protocol) + self.fixed + self.images * image_worst(model, protocol) + documents


def scaled(tokens: int, protocol: Protocol) -> int:
    """cl100k's count of a text as the provider's tokenizer is estimated to count it."""
    return math.ceil(tokens * ANTHROPIC_FACTOR) if protocol is Protocol.ANTHROPIC else tokens


def worst_input(request: LLMRequest, exact: int = EXACT_CHARS) -> WorstInput:
    """`input_tokens` at its worst, what depends on the target apart (its tokenizer, what its model bills an
    image, its page limit): a route's targets each price it as they would bill it."""
    text, fixed, media = _counted(request, exact, worst=True)
    if media is None:
        return WorstInput(text, fixed)
    return WorstInput(text, fixed, media.images, media.documents, media.pages)


def input_tokens(request: LLMRequest, exact: int = EXACT_CHARS, worst: bool = False) -> int:
    """What the request's input costs in tokens, estimated: its text (messages, system, tools,
    instructions, input) counted (exactly up to `exact` characters), and its media (`Media`): a base64
    PDF's pages and every other image or file, at their worst cost for a budget's hold (`worst`: on the
    model it names), else at a typical one. A body over EXACT_CHARS × 4 bytes is counted by its size
    without walking it (bounded work on the loop), its PDFs' pages instead of their base64 and its other
    media on top where the limits stage counted them off the loop (`request.media`)."""
    if worst:
        return worst_input(request, exact).on(request.model, request.protocol)
    text, fixed, media = _counted(request, exact, worst=False)
    return scaled(text, request.protocol) + fixed + ((media.images + media.documents) * IMAGE_TOKENS if media is not None else 0)


def _counted(request: LLMRequest, exact: int, worst: bool) -> tuple[int, int, Media | None]:
    """The request's text in cl100k tokens, its tokens no tokenizer changes (base64 PDF pages; a large
    body's size), and its media (None: a large body whose media were not counted, its size counting them)."""
    page = PDF_PAGE_WORST if worst else PDF_PAGE_TOKENS
    if request.size > EXACT_CHARS * 4:
        by_size = math.ceil(request.size / CHARS_PER_TOKEN)
        media = request.media
        if not isinstance(media, Media):
            return 0, by_size, None
        rest = max(0, request.size - media.pdf_chars - media.file_chars - media.audio_chars)
        return 0, max(by_size, math.ceil(rest / CHARS_PER_TOKEN) + media.pages * page + media.text_tokens(worst)), media
    media = Media()
    return count_texts(list(_texts(request.body, media)), Protocol.OPENAI, exact), media.pages * page + media.text_tokens(worst), media


def output_limit(request: LLMRequest) -> int:
    """The most output tokens the request allows: its own limit (else DEFAULT_OUTPUT_TOKENS) for
    every choice it is billed for (`n`, or a legacy completion's `best_of`, generated and billed
    though only `n` come back)."""
    body = request.body
    choices = max([1, *(value for key in ("n", "best_of") if isinstance(value := body.get(key), int))])
    return choice_limit(request) * choices


def choice_limit(request: LLMRequest) -> int:
    """The most output tokens one choice of the request may have: its limit, else DEFAULT_OUTPUT_TOKENS."""
    if request.endpoint in (Endpoint.EMBEDDINGS, Endpoint.COUNT_TOKENS, Endpoint.RESPONSES_INPUT_TOKENS):
        return 0
    body = request.body
    return next((value for key in ("max_tokens", "max_completion_tokens", "max_output_tokens")
                 if isinstance(value := body.get(key), int) and value > 0), DEFAULT_OUTPUT_TOKENS)


def search_limit(request: LLMRequest) -> int:
    """The most web searches the provider may run (and bill per call) for the request: its web search
    tool's `max_uses` (Anthropic) or the request's `max_tool_calls` (Responses), else DEFAULT_SEARCHES
    where it offers one (a server tool `web_search*`, Chat's `web_search_options`); 0 without."""
    body = request.body
    tools = body.get("tools")
    search = next((t for t in tools if isinstance(t, dict) and str(t.get("type", "")).startswith("web_search")), None) \
        if isinstance(tools, list) else None
    if search is None:
        return DEFAULT_SEARCHES if isinstance(body.get("web_search_options"), dict) else 0
    limit = search.get("max_uses", body.get("max_tool_calls"))
    return limit if isinstance(limit, int) and limit >= 0 else DEFAULT_SEARCHES


def hosted_steps(request: LLMRequest) -> int:
    """The most server tool calls the provider may run in a loop for the request (each followed by another
    sampling step): on the Responses API its built-in tools' `max_tool_calls`, else DEFAULT_SEARCHES a tool
    offered; on Messages each server tool's `max_uses`, else DEFAULT_SEARCHES; a Chat request's web search
    (`search_limit`, Claude's loop where the route translates it). 0 without such tools."""
    body = request.body
    listed = body.get("tools")
    tools: list[dict[str, Any]] = [t for t in listed if isinstance(t, dict)] if isinstance(listed, list) else []
    if request.endpoint is Endpoint.RESPONSES:
        hosted = sum(1 for t in tools if t.get("type") in _RESPONSES_LOOPED or _hosted_shell(t))
        limit = body.get("max_tool_calls")
        return (limit if isinstance(limit, int) and limit >= 0 else DEFAULT_SEARCHES * hosted) if hosted else 0
    if request.endpoint.protocol is Protocol.ANTHROPIC:
        uses = [t.get("max_uses") for t in tools if str(t.get("type", "")).startswith(_ANTHROPIC_LOOPED)]
        # the MCP connector calls a listed server's tools in the loop too, without a cap of its own
        return sum(n if isinstance(n, int) and n >= 0 else DEFAULT_SEARCHES for n in uses) + DEFAULT_SEARCHES * len(_mcp_servers(body))
    return search_limit(request)


def _mcp_servers(body: dict[str, Any]) -> list[Any]:
    servers = body.get("mcp_servers")
    return servers if isinstance(servers, list) else []


def listed_tools(request: LLMRequest) -> int:
    """The input tokens of the tool definitions the provider imports from remote MCP servers (a Responses
    `mcp` tool, an Anthropic request's `mcp_servers`), which every step reads and the request does not carry:
    TOOL_RESULT_TOKENS a server."""
    tools = request.body.get("tools")
    servers = sum(1 for t in tools if isinstance(t, dict) and t.get("type") == "mcp") if isinstance(tools, list) else 0
    return TOOL_RESULT_TOKENS * (servers + len(_mcp_servers(request.body)))


def result_tokens(request: LLMRequest) -> int:
    """What a hold counts each server tool result at: TOOL_RESULT_TOKENS, or the most a web fetch tool is
    allowed to bring back (Anthropic's `max_content_tokens`) where that is more."""
    tools = request.body.get("tools")
    fetches = [t.get("max_content_tokens") for t in tools if isinstance(t, dict) and str(t.get("type", "")).startswith("web_fetch")] \
        if isinstance(tools, list) else []
    return max([TOOL_RESULT_TOKENS, *(n for n in fetches if isinstance(n, int))])


def looped_input(prompt: int, steps: int, output: int, result: int = TOOL_RESULT_TOKENS) -> int:
    """The input tokens a request of `prompt` tokens is billed over a hosted tool loop of `steps` calls: each
    of the steps + 1 samplings reads the prompt, the `output` written so far (at most the request's output
    limit) and the results so far (`result` tokens each), and no step more than the largest context window."""
    if steps <= 0:
        return prompt
    total = (steps + 1) * prompt + steps * output + result * steps * (steps + 1) // 2
    return min(total, (steps + 1) * max(prompt, MAX_INPUT_TOKENS))


def tool_call_limits(request: LLMRequest) -> Usage:
    """The most calls of each hosted tool billed per call the provider may run for the request: web
    searches (`search_limit`), and on the Responses API file searches and images where it offers the
    `file_search` or `image_generation` tool, each up to its `max_tool_calls`, else DEFAULT_SEARCHES,
    and a container per `code_interpreter` tool and hosted `shell` tool."""
    calls = Usage(web_searches=search_limit(request))
    body = request.body
    tools = body.get("tools")
    if request.endpoint is Endpoint.RESPONSES and isinstance(tools, list):
        offered = {t.get("type") for t in tools if isinstance(t, dict)}
        limit = body.get("max_tool_calls")
        limit = limit if isinstance(limit, int) and limit >= 0 else DEFAULT_SEARCHES
        calls.file_searches = limit if "file_search" in offered else 0
        calls.images = limit if "image_generation" in offered else 0
        # each code interpreter tool runs in one container (a new one for `auto`), whatever its calls, and so
        # does a hosted shell (`container_auto` makes one for the request, as OpenAI bills it; a local one runs nowhere)
        calls.containers = sum(1 for t in tools if isinstance(t, dict) and (t.get("type") == "code_interpreter" or _hosted_shell(t)))
    return calls


def _hosted_shell(tool: dict[str, Any]) -> bool:
    """The shell tool run in a container on the provider (`container_auto`, `container_reference`), not the client's."""
    environment = tool.get("environment")
    return tool.get("type") == "shell" and isinstance(environment, dict) and \
        environment.get("type") in ("container_auto", "container_reference")
