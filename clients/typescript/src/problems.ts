// One error class per problem type idem answers with (crates/idem-wire/src/reason.rs):
// `type = https://idem.dev/problems/<slug>`. Kept in the table order of idem-wire.

import { ProblemError } from "./errors.js";

/** `key-missing` (400): Idempotency key missing. */
export class KeyMissingError extends ProblemError {
  static override readonly slug = "key-missing";
  static override readonly defaultStatus = 400;
  static override readonly title = "Idempotency key missing";
  override readonly name: string = "KeyMissingError";
}

/** `key-malformed` (400): Idempotency key malformed. */
export class KeyMalformedError extends ProblemError {
  static override readonly slug = "key-malformed";
  static override readonly defaultStatus = 400;
  static override readonly title = "Idempotency key malformed";
  override readonly name: string = "KeyMalformedError";
}

/** `key-multiple` (400): More than one idempotency key. */
export class KeyMultipleError extends ProblemError {
  static override readonly slug = "key-multiple";
  static override readonly defaultStatus = 400;
  static override readonly title = "More than one idempotency key";
  override readonly name: string = "KeyMultipleError";
}

/** `unauthenticated` (401): Principal required. */
export class UnauthenticatedError extends ProblemError {
  static override readonly slug = "unauthenticated";
  static override readonly defaultStatus = 401;
  static override readonly title = "Principal required";
  override readonly name: string = "UnauthenticatedError";
}

/** `credential-ambiguous` (400): Credential ambiguous. */
export class CredentialAmbiguousError extends ProblemError {
  static override readonly slug = "credential-ambiguous";
  static override readonly defaultStatus = 400;
  static override readonly title = "Credential ambiguous";
  override readonly name: string = "CredentialAmbiguousError";
}

/** `not-one-message` (400): Request not one message. */
export class NotOneMessageError extends ProblemError {
  static override readonly slug = "not-one-message";
  static override readonly defaultStatus = 400;
  static override readonly title = "Request not one message";
  override readonly name: string = "NotOneMessageError";
}

/** `body-too-large` (413): Request body too large. */
export class BodyTooLargeError extends ProblemError {
  static override readonly slug = "body-too-large";
  static override readonly defaultStatus = 413;
  static override readonly title = "Request body too large";
  override readonly name: string = "BodyTooLargeError";
}

/** `body-unreadable` (400): Request body unreadable. */
export class BodyUnreadableError extends ProblemError {
  static override readonly slug = "body-unreadable";
  static override readonly defaultStatus = 400;
  static override readonly title = "Request body unreadable";
  override readonly name: string = "BodyUnreadableError";
}

/** `body-ambiguous` (400): Request body ambiguous. */
export class BodyAmbiguousError extends ProblemError {
  static override readonly slug = "body-ambiguous";
  static override readonly defaultStatus = 400;
  static override readonly title = "Request body ambiguous";
  override readonly name: string = "BodyAmbiguousError";
}

/** `body-timeout` (408): Request body too slow. */
export class BodyTimeoutError extends ProblemError {
  static override readonly slug = "body-timeout";
  static override readonly defaultStatus = 408;
  static override readonly title = "Request body too slow";
  override readonly name: string = "BodyTimeoutError";
}

/** `in-flight` (409): Request in flight. */
export class InFlightError extends ProblemError {
  static override readonly slug = "in-flight";
  static override readonly defaultStatus = 409;
  static override readonly title = "Request in flight";
  override readonly name: string = "InFlightError";
}

/** `key-reused` (422): Idempotency key reused. */
export class KeyReusedError extends ProblemError {
  static override readonly slug = "key-reused";
  static override readonly defaultStatus = 422;
  static override readonly title = "Idempotency key reused";
  override readonly name: string = "KeyReusedError";
}

/** `outcome-unknown` (409): Outcome unknown. */
export class OutcomeUnknownError extends ProblemError {
  static override readonly slug = "outcome-unknown";
  static override readonly defaultStatus = 409;
  static override readonly title = "Outcome unknown";
  override readonly name: string = "OutcomeUnknownError";
}

/** `response-not-stored` (409): Response not replayable. */
export class ResponseNotStoredError extends ProblemError {
  static override readonly slug = "response-not-stored";
  static override readonly defaultStatus = 409;
  static override readonly title = "Response not replayable";
  override readonly name: string = "ResponseNotStoredError";
}

/** `store-unavailable` (503): Idempotency store unavailable. */
export class StoreUnavailableError extends ProblemError {
  static override readonly slug = "store-unavailable";
  static override readonly defaultStatus = 503;
  static override readonly title = "Idempotency store unavailable";
  override readonly name: string = "StoreUnavailableError";
}

/** `lease-lost` (503): Claim lost. */
export class LeaseLostError extends ProblemError {
  static override readonly slug = "lease-lost";
  static override readonly defaultStatus = 503;
  static override readonly title = "Claim lost";
  override readonly name: string = "LeaseLostError";
}

