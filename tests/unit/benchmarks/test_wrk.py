"""The wrk driver's pieces: the Lua script, its summary line, and one short real run."""

from __future__ import annotations

import http.server
import shutil
import socketserver
import threading

import pytest

from benchmarks.common.wrk import MARK, lua_script, lua_string, parse_summary, run_wrk


def test_lua_strings_escape_quotes_backslashes_and_bytes():
    assert lua_string('a"b\\c') == '"a\\"b\\\\c"'
    assert lua_string("é") == '"\\195\\169"'


def test_the_script_posts_the_body_file_with_every_header():
    script = lua_script("/tmp/x/body", {"Inference-Header-Content-Length": "42"})
    assert 'io.open("/tmp/x/body", "rb")' in script
    assert 'wrk.headers["Inference-Header-Content-Length"] = "42"' in script
    assert 'wrk.method = "POST"' in script and MARK in script


def test_the_summary_line_becomes_a_result_with_errors_counted():
    out = ("Running 1s test\n" + MARK + '{"requests": 1000, "duration_us": 2000000, '
           '"bytes": 1, "p50_us": 1500, "p90_us": 2000, "p99_us": 9000, "mean_us": 1600.0, '
           '"max_us": 12000, "status_errors": 10, "socket_errors": 2}\n')
    r = parse_summary(out, connections=8, client_cpu_s=0.099)
    assert (r.requests, r.errors, r.throughput_rps) == (990, 12, 495.0)
    assert (r.p50_ms, r.p99_ms) == (1.5, 9.0)
    assert r.client_cpu_us_per_req == pytest.approx(100.0)
    with pytest.raises(RuntimeError, match="no summary"):
        parse_summary("wrk: connection refused", 8, 0.0)


@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed: apt-get install wrk")
def test_a_real_run_sends_the_exact_body_and_headers():
    body = bytes(range(256)) * 2

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            got = self.rfile.read(int(self.headers["Content-Length"]))
            ok = got == body and self.headers["X-Tensor"] == 'a"b'
            self.send_response(200 if ok else 400)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        r = run_wrk(f"http://127.0.0.1:{server.server_address[1]}/infer", body,
                    {"X-Tensor": 'a"b'}, connections=1, duration_s=1)
    finally:
        server.shutdown()
        server.server_close()
    assert r.requests > 0 and r.errors == 0, r
