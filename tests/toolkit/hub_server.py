"""A minimal Hugging Face Hub HTTP API on 127.0.0.1, for tests. A test double, not a Hub.

Point the real `huggingface_hub` client (and transformers' `push_to_hub` / `from_pretrained`) at it with
`HF_ENDPOINT=<LocalHub.url>`, `HF_HUB_DISABLE_XET=1` (uploads then use plain HTTP + the LFS "basic" transfer) and any
token, e.g. `HF_TOKEN=hf_test`. huggingface_hub reads HF_ENDPOINT when it is imported, so run the client in a
subprocess whose environment has these variables.

    with LocalHub(tmp_path) as hub:
        env = hub.client_env(tmp_path / "hf_home")  # then subprocess.run([sys.executable, ...], env=env)

Implemented (`{t}` is model, dataset or space; `{repo}` is `namespace/name`; `{prefix}` is "" for models,
"datasets/" or "spaces/" otherwise; `{rev}` is a branch or a full commit sha):

    GET      /api/whoami-v2                                user "user" (401 without a bearer token)
    POST     /api/repos/create                             409 if it exists (what `exist_ok=True` expects)
    POST     /api/validate-yaml                            always valid (README.md model cards)
    GET      /api/{t}s/{repo}[/revision/{rev}]             repo info: sha, siblings (+ size/blobId/lfs with ?blobs)
    GET      /api/{t}s/{repo}/tree/{rev}[/{path}]          ?recursive=true
    POST     /api/{t}s/{repo}/paths-info/{rev}
    POST     /api/{t}s/{repo}/preupload/{rev}              "lfs" if binary, weight-like or >= 10 MB
    POST     /api/{t}s/{repo}/commit/{rev}                 NDJSON: file (base64), lfsFile, deletedFile, deletedFolder
    POST     /api/{t}s/{repo}/branch/{branch}
    POST     /{prefix}{repo}.git/info/lfs/objects/batch    basic transfer: PUT /_lfs/{oid}, POST /_lfs/verify
    HEAD/GET /{prefix}{repo}/resolve/{rev}/{path}          ETag, X-Repo-Commit, Content-Length (+ X-Linked-*)

Errors carry the `X-Error-Code` header the client maps to exceptions: RepoNotFound, RevisionNotFound, EntryNotFound.
Not implemented: pull requests, tags, xet, multipart LFS, Range requests, access control (every token is "user").
Storage under `root`: `objects/<sha256>` (content-addressed file contents) and `{t}s/{namespace}/{name}.json` (the
branches and every commit's full file table), so a new LocalHub on the same root sees the same repos.
"""

import base64
import hashlib
import json
import os
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit


USER = "user"
REPO_TYPES = {"model": "", "dataset": "datasets/", "space": "spaces/"}  # type -> URL prefix of its pages
LFS_SUFFIXES = (
    ".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".onnx", ".msgpack", ".npy", ".npz", ".pkl", ".pickle",
    ".gguf", ".model", ".ot", ".tflite", ".joblib", ".zip", ".gz", ".tar", ".bz2", ".xz", ".zst", ".7z",
    ".arrow", ".parquet",
)  # fmt: skip
LFS_MIN_SIZE = 10 * 1024 * 1024
GITATTRIBUTES = "".join(f"*{suffix} filter=lfs diff=lfs merge=lfs -text\n" for suffix in LFS_SUFFIXES).encode()


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def is_lfs(path: str, size: int, sample: bytes) -> bool:
    """Upload mode rule (the real Hub decides with .gitattributes, size and content; any consistent rule works)."""
    return path.lower().endswith(LFS_SUFFIXES) or size >= LFS_MIN_SIZE or b"\0" in sample


class HubError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, headers: dict | None = None, **extra):
        super().__init__(message)
        self.status, self.message, self.code, self.headers, self.extra = status, message, code, headers or {}, extra


