"""Ray's token authentication, decided once for every `raybatch` command that meets Ray.

Ray 2.60 turns token authentication on by itself, and not the same way everywhere: a
local `ray.init()` (a local `raybatch up`) always does and writes `~/.ray/auth_token`;
`ray start --head` does when `RAY_AUTH_MODE` is unset and a token exists (so on any
machine where a local Ray ran once); `ray start --address` and `ray.init("HOST:PORT")`
never do. A head that asks for a token then refuses every client and node that does not
send it ("Authentication token is missing or incorrect"), until the operator finds
`RAY_AUTH_MODE=token`. So Raybatch decides instead, whatever the machine's history:

- a head (`raybatch join --head`) always runs with token authentication, unless
  `RAY_AUTH_MODE` says otherwise, with the token of `--auth-token-file`, else Ray's own
  lookup, else one generated in `~/.ray/auth_token`;
- everything that connects to a cluster (`join --address`, `up --address`, `status`)
  asks the head's GCS first, with no token, whether it wants one (`probe_gcs`), and
  matches it: token mode with the token found where Ray looks (or `--auth-token-file`),
  checked against the head before Ray starts; or token mode off. A process whose mode
  differs from its cluster's fails in ways far from the cause, so the head decides.

An explicit `RAY_AUTH_MODE` always wins. The token itself is never printed, logged or
put on a command line: processes get the file's path (`RAY_AUTH_TOKEN_PATH`).
"""

from __future__ import annotations

import enum
import os
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

MODE_ENV = "RAY_AUTH_MODE"
TOKEN_ENV = "RAY_AUTH_TOKEN"
TOKEN_PATH_ENV = "RAY_AUTH_TOKEN_PATH"
_CLUSTER_ID_RPC = "/ray.rpc.NodeInfoGcsService/GetClusterId"  # every Ray client's first call


class AuthError(Exception):
    """The cluster asks for a token that is not here, or refuses the one that is."""


class Unreachable(AuthError):
    """Nothing answered at the cluster's address: a node cannot join it, a client cannot
    connect (`ray start` and `ray.init` would try again for ever)."""


class Reply(enum.Enum):
    """What the head's GCS said to one call."""

    ACCEPTED = "accepted"
    REFUSED = "refused"  # UNAUTHENTICATED: no token, or not the cluster's
    UNREACHABLE = "unreachable"  # nothing answered in time, or an answer that says nothing


@dataclass(frozen=True, slots=True)
class Token:
    """A token and where it was found; `where` is for messages, the value never is."""

    where: str
    value: str = field(repr=False)
    path: Path | None = None  # the file it was read from; None for $RAY_AUTH_TOKEN


@dataclass(frozen=True, slots=True)
class AuthPlan:
    """What a command does about authentication: environment changes (None unsets) for
    itself or the Ray processes it starts, a line for the user, a token file to create."""

    env: Mapping[str, str | None]
    message: str | None = None
    generate: Path | None = None


def default_token_path(home: Path | None = None) -> Path:
    """Where Ray looks for a token when no variable names one (and where it writes one)."""
    return (home or Path.home()) / ".ray" / "auth_token"


def _read(path: Path, what: str) -> str:
    try:
        value = path.read_text().strip()
    except OSError as e:
        raise AuthError(f"{what} {path}: cannot read it ({e.strerror})") from None
    if not value:
        raise AuthError(f"{what} {path} is empty: it should hold the cluster's token")
    return value


