"""Token authentication as the `raybatch` commands decide it: where the token is found,
what a head turns on, how a client or joining node matches its cluster, and the GCS probe
(against an in-process gRPC server that checks tokens as Ray's GCS does; no Ray)."""

from __future__ import annotations

import socket
import stat
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from cluster.rayauth import (
    MODE_ENV,
    TOKEN_ENV,
    TOKEN_PATH_ENV,
    AuthError,
    AuthPlan,
    Reply,
    Unreachable,
    cluster_plan,
    find_token,
    generate_token,
    head_plan,
    probe_gcs,
    with_env,
)

SECRET = "0123456789abcdef" * 4  # what a generated token looks like


@pytest.fixture
def home(tmp_path: Path) -> Path:
    (tmp_path / "home").mkdir()
    return tmp_path / "home"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_the_token_is_found_where_ray_looks_in_rays_order(tmp_path, home):
    assert find_token(environ={}, home=home) is None
    default = write(home / ".ray" / "auth_token", "home-token\n")
    assert find_token(environ={}, home=home).value == "home-token"
    named = write(tmp_path / "named", "named-token")
    assert find_token(environ={TOKEN_PATH_ENV: str(named)}, home=home).path == named
    env = {TOKEN_PATH_ENV: str(named), TOKEN_ENV: " env-token "}
    assert find_token(environ=env, home=home).value == "env-token"
    flag = write(tmp_path / "flag", "flag-token")
    found = find_token(str(flag), environ=env, home=home)
    assert (found.value, found.path, found.where) == ("flag-token", flag, str(flag))
    assert "flag-token" not in repr(found)  # never in a log line or a traceback
    assert default.exists()


@pytest.mark.parametrize("content", [None, "  \n"])
def test_a_named_token_file_that_is_missing_or_empty_is_refused(tmp_path, home, content):
    path = tmp_path / "token"
    if content is not None:
        path.write_text(content)
    with pytest.raises(AuthError, match=r"--auth-token-file .*token"):
        find_token(str(path), environ={}, home=home)
    with pytest.raises(AuthError, match=rf"\${TOKEN_PATH_ENV} .*token"):
        find_token(environ={TOKEN_PATH_ENV: str(path)}, home=home)


def test_a_head_turns_token_auth_on_whatever_the_machine_had(tmp_path, home):
    fresh = head_plan(environ={}, home=home)  # no token here yet: one is generated
    assert fresh.env == {MODE_ENV: "token"}
    assert fresh.generate == home / ".ray" / "auth_token"
    assert "token authentication: on" in fresh.message and "--auth-token-file" in fresh.message
    write(home / ".ray" / "auth_token", SECRET)
    had = head_plan(environ={}, home=home)
    assert had.env == {MODE_ENV: "token"} and had.generate is None
    assert SECRET not in had.message
    flag = write(tmp_path / "cluster-token", SECRET)
    given = head_plan(str(flag), environ={TOKEN_ENV: "other"}, home=home)
    assert given.env == {MODE_ENV: "token", TOKEN_PATH_ENV: str(flag), TOKEN_ENV: None}


def test_a_head_keeps_an_explicit_mode(home):
    off = head_plan(environ={MODE_ENV: "disabled"}, home=home)
    assert off.env == {} and off.generate is None and "off" in off.message
    on = head_plan(environ={MODE_ENV: "token"}, home=home)  # and no token: one is made
    assert on.generate == home / ".ray" / "auth_token"


def test_a_generated_token_is_the_owners_only_and_an_existing_one_is_kept(home):
    path = home / ".ray" / "auth_token"
    generate_token(path)
    token = path.read_text()
    assert len(token) == 64 and int(token, 16) >= 0
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    generate_token(path)
    assert path.read_text() == token


class FakeHead:
    """A head's answers: `token` None for an open cluster; records what was asked."""

    def __init__(self, token: str | None, reachable: bool = True) -> None:
        self.token, self.reachable, self.asked = token, reachable, []

    def __call__(self, address: str, token: str | None, timeout_s: float) -> Reply:
        self.asked.append(token)
        if not self.reachable:
            return Reply.UNREACHABLE
        return Reply.ACCEPTED if self.token in (None, token) else Reply.REFUSED


def test_a_client_of_an_open_cluster_sends_no_token_even_with_one_here(home):
    write(home / ".ray" / "auth_token", SECRET)
    head = FakeHead(None)
    plan = cluster_plan("10.0.0.1:6379", environ={}, home=home, probe=head)
    assert plan.env == {MODE_ENV: "disabled"} and head.asked == [None]


