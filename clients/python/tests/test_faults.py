"""The client against the real gateway, through the fault proxy: every fault ends in one
execution and the first answer. Each scenario also runs a naive client (a fresh key per
retry, no status query) to show what the fault does without the client's half of the
contract."""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import List, Optional, Tuple

import httpx
import pytest

from harness import API_KEY, FaultProxy, Gateway, Requests, Upstream
from idem_client import AsyncClient, Client, Response, RetryPolicy


def policy(attempt_timeout: float) -> RetryPolicy:
    return RetryPolicy(
        max_attempts=5,
        initial_backoff=0.02,
        max_backoff=0.2,
        attempt_timeout=attempt_timeout,
        deadline=20,
    )


def no_keepalive() -> httpx.Limits:
    # A new connection per request, so the proxy's plan meets each attempt.
    return httpx.Limits(max_keepalive_connections=0)


def sync_client(proxy: FaultProxy, attempt_timeout: float = 5) -> Tuple[Client, Requests]:
    seen = Requests()
    http = httpx.Client(limits=no_keepalive(), event_hooks={"request": [seen.hook]})
    client = Client(
        status_url=f"{proxy.url}/idem/status",
        route="charge",
        headers={"x-api-key": API_KEY},
        policy=policy(attempt_timeout),
        http_client=http,
    )
    return client, seen


def async_client(proxy: FaultProxy, attempt_timeout: float = 5) -> Tuple[AsyncClient, Requests]:
    seen = Requests()
    http = httpx.AsyncClient(limits=no_keepalive(), event_hooks={"request": [seen.ahook]})
    client = AsyncClient(
        status_url=f"{proxy.url}/idem/status",
        route="charge",
        headers={"x-api-key": API_KEY},
        policy=policy(attempt_timeout),
        http_client=http,
    )
    return client, seen


def naive_post(url: str, tries: int, timeout: float) -> Optional[httpx.Response]:
    """The naive client: a fresh key on every try, blind resends, no status query."""
    for _ in range(tries):
        try:
            with httpx.Client(limits=no_keepalive(), timeout=timeout) as http:
                return http.post(
                    url,
                    json={"amount": 100},
                    headers={"idempotency-key": str(uuid.uuid4()), "x-api-key": API_KEY},
                )
        except httpx.TransportError:
            continue
    return None


def assert_first_answer(r: Response, up: Upstream, path: str) -> None:
    assert r.status_code == 201, r
    assert r.json()["path"] == path
    assert up.count(path) == 1, f"exactly one execution of {path}"
    assert r.content == up.first_answer(path), "the answer of that one execution"


# --- (a) the answer is lost after the upstream acted ------------------------------------


def test_answer_lost_sync(gateway: Gateway, upstream: Upstream, proxies: List[FaultProxy],
                          path: str) -> None:
    proxy = FaultProxy(gateway.addr, ("drop-after-answer",))
    proxies.append(proxy)
    client, seen = sync_client(proxy)
    with client:
        r = client.post(proxy.url + path, json={"amount": 100})
    assert_first_answer(r, upstream, path)
    assert r.from_status and r.replayed, "the stored answer, fetched from the status endpoint"
    assert r.attempts == 1 and seen.count("POST") == 1, "nothing sent again"
    assert seen.count("GET") == 1 and r.status_queries == 1
    assert proxy.applied() == ["drop-after-answer"]


@pytest.mark.asyncio
async def test_answer_lost_async(gateway: Gateway, upstream: Upstream,
                                 proxies: List[FaultProxy], path: str) -> None:
    proxy = FaultProxy(gateway.addr, ("drop-after-answer",))
    proxies.append(proxy)
    client, seen = async_client(proxy)
    async with client:
        r = await client.post(proxy.url + path, json={"amount": 100}, key=f"a-{uuid.uuid4()}")
    assert_first_answer(r, upstream, path)
    assert r.from_status and r.replayed
    assert r.attempts == 1 and seen.count("POST") == 1
    assert r.key.startswith("a-"), "the caller's key"


def test_answer_lost_naive_runs_twice(gateway: Gateway, upstream: Upstream,
                                      proxies: List[FaultProxy], path: str) -> None:
    proxy = FaultProxy(gateway.addr, ("drop-after-answer",))
    proxies.append(proxy)
    r = naive_post(proxy.url + path, tries=3, timeout=5)
    assert r is not None and r.status_code == 201
    assert r.json()["n"] == 2, "the answer the naive client got is a second execution's"
    assert upstream.count(path) == 2, "the naive client charged twice"


