#!/usr/bin/env python3
"""Server time of a claim script, built up step by step, on a private redis-server.

    crates/idem-redis/bench/script-cost.py [requests]      (default 100000 per round)

Each variant adds one piece of what the real claim script does on a fresh key, so the
difference between two rows is the server time of that piece: an empty script, one SET of a
300-byte value, a GET before it, reading TIME, four numbers turned into text (and, beside it,
the same texts cut from TIME's digits with no number formatting), building the
record by concatenation and answering a table, and finally the real claim script (prelude,
single-operation texts and claim.lua, as the store loads them). A raw SET of the same value is
the baseline. Times are `INFO commandstats` usec_per_call (server CPU per call, whatever the
client does), three rounds each, with `redis-benchmark -c 16` on fresh random keys.
"""
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

REQUESTS = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
LUA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src", "lua")

VALUE = "x" * 300
FP, OWNER = "f" * 68, "a" * 32
TAIL = "0000000040\n" + "m" * 40 + "r" * 200
READ_TIME = (
    "local v = redis.call('GET', KEYS[1]); local t = redis.call('TIME'); "
    "local us = tonumber(t[1]) * 1000000 + tonumber(t[2]); "
)
TEXTS = (
    "local ms = math.floor(us / 1000); local a = string.format('%020.0f', us); "
    "local b = tostring(ms + 45000); local c = tostring(ms); local d = tostring(ms + 86400000); "
)

# The same four texts without formatting a number: the fence and the millisecond time cut
# from TIME's own digits, and the two deadlines kept as that time plus an offset the client
# sends as text (as a record format with offsets would store them).
TEXTS_FROM_TIME = (
    "local u6 = string.sub('00000' .. t[2], -6); local a = '0000' .. t[1] .. u6; "
    "local c = t[1] .. string.sub(u6, 1, 3); local b = c .. ' 0000045000'; "
    "local d = c .. ' 0086400000'; "
)


def real_claim():
    parts = [open(os.path.join(LUA, f)).read() for f in ("prelude.lua", "text_single.lua", "claim.lua")]
    parts.append("return claim(KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6])\n")
    return "".join(parts)


VARIANTS = [
    ("empty script", "return 1", []),
    ("+ one SET", "return redis.call('SET', KEYS[1], ARGV[1], 'PX', 60000)", [VALUE]),
    ("+ GET first", "local v = redis.call('GET', KEYS[1]); "
     "return redis.call('SET', KEYS[1], ARGV[1], 'PX', 60000)", [VALUE]),
    ("+ TIME", READ_TIME + "return redis.call('SET', KEYS[1], ARGV[1], 'PX', 60000)", [VALUE]),
    ("+ four numbers as text", READ_TIME + TEXTS
     + "return redis.call('SET', KEYS[1], ARGV[1], 'PX', 60000)", [VALUE]),
    ("+ four numbers as text, cut from TIME's digits instead", READ_TIME + TEXTS_FROM_TIME
     + "return redis.call('SET', KEYS[1], ARGV[1], 'PX', 60000)", [VALUE]),
    ("+ record by concatenation, table reply", READ_TIME + TEXTS
     + "redis.call('SET', KEYS[1], '1 p ' .. ARGV[2] .. ' ' .. a .. ' ' .. ARGV[3] .. ' ' .. b"
     " .. ' ' .. c .. ' ' .. d .. ' 0000000000000 ' .. ARGV[4], 'PX', 60000); "
     "return {3, us, ms, 0}", [VALUE, OWNER, FP, TAIL]),
    ("real claim script", real_claim(), [FP, OWNER, "45000", "86400000", "0", TAIL]),
]


def main():
    for tool in ("redis-server", "redis-cli", "redis-benchmark"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} missing")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    work = tempfile.mkdtemp()
    subprocess.run(["redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "",
                    "--appendonly", "no", "--daemonize", "yes", "--dir", work,
                    "--pidfile", os.path.join(work, "pid"), "--logfile", os.path.join(work, "log")],
                   check=True)

    def cli(*args):
        return subprocess.run(["redis-cli", "-p", port, *args], capture_output=True,
                              text=True).stdout.strip()

    def per_call(command, *bench_args):
        cli("FLUSHALL")
        cli("CONFIG", "RESETSTAT")
        subprocess.run(["redis-benchmark", "-p", port, "-c", "16", "-n", str(REQUESTS),
                        "-r", "100000000", "-q", *bench_args], capture_output=True, check=True)
        stats = cli("INFO", "commandstats")
        m = re.search(rf"cmdstat_{command}:calls=\d+,usec=\d+,usec_per_call=([\d.]+)", stats)
        return float(m.group(1)) if m else float("nan")

    try:
        for _ in range(50):
            if cli("PING") == "PONG":
                break
            time.sleep(0.1)
        print("| step | server µs per call (3 rounds) |")
        print("|---|---|")
        raw = [per_call("set", "SET", "k:__rand_int__", VALUE, "PX", "60000") for _ in range(3)]
        print(f"| raw SET (baseline) | {' / '.join(f'{x:.2f}' for x in raw)} |")
        for name, src, args in VARIANTS:
            sha = cli("SCRIPT", "LOAD", src)
            if not re.fullmatch(r"[0-9a-f]{40}", sha):
                sys.exit(f"{name}: SCRIPT LOAD failed: {sha}")
            t = [per_call("evalsha", "EVALSHA", sha, "1", "k:__rand_int__", *args) for _ in range(3)]
            print(f"| {name} | {' / '.join(f'{x:.2f}' for x in t)} |")
    finally:
        cli("SHUTDOWN", "NOSAVE")
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