def test_a_client_of_a_token_cluster_finds_the_token_and_checks_it_first(tmp_path, home):
    write(home / ".ray" / "auth_token", SECRET)
    head = FakeHead(SECRET)
    plan = cluster_plan("10.0.0.1:6379", environ={}, home=home, probe=head)
    assert plan.env == {MODE_ENV: "token"} and head.asked == [None, SECRET]
    assert SECRET not in plan.message
    copy = write(tmp_path / "copy", SECRET)
    plan = cluster_plan("10.0.0.1:6379", str(copy), environ={}, home=tmp_path, probe=head)
    assert plan.env == {MODE_ENV: "token", TOKEN_PATH_ENV: str(copy), TOKEN_ENV: None}


def test_a_token_cluster_with_no_token_here_or_another_token_is_a_clear_error(home):
    with pytest.raises(AuthError, match=r"asks for an authentication token and there is "
                                        r"none here.*--auth-token-file FILE"):
        cluster_plan("10.0.0.1:6379", environ={}, home=home, probe=FakeHead(SECRET))
    write(home / ".ray" / "auth_token", "not-the-clusters")
    with pytest.raises(AuthError, match=r"refused the token in .*auth_token: it is not "
                                        r"this cluster's") as e:
        cluster_plan("10.0.0.1:6379", environ={}, home=home, probe=FakeHead(SECRET))
    assert "not-the-clusters" not in str(e.value) and SECRET not in str(e.value)


def test_an_explicit_mode_wins_and_the_head_is_not_asked(tmp_path, home):
    head = FakeHead(SECRET)
    assert cluster_plan("h:1", environ={MODE_ENV: "disabled"}, home=home, probe=head).env == {}
    copy = write(tmp_path / "copy", SECRET)
    plan = cluster_plan("h:1", str(copy), environ={MODE_ENV: "token"}, home=home, probe=head)
    assert plan.env == {TOKEN_PATH_ENV: str(copy), TOKEN_ENV: None} and head.asked == []


def test_a_head_that_does_not_answer_leaves_rays_defaults_with_a_note(home):
    plan = cluster_plan("10.0.0.1:6379", environ={}, home=home,
                        probe=FakeHead(SECRET, reachable=False), timeout_s=3)
    assert plan.env == {} and "no answer from 10.0.0.1:6379 in 3 s" in plan.message


def test_a_joining_node_is_told_when_nothing_answers_at_the_address(home):
    # `ray start --address` to it would try again for ever, logging every few seconds
    with pytest.raises(Unreachable, match=r"nothing answered at 10.0.0.1:6379 in 3 s: start "
                                          r"the head there first"):
        cluster_plan("10.0.0.1:6379", environ={}, home=home,
                     probe=FakeHead(SECRET, reachable=False), timeout_s=3, must_answer=True)


def test_with_env_sets_and_unsets():
    plan = AuthPlan({MODE_ENV: "token", TOKEN_ENV: None})
    assert with_env(plan, {TOKEN_ENV: "x", "PATH": "/bin"}) == {MODE_ENV: "token",
                                                               "PATH": "/bin"}


@pytest.fixture
def gcs():
    """A gRPC server answering Ray's GetClusterId, and refusing it (UNAUTHENTICATED) to
    a call without `authorization: Bearer SECRET`, as a token-mode GCS does."""

    def handle(request: bytes, context: grpc.ServicerContext) -> bytes:
        if dict(context.invocation_metadata()).get("authorization") != f"Bearer {SECRET}":
            context.abort(grpc.StatusCode.UNAUTHENTICATED,
                          "InvalidAuthToken: Authentication token is missing or incorrect")
        return b""

    method = grpc.unary_unary_rpc_method_handler(handle, request_deserializer=lambda b: b,
                                                 response_serializer=lambda b: b)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        "ray.rpc.NodeInfoGcsService", {"GetClusterId": method})])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(grace=None)


def test_the_probe_tells_a_refused_call_from_an_accepted_one(gcs):
    assert probe_gcs(gcs, None, 5.0) is Reply.REFUSED
    assert probe_gcs(gcs, "wrong", 5.0) is Reply.REFUSED
    assert probe_gcs(gcs, SECRET, 5.0) is Reply.ACCEPTED


def test_the_probe_calls_nothing_listening_unreachable():
    with socket.socket() as s:  # a port held, never listened on: connections refused
        s.bind(("127.0.0.1", 0))
        assert probe_gcs(f"127.0.0.1:{s.getsockname()[1]}", None, 0.2) is Reply.UNREACHABLE


def test_a_client_is_told_when_nothing_answers_where_it_would_connect(monkeypatch):
    # `raybatch up --address` and `status --address` went on to ray.init, which waits for
    # ever (watched for 150 s)
    from cluster import rayauth

    monkeypatch.setattr(rayauth, "probe_gcs", lambda address, token, timeout_s:
                        Reply.UNREACHABLE)
    monkeypatch.delenv(MODE_ENV, raising=False)
    with pytest.raises(Unreachable, match=r"nothing answered at 10\.0\.0\.1:6379 in 10 s"):
        rayauth.connect_here("10.0.0.1:6379")