class LocalHub:
    """A Hub-compatible HTTP server on 127.0.0.1 (OS-chosen port) in a daemon thread; a context manager."""

    def __init__(self, root):
        self.root = Path(root)
        (self.root / "objects").mkdir(parents=True, exist_ok=True)
        self.lock = threading.RLock()
        self.repos: dict[tuple[str, str], dict] = {}
        self.requests: list[tuple[str, str]] = []  # (method, path) of every request, for assertions
        self.server = None
        self.url = None

    # ------------------------------------------------------------------------------------------------- lifecycle
    def start(self):
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.server.daemon_threads = True
        self.server.hub = self
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), name="LocalHub", daemon=True).start()
        return self

    def stop(self):
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def client_env(self, hf_home, token: str = "hf_test", **extra) -> dict:
        """A full environment for a client subprocess: this process's, minus any HF_* settings and proxies, plus
        what points huggingface_hub / transformers at this hub (and only at it) with an empty cache in `hf_home`."""
        drop = ("HF_", "HUGGINGFACE_", "TRANSFORMERS_", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")
        env = {k: v for k, v in os.environ.items() if not k.upper().startswith(drop)}
        env.update(
            HF_ENDPOINT=self.url,
            HF_HUB_DISABLE_XET="1",
            HF_TOKEN=token,
            HF_HOME=str(hf_home),
            HF_HUB_DISABLE_TELEMETRY="1",
            HF_HUB_DISABLE_PROGRESS_BARS="1",
            NO_PROXY="127.0.0.1,localhost",
            no_proxy="127.0.0.1,localhost",
        )
        env.update(extra)
        return env

    # --------------------------------------------------------------------------------------------------- storage
    def _repo_file(self, repo_type, repo_id) -> Path:
        if not re.fullmatch(r"[\w-][\w.-]*/[\w-][\w.-]*", repo_id):
            raise HubError(400, f"Invalid repo id {repo_id!r}: expected namespace/name")
        return self.root / f"{repo_type}s" / f"{repo_id}.json"

    def repo(self, repo_type, repo_id) -> dict:
        key = (repo_type, repo_id)
        if key not in self.repos:
            path = self._repo_file(repo_type, repo_id)
            if not path.exists():
                raise HubError(404, f"Repository {repo_id} not found", "RepoNotFound")
            self.repos[key] = json.loads(path.read_text())
        return self.repos[key]

    def _save(self, repo_type, repo_id):
        path = self._repo_file(repo_type, repo_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.repos[(repo_type, repo_id)], indent=1))
        os.replace(tmp, path)

    def object_path(self, sha256: str) -> Path:
        if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
            raise HubError(400, f"Invalid oid {sha256!r}")
        return self.root / "objects" / sha256

    def put_object(self, data: bytes) -> str:
        sha256 = hashlib.sha256(data).hexdigest()
        path = self.object_path(sha256)
        if not path.exists():
            tmp = path.with_name(f"{sha256}.{threading.get_ident()}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)
        return sha256

    def resolve(self, repo: dict, rev: str) -> str:
        if rev in repo["branches"]:
            return repo["branches"][rev]
        if rev in repo["commits"]:
            return rev
        raise HubError(404, f"Invalid rev id: {rev}", "RevisionNotFound")

    def create_repo(self, repo_type, repo_id, private=False) -> bool:
        """Create a repo whose first commit holds a `.gitattributes`, like the Hub. False if it already exists."""
        with self.lock:
            if (repo_type, repo_id) in self.repos or self._repo_file(repo_type, repo_id).exists():
                return False
            repo = {"private": bool(private), "createdAt": _now(), "branches": {}, "commits": {}}
            self.repos[(repo_type, repo_id)] = repo
            self.commit(repo_type, repo_id, "main", "initial commit", [("file", ".gitattributes", GITATTRIBUTES)])
            return True

    def commit(self, repo_type, repo_id, branch, title, ops, parent=None) -> str:
        """Apply ops [(kind, path, data|sha256|None)] on top of `branch`; returns the new commit sha."""
        with self.lock:
            repo = self.repo(repo_type, repo_id)
            head = repo["branches"].get(branch)
            if head is None and repo["commits"]:
                raise HubError(404, f"Invalid rev id: {branch}", "RevisionNotFound")
            if parent is not None and not (head or "").startswith(parent):
                raise HubError(412, f"A commit has happened since. Please refresh and try again. ({head})")
            files = dict(repo["commits"][head]["files"]) if head else {}
            for kind, path, value in ops:
                if kind == "file":
                    files[path] = {"sha256": self.put_object(value), "size": len(value), "lfs": False}
                    files[path]["oid"] = git_blob_sha1(value)
                elif kind == "lfsFile":
                    if not self.object_path(value).exists():
                        raise HubError(422, f"LFS object {value} for {path} was not uploaded")
                    size = self.object_path(value).stat().st_size
                    files[path] = {"sha256": value, "size": size, "lfs": True}
                    files[path]["oid"] = git_blob_sha1(lfs_pointer(value, size))
                elif kind == "deletedFile":
                    if files.pop(path, None) is None:
                        raise HubError(404, f"A file with this name doesn't exist: {path}", "EntryNotFound")
                elif kind == "deletedFolder":
                    files = {p: f for p, f in files.items() if not p.startswith(path.rstrip("/") + "/")}
                else:
                    raise HubError(400, f"Unsupported commit operation {kind!r}")
            seed = json.dumps([head, title, files, time.time_ns(), len(repo["commits"])], sort_keys=True)
            sha = hashlib.sha1(seed.encode()).hexdigest()
            repo["commits"][sha] = {"parent": head, "title": title, "date": _now(), "files": files}
            repo["branches"][branch] = sha
            self._save(repo_type, repo_id)
            return sha


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())


