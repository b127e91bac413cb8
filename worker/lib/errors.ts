/**
 * The closed list of API error codes (DESIGN §3). Every failure the API reports
 * goes through `ApiError`, so clients can branch on `error.code` and the status
 * mapping lives in exactly one place.
 */
export type ErrorCode =
  | "VALIDATION_ERROR"
  | "INVALID_CRON_EXPRESSION"
  | "UNAUTHORIZED"
  | "INSUFFICIENT_SCOPE"
  | "FORBIDDEN"
  | "NOT_FOUND"
  | "APP_NOT_FOUND"
  | "BACKUP_NOT_FOUND"
  | "CRON_NOT_FOUND"
  | "DISK_NOT_FOUND"
  | "KEY_NOT_FOUND"
  | "RUN_NOT_FOUND"
  | "UPLOAD_NOT_FOUND"
  | "DEPLOYMENT_NOT_FOUND"
  | "ENV_VAR_NOT_FOUND"
  | "NODE_NOT_FOUND"
  | "DOMAIN_NOT_FOUND"
  | "WEBHOOK_NOT_FOUND"
  | "DOMAIN_TAKEN"
  | "NODE_NOT_EMPTY"
  | "NODE_LOST"
  | "METHOD_NOT_ALLOWED"
  | "APP_STOPPED"
  | "APP_IS_STATIC"
  | "DISK_IN_USE"
  | "DISK_ATTACHED"
  | "DISK_BUSY"
  | "APP_HAS_DISK"
  | "APP_HAS_INSTANCES"
  | "PLAN_LIMIT_EXCEEDED"
  | "BACKUP_NOT_READY"
  | "DEPLOYMENT_NOT_READY"
  | "UPLOAD_INCOMPLETE"
  | "BACKUP_QUOTA_EXCEEDED"
  | "NAME_TAKEN"
  | "RUN_IN_PROGRESS"
  | "PRESIGNED_URL_EXPIRED"
  | "LENGTH_REQUIRED"
  | "CHECKSUM_MISMATCH"
  | "PAYLOAD_TOO_LARGE"
  | "RATE_LIMITED"
  | "TOO_MANY_JOBS"
  | "BUILDER_UNAVAILABLE"
  | "NODE_UNREACHABLE"
  | "INSUFFICIENT_STORAGE"
  | "INTERNAL";

export type ErrorStatus = 400 | 401 | 403 | 404 | 405 | 409 | 410 | 411 | 413 | 429 | 500 | 502 | 503 | 507;

/** One exhaustive code → status switch; adding a code without a status fails type-checking. */
export function statusOf(code: ErrorCode): ErrorStatus {
  switch (code) {
    case "VALIDATION_ERROR":
    case "INVALID_CRON_EXPRESSION":
    case "CHECKSUM_MISMATCH":
      return 400;
    case "UNAUTHORIZED":
      return 401;
    case "INSUFFICIENT_SCOPE":
    case "FORBIDDEN":
    case "PLAN_LIMIT_EXCEEDED":
      return 403;
    case "NOT_FOUND":
    case "APP_NOT_FOUND":
    case "BACKUP_NOT_FOUND":
    case "CRON_NOT_FOUND":
    case "DISK_NOT_FOUND":
    case "KEY_NOT_FOUND":
    case "RUN_NOT_FOUND":
    case "UPLOAD_NOT_FOUND":
    case "DEPLOYMENT_NOT_FOUND":
    case "ENV_VAR_NOT_FOUND":
    case "NODE_NOT_FOUND":
    case "DOMAIN_NOT_FOUND":
    case "WEBHOOK_NOT_FOUND":
      return 404;
    case "METHOD_NOT_ALLOWED":
      return 405;
    case "APP_STOPPED":
    case "APP_IS_STATIC":
    case "DISK_IN_USE":
    case "DISK_ATTACHED":
    case "DISK_BUSY":
    case "APP_HAS_DISK":
    case "APP_HAS_INSTANCES":
    case "NODE_NOT_EMPTY":
    case "NODE_LOST":
    case "BACKUP_NOT_READY":
    case "DEPLOYMENT_NOT_READY":
    case "UPLOAD_INCOMPLETE":
    case "BACKUP_QUOTA_EXCEEDED":
    case "NAME_TAKEN":
    case "DOMAIN_TAKEN":
    case "RUN_IN_PROGRESS":
      return 409;
    case "PRESIGNED_URL_EXPIRED":
      return 410;
    case "LENGTH_REQUIRED":
      return 411;
    case "PAYLOAD_TOO_LARGE":
      return 413;
    case "RATE_LIMITED":
    case "TOO_MANY_JOBS":
      return 429;
    case "INTERNAL":
      return 500;
    case "BUILDER_UNAVAILABLE":
      return 502;
    case "NODE_UNREACHABLE":
      return 503;
    case "INSUFFICIENT_STORAGE":
      return 507;
    default:
      return code satisfies never;
  }
}

export type ErrorDetail = { field: string; message: string };

/** Thrown by handlers and services for failures the client can act on. */
export class ApiError extends Error {
  readonly status: ErrorStatus;
  constructor(
    readonly code: ErrorCode,
    message: string,
    readonly details?: ErrorDetail[],
    status?: ErrorStatus,
    /** Headers the answer carries (Retry-After for RATE_LIMITED and NODE_UNREACHABLE). */
    readonly headers: Record<string, string> = {},
  ) {
    super(message);
    this.name = "ApiError";
    this.status = status ?? statusOf(code);
  }
}

export type ErrorBody = { error: { code: ErrorCode; message: string; details?: ErrorDetail[] } };

export function errorBody(err: ApiError): ErrorBody {
  return {
    error: { code: err.code, message: err.message, ...(err.details ? { details: err.details } : {}) },
  };
}
