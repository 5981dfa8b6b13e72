import {
  AbortedError,
  AmbiguousError,
  AttemptsExhaustedError,
  DeadlineExceededError,
  IdemError,
  InvalidRequestError,
  PROBLEM_BASE,
  ProblemError,
  StatusQueryError,
  type ProblemClass,
} from "./errors.js";
import { OutcomeUnknownError, PROBLEM_CLASSES, ResponseNotStoredError } from "./problems.js";
import { parseRetryAfter, resolvePolicy, waitMs, type RetryPolicy } from "./policy.js";
import { IdemResponse, isReplayed } from "./response.js";

/** A request body: bytes or text, sent whole on every attempt. */
export type Body = string | Uint8Array | ArrayBuffer;

/** Something that happened during an operation, for logs and tests. */
export type IdemEvent =
  | { type: "attempt"; key: string; attempt: number; result: string }
  | { type: "status"; key: string; attempt: number; state: KeyStateName; url: string }
  | { type: "wait"; key: string; ms: number; reason: string };

/** What a status query said: the gateway's states, and `unavailable` when the query itself failed. */
export type KeyStateName = "absent" | "processing" | "completed" | "unknown" | "unavailable";

/** Options of an {@link IdemClient}: the retry policy and where to ask about keys. */
export interface IdemClientOptions extends Partial<RetryPolicy> {
  /**
   * The gateway's status endpoint (`status.path` as a URL), e.g.
   * `http://127.0.0.1:8080/idem/status`. Without it an ambiguous failure ends the operation
   * with an {@link AmbiguousError}. It receives the calls' headers (their credentials scope
   * the key): point it at the gateway the calls go to, never at another host.
   */
  statusUrl?: string;
  /** The route the status query asks about (`?route=`) when a call names none. */
  route?: string;
  /** The key header. ["Idempotency-Key"] */
  keyHeader?: string;
  /** Headers sent on every request (and on status queries). */
  headers?: HeadersInit;
  /** The fetch used for every request. [globalThis.fetch] */
  fetch?: typeof fetch;
  /** Called for every attempt, status query and wait. */
  onEvent?: (event: IdemEvent) => void;
}

/** Options of one operation. */
export interface RequestOptions {
  /** A value sent as JSON (`content-type: application/json` unless a header says otherwise). */
  json?: unknown;
  /** A raw body; exclusive with `json`. */
  body?: Body;
  /** Headers of this call. */
  headers?: HeadersInit;
  /** The operation's idempotency key. [a random UUID, made once per operation] */
  key?: string;
  /** The route the status query asks about (`?route=`), overriding the client's. */
  route?: string;
  /** Ends the operation (an {@link AbortedError}) when aborted. */
  signal?: AbortSignal;
  /** This operation's deadline, overriding the client's. */
  deadlineMs?: number;
  /** This operation's per-attempt timeout, overriding the client's. */
  attemptTimeoutMs?: number;
}

interface Answer {
  status: number;
  statusText: string;
  headers: Headers;
  body: Uint8Array;
}

/** What one attempt came back with (idem-client's `Attempt`). */
type Attempt =
  | { kind: "not-sent"; why: string; cause: unknown }
  | { kind: "ambiguous"; why: string; cause?: unknown }
  | { kind: "retryable"; why: "in-flight" | "throttled" | "unavailable"; retryAfterMs: number | undefined; answer: Answer }
  | { kind: "outcome-unknown"; answer: Answer }
  | { kind: "final"; answer: Answer };

/** What the status endpoint said (idem-client's `KeyState`). */
type KeyState =
  | { state: "completed"; answer: Answer }
  | { state: "processing"; retryAfterMs: number | undefined }
  | { state: "absent" }
  | { state: "unknown" }
  | { state: "unavailable"; why: string };