def find_token(token_file: str | None = None, environ: Mapping[str, str] = os.environ,
               home: Path | None = None) -> Token | None:
    """The token this machine has: `token_file`, else Ray's own order ($RAY_AUTH_TOKEN,
    the file $RAY_AUTH_TOKEN_PATH names, ~/.ray/auth_token); None when there is none.

    >>> find_token(environ={}, home=Path("/nonexistent")) is None
    True
    """
    if token_file:
        path = Path(token_file).expanduser().absolute()
        return Token(str(path), _read(path, "--auth-token-file"), path)
    if environ.get(TOKEN_ENV, "").strip():
        return Token(f"${TOKEN_ENV}", environ[TOKEN_ENV].strip())
    if environ.get(TOKEN_PATH_ENV):
        path = Path(environ[TOKEN_PATH_ENV]).expanduser().absolute()
        return Token(str(path), _read(path, f"${TOKEN_PATH_ENV}"), path)
    path = default_token_path(home)
    value = path.read_text().strip() if path.is_file() else ""
    return Token(str(path), value, path) if value else None


def _token_env(token: Token, token_file: str | None) -> dict[str, str | None]:
    """Point Ray at `token` when it would not find it by itself (a --auth-token-file):
    by path, and without $RAY_AUTH_TOKEN, which Ray would read first."""
    if token_file and token.path is not None:
        return {TOKEN_PATH_ENV: str(token.path), TOKEN_ENV: None}
    return {}


def head_plan(token_file: str | None = None, environ: Mapping[str, str] = os.environ,
              home: Path | None = None) -> AuthPlan:
    """Token authentication for a head node (`raybatch join --head`): on, unless
    $RAY_AUTH_MODE says otherwise; generates a token in ~/.ray/auth_token if none is here."""
    mode = environ.get(MODE_ENV)
    if mode is not None and mode.lower() != "token":
        return AuthPlan({}, f"token authentication: off ({MODE_ENV}={mode}): anyone who "
                            "reaches the head's ports can run code on the cluster")
    token = find_token(token_file, environ, home)
    generate = None
    if token is None:
        generate = default_token_path(home)
        where = f"{generate} (a new one: none was here)"
    else:
        where = token.where
    return AuthPlan({MODE_ENV: "token", **(_token_env(token, token_file) if token else {})},
                    f"token authentication: on, the token in {where}; other machines "
                    "join with `raybatch join --address HEAD:PORT --auth-token-file FILE`, "
                    "FILE a copy of it", generate)


