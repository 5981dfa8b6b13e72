// Test harness: a counting upstream, the real `idem serve`, and the TCP fault proxy, each
// started by the test and killed when it ends (and, as a last resort, when the process exits).

import { spawn } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";

export const IDEM_BIN = process.env.IDEM_BIN ?? "/var/tmp/idem-bins/idem";
export const IDEM_FAULT_PROXY_BIN = process.env.IDEM_FAULT_PROXY_BIN ?? "/var/tmp/idem-bins/idem-fault-proxy";

const children = new Set();
const killAll = () => {
  for (const child of children) child.kill("SIGKILL");
};
process.on("exit", killAll);
for (const signal of ["SIGINT", "SIGTERM"]) {
  process.once(signal, () => {
    killAll();
    process.exit(130);
  });
}

/** Spawns `bin`, resolving with the child once a stdout line matches `ready` (its match). */
function spawnReady(bin, args, ready, what) {
  // `idem` reads every IDEM_* variable as configuration (IDEM_BIN would be an unknown field):
  // the children get the environment without them.
  const env = Object.fromEntries(Object.entries(process.env).filter(([name]) => !name.startsWith("IDEM_")));
  const child = spawn(bin, args, { stdio: ["pipe", "pipe", "pipe"], env });
  children.add(child);
  child.on("exit", () => children.delete(child));
  let stderr = "";
  child.stderr.on("data", (d) => {
    stderr = (stderr + d.toString()).slice(-4000);
  });
  const lines = createInterface({ input: child.stdout });
  const waiting = [];
  const queued = [];
  let started = false;
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill("SIGKILL");
      reject(new Error(`${what} did not start within 10 s; stderr:\n${stderr}`));
    }, 10_000);
    child.on("error", (e) => {
      clearTimeout(timer);
      reject(new Error(`${what}: cannot run ${bin}: ${e.message}`));
    });
    child.on("exit", (code, signal) => {
      if (!started) {
        clearTimeout(timer);
        reject(new Error(`${what} exited (${code ?? signal}) before it was ready; stderr:\n${stderr}`));
      }
      for (const w of waiting.splice(0)) w.reject(new Error(`${what} exited; stderr:\n${stderr}`));
    });
    lines.on("line", (line) => {
      if (!started) {
        const m = ready.exec(line);
        if (m) {
          started = true;
          clearTimeout(timer);
          resolve({
            child,
            match: m,
            /** The next stdout line. */
            nextLine: () =>
              queued.length > 0
                ? Promise.resolve(queued.shift())
                : new Promise((res, rej) => waiting.push({ resolve: res, reject: rej })),
            stop: () => stop(child),
            stderr: () => stderr,
          });
        }
        return;
      }
      const w = waiting.shift();
      if (w) w.resolve(line);
      else queued.push(line);
    });
  });
}

/** Kills `child` (SIGTERM, then SIGKILL after 2 s) and waits for it to exit. */
function stop(child) {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => {
    const hard = setTimeout(() => child.kill("SIGKILL"), 2_000);
    child.once("exit", () => {
      clearTimeout(hard);
      resolve();
    });
    child.kill("SIGTERM");
  });
}

/**
 * The protected service: counts executions per `Idempotency-Key` and per `op` (a body field
 * naming the logical operation, so a client that changes keys is still caught), answers 201
 * with the execution's number. Body fields: `delay_ms` holds the answer, `fail_first` answers
 * 503 to a key's first execution.
 */
