"""`raybatch dashboard render / publish` against a local double of Grafana's API."""

from __future__ import annotations

import json

import pytest

from cluster.config import load_default
from cluster.grafana.dashboard import render_dashboard
from cluster.grafana.publish import PublishError, publish
from raybatch.main import main
from tests.conftest import free_port
from tests.unit.cluster.grafana.grafana_double import (
    EDITOR_TOKEN,
    PASSWORD,
    USER,
    VIEWER_TOKEN,
    GrafanaDouble,
)


@pytest.fixture
def grafana():
    with GrafanaDouble() as g:
        yield g


def cli(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(["dashboard", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_render_writes_the_dashboard_of_the_config(tmp_path, capsys):
    target = tmp_path / "dash.json"
    rc, out, _ = cli(capsys, "render", "-o", str(target))
    assert rc == 0 and str(target) in out
    assert json.loads(target.read_text()) == render_dashboard(load_default())
    rc, out, _ = cli(capsys, "render", "--uid", "mine", "--title", "Mine")
    assert rc == 0 and json.loads(out)["uid"] == "mine" and json.loads(out)["title"] == "Mine"


def test_render_names_a_bad_config_in_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("models: 3\n")
    rc, _, err = cli(capsys, "render", "--config", str(bad))
    assert rc == 1 and "bad.yaml" in err


def test_publish_creates_the_folder_once_overwrites_and_prints_url_and_version(grafana, capsys):
    args = ("publish", "--url", grafana.url, "--token", EDITOR_TOKEN, "--folder", "Raybatch")
    rc, out, err = cli(capsys, *args)
    assert rc == 0, err
    assert out.strip() == (f"published 'Raybatch: raybatch' in folder 'Raybatch': "
                           f"{grafana.url}/d/raybatch/raybatch-raybatch (version 1)")
    rc, out, _ = cli(capsys, *args)
    assert rc == 0 and out.strip().endswith("(version 2)")
    assert [f["title"] for f in grafana.folders.values()] == ["Raybatch"]
    saved = grafana.dashboards["raybatch"]
    assert saved["folderUid"] == "f1" and saved["dashboard"]["version"] == 2
    assert saved["dashboard"]["panels"] == render_dashboard(load_default())["panels"]
    assert ("GET", "/api/health") in grafana.requests


def test_publish_with_basic_auth_and_no_folder_lands_in_general(grafana, capsys):
    rc, out, err = cli(capsys, "publish", "--url", grafana.url + "/", "--user", USER,
                       "--password", PASSWORD, "--uid", "basic")
    assert rc == 0, err
    assert grafana.dashboards["basic"]["folderUid"] == "" and "(version 1)" in out


@pytest.mark.parametrize(("creds", "fix"), [
    (("--token", "wrong"), "401"),
    (("--user", USER, "--password", "nope"), "check --token, or --user and --password"),
    (("--token", VIEWER_TOKEN), "403"),
])
def test_refused_credentials_give_one_line_saying_what_to_fix(grafana, capsys, creds, fix):
    rc, out, err = cli(capsys, "publish", "--url", grafana.url, *creds)
    assert rc == 1 and out == ""
    assert err.count("\n") == 1 and fix in err, err
    assert grafana.dashboards == {}


def test_an_unreachable_server_is_named_with_the_url_to_check(capsys):
    url = f"http://127.0.0.1:{free_port()}"
    rc, _, err = cli(capsys, "publish", "--url", url, "--token", EDITOR_TOKEN)
    assert rc == 1 and err.count("\n") == 1
    assert f"cannot reach Grafana at {url}" in err and "check --url" in err


def test_a_rejected_dashboard_says_why_and_what_to_change(grafana, capsys):
    d = render_dashboard(load_default())
    with pytest.raises(PublishError, match=r"400 Dashboard title cannot be empty"):
        publish({**d, "title": ""}, grafana.url, token=EDITOR_TOKEN)
    with pytest.raises(PublishError, match=r"400 uid contains illegal"):
        publish({**d, "uid": "no spaces allowed"}, grafana.url, token=EDITOR_TOKEN)
    publish({**d, "uid": "other"}, grafana.url, token=EDITOR_TOKEN)  # same title, other uid
    rc, _, err = cli(capsys, "publish", "--url", grafana.url, "--token", EDITOR_TOKEN)
    assert rc == 1 and err.count("\n") == 1
    assert "412" in err and "pass --title or --uid" in err


def test_the_double_rejects_malformed_bodies_and_missing_auth(grafana):
    import urllib.error
    import urllib.request

    def post(path, body: bytes, auth=f"Bearer {EDITOR_TOKEN}"):
        req = urllib.request.Request(grafana.url + path, body, method="POST",
                                     headers={"Authorization": auth} if auth else {})
        try:
            return urllib.request.urlopen(req, timeout=5).status
        except urllib.error.HTTPError as e:
            return e.code

    assert post("/api/dashboards/db", b"{not json") == 400
    assert post("/api/dashboards/db", b'{"dashboard": 3}') == 400
    assert post("/api/dashboards/db", b'{"dashboard": {"title": "t", "uid": "u"}}') == 400
    assert post("/api/folders", b'{"title": "x"}', auth=None) == 401
    assert post("/api/folders", b'{"title": ""}') == 400


def test_contradictory_credentials_are_refused_before_any_request(grafana):
    with pytest.raises(PublishError, match="not both"):
        publish({}, grafana.url, token="t", user="u", password="p")
    with pytest.raises(PublishError, match="go together"):
        publish({}, grafana.url, user="u")
    with pytest.raises(PublishError, match="must start with http"):
        publish({}, "grafana:3000", token="t")
    assert grafana.requests == []


@pytest.mark.parametrize(("url", "says"), [
    ("http://[::1", "--url is not a URL (Invalid IPv6 URL): give one like http://grafana:3000"),
    ("http://127.0.0.1:99999", "--url is not a URL (Port out of range 0-65535)"),
    ("http://", "--url 'http://' must start with http:// or https:// and name a host"),
    ("ftp://grafana", "--url 'ftp://grafana' must start with http:// or https://"),
])
def test_a_url_that_is_not_one_is_said_in_one_line(capsys, url, says):
    rc, out, err = cli(capsys, "publish", "--url", url, "--token", EDITOR_TOKEN)
    assert rc == 1 and out == "" and err.count("\n") == 1, err
    assert says in err, err


def test_a_password_in_the_url_is_used_but_never_shown(grafana, capsys):
    """Credentials may ride in the URL, as curl takes them; what is printed (the published
    dashboard's address, or an error naming the server) shows the password as ***."""
    host = grafana.url.split("://", 1)[1]
    rc, out, err = cli(capsys, "publish", "--url", f"http://{USER}:{PASSWORD}@{host}")
    assert rc == 0, err
    assert f"http://{USER}:***@{host}/d/raybatch" in out and PASSWORD not in out, out
    url = f"http://{USER}:{PASSWORD}@127.0.0.1:{free_port()}"
    rc, out, err = cli(capsys, "publish", "--url", url)
    assert rc == 1 and PASSWORD not in err, err
    assert f"cannot reach Grafana at http://{USER}:***@127.0.0.1:" in err



def test_a_server_that_drips_its_answer_is_given_up_on_at_the_deadline():
    """Each read gets a byte in time (the per-read timeout never fires): the deadline on the
    whole exchange ends it, saying what it was doing."""
    import socket
    import threading

    stop = threading.Event()
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def drip() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 1000000\r\n\r\n")
            while not stop.wait(0.02):
                try:
                    conn.sendall(b" ")
                except OSError:
                    return

    server = threading.Thread(target=drip, daemon=True)
    server.start()
    try:
        with pytest.raises(PublishError) as e:
            publish({"uid": "u", "title": "t"}, f"http://127.0.0.1:{port}",
                    token=EDITOR_TOKEN, timeout_s=5.0, deadline_s=0.5)
    finally:
        stop.set()
        server.join(10)
        listener.close()
    assert str(e.value) == (f"Grafana at http://127.0.0.1:{port} did not finish answering "
                            "within 0.5 s while checking its health: check that --url is "
                            "Grafana's, and the network between")
