"""Typed errors: one class per idem problem slug, plus the client's own stops.

Every error derives from :class:`IdemError`, which carries ``status`` (the HTTP status of the
answer behind it, when there was one), ``type`` (the problem ``type`` URI), ``detail`` and
``key`` (the operation's idempotency key, so it can be looked up or resumed later).
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Type

PROBLEM_BASE = "https://idem.dev/problems/"


class IdemError(Exception):
    """Base of every error this package raises."""

    #: The problem slug this class stands for (``None`` for the client's own errors).
    slug: Optional[str] = None

    def __init__(
        self,
        detail: str,
        *,
        status: Optional[int] = None,
        type: Optional[str] = None,
        key: Optional[str] = None,
        problem: Optional[Dict[str, Any]] = None,
        response: Any = None,
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.status = status
        self.type = type if type is not None else (
            PROBLEM_BASE + self.slug if self.slug is not None else None
        )
        self.key = key
        #: The problem+json body, when the error came from one.
        self.problem: Dict[str, Any] = dict(problem or {})
        #: The :class:`idem_client.Response` behind the error, when there was one.
        self.response = response

    def __str__(self) -> str:
        parts = []
        if self.status is not None:
            parts.append(f"HTTP {self.status}")
        if self.slug is not None:
            parts.append(self.slug)
        head = " ".join(parts)
        text = f"{head}: {self.detail}" if head else self.detail
        if self.key is not None:
            text += f" (key {self.key!r})"
        return text


# --- the client's own stops -------------------------------------------------------------


class InvalidRequest(IdemError):
    """The request could not be built (bad URL, header or key); nothing was sent."""


class Ambiguous(IdemError):
    """A request was sent, no usable answer came back, and no status endpoint is configured
    to tell whether it ran. Resending blind is the caller's decision, not the client's."""


class GaveUp(IdemError):
    """Base of :class:`AttemptsExhausted` and :class:`DeadlineExceeded`: the operation ended
    on retryable answers or failures. ``last`` describes the last one; ``last_problem`` is
    the typed error of the last idem answer (an :class:`InFlight`, a
    :class:`StoreUnavailable`, ...) when there was one."""

    def __init__(
        self,
        detail: str,
        *,
        attempts: int,
        last: str,
        last_problem: Optional[IdemError] = None,
        **kw: Any,
    ) -> None:
        super().__init__(detail, **kw)
        if last_problem is not None and kw.get("type") is None:
            self.type = last_problem.type
        self.attempts = attempts
        self.last = last
        self.last_problem = last_problem


class AttemptsExhausted(GaveUp):
    """Every attempt the policy allows was used on retryable answers or failures."""


class DeadlineExceeded(GaveUp):
    """The overall deadline passed (or the next wait would have passed it)."""

    def __init__(self, detail: str, *, deadline: float, **kw: Any) -> None:
        super().__init__(detail, **kw)
        self.deadline = deadline


class StatusQueryError(IdemError):
    """The status endpoint answered something that is not a status of this key (a wrong
    URL or route, a refused credential): never read as "absent"."""


# --- one class per problem slug (idem-wire's Reason table) ------------------------------


class ProblemError(IdemError):
    """An answer idem made itself (``application/problem+json`` with an idem ``type``)."""




class KeyMissing(ProblemError):
    """400: no key where one is required."""
    slug = "key-missing"


class KeyMalformed(ProblemError):
    """400: the key is not one valid key."""
    slug = "key-malformed"


class KeyMultiple(ProblemError):
    """400: the key was sent twice."""
    slug = "key-multiple"


class Unauthenticated(ProblemError):
    """401: the principal could not be determined."""
    slug = "unauthenticated"


class CredentialAmbiguous(ProblemError):
    """400: the principal's credential was sent more than once."""
    slug = "credential-ambiguous"


class NotOneMessage(ProblemError):
    """400: a gRPC request is not exactly one message."""
    slug = "not-one-message"


class BodyTooLarge(ProblemError):
    """413: the request body is above the cap; nothing ran."""
    slug = "body-too-large"


class BodyUnreadable(ProblemError):
    """400: the request body could not be read."""
    slug = "body-unreadable"


class BodyAmbiguous(ProblemError):
    """400: the JSON body names a member twice."""
    slug = "body-ambiguous"


class BodyTimeout(ProblemError):
    """408: the request body did not arrive in time."""
    slug = "body-timeout"


class InFlight(ProblemError):
    """409: a request with this key is running (retried by the client until its limits)."""
    slug = "in-flight"


class KeyReused(ProblemError):
    """422: the key was used with a different request; nothing ran."""
    slug = "key-reused"


