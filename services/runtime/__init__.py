"""What every gRPC service of the fleet shares: server lifecycle, health, reflection, auth, error mapping, clients.

A service builds a `GrpcService`, adds its servicers, and calls `run_service`; its logic raises the domain errors
of `services.runtime.errors` and never sees status codes.
"""

from services.runtime.client import make_channel
from services.runtime.errors import DomainError, FailedPrecondition, InvalidArgument, NotFound, Unavailable
from services.runtime.server import GrpcService, run_service

__all__ = [
    "DomainError",
    "FailedPrecondition",
    "GrpcService",
    "InvalidArgument",
    "NotFound",
    "Unavailable",
    "make_channel",
    "run_service",
]
