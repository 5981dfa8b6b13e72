// The client against the real gateway (`idem serve`, memory store) through the TCP fault
// proxy, beside a naive client (a fresh key per attempt, no status query) in the same
// scenarios: the naive one runs the operation twice, the idem client once.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { IdemClient } from "../dist/index.js";
import { naivePost, startGateway, startProxy, startUpstream } from "./harness.mjs";

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

/** A fresh proxy (so no pooled connection of an earlier scenario skips its faults). */
async function proxy(...faults) {
  const p = await startProxy(gateway.url);
  proxies.push(p);
  await p.plan(...faults);
  return p;
}

/** A client asking the gateway's status endpoint, recording its events. */
function client(options = {}) {
  const events = [];
  const c = new IdemClient({
    statusUrl: gateway.statusUrl,
    route: "charge",
    deadlineMs: 15_000,
    attemptTimeoutMs: 5_000,
    initialBackoffMs: 20,
    onEvent: (e) => events.push(e),
    ...options,
  });
  return { c, events, statuses: () => events.filter((e) => e.type === "status").map((e) => e.state) };
}

/** The faults the proxy applied, leaving out connections it passed untouched. */
async function faultsHit(p) {
  return (await p.applied()).filter((f) => f !== "pass");
}

let opSeq = 0;
const newOp = (name) => `${name}-${process.pid}-${++opSeq}`;

describe("(a) answer lost after the upstream acted (drop-after-answer)", () => {
  test("idem client: one execution, the first answer, fetched by the status query", async () => {
    const p = await proxy("drop-after-answer");
    const { c, statuses } = client();
    const op = newOp("a");
    const res = await c.post(`${p.url}/charge`, { json: { op, amount: 100 }, key: op });
    assert.deepEqual(await faultsHit(p), ["drop-after-answer"], "the fault hit the first attempt");
    assert.equal(res.status, 201);
    assert.equal(res.key, op);
    assert.equal(res.attempts, 1, "nothing was sent again");
    assert.equal(res.fromStatus, true);
    assert.equal(res.replayed, true);
    assert.deepEqual(statuses(), ["completed"]);
    assert.equal(upstream.executions(op), 1);
    assert.deepEqual(res.json(), upstream.firstAnswer(op), "the answer of the one execution");
  });

  test("naive client: runs twice", async () => {
    const p = await proxy("drop-after-answer");
    const op = newOp("a-naive");
    const res = await naivePost(`${p.url}/charge`, { op, amount: 100 });
    assert.equal(res.status, 201);
    assert.equal(res.attempts, 2);
    assert.equal(upstream.opExecutions(op), 2, "the charge ran twice");
    assert.notDeepEqual(res.body, upstream.firstAnswer(op), "and it ends with the second run's answer");
  });
});

describe("(b) reset before sending (reset-before-sending)", () => {
  test("idem client: status absent, sent again with the same key: one execution", async () => {
    const p = await proxy("reset-before-sending");
    const { c, statuses, events } = client();
    const op = newOp("b");
    const res = await c.post(`${p.url}/charge`, { json: { op, amount: 5 }, key: op });
    assert.deepEqual(await faultsHit(p), ["reset-before-sending"]);
    assert.equal(res.status, 201);
    assert.equal(res.attempts, 2);
    assert.equal(res.fromStatus, false);
    assert.equal(res.replayed, false);
    assert.deepEqual(statuses(), ["absent"], "it asked before resending");
    assert.match(events.find((e) => e.type === "attempt").result, /^ambiguous/);
    assert.equal(upstream.executions(op), 1);
    assert.equal(res.json().execution, 1);
  });

  test("naive client: one execution here, but only because nothing ran", async () => {
    const p = await proxy("reset-before-sending");
    const op = newOp("b-naive-lucky");
    const res = await naivePost(`${p.url}/charge`, { op, amount: 5 });
    assert.equal(res.attempts, 2);
    assert.equal(upstream.opExecutions(op), 1);
  });

  // A reset before sending looks exactly like a lost answer to a client: the naive rule
  // ("resend with a new key") is right here only by luck, and runs twice when the next
  // reset is a lost answer. The same plan for both clients:
  test("reset then a lost answer: idem client one execution, naive client two", async () => {
    const op = newOp("b-mixed");
    const p1 = await proxy("reset-before-sending", "drop-after-answer");
    const { c, statuses } = client();
    const res = await c.post(`${p1.url}/charge`, { json: { op, amount: 7 }, key: op });
    assert.deepEqual(await faultsHit(p1), ["reset-before-sending", "drop-after-answer"]);
    assert.deepEqual(statuses(), ["absent", "completed"]);
    assert.equal(res.attempts, 2);
    assert.equal(upstream.executions(op), 1);
    assert.deepEqual(res.json(), upstream.firstAnswer(op));

    const naiveOp = newOp("b-naive");
    const p2 = await proxy("reset-before-sending", "drop-after-answer");
    const naive = await naivePost(`${p2.url}/charge`, { op: naiveOp, amount: 7 });
    assert.equal(naive.attempts, 3);
    assert.equal(upstream.opExecutions(naiveOp), 2, "the naive client charged twice");
  });
});