def generate_token(path: Path) -> None:
    """Write a new token (256 random bits in hex, as `ray get-auth-token --generate`) to
    `path`, readable by its owner only; an existing file is kept."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))


Probe = Callable[[str, "str | None", float], Reply]


def cluster_plan(address: str, token_file: str | None = None,
                 environ: Mapping[str, str] = os.environ, home: Path | None = None,
                 probe: Probe | None = None, timeout_s: float = 10.0,
                 must_answer: bool = False) -> AuthPlan:
    """Authentication that matches the cluster at `address` (HOST:PORT of its GCS), for a
    node joining it or a client of it. Raises `AuthError` when the head asks for a token
    and none is here, or refuses the one found; `Unreachable` when nothing answers and
    `must_answer` (else a note)."""
    probe = probe or probe_gcs
    if environ.get(MODE_ENV) is not None:  # the user's choice, whatever the head says
        token = find_token(token_file, environ, home) if token_file else None
        return AuthPlan(_token_env(token, token_file) if token else {})
    reply = probe(address, None, timeout_s)
    if reply is Reply.ACCEPTED:  # an open cluster: no token, whatever is on this machine
        return AuthPlan({MODE_ENV: "disabled"})
    if reply is Reply.UNREACHABLE:
        if must_answer:
            raise Unreachable(f"nothing answered at {address} in {timeout_s:g} s: start the "
                              "head there first (`raybatch join --head` or `raybatch up`), "
                              "and check that this machine reaches its GCS port")
        return AuthPlan({}, f"note: no answer from {address} in {timeout_s:g} s to ask "
                            "whether it wants a token; going on with Ray's defaults")
    token = find_token(token_file, environ, home)
    if token is None:
        raise AuthError(
            f"the Ray cluster at {address} asks for an authentication token and there is "
            f"none here (--auth-token-file, ${TOKEN_ENV}, ${TOKEN_PATH_ENV}, "
            f"{default_token_path(home)}): copy the head's token file (its "
            "~/.ray/auth_token, unless it was started with --auth-token-file) to this "
            "machine and pass --auth-token-file FILE")
    if probe(address, token.value, timeout_s) is Reply.REFUSED:
        raise AuthError(f"the Ray cluster at {address} refused the token in {token.where}: "
                        "it is not this cluster's; use a copy of the head's token file "
                        "(--auth-token-file FILE)")
    return AuthPlan({MODE_ENV: "token", **_token_env(token, token_file)},
                    f"token authentication: on at {address}, the token in {token.where}")


def probe_gcs(address: str, token: str | None, timeout_s: float) -> Reply:
    """Call the GCS at `address` once (the cluster id, every client's first call), with
    `token` or none, waiting up to `timeout_s` for it to come up."""
    import grpc

    channel = _channel(address)
    try:
        call = channel.unary_unary(_CLUSTER_ID_RPC, request_serializer=lambda _: b"",
                                   response_deserializer=lambda raw: raw)
        metadata = [("authorization", f"Bearer {token}")] if token else None
        call(None, timeout=timeout_s, metadata=metadata, wait_for_ready=True)
        return Reply.ACCEPTED
    except grpc.RpcError as e:
        code = e.code() if callable(getattr(e, "code", None)) else None
        return Reply.REFUSED if code == grpc.StatusCode.UNAUTHENTICATED else Reply.UNREACHABLE
    finally:
        channel.close()


def _channel(address: str):
    import grpc

    if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):  # as Ray's own clients
        from ray._common.tls_utils import load_certs_from_env

        chain, key, ca = load_certs_from_env()
        credentials = grpc.ssl_channel_credentials(certificate_chain=chain, private_key=key,
                                                   root_certificates=ca)
        return grpc.secure_channel(address, credentials)
    return grpc.insecure_channel(address)


def with_env(plan: AuthPlan, base: Mapping[str, str]) -> dict[str, str]:
    """`base` with the plan's changes: the environment of a process the command starts."""
    env = dict(base)
    for key, value in plan.env.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def add_token_file_argument(parser, more: str = "") -> None:
    """`--auth-token-file` of the commands that meet a cluster (an argparse parser)."""
    parser.add_argument(
        "--auth-token-file", metavar="FILE",
        help="the cluster's token, when it asks for one (Ray's token authentication; a "
             "copy of the head's ~/.ray/auth_token); default: where Ray looks: "
             f"${TOKEN_ENV}, ${TOKEN_PATH_ENV}, ~/.ray/auth_token{more}")


def connect_here(address: str | None, token_file: str | None = None) -> str | None:
    """Before `ray.init(address)` in this process: match the cluster's authentication
    (`cluster_plan`) here and in Ray's cached config; returns the line for the user.
    A Ray Client address (ray://) or one that names no running cluster is left to Ray; an
    address where nothing answers raises `Unreachable` (`ray.init` would wait for ever)."""
    resolved = resolve_address(address)
    if resolved is None:
        return None
    plan = cluster_plan(resolved, token_file, must_answer=True)
    if plan.env:
        apply_here(plan)
    return plan.message


def resolve_address(address: str | None) -> str | None:
    """HOST:PORT of the GCS that `ray.init(address)` would join (Ray's own resolution of
    "auto" and $RAY_ADDRESS); None for Ray Client addresses or when it finds none."""
    if address and address.startswith("ray://"):
        return None
    try:
        from ray._private.services import canonicalize_bootstrap_address

        return canonicalize_bootstrap_address(address)
    except Exception:  # no cluster found, a bad address: ray.init says so better
        return None


def apply_here(plan: AuthPlan) -> None:
    """Put the plan's environment in this process and make Ray read it again (Ray caches
    its mode and token at import; its own token-by-default code refreshes them the same
    way)."""
    for key, value in plan.env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    from ray._raylet import AuthenticationTokenLoader, Config

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()
