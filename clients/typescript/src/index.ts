export { IdemClient, keyHeaderValue } from "./client.js";
export type { Body, IdemClientOptions, IdemEvent, KeyStateName, RequestOptions } from "./client.js";
export { IdemResponse } from "./response.js";
export { DEFAULT_POLICY, backoffCap, parseRetryAfter, waitMs } from "./policy.js";
export type { Jitter, RetryPolicy } from "./policy.js";
export {
  AbortedError,
  AmbiguousError,
  AttemptsExhaustedError,
  DeadlineExceededError,
  IdemError,
  InvalidRequestError,
  PROBLEM_BASE,
  ProblemError,
  StatusQueryError,
} from "./errors.js";
export type { IdemErrorInit, ProblemClass } from "./errors.js";
export * from "./problems.js";
