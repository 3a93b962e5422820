"""The hostile suite's cases: bytes a broken or hostile client sends, and what the server
must answer. Each case is (id, app, bytes, statuses, end):

- app: "echo" (framing: a 200 echoes what the server framed) or "oip" (the OIP app);
- statuses: the final statuses expected, in order (1xx are not counted);
- end: "open" (the connection stays usable: a request sent after gets its 200),
  "close" (the server closes after those answers, without a reset), or "eof" (the client
  half-closes after its bytes; the server answers what it must, then closes).

The classes: request line, Host, Content-Length, Transfer-Encoding and trailers, header
syntax and size, pipelining and ordering, Expect, upgrades and CONNECT, bodies and OIP
headers, control bytes anywhere.
"""

from __future__ import annotations

import json

from tests.unit.deployments.http.wire import request

INFER = "/v2/models/square/infer"
LIVE = request("GET", "/v2/health/live")
BODY = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1],
                               "data": [3.0]}]}).encode()
OK_INFER = request("POST", INFER, BODY)
BAD_INFER = request("POST", INFER, b"{")  # well framed, refused by the app (400)
H = "host: a\r\n"


def raw(text: str) -> bytes:
    return text.encode("latin-1")


def chunked(*chunks: bytes, trailer: str = "", head: str = "") -> bytes:
    body = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n"
    return raw(f"POST /x HTTP/1.1\r\n{H}transfer-encoding: chunked\r\n{head}\r\n") + body + \
        raw(trailer) + b"\r\n"


def post(te: str | None = None, cl: str | None = None, body: bytes = b"hello",
         version: str = "1.1", extra: str = "") -> bytes:
    head = f"POST /x HTTP/{version}\r\n{H}"
    if te is not None:
        head += f"transfer-encoding: {te}\r\n"
    if cl is not None:
        head += f"content-length: {cl}\r\n"
    return raw(head + extra + "\r\n") + body


