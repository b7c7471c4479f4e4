"""Domain errors. Service logic raises these; the error interceptor turns them into gRPC status codes."""

import grpc


class DomainError(Exception):
    """Base class: an expected failure with a message fit for the caller."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL


class InvalidArgument(DomainError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(DomainError):
    code = grpc.StatusCode.NOT_FOUND


class FailedPrecondition(DomainError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class Unavailable(DomainError):
    code = grpc.StatusCode.UNAVAILABLE