export async function startUpstream() {
  const byKey = new Map();
  const byOp = new Map();
  const firstAnswer = new Map();
  let seq = 0;
  const server = createServer((req, res) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => {
      let body = {};
      try {
        body = JSON.parse(Buffer.concat(chunks).toString() || "{}");
      } catch {
        body = {};
      }
      const key = req.headers["idempotency-key"] ?? "";
      const op = typeof body.op === "string" ? body.op : key;
      const n = (byKey.get(key) ?? 0) + 1;
      byKey.set(key, n);
      byOp.set(op, (byOp.get(op) ?? 0) + 1);
      seq += 1;
      const answer = { op, key, execution: byOp.get(op), id: `ch_${String(seq).padStart(6, "0")}` };
      if (!firstAnswer.has(op)) firstAnswer.set(op, answer);
      const send = () => {
        if (res.destroyed) return;
        if (body.fail_first === true && n === 1) {
          res.writeHead(503, { "content-type": "application/json", "retry-after": "0" });
          res.end(JSON.stringify({ error: "try again" }));
          return;
        }
        res.writeHead(201, { "content-type": "application/json" });
        res.end(JSON.stringify(answer));
      };
      const delay = typeof body.delay_ms === "number" ? body.delay_ms : 0;
      if (delay > 0) setTimeout(send, delay);
      else send();
    });
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address();
  return {
    url: `http://127.0.0.1:${port}`,
    /** Executions of this key. */
    executions: (key) => byKey.get(key) ?? 0,
    /** Executions of this logical operation, whatever keys it came with. */
    opExecutions: (op) => byOp.get(op) ?? 0,
    /** The answer of the operation's first execution. */
    firstAnswer: (op) => firstAnswer.get(op),
    stop: () =>
      new Promise((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

/** `idem serve` with the memory store and the status endpoint, in front of `upstreamUrl`. */
export async function startGateway(upstreamUrl) {
  const dir = mkdtempSync(join(tmpdir(), "idem-ts-"));
  const config = join(dir, "idem.toml");
  writeFileSync(
    config,
    `listen = "127.0.0.1:0"
upstream = "${upstreamUrl}"
store = "memory:"

[defaults]
principal = { from = "none" }

[status]
path = "/idem/status"

[[routes]]
name = "charge"
method = "POST"
path = "/charge"

[[routes]]
name = "slow"
method = "POST"
path = "/slow"
timeout = "300ms"
`,
  );
  const proc = await spawnReady(IDEM_BIN, ["serve", "--config", config, "--log-level", "warn"], /idem listening on (http:\/\/\S+)/, "idem serve");
  const url = proc.match[1].replace(/\/$/, "");
  return {
    url,
    statusUrl: `${url}/idem/status`,
    stop: async () => {
      await proc.stop();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** The fault proxy in front of `targetUrl`, faulting POSTs only (status queries pass). */
export async function startProxy(targetUrl) {
  const target = new URL(targetUrl).host;
  const proc = await spawnReady(IDEM_FAULT_PROXY_BIN, ["--target", target, "--posts"], /listening on (\S+)/, "idem-fault-proxy");
  const command = async (line) => {
    proc.child.stdin.write(`${line}\n`);
    const answer = await proc.nextLine();
    if (answer.startsWith("error")) throw new Error(`fault proxy: ${line}: ${answer}`);
    return answer;
  };
  return {
    url: `http://${proc.match[1]}`,
    /** Appends faults to the plan (`drop-after-answer`, `reset-before-sending`, `delay MS`, `pass`). */
    plan: async (...faults) => {
      for (const f of faults) await command(f);
    },
    /** The faults applied so far. */
    applied: async () => {
      const a = await command("applied");
      const list = a.replace(/^applied:\s*/, "");
      return list === "" ? [] : list.split(",");
    },
    /** Waits until every delayed request reached the gateway. */
    settled: async () => (await command("settled")) === "settled",
    stop: async () => {
      proc.child.stdin.end();
      await proc.stop();
    },
  };
}

/**
 * The naive client the tests compare against: a fresh key on every attempt, a retry on any
 * network error or timeout, and no status query.
 */
export async function naivePost(url, json, { attempts = 3, attemptTimeoutMs = 10_000 } = {}) {
  let last;
  for (let i = 0; i < attempts; i++) {
    const controller = new AbortController();
    const timer = setTimeout(() => controller.abort(), attemptTimeoutMs);
    try {
      const res = await fetch(url, {
        method: "POST",
        headers: { "content-type": "application/json", "idempotency-key": crypto.randomUUID() },
        body: JSON.stringify(json),
        signal: controller.signal,
      });
      const body = await res.json();
      return { status: res.status, body, attempts: i + 1 };
    } catch (e) {
      last = e;
    } finally {
      clearTimeout(timer);
    }
  }
  throw new Error(`naive client gave up: ${last}`);
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