def _tree_entry(path: str, f: dict | None) -> dict:
    if f is None:  # a folder
        return {"type": "directory", "oid": hashlib.sha1(path.encode()).hexdigest(), "size": 0, "path": path}
    entry = {"type": "file", "oid": f["oid"], "size": f["size"], "path": path}
    if f["lfs"]:
        entry["lfs"] = {"oid": f["sha256"], "size": f["size"], "pointerSize": len(lfs_pointer(f["sha256"], f["size"]))}
    return entry


def _folders(files) -> set[str]:
    return {p.rsplit("/", i)[0] for p in files for i in range(1, p.count("/") + 1)}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive; every response carries a Content-Length

    def log_message(self, *args):  # quiet
        pass

    @property
    def hub(self) -> LocalHub:
        return self.server.hub

    def do_GET(self):
        self._dispatch("GET")

    def do_HEAD(self):
        self._dispatch("HEAD")

    def do_POST(self):
        self._dispatch("POST")

    def do_PUT(self):
        self._dispatch("PUT")

    # ----------------------------------------------------------------------------------------------- plumbing
    def _send(self, status, body=b"", content_type="application/json", headers=None):
        if not isinstance(body, bytes):
            body = json.dumps(body).encode()
        self.send_response(status)
        for key, value in {"Content-Type": content_type, "Content-Length": str(len(body)), **(headers or {})}.items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = bytearray()
            while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                data += self.rfile.read(size)
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
                pass
            return bytes(data)
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _json(self) -> dict:
        return json.loads(self.body or b"{}")

    def _need_token(self):
        if not self.headers.get("Authorization", "").startswith("Bearer "):
            raise HubError(401, "Invalid credentials in Authorization header")

    def _dispatch(self, method):
        url = urlsplit(self.path)
        parts = [unquote(p) for p in url.path.split("/")[1:]]
        query = parse_qs(url.query)
        self.hub.requests.append((method, url.path))
        self.body = self._read_body()  # always consume the body, so that an early error keeps the connection usable
        try:
            body = self._route(method, parts, query)
            if body is not None:
                self._send(200, body)
        except HubError as e:
            headers = {"X-Error-Message": e.message, **e.headers}
            if e.code:
                headers["X-Error-Code"] = e.code
            self._send(e.status, {"error": e.message, **e.extra}, headers=headers)
        except Exception as e:  # noqa: BLE001 -- a bug here: answer 500 rather than leave the client hanging
            self._send(500, {"error": f"LocalHub: {type(e).__name__}: {e}"})

    def _route(self, method, parts, query):
        if parts[0] == "api":
            return self._api(method, parts[1:], query)
        if parts[0] == "_lfs" and method == "PUT" and len(parts) == 2:
            return self._lfs_put(parts[1])
        if parts[:2] == ["_lfs", "verify"] and method == "POST":
            f = self._json()
            path = self.hub.object_path(f["oid"])
            if not path.exists() or path.stat().st_size != f["size"]:
                raise HubError(404, f"LFS object {f['oid']} not found")
            return {"success": True}
        repo_type = "model"
        if parts[0] in ("datasets", "spaces"):
            repo_type, parts = parts[0][:-1], parts[1:]
        if len(parts) == 6 and parts[1].endswith(".git") and parts[2:] == ["info", "lfs", "objects", "batch"]:
            return self._lfs_batch(repo_type, f"{parts[0]}/{parts[1][:-4]}")
        if len(parts) >= 5 and parts[2] == "resolve" and method in ("GET", "HEAD"):
            return self._resolve(repo_type, f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:]))
        raise HubError(404, f"LocalHub: no route for {method} {self.path}")

    # ---------------------------------------------------------------------------------------------------- API
    def _api(self, method, parts, query):
        if parts == ["whoami-v2"]:
            self._need_token()
            token = {"displayName": "test", "role": "write"}
            return {"type": "user", "id": "0" * 24, "name": USER, "fullname": "Test User", "orgs": [],
                    "auth": {"type": "access_token", "accessToken": token}}  # fmt: skip
        if parts == ["validate-yaml"]:
            return {"errors": [], "warnings": []}
        if parts == ["repos", "create"] and method == "POST":
            self._need_token()
            payload = self._json()
            repo_type = payload.get("type") or "model"
            repo_id = f"{payload.get('organization') or USER}/{payload['name']}"
            url = f"{self.hub.url}/{REPO_TYPES[repo_type]}{repo_id}"
            private = payload.get("private") or payload.get("visibility") == "private"
            if not self.hub.create_repo(repo_type, repo_id, private=private):
                raise HubError(409, f"You already created this {repo_type} repo", url=url)  # body has the url
            return {"url": url, "name": repo_id, "id": repo_id}
        if len(parts) < 3 or parts[0][:-1] not in REPO_TYPES:
            raise HubError(404, f"LocalHub: no API route /api/{'/'.join(parts)}")
        repo_type, repo_id, rest = parts[0][:-1], f"{parts[1]}/{parts[2]}", parts[3:]
        with self.hub.lock:
            repo = self.hub.repo(repo_type, repo_id)
            if rest == [] or (len(rest) == 2 and rest[0] == "revision"):
                return self._info(repo_type, repo_id, repo, rest[1] if rest else "main", "blobs" in query)
            if len(rest) < 2:
                raise HubError(404, f"LocalHub: no API route /api/{'/'.join(parts)}")
            action, rev = rest[0], rest[1]
            if action == "tree" and method == "GET":
                recursive = query.get("recursive", ["false"])[0].lower() in ("1", "true")
                return self._tree(repo, rev, "/".join(rest[2:]), recursive)
            if action == "paths-info" and method == "POST":
                files = repo["commits"][self.hub.resolve(repo, rev)]["files"]
                paths = parse_qs(self.body.decode()).get("paths", [])
                folders = _folders(files)
                return [_tree_entry(p, files.get(p)) for p in paths if p in files or p in folders]
            if action == "preupload" and method == "POST":
                self._need_token()
                return self._preupload(repo, rev, query)
            if action == "branch" and method == "POST":
                self._need_token()
                if rev in repo["branches"]:
                    raise HubError(409, f"Branch {rev} already exists")
                repo["branches"][rev] = self.hub.resolve(repo, self._json().get("startingPoint") or "main")
                self.hub._save(repo_type, repo_id)
                return {}
        if action == "commit" and method == "POST":
            self._need_token()
            return self._commit(repo_type, repo_id, rev, query)
        raise HubError(404, f"LocalHub: no API route {method} /api/{'/'.join(parts)}")

    def _info(self, repo_type, repo_id, repo, rev, blobs):
        sha = self.hub.resolve(repo, rev)
        commit = repo["commits"][sha]
        siblings = []
        for path, f in sorted(commit["files"].items()):
            sibling = {"rfilename": path}
            if blobs:
                sibling.update(size=f["size"], blobId=f["oid"])
                if f["lfs"]:
                    pointer_size = len(lfs_pointer(f["sha256"], f["size"]))
                    sibling["lfs"] = {"size": f["size"], "sha256": f["sha256"], "pointerSize": pointer_size}
            siblings.append(sibling)
        info = {"_id": hashlib.sha1(repo_id.encode()).hexdigest()[:24], "id": repo_id, "author": repo_id.split("/")[0],
                "sha": sha, "lastModified": commit["date"], "createdAt": repo["createdAt"],
                "private": repo["private"], "gated": False, "disabled": False, "downloads": 0, "likes": 0,
                "tags": [], "siblings": siblings}  # fmt: skip
        if repo_type == "model":
            info["modelId"] = repo_id
        return info

    def _tree(self, repo, rev, path, recursive):
        files = repo["commits"][self.hub.resolve(repo, rev)]["files"]
        folders = _folders(files)
        if path and path not in folders:
            raise HubError(404, f"{path} does not exist on this revision", "EntryNotFound")
        prefix = f"{path}/" if path else ""
        entries = [p for p in sorted(set(files) | folders) if p.startswith(prefix)]
        if not recursive:
            entries = [p for p in entries if "/" not in p[len(prefix) :]]
        return [_tree_entry(p, files.get(p)) for p in entries]

    def _preupload(self, repo, rev, query):
        if "create_pr" in query:
            raise HubError(400, "LocalHub does not support pull requests")
        files = repo["commits"][self.hub.resolve(repo, rev)]["files"]
        answer = []
        for f in self._json()["files"]:
            lfs = is_lfs(f["path"], f["size"], base64.b64decode(f.get("sample", "")))
            entry = {"path": f["path"], "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False}
            if f["path"] in files:  # lets the client skip unchanged files: sha256 for LFS, git blob sha1 otherwise
                old = files[f["path"]]
                entry["oid"] = old["sha256"] if old["lfs"] else old["oid"]
            answer.append(entry)
        return {"files": answer, "commitOid": repo["branches"].get(rev, rev)}

    def _commit(self, repo_type, repo_id, rev, query):
        if "create_pr" in query:
            raise HubError(400, "LocalHub does not support pull requests")
        lines = [json.loads(line) for line in self.body.splitlines() if line.strip()]
        header = next((item["value"] for item in lines if item["key"] == "header"), {})
        ops = []
        for item in lines:
            key, value = item["key"], item["value"]
            if key == "file":
                ops.append(("file", value["path"], base64.b64decode(value["content"])))
            elif key == "lfsFile":
                ops.append(("lfsFile", value["path"], value["oid"]))
            elif key in ("deletedFile", "deletedFolder"):
                ops.append((key, value["path"], None))
            elif key != "header":
                raise HubError(400, f"Unsupported commit operation {key!r}")
        sha = self.hub.commit(repo_type, repo_id, rev, header.get("summary", ""), ops, header.get("parentCommit"))
        url = f"{self.hub.url}/{REPO_TYPES[repo_type]}{repo_id}/commit/{sha}"
        return {"success": True, "commitOid": sha, "commitUrl": url, "pullRequestUrl": None}

    # ---------------------------------------------------------------------------------------------------- LFS
    def _lfs_batch(self, repo_type, repo_id):
        self._need_token()
        self.hub.repo(repo_type, repo_id)
        payload = self._json()
        if payload.get("operation") != "upload":
            raise HubError(400, "LocalHub only implements LFS uploads (downloads go through /resolve)")
        objects = []
        for obj in payload["objects"]:
            entry = {"oid": obj["oid"], "size": obj["size"], "authenticated": True}
            path = self.hub.object_path(obj["oid"])
            if not path.exists() or path.stat().st_size != obj["size"]:
                entry["actions"] = {"upload": {"href": f"{self.hub.url}/_lfs/{obj['oid']}"},
                                    "verify": {"href": f"{self.hub.url}/_lfs/verify"}}  # fmt: skip
            objects.append(entry)
        body = json.dumps({"transfer": "basic", "objects": objects, "hash_algo": "sha256"}).encode()
        self._send(200, body, content_type="application/vnd.git-lfs+json")

    def _lfs_put(self, oid):
        data = self.body
        if hashlib.sha256(data).hexdigest() != oid:
            raise HubError(400, f"Uploaded content does not match oid {oid}")
        self.hub.put_object(data)
        self._send(200, b"", content_type="text/plain")

    # ------------------------------------------------------------------------------------------------ resolve
    def _resolve(self, repo_type, repo_id, rev, path):
        with self.hub.lock:
            repo = self.hub.repo(repo_type, repo_id)
            sha = self.hub.resolve(repo, rev)
            f = repo["commits"][sha]["files"].get(path)
        if f is None:
            raise HubError(404, "Entry not found", "EntryNotFound", headers={"X-Repo-Commit": sha})
        etag = f'"{f["sha256"] if f["lfs"] else f["oid"]}"'
        headers = {"ETag": etag, "X-Repo-Commit": sha, "Accept-Ranges": "none"}
        if f["lfs"]:
            headers.update({"X-Linked-Etag": etag, "X-Linked-Size": str(f["size"])})
        headers["Content-Disposition"] = f'inline; filename="{path.rsplit("/", 1)[-1]}"'
        data = b"" if self.command == "HEAD" else self.hub.object_path(f["sha256"]).read_bytes()
        self.send_response(200)
        headers.update({"Content-Type": "application/octet-stream", "Content-Length": str(f["size"])})
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)
