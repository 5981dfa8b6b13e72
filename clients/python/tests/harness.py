"""The real processes the tests run against: a counting upstream (http.server), the idem
gateway (`idem serve`) and the fault proxy (`idem-fault-proxy`), each stopped on teardown."""

from __future__ import annotations

import json
import os
import queue
import socket
import struct
import subprocess
import threading
import time
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import DefaultDict, Dict, List, Optional, Tuple
from urllib.parse import parse_qs, urlsplit

IDEM_BIN = os.environ.get("IDEM_BIN", "/var/tmp/idem-bins/idem")
IDEM_FAULT_PROXY_BIN = os.environ.get(
    "IDEM_FAULT_PROXY_BIN", "/var/tmp/idem-bins/idem-fault-proxy"
)
API_KEY = "alice-api-key"


class Upstream:
    """Counts executions per path and per idempotency key; answers 201 with JSON naming the
    path, the key and the execution's number. `?delay_ms=N` holds the answer; a path ending
    in `/reset` resets the connection without answering (after counting)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_path: DefaultDict[str, int] = defaultdict(int)
        self.by_key: DefaultDict[str, int] = defaultdict(int)
        self.answers: DefaultDict[str, List[bytes]] = defaultdict(list)
        self.total = 0
        up = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                self.rfile.read(length)
                parts = urlsplit(self.path)
                key = self.headers.get("idempotency-key", "")
                with up.lock:
                    up.total += 1
                    up.by_path[parts.path] += 1
                    up.by_key[key] += 1
                    n = up.by_path[parts.path]
                delay = parse_qs(parts.query).get("delay_ms")
                if delay:
                    time.sleep(int(delay[0]) / 1000)
                if parts.path.endswith("/reset"):
                    self.connection.setsockopt(
                        socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                    )
                    self.close_connection = True
                    self.connection.close()
                    return
                body = json.dumps(
                    {"path": parts.path, "key": key, "n": n, "total": up.total}
                ).encode()
                with up.lock:
                    up.answers[parts.path].append(body)
                self.send_response(201)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_PUT = do_POST
            do_PATCH = do_POST
            do_DELETE = do_POST

            def finish(self) -> None:
                try:
                    super().finish()
                except OSError:
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}"

    def count(self, path: str) -> int:
        with self.lock:
            return self.by_path[path]

    def first_answer(self, path: str) -> bytes:
        with self.lock:
            return self.answers[path][0]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class _Lines:
    """A child process's stdout, read on a thread so reads can time out."""

    def __init__(self, proc: "subprocess.Popen[str]") -> None:
        self.q: "queue.Queue[Optional[str]]" = queue.Queue()
        assert proc.stdout is not None
        out = proc.stdout

        def pump() -> None:
            for line in out:
                self.q.put(line.rstrip("\n"))
            self.q.put(None)

        threading.Thread(target=pump, daemon=True).start()

    def next(self, timeout: float, what: str) -> str:
        try:
            line = self.q.get(timeout=timeout)
        except queue.Empty:
            raise RuntimeError(f"timed out waiting for {what}") from None
        if line is None:
            raise RuntimeError(f"process exited while waiting for {what}")
        return line


def _child_env() -> Dict[str, str]:
    # `idem` reads IDEM_* variables as configuration (and refuses unknown fields), so the
    # test's own IDEM_BIN / IDEM_FAULT_PROXY_BIN must not reach it.
    return {k: v for k, v in os.environ.items() if not k.startswith("IDEM_")}


def _stop(proc: "subprocess.Popen[str]") -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


class Gateway:
    """`idem serve` with a memory store, the status endpoint at /idem/status and one
    protected route `charge` (`POST /charge/*`, principal from `x-api-key`)."""

    def __init__(self, upstream: str, workdir: Path) -> None:
        config = workdir / "idem.toml"
        config.write_text(
            f'''listen = "127.0.0.1:0"
upstream = "{upstream}"
store = "memory:"

[log]
level = "warn"

[status]
path = "/idem/status"

[defaults]
principal = {{ from = "header", header = "x-api-key" }}

[[routes]]
name = "charge"
method = ["POST", "PUT", "PATCH", "DELETE"]
path = "/charge/*"
'''
        )
        self.stderr = open(workdir / "idem.stderr", "w")
        self.proc = subprocess.Popen(
            [IDEM_BIN, "serve", "--config", str(config)],
            stdout=subprocess.PIPE, stderr=self.stderr, text=True, env=_child_env(),
        )
        self.log = workdir / "idem.stderr"
        try:
            lines = _Lines(self.proc)
            while True:
                line = lines.next(20, "the gateway's listening line")
                if line.startswith("idem listening on http://"):
                    self.addr = line.rsplit("http://", 1)[1].strip()
                    break
        except RuntimeError as exc:
            self.stop()
            raise RuntimeError(f"{exc}; its stderr:\n{self.log.read_text()[-2000:]}") from None
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        _stop(self.proc)
        self.stderr.close()


class FaultProxy:
    """`idem-fault-proxy --target GATEWAY --posts`: faults apply to POST connections, in
    turn; other requests (the status GETs) pass."""

    def __init__(self, target: str, faults: Tuple[str, ...] = ()) -> None:
        self.proc = subprocess.Popen(
            [IDEM_FAULT_PROXY_BIN, "--target", target, "--posts"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
            env=_child_env(),
        )
        try:
            self.lines = _Lines(self.proc)
            line = self.lines.next(10, "the proxy's listening line")
            if not line.startswith("listening on "):
                raise RuntimeError(f"unexpected proxy output: {line!r}")
            self.addr = line[len("listening on "):].strip()
            for fault in faults:
                self.push(fault)
        except BaseException:
            self.stop()
            raise

    def _command(self, command: str, timeout: float = 15) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.lines.next(timeout, f"the answer to `{command}`")

    def push(self, fault: str) -> None:
        answer = self._command(fault)
        if answer != "ok":
            raise RuntimeError(f"proxy refused `{fault}`: {answer}")

    def applied(self) -> List[str]:
        answer = self._command("applied")
        rest = answer[len("applied:"):].strip()
        return [f for f in rest.split(",") if f]

    def settled(self) -> bool:
        return self._command("settled") == "settled"

    @property
    def url(self) -> str:
        return f"http://{self.addr}"

    def stop(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            _stop(self.proc)


class Requests:
    """Counts the requests an httpx client sent, by method (an event hook)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: Dict[str, int] = defaultdict(int)

    def count(self, method: str) -> int:
        with self.lock:
            return self.seen[method]

    def hook(self, request: object) -> None:
        with self.lock:
            self.seen[getattr(request, "method")] += 1

    async def ahook(self, request: object) -> None:
        self.hook(request)
