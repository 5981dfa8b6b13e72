"""The decision table, the policy and the error mapping, over scripted answers
(httpx.MockTransport): no process needed."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable, List, Union

import httpx
import pytest

import idem_client
from idem_client import (
    Ambiguous,
    AsyncClient,
    AttemptsExhausted,
    Client,
    DeadlineExceeded,
    IdemError,
    InvalidRequest,
    KeyMalformed,
    KeyReused,
    OutcomeUnknown,
    ProblemError,
    ResponseNotStored,
    RetryPolicy,
    StatusQueryError,
)

URL = "http://gw.test/charge/x"
STATUS = "http://gw.test/idem/status"
Script = List[Union[httpx.Response, Exception]]


def problem(status: int, slug: str, key: str = "k-1", **headers: str) -> httpx.Response:
    body = {"type": f"https://idem.dev/problems/{slug}", "title": slug, "status": status,
            "detail": f"{slug} detail", "key": key}
    return httpx.Response(status, headers={"content-type": "application/problem+json",
                                           **headers}, content=json.dumps(body).encode())


def state(key: str, name: str, status: int = 200, retry_after: str = "") -> httpx.Response:
    headers = {"retry-after": retry_after} if retry_after else {}
    return httpx.Response(status, headers=headers, json={"key": key, "state": name})


class Scripted:
    """Answers POSTs and status GETs from two scripts, recording every request."""

    def __init__(self, posts: Script, gets: Script = ()) -> None:  # type: ignore[assignment]
        self.posts = list(posts)
        self.gets = list(gets)
        self.requests: List[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        script = self.gets if request.method == "GET" else self.posts
        if not script:
            raise AssertionError(f"unexpected {request.method} {request.url}")
        step = script.pop(0)
        if isinstance(step, Exception):
            raise step
        return step

    def count(self, method: str) -> int:
        return sum(r.method == method for r in self.requests)


def fast(**kw: float) -> RetryPolicy:
    base = dict(max_attempts=5, initial_backoff=0.001, max_backoff=0.01, attempt_timeout=1.0,
                deadline=10.0)
    base.update(kw)
    return RetryPolicy(**base)  # type: ignore[arg-type]


def client(s: Scripted, status: bool = True, **kw: float) -> Client:
    return Client(status_url=STATUS if status else None, route="charge", policy=fast(**kw),
                  http_client=httpx.Client(transport=httpx.MockTransport(s)))


def test_one_key_on_every_attempt_and_503_429_retried() -> None:
    s = Scripted([httpx.Response(503), httpx.Response(429), httpx.ConnectError("refused"),
                  httpx.Response(201, json={"ok": True})])
    r = client(s).post(URL, json={"amount": 1})
    assert r.status_code == 201 and r.attempts == 4
    keys = {req.headers["idempotency-key"] for req in s.requests}
    assert keys == {r.key}, "one key per operation, reused on every retry"
    assert len({req.headers["x-request-id"] for req in s.requests}) == 1
    assert {req.content for req in s.requests} == {b'{"amount":1}'}
    assert s.count("GET") == 0, "nothing ambiguous, nothing asked"


def test_in_flight_honours_retry_after() -> None:
    s = Scripted([problem(409, "in-flight", **{"retry-after": "1"}), httpx.Response(201)])
    started = time.monotonic()
    r = client(s).post(URL, key="k-1")
    assert r.status_code == 201 and r.attempts == 2
    assert time.monotonic() - started >= 1.0, "waited at least Retry-After"


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422, 500])
def test_other_answers_are_final(status: int) -> None:
    s = Scripted([httpx.Response(status, json={"upstream": True})])
    r = client(s).post(URL)
    assert r.status_code == status and r.attempts == 1 and len(s.requests) == 1


def test_replayed_answer_is_final_whatever_its_status() -> None:
    s = Scripted([httpx.Response(503, headers={"idempotent-replayed": "true"})])
    r = client(s).post(URL)
    assert r.status_code == 503 and r.replayed and r.attempts == 1


@pytest.mark.parametrize("slug,status,cls", [
    ("key-reused", 422, KeyReused), ("key-malformed", 400, KeyMalformed),
])
def test_problems_raise_typed_errors_without_retry(slug: str, status: int,
                                                   cls: type) -> None:
    s = Scripted([problem(status, slug)])
    with pytest.raises(cls) as info:
        client(s).post(URL, key="k-1")
    err = info.value
    assert isinstance(err, ProblemError) and isinstance(err, IdemError)
    assert (err.status, err.type, err.detail, err.key) == (
        status, f"https://idem.dev/problems/{slug}", f"{slug} detail", "k-1")
    assert err.response is not None and err.response.status_code == status
    assert len(s.requests) == 1, "never retried"


def test_raise_problems_off_returns_the_answer() -> None:
    s = Scripted([problem(422, "key-reused")])
    c = Client(raise_problems=False, policy=fast(),
               http_client=httpx.Client(transport=httpx.MockTransport(s)))
    assert c.post(URL, key="k-1").status_code == 422


def test_outcome_unknown_answer_stops() -> None:
    s = Scripted([problem(409, "outcome-unknown")])
    with pytest.raises(OutcomeUnknown) as info:
        client(s).post(URL, key="k-1")
    assert info.value.key == "k-1" and len(s.requests) == 1


def test_ambiguous_failure_asks_then_returns_the_stored_answer() -> None:
    stored = httpx.Response(201, headers={"idempotent-replayed": "true"}, json={"n": 1})
    s = Scripted([httpx.ReadTimeout("slow")],
                 [state("k-1", "processing", retry_after="0"), stored])
    r = client(s).post(URL, key="k-1", headers={"x-api-key": "alice"})
    assert r.from_status and r.replayed and r.attempts == 1 and r.status_queries == 2
    q = [req for req in s.requests if req.method == "GET"][0]
    assert q.url.path == "/idem/status/k-1"
    assert dict(q.url.params) == {"answer": "1", "route": "charge"}
    assert q.headers["x-api-key"] == "alice", "the call's credential scopes the query"
    assert "idempotency-key" not in q.headers and "content-type" not in q.headers


def test_absent_resends_with_the_same_key() -> None:
    s = Scripted([httpx.RemoteProtocolError("reset"), httpx.Response(201)],
                 [httpx.Response(503), state("k/1", "absent", 404)])
    r = client(s).post(URL, key="k/1")
    assert r.attempts == 2 and r.status_queries == 2
    assert [req.url.raw_path for req in s.requests if req.method == "GET"][0] \
        == b"/idem/status/k%2F1?answer=1&route=charge", "the key is one path segment"


def test_502_and_504_are_ambiguous() -> None:
    for status in (502, 504):
        s = Scripted([httpx.Response(status)], [state("k-1", "unknown")])
        with pytest.raises(OutcomeUnknown):
            client(s).post(URL, key="k-1")
        assert s.count("POST") == 1


def test_without_status_endpoint_ambiguous_is_an_error() -> None:
    s = Scripted([httpx.ReadTimeout("slow")])
    with pytest.raises(Ambiguous) as info:
        client(s, status=False).post(URL, key="k-1")
    assert "timed out" in str(info.value) and s.count("POST") == 1


def test_a_status_answer_that_is_not_a_status_is_refused() -> None:
    for answer in (httpx.Response(404, text="<h1>not found</h1>"), httpx.Response(401),
                   state("other-key", "absent", 404)):
        s = Scripted([httpx.ReadTimeout("slow")], [answer])
        with pytest.raises(StatusQueryError):
            client(s).post(URL, key="k-1")
        assert s.count("POST") == 1, "never read as absent"


def test_response_not_stored() -> None:
    s = Scripted([httpx.ReadTimeout("slow")], [problem(409, "response-not-stored")])
    with pytest.raises(ResponseNotStored):
        client(s).post(URL, key="k-1")


def test_attempts_and_deadline_bound_the_operation() -> None:
    s = Scripted([httpx.Response(503)] * 3)
    with pytest.raises(AttemptsExhausted) as info:
        client(s, max_attempts=3).post(URL, key="k-1")
    assert info.value.attempts == 3 and info.value.key == "k-1" and info.value.status == 503
    s = Scripted([httpx.Response(429, headers={"retry-after": "20"})])
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded) as d:
        client(s, deadline=2.0).post(URL, key="k-1")
    assert time.monotonic() - started < 1.0, "a wait past the deadline is not started"
    assert d.value.attempts == 1


def test_keys_are_checked_before_sending_and_quoted_when_needed() -> None:
    s = Scripted([])
    for bad in ("", "x" * 256, "caf\u00e9", " lead", "tab\there"):
        with pytest.raises(InvalidRequest):
            client(s).post(URL, key=bad)
    assert s.requests == []
    s = Scripted([httpx.Response(201)])
    client(s).post(URL, key='a,b"c')
    assert s.requests[0].headers["idempotency-key"] == '"a,b\\"c"'
    s = Scripted([httpx.Response(201)])
    r = client(s).post(URL, headers={"Idempotency-Key": "from-header"})
    assert r.key == "from-header", "a key given as a header is the operation's key"


def test_full_jitter_stays_under_the_cap() -> None:
    p = RetryPolicy(initial_backoff=0.1, max_backoff=1.0)
    assert [p.backoff_cap(n) for n in (0, 2, 4, 50)] == [0.1, 0.4, 1.0, 1.0]
    waits = {p.wait(6) for _ in range(50)}
    assert all(0 <= w <= 1.0 for w in waits) and len(waits) > 10
    assert RetryPolicy(jitter=False, max_retry_after=3).wait(0, 60) == 3
    assert RetryPolicy(max_attempts=0).max_attempts == 1


def test_one_class_per_problem_type_of_the_openapi_description() -> None:
    # docs/openapi.json is generated from idem-wire's table (a gateway test keeps it current).
    spec = Path(__file__).resolve().parents[3] / "docs/openapi.json"
    problems = json.loads(spec.read_text())["components"]["schemas"]["Problem"]["x-idem-problems"]
    slugs = {p["slug"] for p in problems}
    assert len(slugs) == 45
    assert set(idem_client.PROBLEMS) == slugs
    for p in problems:
        cls = idem_client.PROBLEMS[p["slug"]]
        assert idem_client.problem_class(p["type"]) is cls
    for slug, cls in idem_client.PROBLEMS.items():
        assert idem_client.problem_class(f"https://idem.dev/problems/{slug}") is cls
        assert getattr(idem_client, cls.__name__) is cls
    assert idem_client.problem_class("https://example.com/problems/key-reused") is None


@pytest.mark.asyncio
async def test_async_client_follows_the_same_table() -> None:
    stored = httpx.Response(201, headers={"idempotent-replayed": "true"}, json={"n": 1})
    s = Scripted([httpx.Response(503), httpx.WriteError("reset")],
                 [state("k-1", "processing"), stored])
    c = AsyncClient(status_url=STATUS, policy=fast(),
                    http_client=httpx.AsyncClient(transport=httpx.MockTransport(s)))
    async with c:
        r = await c.put(URL, json={"a": 1}, key="k-1")
    assert r.from_status and r.attempts == 2 and r.status_queries == 2
    assert {req.method for req in s.requests} == {"PUT", "GET"}


def test_giving_up_on_in_flight_names_the_last_problem() -> None:
    s = Scripted([problem(409, "in-flight", **{"retry-after": "0"})] * 2)
    with pytest.raises(AttemptsExhausted) as info:
        client(s, max_attempts=2).post(URL, key="k-1")
    err = info.value
    assert isinstance(err, idem_client.GaveUp)
    assert isinstance(err.last_problem, idem_client.InFlight)
    assert err.type == "https://idem.dev/problems/in-flight" and err.status == 409
    assert "in-flight" in err.last


def test_outcome_unknown_keeps_the_gateway_detail() -> None:
    s = Scripted([problem(409, "outcome-unknown")])
    with pytest.raises(OutcomeUnknown) as info:
        client(s).post(URL, key="k-1")
    assert info.value.detail == "outcome-unknown detail" and info.value.problem["key"] == "k-1"


def test_a_url_that_cannot_be_sent_is_invalid_and_not_retried() -> None:
    for url in ("ftp://gw.test/charge", "http://[::1"):
        with Client(policy=fast()) as c, pytest.raises(InvalidRequest) as info:
            c.post(url, key="k-1")
        assert info.value.key == "k-1"