def test_every_answer_lost_still_ends_with_the_answer(gateway: Gateway, upstream: Upstream,
                                                      proxies: List[FaultProxy],
                                                      path: str) -> None:
    proxy = FaultProxy(gateway.addr, ("drop-after-answer",) * 5)
    proxies.append(proxy)
    client, seen = sync_client(proxy)
    with client:
        r = client.post(proxy.url + path, json={"amount": 100})
    assert_first_answer(r, upstream, path)
    assert r.from_status and seen.count("POST") == 1


def test_every_answer_lost_blind_same_key_ends_without_it(gateway: Gateway,
                                                          upstream: Upstream,
                                                          proxies: List[FaultProxy],
                                                          path: str) -> None:
    # Keeping the key but resending blind (no status query) is safe from double execution,
    # yet when the answers keep getting lost it never learns the charge ran.
    proxy = FaultProxy(gateway.addr, ("drop-after-answer",) * 5)
    proxies.append(proxy)
    key = str(uuid.uuid4())
    got = None
    for _ in range(5):
        try:
            with httpx.Client(limits=no_keepalive(), timeout=5) as http:
                got = http.post(proxy.url + path, json={"amount": 100},
                                headers={"idempotency-key": key, "x-api-key": API_KEY})
                break
        except httpx.TransportError:
            continue
    assert got is None, "no answer reached the blind client"
    assert upstream.count(path) == 1, "yet the charge ran"


# --- (b) a reset before the request reached the gateway ---------------------------------


def test_reset_before_sending_sync(gateway: Gateway, upstream: Upstream,
                                   proxies: List[FaultProxy], path: str) -> None:
    proxy = FaultProxy(gateway.addr, ("reset-before-sending",))
    proxies.append(proxy)
    client, seen = sync_client(proxy)
    with client:
        r = client.post(proxy.url + path, json={"amount": 100})
    assert_first_answer(r, upstream, path)
    # The reset came after the request was written, so the client could not tell: it asked,
    # heard "absent", and sent again with the same key.
    assert r.status_queries == 1 and seen.count("GET") == 1
    assert r.attempts == 2 and not r.from_status and not r.replayed
    assert r.json()["key"] == r.key, "the second attempt carried the operation's key"
    assert proxy.applied() == ["reset-before-sending", "pass"]


@pytest.mark.asyncio
async def test_reset_before_sending_async(gateway: Gateway, upstream: Upstream,
                                          proxies: List[FaultProxy], path: str) -> None:
    proxy = FaultProxy(gateway.addr, ("reset-before-sending",))
    proxies.append(proxy)
    client, seen = async_client(proxy)
    async with client:
        r = await client.post(proxy.url + path, json={"amount": 100})
    assert_first_answer(r, upstream, path)
    assert r.status_queries == 1 and r.attempts == 2


def test_reset_before_sending_naive(gateway: Gateway, upstream: Upstream,
                                    proxies: List[FaultProxy], path: str) -> None:
    # Nothing reached the gateway, so even a blind resend with a fresh key runs once: this
    # fault alone cannot make the naive client double-execute (as docs/client.md says).
    proxy = FaultProxy(gateway.addr, ("reset-before-sending",))
    proxies.append(proxy)
    r = naive_post(proxy.url + path, tries=3, timeout=5)
    assert r is not None and r.status_code == 201
    assert upstream.count(path) == 1
    assert proxy.applied() == ["reset-before-sending", "pass"]


# --- (c) a request held past the client's per-attempt timeout ---------------------------

HOLD_MS = 1500
ATTEMPT_TIMEOUT = 0.4


def test_held_request_sync(gateway: Gateway, upstream: Upstream, proxies: List[FaultProxy],
                           path: str) -> None:
    proxy = FaultProxy(gateway.addr, (f"delay {HOLD_MS}",))
    proxies.append(proxy)
    client, seen = sync_client(proxy, attempt_timeout=ATTEMPT_TIMEOUT)
    with client:
        r = client.post(proxy.url + path, json={"amount": 100})
    # The client did not resend blind: it asked the status endpoint first. The held request
    # had not reached the gateway yet ("absent"), so the same key went again.
    assert seen.count("GET") >= 1 and r.status_queries >= 1, "a status query was made"
    assert r.attempts == 2 and seen.count("POST") == 2
    assert proxy.settled(), "the held request reached the gateway"
    assert_first_answer(r, upstream, path)  # the late copy was answered from the record


@pytest.mark.asyncio
async def test_held_request_async(gateway: Gateway, upstream: Upstream,
                                  proxies: List[FaultProxy], path: str) -> None:
    proxy = FaultProxy(gateway.addr, (f"delay {HOLD_MS}",))
    proxies.append(proxy)
    client, seen = async_client(proxy, attempt_timeout=ATTEMPT_TIMEOUT)
    async with client:
        r = await client.post(proxy.url + path, json={"amount": 100})
    assert r.status_queries >= 1 and seen.count("GET") >= 1
    assert await asyncio.get_running_loop().run_in_executor(None, proxy.settled)
    assert_first_answer(r, upstream, path)