CASES: list[tuple[str, str, bytes, list[int], str]] = [
    # -- request line -------------------------------------------------------------------
    ("line-ok", "echo", raw(f"GET /a HTTP/1.1\r\n{H}\r\n"), [200], "open"),
    ("line-http10-closes", "echo", raw("GET /a HTTP/1.0\r\n\r\n"), [200], "close"),
    ("line-http10-keepalive", "echo", raw("GET /a HTTP/1.0\r\nconnection: keep-alive\r\n\r\n"),
     [200], "open"),
    ("line-http20", "echo", raw(f"GET /a HTTP/2.0\r\n{H}\r\n"), [400], "close"),
    ("line-http09", "echo", raw("GET /a\r\n\r\n"), [400], "close"),
    ("line-http12", "echo", raw(f"GET /a HTTP/1.2\r\n{H}\r\n"), [400], "close"),
    ("line-http110", "echo", raw(f"GET /a HTTP/1.10\r\n{H}\r\n"), [400], "close"),
    ("line-lowercase-version", "echo", raw(f"GET /a http/1.1\r\n{H}\r\n"), [400], "close"),
    ("line-h2-preface", "echo", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", [400], "close"),
    ("line-bad-method-char", "echo", raw(f"G@T /a HTTP/1.1\r\n{H}\r\n"), [400], "close"),
    ("line-lowercase-method", "echo", raw(f"get /a HTTP/1.1\r\n{H}\r\n"), [400], "close"),
    ("line-unknown-method", "echo", raw(f"FROB /a HTTP/1.1\r\n{H}\r\n"), [400], "close"),
    ("line-connect", "echo", raw(f"CONNECT a:443 HTTP/1.1\r\n{H}\r\n"), [405], "close"),
    ("line-absolute-form", "echo", raw(f"GET http://a/b?c=1 HTTP/1.1\r\n{H}\r\n"), [200],
     "open"),
    ("line-absolute-bad-port", "echo", raw(f"GET http://a:99999999/ HTTP/1.1\r\n{H}\r\n"),
     [400], "close"),
    ("line-authority-form-get", "echo", raw(f"GET a:80 HTTP/1.1\r\n{H}\r\n"), [400], "close"),
    ("line-space-in-target", "echo", raw(f"GET /a b HTTP/1.1\r\n{H}\r\n"), [400], "close"),
    # RFC 9112 3: a recipient may take any whitespace between the request line's parts
    ("line-double-space", "echo", raw(f"GET  /a HTTP/1.1\r\n{H}\r\n"), [200], "open"),
    ("line-tab-separator", "echo", raw(f"GET\t/a HTTP/1.1\r\n{H}\r\n"), [400], "close"),
    ("line-no-target", "echo", raw(f"GET HTTP/1.1\r\n{H}\r\n"), [400], "close"),
    ("line-leading-crlf", "echo", raw(f"\r\nGET /a HTTP/1.1\r\n{H}\r\n"), [200], "open"),
    ("line-bare-lf", "echo", raw("GET /a HTTP/1.1\nhost: a\n\n"), [400], "close"),
    ("line-long-url", "echo", raw(f"GET /{'a' * 20000} HTTP/1.1\r\n{H}\r\n"), [414], "close"),
    ("line-url-never-ends", "echo", raw("GET /" + "a" * 200_000), [414], "close"),
    ("line-percent-path", "oip", raw(f"GET /v2/health/%6Cive HTTP/1.1\r\n{H}\r\n"), [200],
     "open"),
    ("line-bad-percent", "oip", raw(f"GET /v2/%zz HTTP/1.1\r\n{H}\r\n"), [404], "open"),
    ("line-fragment", "echo", raw(f"GET /a#frag HTTP/1.1\r\n{H}\r\n"), [200], "open"),
    ("line-only-crlf-then-eof", "echo", b"\r\n", [], "eof"),
    ("line-garbage", "echo", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", [400], "close"),
    # -- Host ---------------------------------------------------------------------------
    ("host-missing-11", "echo", raw("GET /a HTTP/1.1\r\n\r\n"), [400], "close"),
    ("host-missing-10", "echo", raw("GET /a HTTP/1.0\r\n\r\n"), [200], "close"),
    ("host-twice", "echo", raw("GET /a HTTP/1.1\r\nhost: a\r\nhost: b\r\n\r\n"), [400],
     "close"),
    ("host-twice-10", "echo", raw("GET /a HTTP/1.0\r\nhost: a\r\nHost: a\r\n\r\n"), [400],
     "close"),
    ("host-empty", "echo", raw("GET /a HTTP/1.1\r\nhost:\r\n\r\n"), [200], "open"),
    # -- Content-Length -----------------------------------------------------------------
    ("cl-ok", "echo", post(cl="5"), [200], "open"),
    ("cl-zero", "echo", post(cl="0", body=b""), [200], "open"),
    ("cl-leading-zeros", "echo", post(cl="0005"), [200], "open"),
    ("cl-ows", "echo", post(cl=" 5 "), [200], "open"),
    ("cl-negative", "echo", post(cl="-5"), [400], "close"),
    ("cl-plus", "echo", post(cl="+5"), [400], "close"),
    ("cl-hex", "echo", post(cl="0x5"), [400], "close"),
    ("cl-letters", "echo", post(cl="abc"), [400], "close"),
    ("cl-empty", "echo", post(cl=""), [400], "close"),
    ("cl-list", "echo", post(cl="5, 5"), [400], "close"),
    ("cl-twice-same", "echo", post(cl="5", extra="content-length: 5\r\n"), [400], "close"),
    ("cl-twice-differ", "echo", post(cl="5", extra="content-length: 6\r\n"), [400], "close"),
    ("cl-5000-digits", "echo", post(cl="9" * 5000), [400], "close"),
    ("cl-overflow-u64", "echo", post(cl="18446744073709551616"), [400], "close"),
    ("cl-past-max-body", "oip", raw(f"POST {INFER} HTTP/1.1\r\n{H}content-length: "
                                    "99999999999\r\n\r\n"), [413], "close"),
    ("cl-short-body-then-eof", "echo", post(cl="50"), [], "eof"),
    ("cl-body-longer", "echo", post(cl="2", body=b"hiGARBAGE\r\n\r\n"), [200, 400], "close"),
    ("cl-body-longer-waits", "echo", post(cl="2", body=b"hiGET"), [200], "eof"),
    ("cl-on-get", "echo", raw(f"GET /a HTTP/1.1\r\n{H}content-length: 3\r\n\r\nabc"), [200],
     "open"),
    ("cl-space-in-name", "echo", post(extra="content-length : 5\r\n"), [400], "close"),
    # -- Transfer-Encoding and trailers -------------------------------------------------
    ("te-chunked", "echo", chunked(b"hello", b" world"), [200], "open"),
    ("te-chunked-ext", "echo", raw(f"POST /x HTTP/1.1\r\n{H}transfer-encoding: chunked\r\n\r\n"
                                   "5;name=value\r\nhello\r\n0\r\n\r\n"), [200], "open"),
    ("te-uppercase", "echo", post(te="Chunked", body=b"5\r\nhello\r\n0\r\n\r\n"), [200], "open"),
    ("te-bad-hex", "echo", post(te="chunked", body=b"zz\r\nhello\r\n0\r\n\r\n"), [400], "close"),
    ("te-size-overflow", "echo", post(te="chunked", body=b"ffffffffffffffffff\r\nx\r\n"), [400],
     "close"),
    ("te-missing-crlf", "echo", post(te="chunked", body=b"5\r\nhelloXX0\r\n\r\n"), [400],
     "close"),
    ("te-negative-size", "echo", post(te="chunked", body=b"-5\r\nhello\r\n0\r\n\r\n"), [400],
     "close"),
    ("te-and-cl", "echo", post(te="chunked", cl="5", body=b"5\r\nhello\r\n0\r\n\r\n"), [400],
     "close"),
    ("te-in-http10", "echo", post(te="chunked", version="1.0",
                                  body=b"5\r\nhello\r\n0\r\n\r\n"), [400], "close"),
    ("te-xchunked", "echo", post(te="xchunked", body=b""), [400], "close"),
    ("te-identity", "echo", post(te="identity", cl=None, body=b""), [400], "close"),
    ("te-gzip-chunked", "echo", post(te="gzip, chunked", body=b"5\r\nhello\r\n0\r\n\r\n"), [400],
     "close"),
    ("te-chunked-gzip", "echo", post(te="chunked, gzip", body=b""), [400], "close"),
    ("te-chunked-twice", "echo", post(te="chunked, chunked", body=b"0\r\n\r\n"), [400], "close"),
    ("te-two-headers", "echo", post(te="gzip", extra="transfer-encoding: chunked\r\n",
                                    body=b"0\r\n\r\n"), [400], "close"),
    ("te-empty", "echo", post(te="", body=b""), [400], "close"),
    ("te-trailer-ok", "echo", chunked(b"hello", trailer="x-checksum: 1\r\n"), [200], "open"),
    # framing fields are not allowed in a trailer (RFC 9110 6.5.1): refused, never used
    ("te-trailer-cl-refused", "echo", chunked(b"hello", trailer="content-length: 99\r\n"),
     [400], "close"),
    ("te-trailer-te-refused", "echo", chunked(b"hello", trailer="transfer-encoding: gzip\r\n"),
     [400], "close"),
    ("te-trailer-too-large", "echo", chunked(b"hello", trailer="x: " + "a" * 20000 + "\r\n"),
     [431], "close"),
    ("te-trailer-bad-syntax", "echo", chunked(b"hello", trailer="no colon here\r\n"), [400],
     "close"),
    ("te-eof-mid-chunk", "echo", post(te="chunked", body=b"a\r\nhel"), [], "eof"),
    ("te-eof-before-last", "echo", post(te="chunked", body=b"5\r\nhello\r\n"), [], "eof"),
    # -- header syntax and size ---------------------------------------------------------
    ("hdr-no-colon", "echo", raw(f"GET /a HTTP/1.1\r\n{H}x-a\r\n\r\n"), [400], "close"),
    ("hdr-space-before-colon", "echo", raw("GET /a HTTP/1.1\r\nhost : a\r\n\r\n"), [400],
     "close"),
    ("hdr-obs-fold", "echo", raw(f"GET /a HTTP/1.1\r\n{H}x-a: b\r\n c\r\n\r\n"), [400], "close"),
    ("hdr-empty-name", "echo", raw(f"GET /a HTTP/1.1\r\n{H}: x\r\n\r\n"), [400], "close"),
    ("hdr-bad-name-char", "echo", raw(f"GET /a HTTP/1.1\r\n{H}x(a): 1\r\n\r\n"), [400],
     "close"),
    ("hdr-nul-value", "echo", raw(f"GET /a HTTP/1.1\r\n{H}x-a: b\x00c\r\n\r\n"), [400], "close"),
    ("hdr-bare-cr-value", "echo", raw(f"GET /a HTTP/1.1\r\n{H}x-a: b\rc\r\n\r\n"), [400],
     "close"),
    ("hdr-obs-text-value", "echo", raw(f"GET /a HTTP/1.1\r\n{H}x-a: caf\xe9\r\n\r\n"), [200],
     "open"),
    ("hdr-spaces-value", "echo", raw(f"GET /a HTTP/1.1\r\n{H}x-a:    \r\n\r\n"), [200], "open"),
    ("hdr-line-never-ends", "echo", raw(f"GET /a HTTP/1.1\r\n{H}x-a: " + "a" * 4_000_000),
     [431], "close"),
    ("hdr-name-never-ends", "echo", raw(f"GET /a HTTP/1.1\r\n{H}" + "a" * 4_000_000), [431],
     "close"),
    ("hdr-too-many-lines", "echo", raw("GET /a HTTP/1.1\r\n" + H + "".join(
        f"x-{i}: {'v' * 200}\r\n" for i in range(100)) + "\r\n"), [431], "close"),
    ("hdr-just-under-limit", "echo", raw(f"GET /a HTTP/1.1\r\n{H}x: {'a' * 15000}\r\n\r\n"),
     [200], "open"),
    ("hdr-just-over-limit", "echo", raw(f"GET /a HTTP/1.1\r\n{H}x: {'a' * 17000}\r\n\r\n"),
     [431], "close"),
    ("hdr-too-many-for-app", "oip", raw("GET /v2/health/live HTTP/1.1\r\n" + H + "".join(
        f"x-{i}: 1\r\n" for i in range(150)) + "\r\n"), [431], "close"),
    ("hdr-eof-mid-head", "echo", raw(f"GET /a HTTP/1.1\r\n{H}x-a: b"), [], "eof"),
    # -- pipelining and ordering --------------------------------------------------------
    ("pipe-two", "echo", raw(f"GET /1 HTTP/1.1\r\n{H}\r\nGET /2 HTTP/1.1\r\n{H}\r\n"),
     [200, 200], "open"),
    ("pipe-fifty", "oip", OK_INFER * 50, [200] * 50, "open"),
    ("pipe-valid-then-garbage", "oip", OK_INFER + b"\x00\x01garbage\r\n\r\n", [200, 400],
     "close"),
    ("pipe-valid-then-oversized-head", "oip",
     OK_INFER + raw(f"GET /a HTTP/1.1\r\n{H}x: {'a' * 40000}\r\n\r\n"), [200, 431], "close"),
    ("pipe-valid-then-line-never-ends", "oip", OK_INFER + raw("GET /" + "a" * 100_000), [200,
                                                                                        414],
     "close"),
    ("pipe-close-then-more", "oip",
     request("POST", INFER, BODY, connection="close") + OK_INFER + b"garbage", [200], "close"),
    ("pipe-close-then-garbage", "echo",
     raw(f"GET /a HTTP/1.1\r\n{H}connection: close\r\n\r\n") + b"\x00" * 1000, [200], "close"),
    ("pipe-valid-then-500-bad", "oip", OK_INFER + BAD_INFER * 500, [200] + [400] * 500, "open"),
    ("pipe-1000-tiny", "echo", raw(f"GET / HTTP/1.1\r\n{H}\r\n") * 1000, [200] * 1000, "open"),
    ("pipe-valid-then-cut", "oip", OK_INFER + OK_INFER[:40], [200], "eof"),
    ("pipe-mixed", "oip", LIVE + OK_INFER + request("GET", "/v2/models/square") + OK_INFER,
     [200] * 4, "open"),
    ("pipe-404-then-ok", "oip", request("GET", "/nope") + LIVE, [404, 200], "open"),
    ("pipe-http10-then-more", "echo", raw("GET /a HTTP/1.0\r\n\r\nGET /b HTTP/1.0\r\n\r\n"),
     [200], "close"),
    # -- Expect -------------------------------------------------------------------------
    ("expect-unknown", "echo", post(cl="5", extra="expect: the-impossible\r\n"), [417], "close"),
    ("expect-with-body-at-once", "echo", post(cl="5", extra="expect: 100-continue\r\n"), [200],
     "open"),
    ("expect-before-cl", "echo", raw(f"POST /x HTTP/1.1\r\n{H}expect: 100-continue\r\n"
                                     "content-length: 5\r\n\r\nhello"), [200], "open"),
    # -- upgrades and CONNECT -----------------------------------------------------------
    ("upgrade-websocket", "oip", raw(f"GET /v2/health/live HTTP/1.1\r\n{H}connection: upgrade"
                                     "\r\nupgrade: websocket\r\n\r\n"), [200], "close"),
    ("upgrade-h2c", "oip", raw(f"GET /v2/health/live HTTP/1.1\r\n{H}connection: Upgrade, "
                               "HTTP2-Settings\r\nupgrade: h2c\r\nhttp2-settings: AAMAAABkAAQ"
                               "AAP__\r\n\r\n"), [200], "close"),
    ("upgrade-connect-with-body", "echo", raw(f"CONNECT a:443 HTTP/1.1\r\n{H}\r\n") + b"\x16" *
     50, [405], "close"),
    # -- bodies and the OIP headers -----------------------------------------------------
    ("oip-infer", "oip", OK_INFER, [200], "open"),
    ("oip-bad-json", "oip", BAD_INFER, [400], "open"),
    ("oip-ichl-5000-digits", "oip", request("POST", INFER, BODY, inference_header_content_length=
                                            "9" * 5000), [400], "open"),
    ("oip-ichl-letters", "oip", request("POST", INFER, BODY, inference_header_content_length="x"),
     [400], "open"),
    ("oip-ichl-zero", "oip", request("POST", INFER, BODY, inference_header_content_length="0"),
     [400], "open"),
    ("oip-ichl-past-body", "oip", request("POST", INFER, BODY,
                                          inference_header_content_length="9999"), [400], "open"),
    ("oip-chunked-infer", "oip", raw(f"POST {INFER} HTTP/1.1\r\n{H}transfer-encoding: chunked"
                                     "\r\n\r\n") + b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY),
     [200], "open"),
    ("oip-chunked-trailer-ichl", "oip", raw(f"POST {INFER} HTTP/1.1\r\n{H}transfer-encoding: "
                                            "chunked\r\n\r\n") + b"%x\r\n%s\r\n0\r\n"
     b"inference-header-content-length: 3\r\ncontent-encoding: gzip\r\n\r\n" % (len(BODY), BODY),
     [200], "open"),
    ("oip-unknown-model", "oip", request("POST", "/v2/models/nope/infer", BODY), [404], "open"),
    ("oip-get-on-infer", "oip", request("GET", INFER), [405], "open"),
]

# Control bytes where HTTP allows none: the target, a header name, a header value.
for byte in (0x00, 0x01, 0x07, 0x08, 0x0B, 0x0C, 0x0E, 0x1B, 0x1F, 0x7F):
    c = chr(byte)
    CASES.append((f"ctl-{byte:02x}-target", "echo", raw(f"GET /a{c}b HTTP/1.1\r\n{H}\r\n"), [400],
                  "close"))
    CASES.append((f"ctl-{byte:02x}-name", "echo", raw(f"GET /a HTTP/1.1\r\n{H}x{c}a: 1\r\n\r\n"),
                  [400], "close"))
    CASES.append((f"ctl-{byte:02x}-value", "echo",
                  raw(f"GET /a HTTP/1.1\r\n{H}x-a: 1{c}2\r\n\r\n"), [400] if byte != 0x09 else
                  [200], "close"))
