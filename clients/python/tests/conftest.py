from __future__ import annotations

import uuid
from pathlib import Path
from typing import Iterator, List

import pytest

from harness import Gateway, Upstream, FaultProxy


@pytest.fixture(scope="session")
def upstream() -> Iterator[Upstream]:
    up = Upstream()
    try:
        yield up
    finally:
        up.stop()


@pytest.fixture(scope="session")
def gateway(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    gw = Gateway(upstream.url, tmp_path_factory.mktemp("gateway"))
    try:
        yield gw
    finally:
        gw.stop()


@pytest.fixture
def proxies(gateway: Gateway) -> Iterator[List[FaultProxy]]:
    """Start proxies with `proxies.append(FaultProxy(gateway.addr, ...))`; all are stopped."""
    started: List[FaultProxy] = []
    try:
        yield started
    finally:
        for p in started:
            p.stop()


@pytest.fixture
def path() -> str:
    """A fresh protected path, so counts of one test never meet another's."""
    return f"/charge/{uuid.uuid4().hex[:12]}"
