/** How waits before a retry are drawn. */
export type Jitter = "full" | "none";

/** The retry policy, the same as idem-client's `RetryPolicy` (defaults in the comments). */
export interface RetryPolicy {
  /** Most requests sent for one operation, at least 1; status queries do not count. [5] */
  maxAttempts: number;
  /** The cap of the first wait; it doubles with every wait. [100 ms] */
  initialBackoffMs: number;
  /** The largest cap a wait is drawn under. [5 s] */
  maxBackoffMs: number;
  /** The longest server `Retry-After` honoured. [30 s] */
  maxRetryAfterMs: number;
  /** The longest one attempt, or one status query, may take. [10 s] */
  attemptTimeoutMs: number;
  /** The whole operation: every attempt, wait and status query. [30 s] */
  deadlineMs: number;
  /** `"full"`: uniform between zero and the cap; `"none"`: exactly the cap (tests). ["full"] */
  jitter: Jitter;
}

export const DEFAULT_POLICY: Readonly<RetryPolicy> = Object.freeze({
  maxAttempts: 5,
  initialBackoffMs: 100,
  maxBackoffMs: 5_000,
  maxRetryAfterMs: 30_000,
  attemptTimeoutMs: 10_000,
  deadlineMs: 30_000,
  jitter: "full",
});

/** The policy with `overrides` applied, checked. */
export function resolvePolicy(overrides: Partial<RetryPolicy>): RetryPolicy {
  const p: RetryPolicy = { ...DEFAULT_POLICY };
  for (const [name, value] of Object.entries(overrides) as [keyof RetryPolicy, unknown][]) {
    if (value === undefined) continue;
    if (name === "jitter") {
      if (value !== "full" && value !== "none") {
        throw new TypeError(`jitter must be "full" or "none", not ${String(value)}`);
      }
      p.jitter = value;
      continue;
    }
    if (typeof value !== "number" || !Number.isFinite(value) || value < 0) {
      throw new TypeError(`${name} must be a finite number ≥ 0, not ${String(value)}`);
    }
    p[name] = value;
  }
  p.maxAttempts = Math.max(1, Math.floor(p.maxAttempts));
  return p;
}

/** The cap the wait before retry `n` (from zero) is drawn under: `min(max, initial·2ⁿ)`. */
export function backoffCap(p: RetryPolicy, n: number): number {
  return Math.min(p.maxBackoffMs, p.initialBackoffMs * 2 ** Math.min(n, 31));
}

/**
 * The wait before retry `n`: drawn under the cap per the jitter, raised to the server's
 * `Retry-After` (itself capped by `maxRetryAfterMs`) when it gave one.
 */
export function waitMs(p: RetryPolicy, n: number, retryAfterMs: number | undefined, random: () => number = Math.random): number {
  const cap = backoffCap(p, n);
  const drawn = p.jitter === "full" ? random() * cap : cap;
  return retryAfterMs === undefined ? drawn : Math.max(drawn, Math.min(retryAfterMs, p.maxRetryAfterMs));
}

/** The wait a `Retry-After` header names in delta-seconds; `undefined` for anything else. */
export function parseRetryAfter(value: string | null): number | undefined {
  if (value === null) return undefined;
  const v = value.trim();
  return /^\d+$/.test(v) ? Number(v) * 1000 : undefined;
}
