import type { IdemResponse } from "./response.js";

/** Base of every problem `type` URI idem answers with. */
export const PROBLEM_BASE = "https://idem.dev/problems/";

/** What every error of this package carries. */
export interface IdemErrorInit {
  /** The operation's key, when one was chosen (absent only for a call refused before it). */
  key?: string | undefined;
  /** The HTTP status the error stands for, when there is one. */
  status?: number | undefined;
  /** The problem `type` URI, when the error is a problem idem answered. */
  type?: string | undefined;
  /** A human-readable explanation. */
  detail?: string | undefined;
  /** Requests sent for the operation before it ended. */
  attempts?: number | undefined;
  /** The answer the error was read from, when there is one. */
  response?: IdemResponse | undefined;
  /** The underlying failure. */
  cause?: unknown;
}

/**
 * Base of every error the client throws. `key` names the operation's idempotency key so the
 * operation can be looked up, or resumed with the same key, later.
 */
export class IdemError extends Error {
  override readonly name: string = "IdemError";
  /** The operation's idempotency key (`undefined` only when the call was refused before a key was chosen). */
  readonly key: string | undefined;
  /** The HTTP status, for a problem idem answered (`undefined` for the client's own errors). */
  readonly status: number | undefined;
  /** The problem `type` URI (`https://idem.dev/problems/<slug>`), for a problem idem answered. */
  readonly type: string | undefined;
  /** The problem's `detail`, or the client's explanation. */
  readonly detail: string | undefined;
  /** Requests sent for the operation. */
  readonly attempts: number;
  /** The answer this error was read from, when there is one (its body, headers, status). */
  readonly response: IdemResponse | undefined;

  constructor(message: string, init: IdemErrorInit = {}) {
    super(message, init.cause === undefined ? undefined : { cause: init.cause });
    this.key = init.key;
    this.status = init.status;
    this.type = init.type;
    this.detail = init.detail;
    this.attempts = init.attempts ?? 0;
    this.response = init.response;
  }
}

/** What a problem class looks like (used to map a `type` URI to its class). */
export interface ProblemClass {
  new (message: string, init?: IdemErrorInit): ProblemError;
  readonly slug: string;
  readonly defaultStatus: number;
  readonly title: string;
}

/**
 * A problem idem answered itself (`application/problem+json` with
 * `type = https://idem.dev/problems/<slug>`), not the protected service. One subclass per
 * slug, e.g. `KeyReusedError`, `OutcomeUnknownError`; an idem type this version does not
 * know is a plain `ProblemError`.
 */
export class ProblemError extends IdemError {
  override readonly name: string = "ProblemError";
  /** The problem's slug: the last segment of its type URI. */
  static readonly slug: string = "";
  /** The HTTP status idem answers this problem with. */
  static readonly defaultStatus: number = 500;
  /** The problem's title, the same for every occurrence. */
  static readonly title: string = "";
  declare readonly status: number;
  declare readonly type: string;
  /** The problem body as sent (its `title`, `detail`, `key`, and any other members). */
  readonly problem: Readonly<Record<string, unknown>> | undefined;

  constructor(message: string, init: IdemErrorInit & { problem?: Record<string, unknown> } = {}) {
    const cls = new.target as unknown as ProblemClass;
    super(message, {
      ...init,
      status: init.status ?? cls.defaultStatus,
      type: init.type ?? PROBLEM_BASE + cls.slug,
    });
    this.problem = init.problem;
  }

  /** The slug of this error's type URI. */
  get slug(): string {
    return this.type.startsWith(PROBLEM_BASE) ? this.type.slice(PROBLEM_BASE.length) : this.type;
  }
}

/** The call was refused before anything was sent (a bad key, URL or body). */
export class InvalidRequestError extends IdemError {
  override readonly name: string = "InvalidRequestError";
}

/**
 * An attempt may have run and no status endpoint is configured to ask: the client does not
 * guess. Resume with the same key, or ask the gateway's status endpoint.
 */
export class AmbiguousError extends IdemError {
  override readonly name: string = "AmbiguousError";
}

/** The operation's deadline passed (or the next wait would pass it) before an answer. */
export class DeadlineExceededError extends IdemError {
  override readonly name: string = "DeadlineExceededError";
  /** The deadline, in milliseconds. */
  readonly deadlineMs: number;
  constructor(message: string, init: IdemErrorInit & { deadlineMs: number }) {
    super(message, init);
    this.deadlineMs = init.deadlineMs;
  }
}

/** Every attempt the policy allows was sent and none got a final answer. */
export class AttemptsExhaustedError extends IdemError {
  override readonly name: string = "AttemptsExhaustedError";
}

/**
 * The status endpoint answered something that is not a status of this key (a plain 404 page,
 * 401, `400 status-route`): a wrong URL or route must not read as "absent".
 */
export class StatusQueryError extends IdemError {
  override readonly name: string = "StatusQueryError";
}

/** The caller's `AbortSignal` ended the operation. */
export class AbortedError extends IdemError {
  override readonly name: string = "AbortedError";
}
