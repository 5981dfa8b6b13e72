// Typed errors against the real gateway: what idem refuses, what the client gives up on.

import assert from "node:assert/strict";
import { createServer } from "node:http";
import { after, before, test } from "node:test";

import {
  AmbiguousError,
  AttemptsExhaustedError,
  DeadlineExceededError,
  IdemClient,
  IdemError,
  InFlightError,
  InvalidRequestError,
  KeyReusedError,
  OutcomeUnknownError,
  ProblemError,
  StatusQueryError,
} from "../dist/index.js";
import { startGateway, startProxy, startUpstream } from "./harness.mjs";

let upstream;
let gateway;
const proxies = [];

before(async () => {
  upstream = await startUpstream();
  gateway = await startGateway(upstream.url);
});

after(async () => {
  await Promise.all(proxies.splice(0).map((p) => p.stop()));
  await gateway?.stop();
  await upstream?.stop();
});

let seq = 0;
const newKey = (name) => `${name}-${process.pid}-${++seq}`;

function client(options = {}) {
  const events = [];
  const c = new IdemClient({
    statusUrl: gateway.statusUrl,
    route: "charge",
    deadlineMs: 10_000,
    attemptTimeoutMs: 5_000,
    initialBackoffMs: 10,
    onEvent: (e) => events.push(e),
    ...options,
  });
  return { c, events };
}

test("a key reused with another body: KeyReusedError (422), not retried, nothing ran again", async () => {
  const { c } = client();
  const key = newKey("reused");
  const first = await c.post(`${gateway.url}/charge`, { json: { amount: 1 }, key });
  assert.equal(first.status, 201);
  const err = await c.post(`${gateway.url}/charge`, { json: { amount: 2 }, key }).then(
    () => assert.fail("a reused key must be refused"),
    (e) => e,
  );
  assert.ok(err instanceof KeyReusedError);
  assert.ok(err instanceof ProblemError);
  assert.ok(err instanceof IdemError);
  assert.equal(err.name, "KeyReusedError");
  assert.equal(err.status, 422);
  assert.equal(err.type, "https://idem.dev/problems/key-reused");
  assert.equal(err.slug, "key-reused");
  assert.equal(err.key, key);
  assert.equal(err.attempts, 1, "a 422 is never retried");
  assert.match(err.detail, /different request/);
  assert.equal(err.response.status, 422);
  assert.equal(upstream.executions(key), 1);
});

test("a replayed answer is returned with replayed = true and the key", async () => {
  const { c } = client();
  const key = newKey("replay");
  const a = await c.post(`${gateway.url}/charge`, { json: { amount: 1 }, key });
  const b = await c.post(`${gateway.url}/charge`, { json: { amount: 1 }, key });
  assert.equal(a.replayed, false);
  assert.equal(b.replayed, true);
  assert.equal(b.key, key);
  assert.deepEqual(b.json(), a.json());
  assert.equal(upstream.executions(key), 1);
});

test("upstream past the route's timeout: 504, status unknown → OutcomeUnknownError; a resend gets 409 outcome-unknown → the same", async () => {
  const { c, events } = client({ route: "slow" });
  const key = newKey("unknown");
  const err = await c.post(`${gateway.url}/slow`, { json: { delay_ms: 1_000 }, key }).then(
    () => assert.fail("the outcome is unknown"),
    (e) => e,
  );
  assert.ok(err instanceof OutcomeUnknownError, String(err));
  assert.equal(err.status, 409);
  assert.equal(err.type, "https://idem.dev/problems/outcome-unknown");
  assert.equal(err.key, key);
  assert.deepEqual(
    events.filter((e) => e.type === "status").map((e) => e.state),
    ["unknown"],
  );
  assert.ok(events[0].result.includes("HTTP 504"), events[0].result);

  const blind = new IdemClient({ initialBackoffMs: 10 });
  const again = await blind.post(`${gateway.url}/slow`, { json: { delay_ms: 1_000 }, key }).then(
    () => assert.fail("the outcome is unknown"),
    (e) => e,
  );
  assert.ok(again instanceof OutcomeUnknownError);
  assert.equal(again.response.status, 409);
  assert.equal(again.problem.key, key);
  assert.equal(upstream.executions(key), 1, "the upstream ran once and never again");
});