class OutcomeUnknown(ProblemError):
    """409 (or the status endpoint's ``unknown``): an earlier attempt may have acted and
    nothing will run until an operator resolves the key. Retrying cannot help."""
    slug = "outcome-unknown"


class ResponseNotStored(ProblemError):
    """409: the request completed but its answer was too large to keep."""
    slug = "response-not-stored"


class StoreUnavailable(ProblemError):
    """503: the idempotency store failed or timed out; nothing ran."""
    slug = "store-unavailable"


class LeaseLost(ProblemError):
    """503: the claim was lost while the handler ran."""
    slug = "lease-lost"


class HandlerTimeout(ProblemError):
    """504: the handler ran past its deadline."""
    slug = "handler-timeout"


class HandlerPanicked(ProblemError):
    """500: the handler failed."""
    slug = "handler-panicked"


class ResponseFailed(ProblemError):
    """500: the handler's answer failed while being read."""
    slug = "response-failed"


class AnswerNotRecorded(ProblemError):
    """503: it ran, but the store failed to record the answer; retry with the same key."""
    slug = "answer-not-recorded"


class Internal(ProblemError):
    """500: anything else idem could not complete."""
    slug = "internal"


class MethodNotAllowed(ProblemError):
    """405: the method is not answered at this path."""
    slug = "method-not-allowed"


class NoRoute(ProblemError):
    """404: no route of the gateway matches."""
    slug = "no-route"


class MethodNotCanonical(ProblemError):
    """400: the method is a case variant of a configured one."""
    slug = "method-not-canonical"


class PathRejected(ProblemError):
    """400: the request path is refused."""
    slug = "path-rejected"


class BadRequestTarget(ProblemError):
    """400: the request target cannot be forwarded."""
    slug = "bad-request-target"


class StatusPath(ProblemError):
    """400: a status query's path names no key."""
    slug = "status-path"


class StatusRoute(ProblemError):
    """400: a status query does not say which route it asks about."""
    slug = "status-route"


class StatusToken(ProblemError):
    """400: a status query's token is malformed or sent in the URL."""
    slug = "status-token"


class Overloaded(ProblemError):
    """503: the gateway is at its limit of requests in progress."""
    slug = "overloaded"


class UpstreamUnavailable(ProblemError):
    """503: the upstream could not be reached; nothing was sent."""
    slug = "upstream-unavailable"


class UpstreamTls(ProblemError):
    """502: the TLS handshake with the upstream failed; nothing was sent."""
    slug = "upstream-tls"


class UpstreamFailed(ProblemError):
    """502: the upstream's connection failed while the request was sent or answered."""
    slug = "upstream-failed"


class UpstreamTimeout(ProblemError):
    """504: the upstream did not answer in time."""
    slug = "upstream-timeout"


class AnswerUnreadable(ProblemError):
    """500: the upstream's answer could not be read."""
    slug = "answer-unreadable"


class TokenMissing(ProblemError):
    """428: a token route got no token."""
    slug = "token-missing"


class TokenMalformed(ProblemError):
    """400: the token is not one well-formed token."""
    slug = "token-malformed"


class TokenWithKey(ProblemError):
    """400: a token route got an Idempotency-Key too."""
    slug = "token-with-key"


class TokenUnknown(ProblemError):
    """403: the token was not issued to this caller for this route."""
    slug = "token-unknown"


class TokenExpired(ProblemError):
    """410: the token expired before it was used."""
    slug = "token-expired"


class TokenUsed(ProblemError):
    """409: the token was used and no answer is kept under it."""
    slug = "token-used"


class TokenMismatch(ProblemError):
    """422: the token is bound to another request."""
    slug = "token-mismatch"


class TokenRateLimited(ProblemError):
    """429: tokens were asked for faster than the route allows."""
    slug = "token-rate-limited"


class TokenStoreUnavailable(ProblemError):
    """503: the token store failed."""
    slug = "token-store-unavailable"


class TokenStoreFull(ProblemError):
    """503: the token store holds as many live tokens as it may."""
    slug = "token-store-full"


#: Every problem class by slug.
PROBLEMS: Dict[str, Type[ProblemError]] = {
    cls.slug: cls
    for cls in ProblemError.__subclasses__()
    if cls.slug is not None
}


def problem_class(type_uri: str) -> Optional[Type[ProblemError]]:
    """The class of an idem problem ``type`` URI, or ``None`` when it is not one of idem's."""
    if not type_uri.startswith(PROBLEM_BASE):
        return None
    return PROBLEMS.get(type_uri[len(PROBLEM_BASE):])