/** Error codes (Node, undici) that mean the connection was never made: nothing was sent. */
const NOT_SENT_CODES = new Set([
  "ECONNREFUSED",
  "ENOTFOUND",
  "EAI_AGAIN",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "EADDRNOTAVAIL",
  "UND_ERR_CONNECT_TIMEOUT",
  "ERR_TLS_CERT_ALTNAME_INVALID",
  "CERT_HAS_EXPIRED",
  "DEPTH_ZERO_SELF_SIGNED_CERT",
  "SELF_SIGNED_CERT_IN_CHAIN",
  "UNABLE_TO_VERIFY_LEAF_SIGNATURE",
  "UNABLE_TO_GET_ISSUER_CERT_LOCALLY",
  "ERR_SSL_WRONG_VERSION_NUMBER",
]);

/** Headers that describe a body: not sent on a status query. */
const BODY_HEADERS = ["content-type", "content-length", "content-encoding", "transfer-encoding"];

const PROBLEMS: ReadonlyMap<string, ProblemClass> = new Map(PROBLEM_CLASSES.map((c) => [c.slug, c]));

const STANDARD_METHODS = new Set(["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]);

/**
 * The retrying client for services behind idem: one key per logical operation, reused on
 * every attempt; retries only where a retry is safe; and, when it cannot tell whether an
 * attempt ran, it asks the status endpoint instead of resending blind.
 *
 * ```ts
 * const client = new IdemClient({ statusUrl: "http://127.0.0.1:8080/idem/status" });
 * const res = await client.post("http://127.0.0.1:8080/charge", { json: { amount: 100 }, key: "order-42" });
 * ```
 */
export class IdemClient {
  /** The retry policy in force (defaults filled in). */
  readonly policy: Readonly<RetryPolicy>;
  readonly #statusUrl: URL | undefined;
  readonly #route: string | undefined;
  readonly #keyHeader: string;
  readonly #headers: Headers;
  readonly #fetch: typeof fetch;
  readonly #onEvent: ((event: IdemEvent) => void) | undefined;

  constructor(options: IdemClientOptions = {}) {
    const { statusUrl, route, keyHeader, headers, fetch: fetchImpl, onEvent, ...policy } = options;
    this.policy = Object.freeze(resolvePolicy(policy));
    if (statusUrl !== undefined) {
      let url: URL;
      try {
        url = new URL(statusUrl);
      } catch {
        throw new InvalidRequestError(`statusUrl \`${statusUrl}\` is not an absolute URL`);
      }
      if (url.protocol !== "http:" && url.protocol !== "https:") {
        throw new InvalidRequestError(`statusUrl \`${statusUrl}\`: the status endpoint must be an http(s) URL`);
      }
      this.#statusUrl = url;
    }
    this.#route = route;
    this.#keyHeader = keyHeader ?? "Idempotency-Key";
    this.#headers = new Headers(headers);
    const f = fetchImpl ?? globalThis.fetch;
    if (typeof f !== "function") {
      throw new InvalidRequestError("no fetch: pass `fetch` in the options (Node 18+ and browsers have one)");
    }
    this.#fetch = f;
    this.#onEvent = onEvent;
  }

  /** `POST url` as one operation. */
  post(url: string | URL, options?: RequestOptions): Promise<IdemResponse> {
    return this.request("POST", url, options);
  }

  /** `PUT url` as one operation. */
  put(url: string | URL, options?: RequestOptions): Promise<IdemResponse> {
    return this.request("PUT", url, options);
  }

  /** `PATCH url` as one operation. */
  patch(url: string | URL, options?: RequestOptions): Promise<IdemResponse> {
    return this.request("PATCH", url, options);
  }

  /** `DELETE url` as one operation. */
  delete(url: string | URL, options?: RequestOptions): Promise<IdemResponse> {
    return this.request("DELETE", url, options);
  }

  /**
   * Sends one operation: every attempt with the same key, the same body and the same
   * `X-Request-ID`, under the policy's attempts and deadline.
   *
   * Resolves with the final answer: the service's answer of any status, or a stored answer
   * replayed (`res.replayed`), possibly fetched from the status endpoint (`res.fromStatus`).
   * Rejects with a {@link ProblemError} subclass when idem itself refused the request
   * (e.g. `KeyReusedError`, `OutcomeUnknownError`), or with the client's own
   * {@link IdemError}s (`DeadlineExceededError`, `AttemptsExhaustedError`, `AmbiguousError`,
   * `StatusQueryError`, `InvalidRequestError`, `AbortedError`).
   */
  async request(method: string, url: string | URL, options: RequestOptions = {}): Promise<IdemResponse> {
    const call = this.#prepare(method, url, options, await randomSource());
    const policy = resolvePolicy({
      ...this.policy,
      ...(options.deadlineMs === undefined ? {} : { deadlineMs: options.deadlineMs }),
      ...(options.attemptTimeoutMs === undefined ? {} : { attemptTimeoutMs: options.attemptTimeoutMs }),
    });
    return this.#run(policy, call);
  }

  #prepare(method: string, url: string | URL, options: RequestOptions, rng: Random): Call {
    if (typeof method !== "string" || !/^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/.test(method)) {
      throw new InvalidRequestError(`\`${String(method)}\` is not an HTTP method`);
    }
    const upper = method.toUpperCase();
    const m = STANDARD_METHODS.has(upper) ? upper : method;
    let target: URL;
    try {
      target = new URL(url);
    } catch {
      throw new InvalidRequestError(`\`${String(url)}\` is not an absolute URL`);
    }
    const headers = new Headers(this.#headers);
    new Headers(options.headers).forEach((value, name) => headers.set(name, value));
    const headerKey = headers.get(this.#keyHeader) ?? undefined;
    headers.delete(this.#keyHeader);
    if (options.key !== undefined && headerKey !== undefined && unquote(headerKey) !== options.key) {
      throw new InvalidRequestError(`two keys for one call: \`${options.key}\` and the ${this.#keyHeader} header \`${headerKey}\``);
    }
    const key = options.key ?? (headerKey === undefined ? rng.randomUUID() : unquote(headerKey));
    const keyValue = keyHeaderValue(key);
    if (keyValue === undefined) {
      throw new InvalidRequestError(`the key must be 1–255 printable ASCII characters: ${JSON.stringify(key)}`, { key });
    }
    let body: Uint8Array<ArrayBuffer> | undefined;
    if (options.json !== undefined && options.body !== undefined) {
      throw new InvalidRequestError("give `json` or `body`, not both", { key });
    }
    if (options.json !== undefined) {
      const text = JSON.stringify(options.json);
      if (text === undefined) throw new InvalidRequestError("`json` cannot be serialised as JSON", { key });
      body = new TextEncoder().encode(text);
      if (!headers.has("content-type")) headers.set("content-type", "application/json");
    } else if (typeof options.body === "string") {
      body = new TextEncoder().encode(options.body);
    } else if (options.body instanceof ArrayBuffer) {
      body = new Uint8Array(options.body.slice(0));
    } else if (options.body !== undefined) {
      body = new Uint8Array(options.body);
    }
    const requestId = headers.get("x-request-id") ?? rng.randomUUID();
    headers.set("x-request-id", requestId);
    const traceId = headers.has("traceparent") ? undefined : randomHex(rng, 16);
    return {
      method: m,
      url: target,
      headers,
      keyValue,
      key,
      body,
      requestId,
      traceId,
      route: options.route ?? this.#route,
      signal: options.signal,
      rng,
    };
  }

  /** The loop of idem-client's `retry::run`, over the decide table. */
  async #run(policy: RetryPolicy, call: Call): Promise<IdemResponse> {
    const started = Date.now();
    const deadline = started + policy.deadlineMs;
    let attempts = 0;
    let waits = 0;
    let last = "none";
    let lastError: unknown;
    let ask = false;
    let wait: { retryAfterMs: number | undefined } | undefined;
    const gaveUp = (): DeadlineExceededError =>
      new DeadlineExceededError(
        `gave up on key \`${call.key}\` after ${attempts} attempt(s): the ${policy.deadlineMs} ms deadline passed (last: ${last})`,
        { key: call.key, attempts, deadlineMs: policy.deadlineMs, detail: last, cause: lastError },
      );
    for (;;) {
      this.#checkAbort(call, attempts);
      if (wait !== undefined) {
        const pause = waitMs(policy, waits, wait.retryAfterMs);
        waits += 1;
        wait = undefined;
        if (Date.now() + pause >= deadline) throw gaveUp();
        this.#emit({ type: "wait", key: call.key, ms: pause, reason: last });
        await sleep(pause, call.signal);
        this.#checkAbort(call, attempts);
      }
      const remaining = deadline - Date.now();
      if (remaining <= 0) throw gaveUp();
      const timeout = Math.min(policy.attemptTimeoutMs, remaining);
      if (ask) {
        if (this.#statusUrl === undefined) {
          throw new AmbiguousError(
            `cannot tell whether key \`${call.key}\` ran (${last}) and no statusUrl is configured to ask; resume with the same key`,
            { key: call.key, attempts, detail: last, cause: lastError },
          );
        }
        const url = this.#statusQueryUrl(call);
        const state = await this.#queryStatus(call, url, timeout, attempts);
        this.#checkAbort(call, attempts);
        this.#emit({ type: "status", key: call.key, attempt: attempts, state: state.state, url: url.href });
        switch (state.state) {
          case "completed":
            return this.#finish(call, state.answer, attempts, true);
          case "unknown":
            throw new OutcomeUnknownError(
              `the outcome of key \`${call.key}\` is unknown (status endpoint): nothing will run until an operator resolves it`,
              { key: call.key, attempts, detail: "the status endpoint says the key's outcome is unknown" },
            );
          case "absent":
            ask = false;
            break;
          case "processing":
            wait = { retryAfterMs: state.retryAfterMs };
            break;
          case "unavailable":
            last = `status query failed: ${state.why}`;
            wait = { retryAfterMs: undefined };
            break;
        }
        continue;
      }
      if (attempts >= policy.maxAttempts) {
        throw new AttemptsExhaustedError(
          `gave up on key \`${call.key}\` after ${attempts} attempt(s) (last: ${last})`,
          { key: call.key, attempts, detail: last, cause: lastError },
        );
      }
      attempts += 1;
      const attempt = await this.#send(call, timeout);
      this.#checkAbort(call, attempts);
      const label = attemptLabel(attempt);
      this.#emit({ type: "attempt", key: call.key, attempt: attempts, result: label });
      switch (attempt.kind) {
        case "final":
          return this.#finish(call, attempt.answer, attempts, false);
        case "outcome-unknown":
          throw this.#problem(call, attempt.answer, attempts) ?? new OutcomeUnknownError(`the outcome of key \`${call.key}\` is unknown`, { key: call.key, attempts });
        case "not-sent":
          last = label;
          lastError = attempt.cause;
          wait = { retryAfterMs: undefined };
          break;
        case "retryable":
          last = label;
          lastError = this.#problem(call, attempt.answer, attempts);
          wait = { retryAfterMs: attempt.retryAfterMs };
          break;
        case "ambiguous":
          last = label;
          lastError = attempt.cause;
          ask = true;
          break;
      }
    }
  }

  /** Sends the request once and classifies what came back (idem-client's `classify`). */
  async #send(call: Call, timeoutMs: number): Promise<Attempt> {
    const headers = new Headers(call.headers);
    headers.set(this.#keyHeader, call.keyValue);
    if (call.traceId !== undefined) {
      headers.set("traceparent", `00-${call.traceId}-${randomHex(call.rng, 8)}-01`);
    }
    const init: RequestInit = { method: call.method, headers, redirect: "manual" };
    if (call.body !== undefined) init.body = call.body;
    const got = await this.#fetchWhole(call.url, init, timeoutMs, call.signal);
    if ("failure" in got) {
      const { failure } = got;
      if (failure.phase === "connect" && failure.code !== undefined && NOT_SENT_CODES.has(failure.code)) {
        return { kind: "not-sent", why: failure.why, cause: failure.cause };
      }
      return { kind: "ambiguous", why: failure.why, cause: failure.cause };
    }
    const answer = got.answer;
    if (isReplayed(answer.headers)) return { kind: "final", answer };
    const retryAfterMs = parseRetryAfter(answer.headers.get("retry-after"));
    switch (answer.status) {
      case 409: {
        const slug = problemSlug(answer);
        if (slug === "in-flight") return { kind: "retryable", why: "in-flight", retryAfterMs, answer };
        if (slug === "outcome-unknown") return { kind: "outcome-unknown", answer };
        return { kind: "final", answer };
      }
      case 429:
        return { kind: "retryable", why: "throttled", retryAfterMs, answer };
      case 503:
        return { kind: "retryable", why: "unavailable", retryAfterMs, answer };
      case 502:
      case 504:
        return { kind: "ambiguous", why: `HTTP ${answer.status}` };
      default:
        return { kind: "final", answer };
    }
  }

  #statusQueryUrl(call: Call): URL {
    const base = this.#statusUrl;
    if (base === undefined) throw new Error("unreachable: no status endpoint");
    const url = new URL(base.href);
    url.pathname = `${url.pathname.replace(/\/+$/, "")}/${encodeURIComponent(call.key)}`;
    url.search = "";
    url.searchParams.set("answer", "1");
    if (call.route !== undefined) url.searchParams.set("route", call.route);
    return url;
  }

  /** Asks the status endpoint once (idem-client's `StatusEndpoint::query` and `read_state`). */
  async #queryStatus(call: Call, url: URL, timeoutMs: number, attempts: number): Promise<KeyState> {
    const headers = new Headers(call.headers);
    for (const h of BODY_HEADERS) headers.delete(h);
    const got = await this.#fetchWhole(url, { method: "GET", headers, redirect: "manual" }, timeoutMs, call.signal);
    if ("failure" in got) return { state: "unavailable", why: got.failure.why };
    const answer = got.answer;
    if (isReplayed(answer.headers)) return { state: "completed", answer };
    const refused = (detail: string): StatusQueryError =>
      new StatusQueryError(`the status endpoint ${url.origin}${url.pathname} did not answer a status of key \`${call.key}\`: ${detail}`, {
        key: call.key,
        attempts,
        status: answer.status,
        detail,
        response: this.#response(call, answer, attempts, true),
      });
    if ([429, 502, 503, 504].includes(answer.status)) {
      return { state: "unavailable", why: `HTTP ${answer.status}` };
    }
    if (answer.status === 409 && problemSlug(answer) === "response-not-stored") {
      throw (
        this.#problem(call, answer, attempts) ??
        new ResponseNotStoredError(`key \`${call.key}\` completed but its answer was too large to keep`, { key: call.key, attempts })
      );
    }
    const text = new TextDecoder().decode(answer.body);
    let json: unknown;
    if (answer.status === 200 || answer.status === 404) {
      try {
        json = JSON.parse(text);
      } catch {
        json = undefined;
      }
    }
    if (!isRecord(json) || json["key"] !== call.key) {
      throw refused(`HTTP ${answer.status}: ${text.slice(0, 200)}`);
    }
    switch (json["state"]) {
      case "absent":
        return { state: "absent" };
      case "processing":
        return { state: "processing", retryAfterMs: parseRetryAfter(answer.headers.get("retry-after")) };
      case "unknown":
        return { state: "unknown" };
      case undefined:
        throw refused("no `state` in the answer");
      default:
        throw refused(`state \`${String(json["state"])}\` without the stored answer`);
    }
  }

  /** One fetch with its own timeout, its body read whole within it. */
  async #fetchWhole(
    url: URL,
    init: RequestInit,
    timeoutMs: number,
    outer: AbortSignal | undefined,
  ): Promise<{ answer: Answer } | { failure: Failure }> {
    const controller = new AbortController();
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      controller.abort(new Error(`no answer within ${timeoutMs} ms`));
    }, timeoutMs);
    const onAbort = (): void => controller.abort(outer?.reason);
    outer?.addEventListener("abort", onAbort, { once: true });
    let phase: Failure["phase"] = "connect";
    try {
      const res = await this.#fetch(url, { ...init, signal: controller.signal });
      phase = "body";
      const body = new Uint8Array(await res.arrayBuffer());
      return { answer: { status: res.status, statusText: res.statusText, headers: res.headers, body } };
    } catch (cause) {
      if (timedOut) {
        return { failure: { phase: "timeout", why: `timed out after ${timeoutMs} ms`, code: undefined, cause } };
      }
      const code = errorCode(cause);
      const why =
        phase === "body"
          ? `answer cut off: ${describe(cause)}`
          : `${describe(cause)}${code === undefined ? "" : ` (${code})`}`;
      return { failure: { phase, why, code, cause } };
    } finally {
      clearTimeout(timer);
      outer?.removeEventListener("abort", onAbort);
    }
  }

  /** The answer returned, or the problem thrown when idem itself refused. */
  #finish(call: Call, answer: Answer, attempts: number, fromStatus: boolean): IdemResponse {
    if (!isReplayed(answer.headers)) {
      const problem = this.#problem(call, answer, attempts);
      if (problem !== undefined) throw problem;
    }
    return this.#response(call, answer, attempts, fromStatus);
  }

  #response(call: Call, answer: Answer, attempts: number, fromStatus: boolean): IdemResponse {
    return new IdemResponse({ ...answer, key: call.key, attempts, fromStatus, requestId: call.requestId });
  }

  /** The typed error for an idem problem answer (`undefined` when the answer is not one). */
  #problem(call: Call, answer: Answer, attempts: number): ProblemError | undefined {
    const problem = readProblem(answer);
    if (problem === undefined) return undefined;
    const type = problem["type"] as string;
    const slug = type.slice(PROBLEM_BASE.length);
    const cls = PROBLEMS.get(slug) ?? ProblemError;
    const detail = typeof problem["detail"] === "string" ? problem["detail"] : undefined;
    const title = typeof problem["title"] === "string" ? problem["title"] : slug;
    return new cls(`${title} (HTTP ${answer.status}, key \`${call.key}\`)${detail === undefined ? "" : `: ${detail}`}`, {
      key: call.key,
      attempts,
      status: answer.status,
      type,
      detail,
      problem,
      response: this.#response(call, answer, attempts, false),
    });
  }

  #checkAbort(call: Call, attempts: number): void {
    if (call.signal?.aborted === true) {
      throw new AbortedError(`key \`${call.key}\`: aborted by the caller after ${attempts} attempt(s)`, {
        key: call.key,
        attempts,
        cause: call.signal.reason,
      });
    }
  }

  #emit(event: IdemEvent): void {
    if (this.#onEvent === undefined) return;
    try {
      this.#onEvent(event);
    } catch {
      // A listener's failure never changes the operation.
    }
  }
}

