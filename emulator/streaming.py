"""Shared response flow: pre-response faults, latency waits, paced SSE with faults and
cancellation accounting. Provider modules build the bytes; this module decides when to send."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from .asgi import Call, Headers
from .faults import FaultSet, FaultSpecError

if TYPE_CHECKING:
    from .app import Emulator

# Sends a provider-shaped error response: (status, its retry-after headers) -> None
ErrorSender = Callable[[int, Headers], Awaitable[None]]


def retry_headers(retry_after: float | None, retry_after_ms: float | None) -> Headers:
    """`retry-after` (seconds) and `retry-after-ms`, as both providers' SDKs read them."""
    h: Headers = []
    for name, v in ((b"retry-after", retry_after), (b"retry-after-ms", retry_after_ms)):
        if v is not None:
            h.append((name, (str(int(v)) if float(v).is_integer() else str(v)).encode()))
    return h


async def pre_faults(
    emu: Emulator, call: Call, model: str | None, stream: bool,
    bad_spec: Callable[[str], Awaitable[None]], send_error: ErrorSender,
) -> tuple[bool, FaultSet | None]:
    """(handled, faults): the request's faults, with the stall / reset / error-status ones that act
    before the first byte applied. A malformed `x-emulator-fault` is answered by `bad_spec`.

    `handled` is True when the request has been fully dealt with (answered, dropped or cancelled).
    """
    try:
        faults = emu.take_faults(call, model, stream)
    except FaultSpecError as e:
        await bad_spec(f"x-emulator-fault: {e}")
        return True, None
    if faults is None:  # the common case: nothing to apply
        return False, None
    if faults.stall_ms > 0 and not await call.pause(faults.stall_ms / 1000.0):
        _cancelled(emu, stream)
        return True, faults
    if faults.reset:
        await call.reset()
        return True, faults
    if faults.status:
        await send_error(faults.status, retry_headers(faults.retry_after, faults.retry_after_ms))
        return True, faults
    return False, faults


def _cancelled(emu: Emulator, stream: bool) -> None:
    if stream:
        emu.stats.cancelled_streams += 1
    else:
        emu.stats.cancelled_requests += 1


async def respond_after(
    emu: Emulator, call: Call, seconds: float, status: int, body: bytes, headers: Headers,
    on_start: Callable[[], None],
) -> None:
    """Non-streaming answer after the modelled latency; counts a disconnect while 'thinking'."""
    if seconds > 0 and not await call.pause(seconds):
        emu.stats.cancelled_requests += 1
        return
    on_start()
    emu.count_status(status)
    await call.respond(status, body, headers)


async def run_stream(
    emu: Emulator,
    call: Call,
    headers: Headers,
    events: list[bytes],
    tokens: list[int],
    faults: FaultSet | None,
    error_event: bytes | Callable[[int], bytes],
    ttft_s: float,
    on_start: Callable[[], None],
    pauses: dict[int, float] | None = None,
) -> None:
    """Send SSE `events` (each preceded by tokens[i] x per_output_token_ms of pacing).

    `pauses`: seconds more to wait before the events at these indexes (a Chat stream's usage chunk).
    `error_event` is what `midstream_error` sends, or a function of the event index it replaces
    (for protocols that number their events). Exactly one of completed_streams / cancelled_streams / errored_streams is incremented for
    every stream that got past validation.
    """
    st = emu.stats
    st.open_streams += 1
    try:
        if not await call.pause(ttft_s):
            st.cancelled_streams += 1
            return
        await call.start_stream(headers)
        emu.count_status(200)
        on_start()
        cut = -1
        if faults is not None:
            n = faults.disconnect_after if faults.disconnect_after >= 0 else faults.midstream_after
            cut = min(n, len(events) - 1) if n >= 0 else -1
        pace = emu.config.per_output_token_ms / 1000.0
        if pace <= 0 and cut < 0 and not pauses and not call.gone():
            # Nothing to wait for: one write is much cheaper than one per event.
            await call.chunk(b"".join(events), more=False)
            st.completed_streams += 1
            return
        for i, ev in enumerate(events):
            if i == cut:
                st.errored_streams += 1
                assert faults is not None
                if faults.disconnect_after >= 0:
                    await call.close_after_flush()
                else:
                    err = error_event(i) if callable(error_event) else error_event
                    await call.chunk(err, more=False)
                return
            wait = (pace * tokens[i] if pace > 0 else 0.0) + (pauses.get(i, 0.0) if pauses else 0.0)
            if wait > 0:
                ok = await call.pause(wait)
            else:
                ok = not call.gone()
            if not ok:
                st.cancelled_streams += 1
                return
            await call.chunk(ev)
        if call.gone():
            st.cancelled_streams += 1
            return
        await call.chunk(b"", more=False)
        st.completed_streams += 1
    finally:
        st.open_streams -= 1
