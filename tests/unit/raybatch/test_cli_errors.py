"""The command line's wrong input and failures: a line saying what to fix and a non-zero
exit, never a traceback, and an `up` that fails once its Ray runs stops that Ray. No Ray
here: where a command would reach one, the call it makes is replaced."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from raybatch.main import build_parser, main


@pytest.mark.parametrize("args", [
    ["up", "--port", "-5"], ["up", "--port", "99999"], ["up", "--port", "http"],
    ["up", "--grpc-port", "0"], ["up", "--metrics-port", "70000"],
    ["up", "--native-port", "-1"],
])
def test_a_port_out_of_range_is_refused_before_anything_starts(args, capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(args)
    assert e.value.code == 2
    assert "is not a port: give 1..65535" in capsys.readouterr().err


@pytest.mark.parametrize("args, words", [
    (["demo", "--concurrency", "0"], "give an integer from 1 to 100,000"),
    (["demo", "--concurrency", "100000000"], "give an integer from 1 to 100,000"),  # hung
    (["demo", "--seconds", "-1"], "give a number above 0"),
    (["demo", "--seconds", "nan"], "give a number above 0"),
    (["demo", "--max-batch-size", "0"], "give an integer above 0"),
    (["demo", "--max-queue-delay-ms", "-5"], "give a number 0 or more"),
    (["status", "--watch", "--interval", "0"], "give a number of 0.1 or more"),
    (["status", "--watch", "--interval", "1e-300"], "give a number of 0.1 or more"),
    (["status", "--count", "-1"], "give an integer 0 or more"),
    (["down", "--timeout", "inf"], "give a number 0 or more"),
    (["up", "--num-cpus", "-5"], "give an integer 0 or more"),
    (["up", "--num-gpus", "-1"], "give an integer 0 or more"),
    (["join", "--num-cpus", "-2"], "give an integer 0 or more"),
])
def test_a_number_out_of_its_range_is_refused_by_the_parser(args, words, capsys):
    # the demo ran and failed with numpy's IndexError, or pydantic's traceback
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(args)
    assert e.value.code == 2 and words in capsys.readouterr().err


@pytest.mark.parametrize("command", [["status"], ["status", "--watch"], ["up"], ["join"]])
@pytest.mark.parametrize("address", ["", "http://[::1", "127.0.0.1:99999", "head", "h:0",
                                     "[::1]:6379x", "::1:6379", "host name:6379",
                                     "http://head:8265", "head:\uff16\uff13\uff17\uff19"])
def test_an_address_that_is_not_a_ray_address_is_refused_by_the_parser(command, address,
                                                                         capsys):
    """Ray took these with a ValueError's traceback (`''`, an HTTP URL), or waited a
    minute for a GCS at an empty host (`up --address ''`)."""
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args([*command, "--address", address])
    assert e.value.code == 2
    assert (f"--address: {address!r} is not a Ray address: give HOST:PORT of the head's GCS"
            in capsys.readouterr().err)


@pytest.mark.parametrize("address", ["auto", "10.0.0.1:6379", "head-0.svc:6379",
                                     "[::1]:6379", "ray://head:10001"])
def test_a_ray_address_is_taken_as_given(address):
    for command in (["status"], ["up"], ["join"]):
        assert build_parser().parse_args([*command, "--address", address]).address == address


def test_status_watch_without_a_cluster_says_so_as_status_does(monkeypatch, capsys):
    import ray

    def no_cluster(**kwargs):
        raise ConnectionError("Could not find any running Ray instance.")

    _no_auth_probe(monkeypatch)
    monkeypatch.setattr(ray, "init", no_cluster)
    assert main(["status", "--watch", "--count", "1"]) == 2  # a traceback before
    assert "raybatch status: no Ray cluster to ask" in capsys.readouterr().err


def test_native_port_0_still_means_none():
    assert build_parser().parse_args(["up", "--native-port", "0"]).native_port == 0


def test_a_file_that_cannot_be_written_is_a_line_not_a_traceback(tmp_path, capsys):
    where = tmp_path / "no-such-folder" / "app.py"
    assert main(["build", "-o", str(where)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("raybatch build: ") and "No such file or directory" in err
    assert "Traceback" not in err


def _no_auth_probe(monkeypatch) -> None:
    """`status` asks the cluster it finds about its token first: none here (a Ray running
    on this machine, such as the integration tests', must not be asked, nor its token
    auth put in this process's environment)."""
    from raybatch import apphandle

    monkeypatch.setattr(apphandle, "connect_here", lambda address, token_file: None)


def test_status_without_a_cluster_says_so(monkeypatch, capsys):
    import ray

    def no_cluster(**kwargs):
        raise ConnectionError("Could not find any running Ray instance.")

    _no_auth_probe(monkeypatch)
    monkeypatch.setattr(ray, "init", no_cluster)
    assert main(["status"]) == 2
    err = capsys.readouterr().err
    assert "raybatch status: no Ray cluster to ask" in err and "raybatch up" in err


def test_status_of_an_app_that_is_not_there_says_so(monkeypatch, capsys):
    import ray
    from ray import serve
    from ray.serve.exceptions import RayServeException

    def no_app(name):
        raise RayServeException(f"Application '{name}' does not exist.")

    _no_auth_probe(monkeypatch)
    monkeypatch.setattr(ray, "init", lambda **kwargs: None)
    monkeypatch.setattr(serve, "get_app_handle", no_app)
    assert main(["status", "--app", "nope"]) == 2
    err = capsys.readouterr().err
    assert "Application 'nope' does not exist" in err and "--app names the app" in err


def test_an_up_that_fails_once_its_ray_runs_stops_what_it_started(monkeypatch, tmp_path):
    from raybatch import serving, startup

    stopped = []
    # nothing of this process's own is changed: its signal handlers, Serve's environment
    monkeypatch.setattr(startup.Stopper, "install", lambda self: None)
    monkeypatch.setattr(serving, "serve_environment_here", lambda config, local: {})
    monkeypatch.setattr(serving, "_claim_ports", lambda ports, config: SimpleNamespace())
    monkeypatch.setattr(startup, "fits_as_asked", lambda *a: True)
    monkeypatch.setattr(startup, "start_local_ray", lambda init, stopper, **options: None)
    done = threading.Thread(target=lambda: None)
    done.start()
    monkeypatch.setattr(serving, "_import_in_background", lambda *modules: done)
    monkeypatch.setattr(startup, "stop", lambda *a, **k: stopped.append(a[0]) or 0)

    def broken(*args):
        raise RuntimeError("Serve's proxy did not start")

    monkeypatch.setattr(serving, "_serve", broken)
    args = build_parser().parse_args(["up", "--sysfs-root", str(tmp_path)])
    with pytest.raises(RuntimeError, match="proxy did not start"):
        serving.up(args)
    assert stopped == ["raybatch"]  # the demo's app, its Serve and its Ray


def test_python_dash_m_raybatch_runs_the_command_without_a_warning():
    """`python -m raybatch` (as the tests and the lab start it where the script is not on
    PATH) is the command, and says nothing but what it was asked: `-m raybatch.main` made
    runpy warn that the package had imported the module it was about to run."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "raybatch", "--help"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: raybatch"), done.stdout
    assert done.stderr == ""