interface Call {
  method: string;
  url: URL;
  headers: Headers;
  key: string;
  keyValue: string;
  body: Uint8Array<ArrayBuffer> | undefined;
  requestId: string;
  traceId: string | undefined;
  route: string | undefined;
  signal: AbortSignal | undefined;
  rng: Random;
}

interface Failure {
  phase: "connect" | "body" | "timeout";
  why: string;
  code: string | undefined;
  cause: unknown;
}

function attemptLabel(a: Attempt): string {
  switch (a.kind) {
    case "not-sent":
      return `not sent: ${a.why}`;
    case "ambiguous":
      return `ambiguous: ${a.why}`;
    case "retryable":
      return `${a.why} (HTTP ${a.answer.status})`;
    case "outcome-unknown":
      return `outcome unknown (HTTP ${a.answer.status})`;
    case "final":
      return `final (HTTP ${a.answer.status})`;
  }
}

function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

/** The problem body when `answer` is an idem problem (`application/problem+json` with an idem `type`). */
function readProblem(answer: Answer): Record<string, unknown> | undefined {
  const ct = answer.headers.get("content-type");
  if (ct === null || !ct.trimStart().toLowerCase().startsWith("application/problem+json")) return undefined;
  let v: unknown;
  try {
    v = JSON.parse(new TextDecoder().decode(answer.body));
  } catch {
    return undefined;
  }
  if (!isRecord(v) || typeof v["type"] !== "string" || !v["type"].startsWith(PROBLEM_BASE)) return undefined;
  return v;
}

