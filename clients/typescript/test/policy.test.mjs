// The policy and the decision table without a server: a scripted fetch.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import * as idem from "../dist/index.js";
import {
  DEFAULT_POLICY,
  IdemClient,
  PROBLEM_BASE,
  PROBLEM_CLASSES,
  ProblemError,
  ResponseNotStoredError,
  StatusQueryError,
  backoffCap,
  keyHeaderValue,
  parseRetryAfter,
  waitMs,
} from "../dist/index.js";

const policy = (o = {}) => ({ ...DEFAULT_POLICY, ...o });

test("waits grow exponentially under the cap", () => {
  const p = policy({ initialBackoffMs: 100, maxBackoffMs: 1_000 });
  assert.equal(backoffCap(p, 0), 100);
  assert.equal(backoffCap(p, 2), 400);
  assert.equal(backoffCap(p, 4), 1_000);
  assert.equal(backoffCap(p, 200), 1_000);
  for (let n = 0; n < 10; n++) assert.ok(waitMs(p, n, undefined) <= backoffCap(p, n));
});

test("full jitter spreads the waits; none is exactly the cap", () => {
  const p = policy({ maxBackoffMs: 10_000 });
  const waits = new Set(Array.from({ length: 50 }, () => waitMs(p, 6, undefined)));
  assert.ok(waits.size > 10);
  assert.equal(waitMs(policy({ jitter: "none" }), 1, undefined), 200);
});

test("Retry-After raises the wait up to its cap", () => {
  const p = policy({ jitter: "none", maxRetryAfterMs: 3_000 });
  assert.equal(waitMs(p, 0, 2_000), 2_000);
  assert.equal(waitMs(p, 0, 60_000), 3_000);
  assert.equal(waitMs(p, 1, 0), 200);
  assert.equal(parseRetryAfter(" 2 "), 2_000);
  assert.equal(parseRetryAfter("Wed, 21 Oct 2015 07:28:00 GMT"), undefined);
  assert.equal(parseRetryAfter(null), undefined);
});

test("keys are sent bare or as an RFC 8941 string; bad keys are refused", () => {
  assert.equal(keyHeaderValue("order-42"), "order-42");
  assert.equal(keyHeaderValue("a,b"), '"a,b"');
  assert.equal(keyHeaderValue('say "hi"'), '"say \\"hi\\""');
  assert.equal(keyHeaderValue(" edge"), '" edge"');
  assert.equal(keyHeaderValue(""), undefined);
  assert.equal(keyHeaderValue("é"), undefined);
  assert.equal(keyHeaderValue("x".repeat(256)), undefined);
});

test("one error class per idem-wire problem slug, each exported", () => {
  assert.equal(PROBLEM_CLASSES.length, 45);
  const slugs = new Set(PROBLEM_CLASSES.map((c) => c.slug));
  assert.equal(slugs.size, 45);
  for (const cls of PROBLEM_CLASSES) {
    const e = new cls("m", { key: "k" });
    assert.ok(e instanceof ProblemError);
    assert.equal(e.type, PROBLEM_BASE + cls.slug);
    assert.equal(e.status, cls.defaultStatus);
    assert.equal(e.name, cls.name);
    assert.equal(idem[cls.name], cls, `${cls.name} is exported`);
    assert.ok(cls.name.endsWith("Error") && cls.title.length > 0);
  }
  assert.equal(idem.KeyReusedError.defaultStatus, 422);
  assert.equal(idem.OutcomeUnknownError.defaultStatus, 409);
  assert.equal(idem.InFlightError.slug, "in-flight");
});

test("the error classes are the problem types of the OpenAPI description", () => {
  // docs/openapi.json is generated from idem-wire's table (a gateway test keeps it current).
  const spec = JSON.parse(
    readFileSync(new URL("../../../docs/openapi.json", import.meta.url), "utf8"),
  );
  const problems = spec.components.schemas.Problem["x-idem-problems"];
  assert.equal(problems.length, PROBLEM_CLASSES.length);
  const bySlug = new Map(PROBLEM_CLASSES.map((c) => [c.slug, c]));
  for (const p of problems) {
    const cls = bySlug.get(p.slug);
    assert.ok(cls, `no class for ${p.slug}`);
    assert.equal(PROBLEM_BASE + cls.slug, p.type);
    assert.equal(cls.defaultStatus, p.status, p.slug);
    assert.equal(cls.title, p.title, p.slug);
  }
});

