"""Typed errors and the other methods, against the real gateway (no faults)."""

from __future__ import annotations

import uuid
from typing import List

import pytest

from harness import API_KEY, FaultProxy, Gateway, Upstream
from idem_client import AsyncClient, Client, KeyReused, OutcomeUnknown, RetryPolicy, \
    Unauthenticated


def make(gateway: Gateway) -> Client:
    return Client(status_url=f"http://{gateway.addr}/idem/status", route="charge",
                  headers={"x-api-key": API_KEY},
                  policy=RetryPolicy(initial_backoff=0.02, attempt_timeout=5, deadline=20))


def test_a_retry_replays_and_a_changed_body_is_key_reused(gateway: Gateway,
                                                          upstream: Upstream,
                                                          path: str) -> None:
    url = f"http://{gateway.addr}{path}"
    key = f"order-{uuid.uuid4()}"
    with make(gateway) as client:
        first = client.post(url, json={"amount": 100}, key=key)
        again = client.post(url, json={"amount": 100}, key=key)
        with pytest.raises(KeyReused) as info:
            client.post(url, json={"amount": 200}, key=key)
    assert first.status_code == 201 and not first.replayed and first.key == key
    assert again.replayed and again.content == first.content
    err = info.value
    assert (err.status, err.key, err.type) == (422, key, "https://idem.dev/problems/key-reused")
    assert "different request" in err.detail
    assert upstream.count(path) == 1


def test_missing_credential_is_unauthenticated(gateway: Gateway, path: str) -> None:
    with Client() as client, pytest.raises(Unauthenticated) as info:
        client.post(f"http://{gateway.addr}{path}", json={})
    assert info.value.status == 401


def test_upstream_reset_leaves_the_key_unknown(gateway: Gateway, upstream: Upstream,
                                               proxies: List[FaultProxy], path: str) -> None:
    # The upstream drops the connection after it acted: the gateway answers 502 and holds the
    # key unknown; the client asks, hears "unknown", and stops with a typed error.
    proxy = FaultProxy(gateway.addr)
    proxies.append(proxy)
    reset = f"{path}/reset"
    with Client(status_url=f"{proxy.url}/idem/status", route="charge",
                headers={"x-api-key": API_KEY},
                policy=RetryPolicy(initial_backoff=0.02, deadline=20)) as client:
        with pytest.raises(OutcomeUnknown) as info:
            client.post(proxy.url + reset, json={"amount": 1}, key=f"u-{uuid.uuid4()}")
    assert info.value.key is not None and info.value.key.startswith("u-")
    assert upstream.count(reset) == 1, "not run again"


@pytest.mark.asyncio
async def test_put_patch_delete_run_once(gateway: Gateway, upstream: Upstream,
                                         path: str) -> None:
    url = f"http://{gateway.addr}{path}"
    async with AsyncClient(status_url=f"http://{gateway.addr}/idem/status", route="charge",
                           headers={"x-api-key": API_KEY}) as client:
        for method in ("put", "patch", "delete"):
            key = f"{method}-{uuid.uuid4()}"
            first = await getattr(client, method)(url, json={"m": method}, key=key)
            again = await client.request(method.upper(), url, json={"m": method}, key=key)
            assert first.status_code == 201 and not first.replayed
            assert again.replayed and again.content == first.content
    assert upstream.count(path) == 3, "one execution per method's key"
