"""An ingress replica's own gRPC port is its own: Serve's wish for no SO_REUSEPORT, kept.

With direct ingress, Serve starts a gRPC server in each ingress replica on a port its
controller allocates (from `RAY_SERVE_DIRECT_INGRESS_MIN_GRPC_PORT`, 40000) and asks gRPC
for no SO_REUSEPORT there, so that a port held by anything else fails the bind and Serve
tries the next port. But it passes the option as a string (`("grpc.so_reuseport", "0")`),
which gRPC's core ignores for an integer option, keeping its default: SO_REUSEPORT on.
Two Serve instances on one machine (two Ray clusters, two `raybatch up`) then both bind
port 40000, and the kernel shares the connections between them: a client of one app is
answered, some of the time, by the other's replica ("Application ... not found", or
another model's answer). Seen when the test suite's two lanes each ran a Ray.

`keep_serves_socket_options()` makes that option, where Serve passes it to its gRPC servers
as digits, an integer, so gRPC applies it as Serve meant (the proxy's own
`RAY_SERVE_SOCKET_REUSE_PORT_ENABLED` included); any other option is passed as it was.
It runs when the ingress module is imported, which in a replica is before Serve starts the
replica's servers. Where Serve's module no longer has the class (another Ray version), it
changes nothing; the unit test says so.
"""

from __future__ import annotations

from typing import Any

_PATCHED = "_raybatch_int_options"
_INT_OPTIONS = frozenset({"grpc.so_reuseport"})  # integer options Serve passes as strings


def _as_ints(options: Any) -> Any:
    return options and [(k, int(v)) if k in _INT_OPTIONS and isinstance(v, str)
                        and v.isdigit() else (k, v) for k, v in options]


def keep_serves_socket_options() -> bool:
    """Patch Serve's gRPC server class (once); True where it is patched."""
    try:
        from ray.serve._private import grpc_util
    except ImportError:
        return False
    server = getattr(grpc_util, "gRPCGenericServer", None)
    if server is None:
        return False
    if getattr(server, _PATCHED, False):
        return True

    class IntOptionsServer(server):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, extra_options: Any = None, **kwargs: Any) -> None:
            super().__init__(*args, extra_options=_as_ints(extra_options), **kwargs)

    setattr(IntOptionsServer, _PATCHED, True)
    IntOptionsServer.__name__ = IntOptionsServer.__qualname__ = server.__name__
    IntOptionsServer.__module__ = server.__module__
    grpc_util.gRPCGenericServer = IntOptionsServer
    return True


__all__ = ["keep_serves_socket_options"]