describe("(c) a request held longer than the per-attempt timeout (delay)", () => {
  test("idem client: the status query, then the same key; the upstream sees one request", async () => {
    const p = await proxy("delay 1500");
    const { c, statuses, events } = client({ attemptTimeoutMs: 500 });
    const op = newOp("c");
    const res = await c.post(`${p.url}/charge`, { json: { op, amount: 9 }, key: op });
    assert.match(events.find((e) => e.type === "attempt").result, /ambiguous: timed out/);
    assert.deepEqual(statuses(), ["absent"], "a status GET after the timeout (the request is still held)");
    assert.deepEqual(
      events.filter((e) => e.type !== "wait").map((e) => `${e.type}:${e.type === "status" ? e.state : e.result.split(":")[0]}`),
      ["attempt:ambiguous", "status:absent", "attempt:final (HTTP 201)"],
      "asked before it sent again, with the same key",
    );
    assert.equal(res.status, 201);
    assert.equal(await p.settled(), true, "the held request reached the gateway");
    assert.equal(upstream.executions(op), 1, "the late request was answered from the record");
    assert.deepEqual(res.json(), upstream.firstAnswer(op));
  });

  test("idem client: held, then slow upstream: status says processing, then completed; nothing sent again", async () => {
    const p = await proxy("delay 300");
    const { c, statuses } = client({ attemptTimeoutMs: 1_000 });
    const op = newOp("c-slow");
    const res = await c.post(`${p.url}/charge`, { json: { op, amount: 9, delay_ms: 1_200 }, key: op });
    assert.equal(res.attempts, 1, "one POST: the status query, not a second send");
    assert.equal(res.fromStatus, true);
    assert.equal(res.replayed, true);
    assert.equal(statuses()[0], "processing");
    assert.equal(statuses().at(-1), "completed");
    assert.equal(upstream.executions(op), 1);
    assert.deepEqual(res.json(), upstream.firstAnswer(op));
  });

  test("naive client: runs twice", async () => {
    const p = await proxy("delay 1500");
    const op = newOp("c-naive");
    const res = await naivePost(`${p.url}/charge`, { op, amount: 9 }, { attemptTimeoutMs: 500 });
    assert.equal(res.status, 201);
    assert.equal(await p.settled(), true);
    assert.equal(upstream.opExecutions(op), 2, "the held request ran too, under its own key");
  });
});

describe("(d) concurrent duplicates", () => {
  test("idem client, same key twice at once: one execution, both get its answer", async () => {
    const { c, events } = client();
    const op = newOp("d");
    const call = () => c.post(`${gateway.url}/charge`, { json: { op, amount: 3, delay_ms: 400 }, key: op });
    const [r1, r2] = await Promise.all([call(), call()]);
    assert.equal(upstream.executions(op), 1);
    assert.deepEqual(r1.json(), r2.json());
    assert.deepEqual(r1.json(), upstream.firstAnswer(op));
    assert.deepEqual([r1.replayed, r2.replayed].sort(), [false, true], "the duplicate got the replay");
    assert.ok(
      events.some((e) => e.type === "attempt" && e.result.startsWith("in-flight")),
      "the duplicate was told 409 in-flight and waited",
    );
    const waits = events.filter((e) => e.type === "wait");
    assert.ok(waits.length >= 1 && waits.every((w) => w.ms >= 1_000), "at least the gateway's Retry-After: 1");
  });

  test("naive client, the same operation twice at once: runs twice", async () => {
    const op = newOp("d-naive");
    const call = () => naivePost(`${gateway.url}/charge`, { op, amount: 3, delay_ms: 400 });
    const [r1, r2] = await Promise.all([call(), call()]);
    assert.equal(r1.status, 201);
    assert.equal(r2.status, 201);
    assert.equal(upstream.opExecutions(op), 2);
  });
});
