"""The sync :class:`Client` and the async :class:`AsyncClient`: one loop (``_core.operation``),
two drivers."""

from __future__ import annotations

import asyncio
import json as jsonlib
import logging
import time
import uuid
from typing import Any, Dict, Mapping, Optional, Tuple, Union
from urllib.parse import quote

import httpx

from ._core import (
    Ask,
    Attempt,
    Done,
    KeyState,
    QueryFailed,
    Send,
    Sleep,
    check_key,
    classify,
    is_replayed,
    operation,
    problem_error,
    read_status,
    transport_failure,
)
from ._errors import InvalidRequest
from ._policy import RetryPolicy

log = logging.getLogger("idem_client")

HeadersIn = Optional[Mapping[str, str]]
_BODY_HEADERS = ("content-type", "content-length", "content-encoding", "transfer-encoding")


class Response:
    """A final answer of one operation."""

    def __init__(self, done: Done, key: str, request_id: str, status_queries: int) -> None:
        answer = done.answer
        #: The underlying ``httpx.Response`` (of the attempt or of the status query).
        self.http: httpx.Response = answer
        self.status_code: int = answer.status_code
        self.headers: httpx.Headers = answer.headers
        self.content: bytes = answer.content
        #: The operation's idempotency key (every attempt carried it).
        self.key: str = key
        #: The operation's ``X-Request-ID``.
        self.request_id: str = request_id
        #: Requests sent (status queries not counted).
        self.attempts: int = done.attempts
        #: Status queries made.
        self.status_queries: int = status_queries
        #: Whether the answer came from the status endpoint (the stored answer of an attempt
        #: whose own answer was lost).
        self.from_status: bool = done.from_status

    @property
    def replayed(self) -> bool:
        """Whether the gateway replayed a stored answer (``Idempotent-Replayed: true``)."""
        return is_replayed(self.headers)

    @property
    def text(self) -> str:
        return self.http.text

    def json(self) -> Any:
        return jsonlib.loads(self.content)

    def __repr__(self) -> str:
        return (
            f"<idem_client.Response {self.status_code} key={self.key!r} "
            f"attempts={self.attempts} replayed={self.replayed} from_status={self.from_status}>"
        )


class _Prepared:
    """One operation's request, built once: the same bytes on every attempt."""

    def __init__(
        self,
        base: "_Base",
        method: str,
        url: str,
        *,
        json: Any,
        content: Optional[Union[bytes, str]],
        headers: HeadersIn,
        params: Optional[Mapping[str, str]],
        key: Optional[str],
        route: Optional[str],
    ) -> None:
        if json is not None and content is not None:
            raise InvalidRequest("give either json= or content=, not both")
        merged: Dict[str, str] = {}
        for source in (base.headers, headers or {}):
            for name, value in source.items():
                merged[name.lower()] = value
        given = merged.pop(base.key_header.lower()) if base.key_header.lower() in merged else None
        if key is None and given is not None:
            key = given.strip()
        self.key = key if key is not None else str(uuid.uuid4())
        self.key_value = check_key(self.key)
        self.request_id = merged.pop("x-request-id", "") or str(uuid.uuid4())
        body: bytes = b""
        if json is not None:
            body = jsonlib.dumps(json, separators=(",", ":")).encode()
            merged.setdefault("content-type", "application/json")
        elif isinstance(content, str):
            body = content.encode()
        elif content is not None:
            body = content
        self.method = method.upper()
        self.url = url
        self.params = dict(params or {})
        self.body = body
        self.headers = merged
        self.route = route if route is not None else base.route
        self.status_url = base.status_url

    def attempt_headers(self, key_header: str) -> Dict[str, str]:
        h = dict(self.headers)
        h[key_header] = self.key_value
        h["x-request-id"] = self.request_id
        return h

    def status_request(self) -> Tuple[str, Dict[str, str], Dict[str, str]]:
        assert self.status_url is not None
        url = self.status_url.rstrip("/") + "/" + quote(self.key, safe="")
        params = {"answer": "1"}
        if self.route is not None:
            params["route"] = self.route
        headers = {k: v for k, v in self.headers.items() if k not in _BODY_HEADERS}
        headers["x-request-id"] = self.request_id
        return url, params, headers


