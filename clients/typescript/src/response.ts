/** One final answer of an operation, read whole. */
export class IdemResponse {
  /** The HTTP status. */
  readonly status: number;
  /** The status text, when the server sent one. */
  readonly statusText: string;
  /** The answer's headers. */
  readonly headers: Headers;
  /** The answer's body, read whole. */
  readonly body: Uint8Array;
  /** The operation's idempotency key (sent on every attempt). */
  readonly key: string;
  /** Whether the server replayed a stored answer (`Idempotent-Replayed: true`). */
  readonly replayed: boolean;
  /** Requests sent for the operation (status queries not counted). */
  readonly attempts: number;
  /** Whether the answer came from the status endpoint (an attempt's own answer was lost). */
  readonly fromStatus: boolean;
  /** The operation's `X-Request-ID`, the same on every attempt and status query. */
  readonly requestId: string;

  constructor(init: {
    status: number;
    statusText: string;
    headers: Headers;
    body: Uint8Array;
    key: string;
    attempts: number;
    fromStatus: boolean;
    requestId: string;
  }) {
    this.status = init.status;
    this.statusText = init.statusText;
    this.headers = init.headers;
    this.body = init.body;
    this.key = init.key;
    this.replayed = isReplayed(init.headers);
    this.attempts = init.attempts;
    this.fromStatus = init.fromStatus;
    this.requestId = init.requestId;
  }

  /** Whether the status is 2xx. */
  get ok(): boolean {
    return this.status >= 200 && this.status < 300;
  }

  /** The body as UTF-8 text. */
  text(): string {
    return new TextDecoder().decode(this.body);
  }

  /** The body parsed as JSON (throws a `SyntaxError` when it is not JSON). */
  json<T = unknown>(): T {
    return JSON.parse(this.text()) as T;
  }
}

/** Whether `headers` carry `Idempotent-Replayed: true` (case-insensitive). */
export function isReplayed(headers: Headers): boolean {
  return headers.get("idempotent-replayed")?.trim().toLowerCase() === "true";
}