/** `handler-timeout` (504): Handler timed out. */
export class HandlerTimeoutError extends ProblemError {
  static override readonly slug = "handler-timeout";
  static override readonly defaultStatus = 504;
  static override readonly title = "Handler timed out";
  override readonly name: string = "HandlerTimeoutError";
}

/** `handler-panicked` (500): Handler failed. */
export class HandlerPanickedError extends ProblemError {
  static override readonly slug = "handler-panicked";
  static override readonly defaultStatus = 500;
  static override readonly title = "Handler failed";
  override readonly name: string = "HandlerPanickedError";
}

/** `response-failed` (500): Response failed. */
export class ResponseFailedError extends ProblemError {
  static override readonly slug = "response-failed";
  static override readonly defaultStatus = 500;
  static override readonly title = "Response failed";
  override readonly name: string = "ResponseFailedError";
}

/** `answer-not-recorded` (503): Answer not recorded yet. */
export class AnswerNotRecordedError extends ProblemError {
  static override readonly slug = "answer-not-recorded";
  static override readonly defaultStatus = 503;
  static override readonly title = "Answer not recorded yet";
  override readonly name: string = "AnswerNotRecordedError";
}

/** `internal` (500): Internal error. */
export class InternalError extends ProblemError {
  static override readonly slug = "internal";
  static override readonly defaultStatus = 500;
  static override readonly title = "Internal error";
  override readonly name: string = "InternalError";
}

/** `method-not-allowed` (405): Method not allowed. */
export class MethodNotAllowedError extends ProblemError {
  static override readonly slug = "method-not-allowed";
  static override readonly defaultStatus = 405;
  static override readonly title = "Method not allowed";
  override readonly name: string = "MethodNotAllowedError";
}

/** `no-route` (404): No route. */
export class NoRouteError extends ProblemError {
  static override readonly slug = "no-route";
  static override readonly defaultStatus = 404;
  static override readonly title = "No route";
  override readonly name: string = "NoRouteError";
}

/** `method-not-canonical` (400): Method not canonical. */
export class MethodNotCanonicalError extends ProblemError {
  static override readonly slug = "method-not-canonical";
  static override readonly defaultStatus = 400;
  static override readonly title = "Method not canonical";
  override readonly name: string = "MethodNotCanonicalError";
}

/** `path-rejected` (400): Request path rejected. */
export class PathRejectedError extends ProblemError {
  static override readonly slug = "path-rejected";
  static override readonly defaultStatus = 400;
  static override readonly title = "Request path rejected";
  override readonly name: string = "PathRejectedError";
}

/** `bad-request-target` (400): Bad request target. */
export class BadRequestTargetError extends ProblemError {
  static override readonly slug = "bad-request-target";
  static override readonly defaultStatus = 400;
  static override readonly title = "Bad request target";
  override readonly name: string = "BadRequestTargetError";
}

/** `status-path` (400): Status path malformed. */
export class StatusPathError extends ProblemError {
  static override readonly slug = "status-path";
  static override readonly defaultStatus = 400;
  static override readonly title = "Status path malformed";
  override readonly name: string = "StatusPathError";
}

/** `status-route` (400): Status route not chosen. */
export class StatusRouteError extends ProblemError {
  static override readonly slug = "status-route";
  static override readonly defaultStatus = 400;
  static override readonly title = "Status route not chosen";
  override readonly name: string = "StatusRouteError";
}

/** `status-token` (400): Status token refused. */
export class StatusTokenError extends ProblemError {
  static override readonly slug = "status-token";
  static override readonly defaultStatus = 400;
  static override readonly title = "Status token refused";
  override readonly name: string = "StatusTokenError";
}

/** `overloaded` (503): Too many requests in progress. */
export class OverloadedError extends ProblemError {
  static override readonly slug = "overloaded";
  static override readonly defaultStatus = 503;
  static override readonly title = "Too many requests in progress";
  override readonly name: string = "OverloadedError";
}

/** `upstream-unavailable` (503): Upstream unavailable. */
export class UpstreamUnavailableError extends ProblemError {
  static override readonly slug = "upstream-unavailable";
  static override readonly defaultStatus = 503;
  static override readonly title = "Upstream unavailable";
  override readonly name: string = "UpstreamUnavailableError";
}

/** `upstream-tls` (502): Upstream TLS handshake failed. */
export class UpstreamTlsError extends ProblemError {
  static override readonly slug = "upstream-tls";
  static override readonly defaultStatus = 502;
  static override readonly title = "Upstream TLS handshake failed";
  override readonly name: string = "UpstreamTlsError";
}

/** `upstream-failed` (502): Upstream failed. */
export class UpstreamFailedError extends ProblemError {
  static override readonly slug = "upstream-failed";
  static override readonly defaultStatus = 502;
  static override readonly title = "Upstream failed";
  override readonly name: string = "UpstreamFailedError";
}