class _Base:
    def __init__(
        self,
        *,
        status_url: Optional[str],
        route: Optional[str],
        policy: Optional[RetryPolicy],
        key_header: str,
        headers: HeadersIn,
        raise_problems: bool,
    ) -> None:
        if status_url is not None and not status_url.startswith(("http://", "https://")):
            raise InvalidRequest(f"status_url {status_url!r}: must be an http(s) URL")
        self.status_url = status_url
        self.route = route
        self.policy = policy if policy is not None else RetryPolicy()
        self.key_header = key_header
        self.headers: Dict[str, str] = dict(headers or {})
        self.raise_problems = raise_problems

    def _finish(self, done: Done, prep: _Prepared, queries: int) -> Response:
        if self.raise_problems:
            err = problem_error(done.answer, prep.key)
            if err is not None:
                err.response = Response(done, prep.key, prep.request_id, queries)
                raise err
        return Response(done, prep.key, prep.request_id, queries)


class Client(_Base):
    """The synchronous client.

    >>> client = Client(status_url="http://127.0.0.1:8080/idem/status", route="charge")
    >>> r = client.post("http://127.0.0.1:8080/charge", json={"amount": 100}, key="order-42")
    >>> r.status_code, r.key, r.replayed
    """

    def __init__(
        self,
        *,
        status_url: Optional[str] = None,
        route: Optional[str] = None,
        policy: Optional[RetryPolicy] = None,
        key_header: str = "Idempotency-Key",
        headers: HeadersIn = None,
        raise_problems: bool = True,
        http_client: Optional[httpx.Client] = None,
    ) -> None:
        super().__init__(status_url=status_url, route=route, policy=policy,
                         key_header=key_header, headers=headers, raise_problems=raise_problems)
        self._own = http_client is None
        # Redirects are never followed: a 3xx is the answer.
        self._http = http_client if http_client is not None else httpx.Client(
            follow_redirects=False
        )

    def close(self) -> None:
        if self._own:
            self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(
        self,
        method: str,
        url: str,
        *,
        json: Any = None,
        content: Optional[Union[bytes, str]] = None,
        headers: HeadersIn = None,
        params: Optional[Mapping[str, str]] = None,
        key: Optional[str] = None,
        route: Optional[str] = None,
    ) -> Response:
        """Runs one operation: sends, retries what is safe with the same key, asks the status
        endpoint after an ambiguous failure, and returns the final answer."""
        prep = _Prepared(self, method, url, json=json, content=content, headers=headers,
                         params=params, key=key, route=route)
        loop = operation(self.policy, prep.key, prep.status_url is not None)
        queries = 0
        reply: Any = None
        try:
            while True:
                action = loop.send(reply)
                if isinstance(action, Send):
                    reply = self._send(prep, action)
                elif isinstance(action, Ask):
                    queries += 1
                    reply = self._ask(prep, action.timeout)
                else:
                    assert isinstance(action, Sleep)
                    time.sleep(action.seconds)
                    reply = None
        except StopIteration as stop:
            return self._finish(stop.value, prep, queries)

    def _send(self, prep: _Prepared, action: Send) -> Attempt:
        try:
            answer = self._http.request(
                prep.method, prep.url, content=prep.body, params=prep.params,
                headers=prep.attempt_headers(self.key_header),
                timeout=httpx.Timeout(action.timeout),
            )
        except (httpx.InvalidURL, httpx.UnsupportedProtocol) as exc:
            raise InvalidRequest(f"{prep.method} {prep.url}: {exc}", key=prep.key) from exc
        except httpx.TransportError as exc:
            result = transport_failure(exc)
        else:
            result = classify(answer)
        log.info("attempt %d key=%s result=%s", action.attempt, prep.key, type(result).__name__)
        return result

    def _ask(self, prep: _Prepared, timeout: float) -> KeyState:
        url, params, headers = prep.status_request()
        try:
            answer = self._http.get(url, params=params, headers=headers,
                                    timeout=httpx.Timeout(timeout))
        except httpx.TransportError as exc:
            return QueryFailed(f"{type(exc).__name__}: {exc}")
        state = read_status(prep.key, answer)
        log.info("status query key=%s state=%s", prep.key, type(state).__name__)
        return state

    def post(self, url: str, **kw: Any) -> Response:
        return self.request("POST", url, **kw)

    def put(self, url: str, **kw: Any) -> Response:
        return self.request("PUT", url, **kw)

    def patch(self, url: str, **kw: Any) -> Response:
        return self.request("PATCH", url, **kw)

    def delete(self, url: str, **kw: Any) -> Response:
        return self.request("DELETE", url, **kw)


