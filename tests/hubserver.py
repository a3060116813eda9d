"""A loopback Hugging Face Hub for the tests: the real huggingface_hub client talks to it through HF_ENDPOINT.

It serves the endpoints the client uses (model info, recursive tree listing, HEAD/GET on
``resolve/<rev>/<path>`` with Range and the X-Repo-Commit / X-Linked-Etag / X-Linked-Size headers),
with the Hub's error codes (RepoNotFound, RevisionNotFound, EntryNotFound, GatedRepo), and counts every
request and byte so tests can hold the planner to "no weights fetched".
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

DRIP = 0.5  # seconds between the bytes of a dripped answer


@dataclass
class Repo:
    files: dict[str, Path]  # repo path -> local file, in listing order
    commit: str = ""
    gated: bool = False
    token: str = "hf_" + "x" * 34  # the token that opens a gated repo
    hide: set[str] = field(default_factory=set)  # listed in the tree but answered 404 (a partial upload)
    unlisted: set[str] = field(default_factory=set)  # present but not in the listing


@dataclass
class Request:
    method: str
    path: str
    range: str | None
    sent: int


class FakeHub:
    def __init__(self) -> None:
        # a fault to inject: "html" (every answer is a web page), "stall_tree" (the tree listing never answers),
        # "drip_info" / "drip_file" (the repo's info, or a file's bytes, one byte every DRIP seconds)
        self.fault: str | None = None
        self.delay_per_mib = 0.0  # seconds between 1 MiB chunks of a file (a slow link)
        self.repos: dict[str, Repo] = {}
        self.requests: list[Request] = []
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def add(self, name: str, files: dict[str, Path], **kw: object) -> Repo:
        commit = str(kw.pop("commit", "")) or hashlib.sha1(name.encode()).hexdigest()  # a hostile one if given
        repo = Repo(files, commit, **kw)  # type: ignore[arg-type]
        self.repos[name] = repo
        return repo

    def start(self) -> FakeHub:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def reset_counts(self) -> None:
        with self.lock:
            self.requests.clear()

    def bytes_sent(self, path_part: str = "") -> int:
        return sum(r.sent for r in self.requests if path_part in r.path)

    def file_requests(self) -> list[Request]:
        return [r for r in self.requests if "/resolve/" in r.path]

    # -- HTTP ---------------------------------------------------------------------------------------

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _send(self, code: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
                self.send_response(code)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD" and hub.fault == "drip_info" and "/api/models/" in self.path:
                    self._drip(body)
                elif self.command != "HEAD":
                    self.wfile.write(body)
                with hub.lock:
                    hub.requests.append(Request(self.command, self.path, self.headers.get("Range"),
                                                0 if self.command == "HEAD" else len(body)))  # fmt: skip

            def _drip(self, body: bytes) -> None:
                """A byte at a time: every read the client makes gets an answer, the whole never comes."""
                try:
                    for i in range(len(body)):
                        self.wfile.write(body[i : i + 1])
                        self.wfile.flush()
                        time.sleep(DRIP)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def _error(self, code: int, error_code: str, message: str) -> None:
                body = json.dumps({"error": message}).encode()
                self._send(code, body, {"X-Error-Code": error_code, "X-Error-Message": message,
                                        "Content-Type": "application/json"})  # fmt: skip

            def _repo(self, name: str) -> Repo | None:
                repo = hub.repos.get(name)
                if repo is None:
                    self._error(404, "RepoNotFound", "Repository not found")
                return repo

            def _authorized(self, repo: Repo) -> bool:
                return not repo.gated or self.headers.get("Authorization") == f"Bearer {repo.token}"

            def do_GET(self) -> None:
                self._dispatch()

            def do_HEAD(self) -> None:
                self._dispatch()

            def _dispatch(self) -> None:
                path = unquote(urlparse(self.path).path)
                if hub.fault == "html":
                    return self._send(200, b"<!doctype html><html><body>Sign in</body></html>",
                                      {"Content-Type": "text/html"})  # fmt: skip
                if hub.fault == "stall_tree" and "/tree/" in path:
                    time.sleep(600)  # the client must give up first (a daemon thread: gone with the test)
                    return None
                if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)(?:/.*)?", path):
                    return self._tree(m.group(1), m.group(2))
                if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?", path):
                    return self._info(m.group(1), m.group(2))
                if m := re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path):
                    return self._file(m.group(1), m.group(2), m.group(3))
                self._error(404, "EntryNotFound", "not found")

            def _rev_ok(self, repo: Repo, rev: str | None) -> bool:
                if rev in (None, "main", repo.commit):
                    return True
                self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
                return False

            def _listed(self, repo: Repo) -> list[str]:
                return [p for p in repo.files if p not in repo.unlisted]

            def _info(self, name: str, rev: str | None) -> None:
                repo = self._repo(name)
                if repo is None or not self._rev_ok(repo, rev):
                    return
                doc = {
                    "id": name, "modelId": name, "sha": repo.commit, "private": False,
                    "gated": "manual" if repo.gated else False,
                    "siblings": [{"rfilename": p} for p in self._listed(repo)],
                }  # fmt: skip
                self._send(200, json.dumps(doc).encode(), {"Content-Type": "application/json"})

            def _tree(self, name: str, rev: str) -> None:
                repo = self._repo(name)
                if repo is None or not self._rev_ok(repo, rev):
                    return
                entries = []
                for p in self._listed(repo):
                    size = repo.files[p].stat().st_size if repo.files[p].exists() else 0
                    oid = hashlib.sha256(f"{p}:{size}".encode()).hexdigest()
                    entry = {"type": "file", "path": p, "size": size, "oid": oid[:40]}
                    if p.endswith(".gguf"):
                        entry["lfs"] = {"oid": oid, "size": size, "pointerSize": 134}
                    entries.append(entry)
                self._send(200, json.dumps(entries).encode(), {"Content-Type": "application/json"})

            def _file(self, name: str, rev: str, rpath: str) -> None:
                repo = self._repo(name)
                if repo is None or not self._rev_ok(repo, rev):
                    return
                if not self._authorized(repo):
                    return self._error(401, "GatedRepo", "Access to model is restricted")
                local = repo.files.get(rpath)
                if local is None or rpath in repo.hide or not local.exists():
                    return self._error(404, "EntryNotFound", "Entry not found")
                size = local.stat().st_size
                etag = hashlib.sha256(f"{rpath}:{size}".encode()).hexdigest()
                headers = {"X-Repo-Commit": repo.commit, "ETag": f'"{etag}"', "X-Linked-Etag": f'"{etag}"',
                           "X-Linked-Size": str(size), "Accept-Ranges": "bytes"}  # fmt: skip
                start, end = 0, size - 1
                code = 200
                rng = self.headers.get("Range")
                if rng and (m := re.fullmatch(r"bytes=(\d+)-(\d*)", rng.strip())):
                    start = int(m.group(1))
                    end = min(int(m.group(2)) if m.group(2) else size - 1, size - 1)
                    if start >= size:
                        return self._send(416, b"", {"Content-Range": f"bytes */{size}"})
                    code = 206
                    headers["Content-Range"] = f"bytes {start}-{end}/{size}"
                if self.command == "HEAD":
                    self.send_response(200)
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", str(size))
                    self.end_headers()
                    with hub.lock:
                        hub.requests.append(Request("HEAD", self.path, rng, 0))
                    return
                n = end - start + 1
                self.send_response(code)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(n))
                self.end_headers()
                sent = 0
                if hub.fault == "drip_file":
                    with open(local, "rb") as fh:
                        fh.seek(start)
                        return self._drip(fh.read(n))
                try:
                    with open(local, "rb") as fh:
                        fh.seek(start)
                        while sent < n:
                            chunk = fh.read(min(1 << 20, n - sent))
                            if not chunk:
                                break
                            self.wfile.write(chunk)
                            sent += len(chunk)
                            if hub.delay_per_mib:
                                time.sleep(hub.delay_per_mib)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client read what it needed and hung up
                with hub.lock:
                    hub.requests.append(Request("GET", self.path, rng, sent))

        return Handler
