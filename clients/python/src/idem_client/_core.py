"""The carrier-neutral part: classifying answers, reading status answers, and the retry loop
as a generator of actions (send, ask, sleep), driven by the sync and the async client alike.

| an attempt came back with | next step |
|---|---|
| nothing was sent (connect refused, DNS, connect timeout) | retry after backoff |
| sent, no usable answer (timeout, reset, body cut off, 502, 504) | ask the status endpoint |
| 409 in-flight, 429, 503 | wait (at least Retry-After), retry with the same key |
| 409 outcome-unknown | stop: OutcomeUnknown |
| Idempotent-Replayed: true, or anything else | final |

| the status endpoint says | next step |
|---|---|
| completed (the stored answer, Idempotent-Replayed: true) | return it |
| processing | wait (at least Retry-After), ask again |
| absent | retry the request, same key |
| unknown | stop: OutcomeUnknown |
| the query failed (connection, timeout, 429, 502-504) | wait, ask again |
| anything that is not a status of this key | stop: StatusQueryError |
| 409 response-not-stored | stop: ResponseNotStored |
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Dict, Generator, Mapping, Optional, Union

import httpx

from ._errors import (
    Ambiguous,
    AttemptsExhausted,
    DeadlineExceeded,
    IdemError,
    InvalidRequest,
    OutcomeUnknown,
    ResponseNotStored,
    StatusQueryError,
    problem_class,
)
from ._policy import RetryPolicy

REPLAYED = "idempotent-replayed"

# --- what one attempt came back with ----------------------------------------------------


@dataclass
class NotSent:
    """Nothing reached the server: a retry is safe."""
    why: str


@dataclass
class Unclear:
    """Sent, but no usable answer: it may or may not have run."""
    why: str


@dataclass
class Later:
    """The server asked to come back later without running anything for this attempt."""
    answer: httpx.Response
    why: str
    retry_after: Optional[float]


@dataclass
class Unknown:
    """409 outcome-unknown."""
    answer: httpx.Response


@dataclass
class Final:
    """A final answer (a replay included): returned, never retried."""
    answer: httpx.Response


Attempt = Union[NotSent, Unclear, Later, Unknown, Final]

# --- what the status endpoint said --------------------------------------------------------


@dataclass
class Absent:
    pass


@dataclass
class Processing:
    retry_after: Optional[float]


@dataclass
class Completed:
    answer: httpx.Response


@dataclass
class KeyUnknown:
    pass


@dataclass
class QueryFailed:
    why: str


KeyState = Union[Absent, Processing, Completed, KeyUnknown, QueryFailed]

# --- actions the loop asks its driver to perform -------------------------------------------


@dataclass
class Send:
    attempt: int
    timeout: float


@dataclass
class Ask:
    timeout: float


@dataclass
class Sleep:
    seconds: float


Action = Union[Send, Ask, Sleep]


@dataclass
class Done:
    answer: httpx.Response
    attempts: int
    from_status: bool


def retry_after(headers: Mapping[str, str]) -> Optional[float]:
    """A ``Retry-After`` in delta-seconds; ``None`` for anything else (an HTTP date is left to
    the client's own backoff)."""
    raw = headers.get("retry-after")
    if raw is None:
        return None
    raw = raw.strip()
    return float(raw) if raw.isdigit() else None


def is_replayed(headers: Mapping[str, str]) -> bool:
    return headers.get(REPLAYED, "").strip().lower() == "true"


def problem_of(answer: httpx.Response) -> Optional[Dict[str, Any]]:
    """The problem+json body of an answer, when it is one."""
    ct = answer.headers.get("content-type", "")
    if not ct.strip().lower().startswith("application/problem+json"):
        return None
    try:
        body = json.loads(answer.content)
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def problem_slug(answer: httpx.Response) -> Optional[str]:
    body = problem_of(answer)
    if body is None or not isinstance(body.get("type"), str):
        return None
    cls = problem_class(body["type"])
    return cls.slug if cls is not None else None


def problem_error(answer: httpx.Response, key: str) -> Optional[IdemError]:
    """The typed error of an idem problem answer (not replayed), else ``None``."""
    if is_replayed(answer.headers):
        return None
    body = problem_of(answer)
    if body is None or not isinstance(body.get("type"), str):
        return None
    cls = problem_class(body["type"])
    if cls is None:
        return None
    detail = body.get("detail")
    return cls(
        detail if isinstance(detail, str) else str(body.get("title", cls.slug)),
        status=answer.status_code,
        type=body["type"],
        key=body["key"] if isinstance(body.get("key"), str) else key,
        problem=body,
    )


def classify(answer: httpx.Response) -> Attempt:
    """What an answer means for the loop."""
    if is_replayed(answer.headers):
        return Final(answer)
    status = answer.status_code
    after = retry_after(answer.headers)
    if status == 409:
        slug = problem_slug(answer)
        if slug == "in-flight":
            return Later(answer, "in-flight", after)
        if slug == "outcome-unknown":
            return Unknown(answer)
        return Final(answer)
    if status == 429:
        return Later(answer, "throttled", after)
    if status == 503:
        return Later(answer, "unavailable", after)
    if status in (502, 504):
        return Unclear(f"HTTP {status}")
    return Final(answer)


def transport_failure(exc: Exception) -> Attempt:
    """A failure before any answer: safe to retry only when nothing can have been sent."""
    if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)):
        return NotSent(f"connect failed: {type(exc).__name__}: {exc}")
    if isinstance(exc, httpx.TimeoutException):
        return Unclear(f"timed out: {type(exc).__name__}: {exc}")
    return Unclear(f"connection failed after sending: {type(exc).__name__}: {exc}")


