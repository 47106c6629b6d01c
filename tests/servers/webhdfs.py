"""A small WebHDFS-protocol server on 127.0.0.1 for tests (no NameNode can be installed here).

Implements the REST subset fsspec's ``webhdfs`` client uses, with the NameNode -> DataNode
307 redirect on CREATE/APPEND/OPEN pointing back at this same server under ``/datanode``:
GETFILESTATUS, LISTSTATUS, OPEN, CREATE, APPEND, MKDIRS, RENAME (plain, and with
``renameoptions=OVERWRITE`` as the NameNode's rename2), DELETE, GETHOMEDIRECTORY.
Files live in a temporary directory. Errors answer with WebHDFS ``RemoteException`` JSON.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit

PREFIX = "/webhdfs/v1"
DATANODE = "/datanode/v1"


class WebHdfsServer:
    """``with WebHdfsServer(root) as server: server.port``; ``server.ops`` counts requests by op."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.ops: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.fail_ops: set[str] = set()  # ops answered with 500, to simulate an outage
        self.stall_ops: dict[str, float] = {}  # op -> seconds to hold the request before answering (a hung node)
        handler = type("Handler", (_Handler,), {"server_state": self})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def url(self, path: str = "/") -> str:
        return f"webhdfs://127.0.0.1:{self.port}/{path.lstrip('/')}"

    def local(self, hdfs_path: str) -> Path:
        parts = [p for p in hdfs_path.split("/") if p]
        if any(p == ".." for p in parts):
            raise PermissionError(hdfs_path)
        return self.root.joinpath(*parts)

    def __enter__(self) -> WebHdfsServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_state: WebHdfsServer

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    # --- plumbing ------------------------------------------------------------------------------------------

    def _parse(self) -> tuple[str, str, dict[str, str]]:
        parts = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        path = unquote(parts.path)
        for prefix in (PREFIX, DATANODE):
            if path.startswith(prefix):
                return prefix, path[len(prefix):] or "/", query
        return "", path, query

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _send(self, status: int, payload: bytes = b"", *, content_type: str = "application/json",
              headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload)

    def _json(self, data: object, status: int = 200) -> None:
        self._send(status, json.dumps(data).encode())

    def _error(self, status: int, exception: str, message: str) -> None:
        self._json({"RemoteException": {"exception": exception, "javaClassName": f"java.io.{exception}",
                                        "message": message}}, status)

    def _redirect(self, path: str, query: dict[str, str]) -> None:
        query = {k: v for k, v in query.items() if k != "user.name"}
        location = f"http://127.0.0.1:{self.server_state.port}{DATANODE}{quote(path)}?" + "&".join(
            f"{k}={quote(str(v))}" for k, v in query.items())
        self._send(307, headers={"Location": location})

    def _status(self, local: Path, suffix: str) -> dict[str, object]:
        stat = local.stat()
        return {"pathSuffix": suffix, "type": "DIRECTORY" if local.is_dir() else "FILE",
                "length": 0 if local.is_dir() else stat.st_size, "modificationTime": int(stat.st_mtime * 1000),
                "accessTime": int(stat.st_atime * 1000), "blockSize": 134217728, "replication": 1,
                "owner": "datahub", "group": "supergroup", "permission": "644"}

    def _dispatch(self, method: str) -> None:
        state = self.server_state
        prefix, path, query = self._parse()
        body = self._body()
        op = query.get("op", "").upper()
        with state.lock:
            state.ops[op if prefix == PREFIX else f"datanode:{op}"] += 1
        if op in state.fail_ops:
            return self._error(500, "IOException", f"injected failure on {op}")
        stall = state.stall_ops.get(op if prefix == PREFIX else f"datanode:{op}")
        if stall:
            time.sleep(stall)
        if not prefix:
            return self._error(404, "FileNotFoundException", f"not a WebHDFS URL: {path}")
        try:
            local = state.local(path)
        except PermissionError:
            return self._error(403, "AccessControlException", f"path escapes the root: {path}")
        try:
            if prefix == DATANODE:
                return self._datanode(method, op, local, body)
            return self._namenode(method, op, path, local, query)
        except FileNotFoundError:
            return self._error(404, "FileNotFoundException", f"File does not exist: {path}")

    def _namenode(self, method: str, op: str, path: str, local: Path, query: dict[str, str]) -> None:
        if method == "GET" and op == "GETFILESTATUS":
            return self._json({"FileStatus": self._status(local, "")})
        if method == "GET" and op == "LISTSTATUS":
            if local.is_file():
                return self._json({"FileStatuses": {"FileStatus": [self._status(local, "")]}})
            entries = [self._status(child, child.name) for child in sorted(local.iterdir())]
            return self._json({"FileStatuses": {"FileStatus": entries}})
        if method == "GET" and op == "GETHOMEDIRECTORY":
            return self._json({"Path": "/user/datahub"})
        if method == "GET" and op == "OPEN":
            if not local.is_file():
                raise FileNotFoundError(path)
            return self._redirect(path, query)
        if method == "PUT" and op == "CREATE":
            if local.exists() and query.get("overwrite", "false") != "true":
                return self._error(403, "FileAlreadyExistsException", f"{path} already exists")
            return self._redirect(path, query)
        if method == "POST" and op == "APPEND":
            if not local.is_file():
                raise FileNotFoundError(path)
            return self._redirect(path, query)
        if method == "PUT" and op == "MKDIRS":
            if local.is_file():
                return self._error(403, "FileAlreadyExistsException", f"{path} is a file")
            local.mkdir(parents=True, exist_ok=True)
            return self._json({"boolean": True})
        if method == "PUT" and op == "RENAME":
            destination = self.server_state.local(query.get("destination", ""))
            if query.get("renameoptions", "").upper() == "OVERWRITE":  # rename2(src, dst, OVERWRITE)
                if not local.exists() or not destination.parent.is_dir():
                    raise FileNotFoundError(path)
                if destination.is_dir() or local.is_dir():
                    return self._error(403, "IOException", f"rename {path}: OVERWRITE of a directory is not supported here")
                os.replace(local, destination)  # one namespace step: readers never see dst missing
                return self._send(200, content_type="application/octet-stream")
            if not local.exists() or destination.exists() or not destination.parent.is_dir():
                return self._json({"boolean": False})  # HDFS semantics: no overwrite, parent must exist
            os.replace(local, destination)
            return self._json({"boolean": True})
        if method == "DELETE" and op == "DELETE":
            if not local.exists():
                return self._json({"boolean": False})
            if local.is_dir():
                if query.get("recursive") != "true" and any(local.iterdir()):
                    return self._error(403, "PathIsNotEmptyDirectoryException", f"{path} is non empty")
                shutil.rmtree(local)
            else:
                local.unlink()
            return self._json({"boolean": True})
        return self._error(400, "UnsupportedOperationException", f"{method} op={op} is not implemented by the test server")

    def _datanode(self, method: str, op: str, local: Path, body: bytes) -> None:
        if method == "PUT" and op == "CREATE":
            local.parent.mkdir(parents=True, exist_ok=True)
            local.write_bytes(body)
            return self._send(201)
        if method == "POST" and op == "APPEND":
            with open(local, "ab") as handle:
                handle.write(body)
            return self._send(200)
        if method == "GET" and op == "OPEN":
            _, _, query = self._parse()
            offset, length = int(query.get("offset", 0)), query.get("length")
            with open(local, "rb") as handle:
                handle.seek(offset)
                data = handle.read(int(length)) if length is not None else handle.read()
            return self._send(200, data, content_type="application/octet-stream")
        return self._error(400, "UnsupportedOperationException", f"datanode {method} op={op}")

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")