/** A fetch that answers from a script, recording every request. */
function scripted(script) {
  const seen = [];
  const fetch = async (url, init) => {
    const u = new URL(url);
    seen.push({ method: init.method, url: u, headers: new Headers(init.headers) });
    const next = script.shift();
    if (next === undefined) throw new Error("script ended");
    if (next instanceof Error) throw next;
    return next;
  };
  return { fetch, seen };
}

const problem = (status, slug, extra = {}, headers = {}) =>
  new Response(JSON.stringify({ type: PROBLEM_BASE + slug, title: slug, status, ...extra }), {
    status,
    headers: { "content-type": "application/problem+json", ...headers },
  });

const reset = () => Object.assign(new TypeError("fetch failed"), { cause: Object.assign(new Error("other side closed"), { code: "ECONNRESET" }) });

function make(script, options = {}) {
  const s = scripted(script);
  const c = new IdemClient({ statusUrl: "http://gw.test/idem/status", fetch: s.fetch, initialBackoffMs: 1, jitter: "none", ...options });
  return { c, seen: s.seen };
}

test("4xx and 500 of the service are final answers: returned, never retried", async () => {
  for (const status of [400, 401, 403, 404, 422, 500]) {
    const { c, seen } = make([new Response("no", { status })]);
    const res = await c.post("http://gw.test/charge", { body: "x" });
    assert.equal(res.status, status);
    assert.equal(res.attempts, 1);
    assert.equal(seen.length, 1);
  }
});

test("429 and 409 in-flight retried with the same key, X-Request-ID and body", async () => {
  const { c, seen } = make([
    new Response("slow down", { status: 429 }),
    problem(409, "in-flight", {}, { "retry-after": "0" }),
    new Response("{}", { status: 201 }),
  ]);
  const res = await c.put("http://gw.test/orders/1", { json: { a: 1 } });
  assert.equal(res.status, 201);
  assert.equal(res.attempts, 3);
  assert.equal(seen.length, 3);
  const keys = new Set(seen.map((s) => s.headers.get("idempotency-key")));
  assert.deepEqual([...keys], [res.key]);
  assert.equal(new Set(seen.map((s) => s.headers.get("x-request-id"))).size, 1);
  assert.ok(seen.every((s) => s.method === "PUT" && s.headers.get("content-type") === "application/json"));
  assert.equal(new Set(seen.map((s) => s.headers.get("traceparent").split("-")[1])).size, 1, "one trace");
  assert.equal(new Set(seen.map((s) => s.headers.get("traceparent"))).size, 3, "a span per attempt");
});

test("status query: sent with the call's headers minus the body's, route, answer=1; unavailable then completed", async () => {
  const { c, seen } = make(
    [
      reset(),
      new Response("busy", { status: 503 }),
      new Response("{\"id\":1}", { status: 201, headers: { "idempotent-replayed": "true" } }),
    ],
    { route: "charge", headers: { "x-api-key": "alice" } },
  );
  const res = await c.patch("http://gw.test/charge", { json: { a: 1 }, key: "order/42" });
  assert.equal(res.fromStatus, true);
  assert.equal(res.replayed, true);
  assert.equal(res.attempts, 1);
  const q = seen[1];
  assert.equal(q.method, "GET");
  assert.equal(q.url.pathname, "/idem/status/order%2F42");
  assert.equal(q.url.searchParams.get("answer"), "1");
  assert.equal(q.url.searchParams.get("route"), "charge");
  assert.equal(q.headers.get("x-api-key"), "alice");
  assert.equal(q.headers.get("content-type"), null);
  assert.equal(q.headers.get("idempotency-key"), null);
  assert.equal(seen.length, 3);
});