def test_held_request_naive_runs_twice(gateway: Gateway, upstream: Upstream,
                                       proxies: List[FaultProxy], path: str) -> None:
    proxy = FaultProxy(gateway.addr, (f"delay {HOLD_MS}",))
    proxies.append(proxy)
    r = naive_post(proxy.url + path, tries=3, timeout=ATTEMPT_TIMEOUT)
    assert r is not None and r.status_code == 201
    assert proxy.settled(), "the held request reached the gateway"
    assert upstream.count(path) == 2, "the held request ran too, under its own key"


def test_slow_upstream_is_asked_about_not_resent(gateway: Gateway, upstream: Upstream,
                                                 proxies: List[FaultProxy], path: str) -> None:
    # The request reached the gateway but the answer is slower than the attempt timeout:
    # the status query finds it processing, then completed; exactly one POST is sent.
    proxy = FaultProxy(gateway.addr)
    proxies.append(proxy)
    client, seen = sync_client(proxy, attempt_timeout=0.3)
    with client:
        r = client.post(proxy.url + path, params={"delay_ms": "1200"}, json={"amount": 1})
    assert_first_answer(r, upstream, path)
    assert r.from_status and r.attempts == 1 and seen.count("POST") == 1
    assert r.status_queries >= 2, "processing, then completed"


def test_slow_upstream_naive_runs_twice(gateway: Gateway, upstream: Upstream,
                                        proxies: List[FaultProxy], path: str) -> None:
    proxy = FaultProxy(gateway.addr)
    proxies.append(proxy)
    r = naive_post(proxy.url + path + "?delay_ms=1200", tries=2, timeout=0.3)
    assert r is None, "every try timed out"
    deadline = 50
    while upstream.count(path) < 2 and deadline:
        threading.Event().wait(0.1)
        deadline -= 1
    assert upstream.count(path) == 2, "each blind resend with a fresh key ran again"


# --- (d) concurrent duplicates: one key, N callers at once ------------------------------

N = 5


def test_concurrent_duplicates_sync(gateway: Gateway, upstream: Upstream,
                                    proxies: List[FaultProxy], path: str) -> None:
    proxy = FaultProxy(gateway.addr)
    proxies.append(proxy)
    client, seen = sync_client(proxy)
    key = f"dup-{uuid.uuid4()}"
    results: List[Response] = []
    errors: List[BaseException] = []
    lock = threading.Lock()

    def call() -> None:
        try:
            r = client.post(proxy.url + path, params={"delay_ms": "800"},
                            json={"amount": 100}, key=key)
            with lock:
                results.append(r)
        except BaseException as e:  # reported below
            with lock:
                errors.append(e)

    threads = [threading.Thread(target=call) for _ in range(N)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    client.close()
    assert not errors, errors
    assert len(results) == N
    assert upstream.count(path) == 1, "one execution for one key"
    assert {r.content for r in results} == {upstream.first_answer(path)}, "one answer for all"
    assert sum(not r.replayed for r in results) == 1, "one ran, the others were replayed"
    assert sum(r.attempts for r in results) > N, "duplicates were refused in flight, then retried"


@pytest.mark.asyncio
async def test_concurrent_duplicates_async(gateway: Gateway, upstream: Upstream,
                                           proxies: List[FaultProxy], path: str) -> None:
    proxy = FaultProxy(gateway.addr)
    proxies.append(proxy)
    client, seen = async_client(proxy)
    key = f"dup-{uuid.uuid4()}"
    async with client:
        results = await asyncio.gather(*(
            client.post(proxy.url + path, params={"delay_ms": "800"}, json={"amount": 100},
                        key=key)
            for _ in range(N)
        ))
    assert upstream.count(path) == 1
    assert {r.content for r in results} == {upstream.first_answer(path)}
    assert sum(not r.replayed for r in results) == 1


def test_concurrent_duplicates_naive_runs_n_times(gateway: Gateway, upstream: Upstream,
                                                  proxies: List[FaultProxy], path: str) -> None:
    proxy = FaultProxy(gateway.addr)
    proxies.append(proxy)
    answers: List[Optional[httpx.Response]] = []
    lock = threading.Lock()

    def call() -> None:
        r = naive_post(proxy.url + path + "?delay_ms=800", tries=1, timeout=5)
        with lock:
            answers.append(r)

    threads = [threading.Thread(target=call) for _ in range(N)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert all(r is not None and r.status_code == 201 for r in answers)
    assert upstream.count(path) == N, "a key per request: every duplicate ran"
