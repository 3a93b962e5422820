"""Publish a rendered dashboard to Grafana with `grafana-client`; every failure in one line.

`publish` checks the server (`/api/health`), finds or creates the folder by title,
and saves the dashboard with `overwrite` (same uid: a new version of the same
dashboard). What Grafana answers becomes a `PublishError` whose message says what
went wrong and what to change: the URL (unreachable), the credentials (401), the
permissions (403), the dashboard (400, 412). The HTTP client's timeout bounds each read
only, so a server that drips its answers would hold the command forever: the whole
exchange runs in a daemon thread and is given up on after `deadline_s`, saying what it
was doing (the thread, blocked on its socket, ends with the command's process).
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from typing import Any
from urllib.parse import SplitResult, urljoin, urlsplit, urlunsplit


class PublishError(Exception):
    """Publishing failed; the message is one line saying what to fix."""


@dataclass(frozen=True, slots=True)
class Published:
    url: str  # where the dashboard opens
    version: int
    uid: str
    folder: str | None


def _credential(token: str | None, user: str | None, password: str | None) -> Any:
    if token and (user or password):
        raise PublishError("give --token or --user/--password, not both")
    if (user is None) != (password is None):
        raise PublishError("--user and --password go together: give both, or --token")
    return token or ((user, password) if user is not None else None)


def _explain(e: Exception, url: str, doing: str) -> PublishError:
    """`e` (from grafana-client or the HTTP layer) as one line saying what to fix."""
    from grafana_client.client import GrafanaException, GrafanaTimeoutError

    status = getattr(e, "status_code", None)
    message = getattr(e, "message", None) or str(e)
    if isinstance(e, GrafanaException) and isinstance(e.response, dict):
        message = e.response.get("message", message)
    message = " ".join(str(message).split())[:200]
    if isinstance(e, GrafanaTimeoutError) or not isinstance(e, GrafanaException) or not status:
        errno = re.search(r"\[Errno -?\d+\] [^'\")]+", str(e))
        reason = errno.group(0) if errno else type(e).__name__
        return PublishError(f"cannot reach Grafana at {url} while {doing} ({reason}): check "
                            "--url and that Grafana is running and reachable from here")
    if status == 401:
        return PublishError(f"Grafana at {url} refused the credentials (401 {message}) while "
                            f"{doing}: check --token, or --user and --password")
    if status == 403:
        return PublishError(f"Grafana at {url} denied {doing} (403 {message}): the token or "
                            "user needs the Editor role (or write access to the folder)")
    if status in (400, 412):
        return PublishError(f"Grafana rejected the dashboard ({status} {message}) while "
                            f"{doing}: another dashboard may have its title or uid in that "
                            "folder (pass --title or --uid), or it is malformed (re-render "
                            "it with `raybatch dashboard render`)")
    return PublishError(f"Grafana at {url} answered {status} while {doing}: {message}")


def _checked(url: str) -> str:
    """`url` as it may be shown (a password in it as ***), once it is an http(s) URL with a
    host and a port in range; PublishError saying what is wrong with it otherwise."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 -- a port out of range raises here
    except ValueError as e:
        raise PublishError(f"--url is not a URL ({e}): give one like http://grafana:3000") \
            from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise PublishError(f"--url {_redacted(parts)!r} must start with http:// or https:// "
                           "and name a host")
    return _redacted(parts)


def _redacted(parts: SplitResult) -> str:
    if parts.password is None:
        return urlunsplit(parts)
    user = parts.username or ""
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def _folder_uid(api: Any, title: str) -> str:
    for folder in api.folder.get_all_folders():
        if folder.get("title") == title:
            return folder["uid"]
    return api.folder.create_folder(title)["uid"]


def publish(dashboard: dict[str, Any], url: str, *, token: str | None = None,
            user: str | None = None, password: str | None = None,
            folder: str | None = None, timeout_s: float = 10.0,
            deadline_s: float = 60.0) -> Published:
    """Save `dashboard` to the Grafana at `url` (in `folder`, created if missing).
    `timeout_s` bounds each read from the server, `deadline_s` the whole exchange."""
    from grafana_client import GrafanaApi

    url = url.rstrip("/")
    shown = _checked(url)
    api = GrafanaApi.from_url(url, credential=_credential(token, user, password),
                              timeout=timeout_s)
    doing = ["checking its health"]
    outcome: list[Any] = []

    def exchange() -> None:
        try:
            api.client.GET("/health")
            doing.append(f"finding or creating folder {folder!r}")
            folder_uid = _folder_uid(api, folder) if folder else None
            doing.append(f"saving dashboard {dashboard.get('uid')!r}")
            body: dict[str, Any] = {"dashboard": {**dashboard, "id": None},
                                    "overwrite": True,
                                    "message": "raybatch dashboard publish"}
            if folder_uid:
                body["folderUid"] = folder_uid
            outcome.append(api.dashboard.update_dashboard(body))
        except PublishError as e:
            outcome.append(e)
        except Exception as e:  # grafana-client's errors, the HTTP layer's (unreachable)
            outcome.append(_explain(e, shown, doing[-1]))

    worker = threading.Thread(target=exchange, name="grafana-publish", daemon=True)
    worker.start()
    worker.join(deadline_s)
    if not outcome:
        raise PublishError(f"Grafana at {shown} did not finish answering within "
                           f"{deadline_s:g} s while {doing[-1]}: check that --url is "
                           "Grafana's, and the network between")
    if isinstance(outcome[0], PublishError):
        raise outcome[0]
    saved = outcome[0]
    where = urljoin(shown + "/", saved.get("url") or f"/d/{saved.get('uid')}")
    return Published(where, int(saved.get("version", 0)), saved.get("uid", ""), folder)