test("status answers that are not a status of this key are errors, not 'absent'", async () => {
  const cases = [
    new Response("<h1>Not Found</h1>", { status: 404 }),
    new Response(JSON.stringify({ key: "another", state: "absent" }), { status: 404 }),
    new Response(JSON.stringify({ key: "k1" }), { status: 200 }),
    problem(401, "unauthenticated"),
  ];
  for (const answer of cases) {
    const { c, seen } = make([reset(), answer]);
    await assert.rejects(c.post("http://gw.test/charge", { key: "k1" }), StatusQueryError);
    assert.equal(seen.length, 2, "nothing resent");
  }
  const { c } = make([reset(), problem(409, "response-not-stored", { key: "k1" })]);
  await assert.rejects(c.post("http://gw.test/charge", { key: "k1" }), ResponseNotStoredError);
});

test("502 and 504 are ambiguous: asked about, and absent means resend with the same key", async () => {
  const { c, seen } = make([
    new Response("bad gateway", { status: 502 }),
    new Response(JSON.stringify({ key: "k2", state: "absent" }), { status: 404 }),
    new Response("ok", { status: 200 }),
  ]);
  const res = await c.delete("http://gw.test/orders/2", { key: "k2" });
  assert.equal(res.status, 200);
  assert.equal(res.attempts, 2);
  assert.deepEqual(seen.map((s) => s.method), ["DELETE", "GET", "DELETE"]);
});

test("an idem problem thrown as its class; a plain problem+json of the service is returned", async () => {
  const { c } = make([problem(400, "key-malformed", { detail: "bad" })]);
  await assert.rejects(c.post("http://gw.test/charge", {}), (e) => e instanceof idem.KeyMalformedError && e.detail === "bad" && e.attempts === 1);
  const svc = new Response(JSON.stringify({ type: "https://example.com/out-of-stock" }), {
    status: 409,
    headers: { "content-type": "application/problem+json" },
  });
  const { c: c2 } = make([svc]);
  const res = await c2.post("http://gw.test/charge", {});
  assert.equal(res.status, 409);
});

test("the caller's key header is the operation's key; two different keys are refused", async () => {
  const { c, seen } = make([new Response("", { status: 201 })]);
  const res = await c.post("http://gw.test/charge", { headers: { "Idempotency-Key": "from-header" } });
  assert.equal(res.key, "from-header");
  assert.equal(seen[0].headers.get("idempotency-key"), "from-header");
  const { c: c2 } = make([]);
  await assert.rejects(c2.post("http://gw.test/charge", { key: "a", headers: { "Idempotency-Key": "b" } }), idem.InvalidRequestError);
});

test("an aborted operation stops at once with AbortedError naming the key", async () => {
  const controller = new AbortController();
  const never = async (_url, init) =>
    new Promise((_, reject) => init.signal.addEventListener("abort", () => reject(init.signal.reason)));
  const c = new IdemClient({ fetch: never });
  const pending = c.post("http://gw.test/charge", { key: "k-abort", signal: controller.signal });
  controller.abort();
  await assert.rejects(pending, (e) => e instanceof idem.AbortedError && e.key === "k-abort");
});

test("without a global crypto (Node 18), keys come from node:crypto", async () => {
  const { execFileSync } = await import("node:child_process");
  const script = `
    Object.defineProperty(globalThis, "crypto", { value: undefined, configurable: true });
    const { IdemClient } = await import(${JSON.stringify(new URL("../dist/index.js", import.meta.url).href)});
    const seen = [];
    const c = new IdemClient({ fetch: async (_u, init) => (seen.push(new Headers(init.headers)), new Response("", { status: 201 })) });
    const res = await c.post("http://gw.test/charge", { json: {} });
    console.log(JSON.stringify({ global: typeof globalThis.crypto, key: res.key, sent: seen[0].get("idempotency-key"), tp: seen[0].get("traceparent") }));
  `;
  const out = JSON.parse(execFileSync(process.execPath, ["--input-type=module", "-e", script], { encoding: "utf8" }));
  assert.equal(out.global, "undefined");
  assert.match(out.key, /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
  assert.equal(out.sent, out.key);
  assert.match(out.tp, /^00-[0-9a-f]{32}-[0-9a-f]{16}-01$/);
});