/** `upstream-timeout` (504): Upstream timed out. */
export class UpstreamTimeoutError extends ProblemError {
  static override readonly slug = "upstream-timeout";
  static override readonly defaultStatus = 504;
  static override readonly title = "Upstream timed out";
  override readonly name: string = "UpstreamTimeoutError";
}

/** `answer-unreadable` (500): Answer unreadable. */
export class AnswerUnreadableError extends ProblemError {
  static override readonly slug = "answer-unreadable";
  static override readonly defaultStatus = 500;
  static override readonly title = "Answer unreadable";
  override readonly name: string = "AnswerUnreadableError";
}

/** `token-missing` (428): Token required. */
export class TokenMissingError extends ProblemError {
  static override readonly slug = "token-missing";
  static override readonly defaultStatus = 428;
  static override readonly title = "Token required";
  override readonly name: string = "TokenMissingError";
}

/** `token-malformed` (400): Token malformed. */
export class TokenMalformedError extends ProblemError {
  static override readonly slug = "token-malformed";
  static override readonly defaultStatus = 400;
  static override readonly title = "Token malformed";
  override readonly name: string = "TokenMalformedError";
}

/** `token-with-key` (400): Idempotency-Key not accepted here. */
export class TokenWithKeyError extends ProblemError {
  static override readonly slug = "token-with-key";
  static override readonly defaultStatus = 400;
  static override readonly title = "Idempotency-Key not accepted here";
  override readonly name: string = "TokenWithKeyError";
}

/** `token-unknown` (403): Token unknown. */
export class TokenUnknownError extends ProblemError {
  static override readonly slug = "token-unknown";
  static override readonly defaultStatus = 403;
  static override readonly title = "Token unknown";
  override readonly name: string = "TokenUnknownError";
}

/** `token-expired` (410): Token expired. */
export class TokenExpiredError extends ProblemError {
  static override readonly slug = "token-expired";
  static override readonly defaultStatus = 410;
  static override readonly title = "Token expired";
  override readonly name: string = "TokenExpiredError";
}

/** `token-used` (409): Token already used. */
export class TokenUsedError extends ProblemError {
  static override readonly slug = "token-used";
  static override readonly defaultStatus = 409;
  static override readonly title = "Token already used";
  override readonly name: string = "TokenUsedError";
}

/** `token-mismatch` (422): Token bound to another request. */
export class TokenMismatchError extends ProblemError {
  static override readonly slug = "token-mismatch";
  static override readonly defaultStatus = 422;
  static override readonly title = "Token bound to another request";
  override readonly name: string = "TokenMismatchError";
}

/** `token-rate-limited` (429): Too many tokens requested. */
export class TokenRateLimitedError extends ProblemError {
  static override readonly slug = "token-rate-limited";
  static override readonly defaultStatus = 429;
  static override readonly title = "Too many tokens requested";
  override readonly name: string = "TokenRateLimitedError";
}

/** `token-store-unavailable` (503): Token store unavailable. */
export class TokenStoreUnavailableError extends ProblemError {
  static override readonly slug = "token-store-unavailable";
  static override readonly defaultStatus = 503;
  static override readonly title = "Token store unavailable";
  override readonly name: string = "TokenStoreUnavailableError";
}

/** `token-store-full` (503): Token store full. */
export class TokenStoreFullError extends ProblemError {
  static override readonly slug = "token-store-full";
  static override readonly defaultStatus = 503;
  static override readonly title = "Token store full";
  override readonly name: string = "TokenStoreFullError";
}

/** Every problem class, one per slug, in idem-wire's order. */
export const PROBLEM_CLASSES = [
  KeyMissingError,
  KeyMalformedError,
  KeyMultipleError,
  UnauthenticatedError,
  CredentialAmbiguousError,
  NotOneMessageError,
  BodyTooLargeError,
  BodyUnreadableError,
  BodyAmbiguousError,
  BodyTimeoutError,
  InFlightError,
  KeyReusedError,
  OutcomeUnknownError,
  ResponseNotStoredError,
  StoreUnavailableError,
  LeaseLostError,
  HandlerTimeoutError,
  HandlerPanickedError,
  ResponseFailedError,
  AnswerNotRecordedError,
  InternalError,
  MethodNotAllowedError,
  NoRouteError,
  MethodNotCanonicalError,
  PathRejectedError,
  BadRequestTargetError,
  StatusPathError,
  StatusRouteError,
  StatusTokenError,
  OverloadedError,
  UpstreamUnavailableError,
  UpstreamTlsError,
  UpstreamFailedError,
  UpstreamTimeoutError,
  AnswerUnreadableError,
  TokenMissingError,
  TokenMalformedError,
  TokenWithKeyError,
  TokenUnknownError,
  TokenExpiredError,
  TokenUsedError,
  TokenMismatchError,
  TokenRateLimitedError,
  TokenStoreUnavailableError,
  TokenStoreFullError,
] as const;