test("an ambiguous failure without a status endpoint: AmbiguousError, nothing resent", async () => {
  const p = await startProxy(gateway.url);
  proxies.push(p);
  await p.plan("drop-after-answer");
  const c = new IdemClient({ initialBackoffMs: 10 });
  const key = newKey("ambiguous");
  const err = await c.post(`${p.url}/charge`, { json: { amount: 4 }, key }).then(
    () => assert.fail("the client cannot tell"),
    (e) => e,
  );
  assert.ok(err instanceof AmbiguousError, String(err));
  assert.equal(err.key, key);
  assert.equal(err.attempts, 1);
  assert.equal(upstream.executions(key), 1);
});

test("a status endpoint that is not one (a 404 page): StatusQueryError, not 'absent'", async () => {
  const p = await startProxy(gateway.url);
  proxies.push(p);
  await p.plan("drop-after-answer");
  const { c } = client({ statusUrl: `${gateway.url}/not-the-status-path` });
  const key = newKey("wrong-status");
  const err = await c.post(`${p.url}/charge`, { json: { amount: 4 }, key }).then(
    () => assert.fail("a wrong status URL must not read as absent"),
    (e) => e,
  );
  assert.ok(err instanceof StatusQueryError, String(err));
  assert.equal(err.status, 404);
  assert.equal(err.key, key);
  assert.equal(upstream.executions(key), 1, "not sent again");
});

test("the upstream's own 503 releases the key: retried with the same key", async () => {
  const { c, events } = client();
  const key = newKey("503");
  const res = await c.post(`${gateway.url}/charge`, { json: { fail_first: true }, key });
  assert.equal(res.status, 201);
  assert.equal(res.attempts, 2);
  assert.match(events[0].result, /^unavailable \(HTTP 503\)/);
  assert.equal(upstream.executions(key), 2, "the first run answered 503 (not done), the second ran");
});

test("409 in-flight longer than the deadline allows: DeadlineExceededError naming the key", async () => {
  const { c } = client();
  const key = newKey("in-flight");
  const slow = c.post(`${gateway.url}/charge`, { json: { delay_ms: 1_500 }, key });
  await new Promise((r) => setTimeout(r, 200));
  const { c: hasty } = client({ deadlineMs: 600 });
  const err = await hasty.post(`${gateway.url}/charge`, { json: { delay_ms: 1_500 }, key }).then(
    () => assert.fail("the deadline is shorter than Retry-After"),
    (e) => e,
  );
  assert.ok(err instanceof DeadlineExceededError, String(err));
  assert.equal(err.key, key);
  assert.equal(err.deadlineMs, 600);
  assert.ok(err.cause instanceof InFlightError, "the last failure is the gateway's 409 in-flight");
  assert.equal((await slow).status, 201);
  assert.equal(upstream.executions(key), 1);
});

test("connection refused: retried (nothing was sent), then AttemptsExhaustedError", async () => {
  const server = createServer();
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  const { port } = server.address();
  await new Promise((r) => server.close(r));
  const { c, events } = client({ maxAttempts: 3 });
  const err = await c.post(`http://127.0.0.1:${port}/charge`, { json: {}, key: newKey("refused") }).then(
    () => assert.fail("nothing listens there"),
    (e) => e,
  );
  assert.ok(err instanceof AttemptsExhaustedError, String(err));
  assert.equal(err.attempts, 3);
  assert.equal(events.filter((e) => e.type === "status").length, 0, "no status query: nothing was sent");
  assert.ok(events.filter((e) => e.type === "attempt").every((e) => e.result.includes("ECONNREFUSED")));
});

test("a key that is not printable ASCII: InvalidRequestError, nothing sent", async () => {
  let sent = 0;
  const c = new IdemClient({ fetch: async () => (sent++, new Response("")) });
  for (const key of ["", "clé", "x".repeat(256), "tab\there"]) {
    await assert.rejects(c.post(`${gateway.url}/charge`, { json: {}, key }), InvalidRequestError);
  }
  assert.equal(sent, 0);
});