def read_status(key: str, answer: httpx.Response) -> KeyState:
    """What a status answer says about ``key``; raises when it is not a status of it."""
    if is_replayed(answer.headers):
        return Completed(answer)
    status = answer.status_code
    if status in (429, 502, 503, 504):
        return QueryFailed(f"HTTP {status}")
    if status == 409 and problem_slug(answer) == "response-not-stored":
        raise ResponseNotStored(
            "the key completed, but its answer was too large to keep",
            status=409,
            key=key,
        )
    body: Any = None
    if status in (200, 404):
        try:
            body = json.loads(answer.content)
        except ValueError:
            body = None
    if not isinstance(body, dict) or body.get("key") != key:
        text = answer.content[:200].decode("utf-8", "replace")
        raise StatusQueryError(
            f"the status endpoint answered HTTP {status}, not a status of this key: {text}",
            status=status,
            key=key,
        )
    state = body.get("state")
    if state == "absent":
        return Absent()
    if state == "processing":
        return Processing(retry_after(answer.headers))
    if state == "unknown":
        return KeyUnknown()
    raise StatusQueryError(
        f"state {state!r} without the stored answer", status=status, key=key
    )


def operation(
    policy: RetryPolicy, key: str, has_status: bool
) -> Generator[Action, Any, Done]:
    """The retry loop. Yields :class:`Send` (answered with an :data:`Attempt`), :class:`Ask`
    (answered with a :data:`KeyState`) and :class:`Sleep` (answered with ``None``); returns
    :class:`Done` or raises an :class:`IdemError` naming the key."""
    deadline = time.monotonic() + policy.deadline
    attempts = 0
    waits = 0
    last = "none"
    last_answer: Optional[httpx.Response] = None
    ask = False
    # A wait before the next step, and the server's Retry-After for it (None: backoff only).
    have_wait = False
    pending_wait: Optional[float] = None

    def last_problem() -> Optional[IdemError]:
        return problem_error(last_answer, key) if last_answer is not None else None

    def gave_up() -> DeadlineExceeded:
        return DeadlineExceeded(
            f"deadline of {policy.deadline}s reached after {attempts} attempts; last: {last}",
            attempts=attempts,
            deadline=policy.deadline,
            last=last,
            key=key,
            status=last_answer.status_code if last_answer is not None else None,
            last_problem=last_problem(),
        )

    while True:
        if have_wait:
            have_wait = False
            pause = policy.wait(waits, pending_wait)
            waits += 1
            if time.monotonic() + pause >= deadline:
                raise gave_up()
            yield Sleep(pause)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise gave_up()
        timeout = min(policy.attempt_timeout, remaining)
        if ask:
            if not has_status:
                raise Ambiguous(
                    f"the request was sent but its outcome cannot be told ({last}); "
                    "no status endpoint is configured",
                    key=key,
                )
            state = yield Ask(timeout)
            if isinstance(state, Completed):
                return Done(state.answer, attempts, True)
            if isinstance(state, KeyUnknown):
                raise OutcomeUnknown(
                    "the status endpoint says an earlier attempt may have acted; "
                    "resolve the key before trying again",
                    key=key,
                    status=409,
                )
            if isinstance(state, Absent):
                ask = False
                continue
            if isinstance(state, Processing):
                pending_wait, have_wait = state.retry_after, True
                continue
            assert isinstance(state, QueryFailed)
            last = f"status query failed: {state.why}"
            pending_wait, have_wait = None, True
            continue
        if attempts >= policy.max_attempts:
            raise AttemptsExhausted(
                f"gave up after {attempts} attempts; last: {last}",
                attempts=attempts,
                last=last,
                key=key,
                status=last_answer.status_code if last_answer is not None else None,
                last_problem=last_problem(),
            )
        attempts += 1
        result = yield Send(attempts, timeout)
        if isinstance(result, Final):
            return Done(result.answer, attempts, False)
        if isinstance(result, Unknown):
            told = problem_error(result.answer, key)
            if isinstance(told, OutcomeUnknown):
                raise told
            raise OutcomeUnknown(
                "the gateway says an earlier attempt's outcome is unknown; "
                "resolve the key before trying again",
                key=key,
                status=result.answer.status_code,
            )
        if isinstance(result, Later):
            last = f"{result.why} (HTTP {result.answer.status_code})"
            last_answer = result.answer
            pending_wait, have_wait = result.retry_after, True
            continue
        if isinstance(result, NotSent):
            last = f"not sent: {result.why}"
            pending_wait, have_wait = None, True
            continue
        assert isinstance(result, Unclear)
        last = f"ambiguous: {result.why}"
        ask = True


# --- building requests ------------------------------------------------------------------


def check_key(key: str) -> str:
    """The header value for ``key``: bare, or an RFC 8941 string when it holds ``,"\\``."""
    if not 1 <= len(key) <= 255:
        raise InvalidRequest(f"key {key!r}: must be 1-255 characters", key=key)
    bad = next((c for c in key if not 0x20 <= ord(c) <= 0x7E), None)
    if bad is not None:
        raise InvalidRequest(
            f"key {key!r}: character {bad!r} is outside printable ASCII", key=key
        )
    if key.startswith(" ") or key.endswith(" "):
        raise InvalidRequest(f"key {key!r}: leading or trailing space", key=key)
    if any(c in key for c in ',"\\'):
        return '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return key