class AsyncClient(_Base):
    """The asyncio client: the same policy and table as :class:`Client`."""

    def __init__(
        self,
        *,
        status_url: Optional[str] = None,
        route: Optional[str] = None,
        policy: Optional[RetryPolicy] = None,
        key_header: str = "Idempotency-Key",
        headers: HeadersIn = None,
        raise_problems: bool = True,
        http_client: Optional[httpx.AsyncClient] = None,
    ) -> None:
        super().__init__(status_url=status_url, route=route, policy=policy,
                         key_header=key_header, headers=headers, raise_problems=raise_problems)
        self._own = http_client is None
        self._http = http_client if http_client is not None else httpx.AsyncClient(
            follow_redirects=False
        )

    async def aclose(self) -> None:
        if self._own:
            await self._http.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def request(
        self,
        method: str,
        url: str,
        *,
        json: Any = None,
        content: Optional[Union[bytes, str]] = None,
        headers: HeadersIn = None,
        params: Optional[Mapping[str, str]] = None,
        key: Optional[str] = None,
        route: Optional[str] = None,
    ) -> Response:
        """As :meth:`Client.request`."""
        prep = _Prepared(self, method, url, json=json, content=content, headers=headers,
                         params=params, key=key, route=route)
        loop = operation(self.policy, prep.key, prep.status_url is not None)
        queries = 0
        reply: Any = None
        try:
            while True:
                action = loop.send(reply)
                if isinstance(action, Send):
                    reply = await self._send(prep, action)
                elif isinstance(action, Ask):
                    queries += 1
                    reply = await self._ask(prep, action.timeout)
                else:
                    assert isinstance(action, Sleep)
                    await asyncio.sleep(action.seconds)
                    reply = None
        except StopIteration as stop:
            return self._finish(stop.value, prep, queries)

    async def _send(self, prep: _Prepared, action: Send) -> Attempt:
        try:
            answer = await self._http.request(
                prep.method, prep.url, content=prep.body, params=prep.params,
                headers=prep.attempt_headers(self.key_header),
                timeout=httpx.Timeout(action.timeout),
            )
        except (httpx.InvalidURL, httpx.UnsupportedProtocol) as exc:
            raise InvalidRequest(f"{prep.method} {prep.url}: {exc}", key=prep.key) from exc
        except httpx.TransportError as exc:
            result = transport_failure(exc)
        else:
            result = classify(answer)
        log.info("attempt %d key=%s result=%s", action.attempt, prep.key, type(result).__name__)
        return result

    async def _ask(self, prep: _Prepared, timeout: float) -> KeyState:
        url, params, headers = prep.status_request()
        try:
            answer = await self._http.get(url, params=params, headers=headers,
                                          timeout=httpx.Timeout(timeout))
        except httpx.TransportError as exc:
            return QueryFailed(f"{type(exc).__name__}: {exc}")
        state = read_status(prep.key, answer)
        log.info("status query key=%s state=%s", prep.key, type(state).__name__)
        return state

    async def post(self, url: str, **kw: Any) -> Response:
        return await self.request("POST", url, **kw)

    async def put(self, url: str, **kw: Any) -> Response:
        return await self.request("PUT", url, **kw)

    async def patch(self, url: str, **kw: Any) -> Response:
        return await self.request("PATCH", url, **kw)

    async def delete(self, url: str, **kw: Any) -> Response:
        return await self.request("DELETE", url, **kw)