function problemSlug(answer: Answer): string | undefined {
  const p = readProblem(answer);
  return p === undefined ? undefined : (p["type"] as string).slice(PROBLEM_BASE.length);
}

/** The first `code` along an error's `cause` chain (undici puts the socket error there). */
function errorCode(e: unknown, depth = 0): string | undefined {
  if (!isRecord(e) && !(e instanceof Error)) return undefined;
  if (depth > 5) return undefined;
  const r = e as Record<string, unknown>;
  if (typeof r["code"] === "string") return r["code"];
  if (Array.isArray(r["errors"])) {
    for (const inner of r["errors"] as unknown[]) {
      const c = errorCode(inner, depth + 1);
      if (c !== undefined) return c;
    }
  }
  return errorCode(r["cause"], depth + 1);
}

function describe(e: unknown): string {
  if (e instanceof Error) {
    const cause = e.cause instanceof Error ? `: ${e.cause.message}` : "";
    return `${e.message}${cause}`;
  }
  return String(e);
}

/** The key as a header value: bare when it is a plain token, else an RFC 8941 sf-string. */
export function keyHeaderValue(key: string): string | undefined {
  if (key.length < 1 || key.length > 255) return undefined;
  for (let i = 0; i < key.length; i++) {
    const c = key.charCodeAt(i);
    if (c < 0x20 || c > 0x7e) return undefined;
  }
  const bare = !/[,"\\]/.test(key) && !key.startsWith(" ") && !key.endsWith(" ");
  return bare ? key : `"${key.replace(/["\\]/g, (c) => `\\${c}`)}"`;
}

/** A key header value read back: an sf-string unquoted, a bare token as it is. */
function unquote(value: string): string {
  const v = value.trim();
  if (v.length >= 2 && v.startsWith('"') && v.endsWith('"')) {
    return v.slice(1, -1).replace(/\\(["\\])/g, "$1");
  }
  return v;
}

/** The random source: Web Crypto's `randomUUID` and `getRandomValues`. */
interface Random {
  randomUUID(): string;
  getRandomValues<T extends Uint8Array>(array: T): T;
}

let random: Random | undefined;

/**
 * Web Crypto: `globalThis.crypto` (browsers, Node 19+), else Node 18's `node:crypto`
 * (its global `crypto` needs a flag there). The module name is a variable so bundlers for
 * the browser leave it alone.
 */
async function randomSource(): Promise<Random> {
  if (random !== undefined) return random;
  const c = (globalThis as { crypto?: Partial<Random> }).crypto;
  if (c !== undefined && typeof c.randomUUID === "function" && typeof c.getRandomValues === "function") {
    random = c as Random;
    return random;
  }
  const name = "node:crypto";
  try {
    const mod = (await import(name)) as { webcrypto?: Partial<Random> };
    const w = mod.webcrypto;
    if (w !== undefined && typeof w.randomUUID === "function" && typeof w.getRandomValues === "function") {
      random = w as Random;
      return random;
    }
  } catch {
    // not Node: fall through
  }
  throw new IdemError("no Web Crypto (crypto.randomUUID, crypto.getRandomValues) on this platform");
}

function randomHex(rng: Random, bytes: number): string {
  const buf = rng.getRandomValues(new Uint8Array(bytes));
  let s = "";
  for (const b of buf) s += b.toString(16).padStart(2, "0");
  return /^0+$/.test(s) ? randomHex(rng, bytes) : s;
}

function sleep(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted === true) return resolve();
    const done = (): void => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal?.addEventListener("abort", done, { once: true });
  });
}
