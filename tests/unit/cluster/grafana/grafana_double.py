"""A local double of the parts of Grafana's HTTP API that publishing uses.

    GET  /api/health                  no auth (as Grafana): {"database": "ok", "version"}
    GET  /api/folders                 the folders
    POST /api/folders                 {"title"} -> a new folder; 409 if the title exists
    POST /api/dashboards/db           {"dashboard", "folderUid"?, "overwrite"?, "message"?}
    GET  /api/dashboards/uid/{uid}    {"dashboard", "meta"} or 404

It checks auth like Grafana (Bearer token or Basic; 401 without valid ones, 403
for a viewer's token on writes) and rejects malformed bodies with 400 (not JSON,
no dashboard object, a dashboard without title or with a bad uid or schemaVersion,
an unknown folderUid). Saving keeps versions: a new uid is version 1, overwriting
adds one; without overwrite an existing uid, or another dashboard's title in the
same folder, is 412 as in Grafana. Binds 127.0.0.1 on a free port, in a thread.
"""

from __future__ import annotations

import base64
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

EDITOR_TOKEN, VIEWER_TOKEN = "glsa_editor", "glsa_viewer"
USER, PASSWORD = "admin", "s3cret"


class GrafanaDouble:
    def __init__(self) -> None:
        self.folders: dict[str, dict[str, Any]] = {}  # uid -> folder
        self.dashboards: dict[str, dict[str, Any]] = {}  # uid -> {"dashboard", "folderUid"}
        self.requests: list[tuple[str, str]] = []  # (method, path)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.02,),
                                        daemon=True)

    def __enter__(self) -> GrafanaDouble:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()

    # -- the API ---------------------------------------------------------------------------
    def role(self, headers: Any) -> str | None:
        auth = headers.get("Authorization", "")
        if auth == f"Bearer {EDITOR_TOKEN}":
            return "Editor"
        if auth == f"Bearer {VIEWER_TOKEN}":
            return "Viewer"
        if auth.startswith("Basic "):
            user, _, password = base64.b64decode(auth[6:]).decode().partition(":")
            return "Admin" if (user, password) == (USER, PASSWORD) else None
        return None

    def handle(self, method: str, path: str, headers: Any, body: bytes) -> tuple[int, Any]:
        self.requests.append((method, path))
        if (method, path) == ("GET", "/api/health"):
            return 200, {"commit": "double", "database": "ok", "version": "11.2.0"}
        role = self.role(headers)
        if role is None:
            return 401, {"message": "Invalid username or password"}
        if method == "POST" and role == "Viewer":
            return 403, {"message": "You'll need additional permissions to perform this action"}
        if method == "GET" and path == "/api/folders":
            return 200, list(self.folders.values())
        if method == "GET" and (m := re.fullmatch(r"/api/dashboards/uid/([^/]+)", path)):
            saved = self.dashboards.get(m.group(1))
            if saved is None:
                return 404, {"message": "Dashboard not found"}
            return 200, {"dashboard": saved["dashboard"], "meta": {
                "folderUid": saved["folderUid"], "url": f"/d/{m.group(1)}/x"}}
        if method != "POST" or path not in ("/api/folders", "/api/dashboards/db"):
            return 404, {"message": "Not found"}
        try:
            data = json.loads(body)
        except ValueError:
            return 400, {"message": "bad request data"}
        if not isinstance(data, dict):
            return 400, {"message": "bad request data"}
        return self.create_folder(data) if path == "/api/folders" else self.save(data)

    def create_folder(self, data: dict) -> tuple[int, Any]:
        title = data.get("title")
        if not isinstance(title, str) or not title:
            return 400, {"message": "folder title cannot be empty"}
        if any(f["title"] == title for f in self.folders.values()):
            return 409, {"message": "a folder with the same name already exists"}
        uid = f"f{len(self.folders) + 1}"
        self.folders[uid] = {"id": len(self.folders) + 1, "uid": uid, "title": title}
        return 200, self.folders[uid]

    def save(self, data: dict) -> tuple[int, Any]:
        d, folder = data.get("dashboard"), data.get("folderUid", "")
        if not isinstance(d, dict):
            return 400, {"message": "bad request data: dashboard is required"}
        title, uid = d.get("title"), d.get("uid")
        if not isinstance(title, str) or not title.strip():
            return 400, {"message": "Dashboard title cannot be empty"}
        if not isinstance(uid, str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,40}", uid):
            return 400, {"message": "uid contains illegal characters or is too long"}
        if not isinstance(d.get("schemaVersion"), int) or not isinstance(d.get("panels"), list):
            return 400, {"message": "bad request data: schemaVersion and panels"}
        if folder and folder not in self.folders:
            return 400, {"message": "folder not found"}
        old = self.dashboards.get(uid)
        clash = any(s["dashboard"]["title"] == title and s["folderUid"] == folder
                    for u, s in self.dashboards.items() if u != uid)
        if clash or (old is not None and not data.get("overwrite")):
            return 412, {"message": "A dashboard with the same name in the folder already "
                         "exists", "status": "name-exists"}
        version = old["dashboard"]["version"] + 1 if old else 1
        self.dashboards[uid] = {"dashboard": {**d, "version": version}, "folderUid": folder}
        slug = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")
        return 200, {"id": len(self.dashboards), "uid": uid, "url": f"/d/{uid}/{slug}",
                     "status": "success", "version": version, "slug": slug}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        double = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                status, payload = double.handle(method, self.path.split("?")[0], self.headers,
                                                self.rfile.read(length))
                body = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                self._serve("GET")

            def do_POST(self) -> None:
                self._serve("POST")

            def log_message(self, *args: Any) -> None:
                pass

        return Handler
