"""A scripted Hugging Face Hub on loopback: the few endpoints `huggingface_hub` calls to create a dataset repo and
commit small files to it (repo create, card YAML check, pre-upload, commit), answered over real HTTP so the real
client runs end to end. It records what it received: the commits' files and the Authorization headers.
Not the Hub: it checks nothing (no auth, no YAML validation), and large (LFS / Xet) uploads are not spoken."""

from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from evolforge.testing.net import SERVE_POLL


class HubServer:
    def __init__(self):
        self.repos: list[str] = []
        self.files: dict[str, bytes] = {}  # path in repo -> content, from the last commit
        self.auth: set[str] = set()
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _reply(self, obj: dict, code: int = 200) -> None:
                body = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                self._reply({"error": "not scripted"}, 404)

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                hub.auth.add(self.headers.get("Authorization", ""))
                if self.path == "/api/repos/create":
                    req = json.loads(body)
                    repo = f"{req['organization']}/{req['name']}"
                    hub.repos.append(repo)
                    return self._reply({"url": f"http://{self.headers['Host']}/datasets/{repo}"})
                if self.path == "/api/validate-yaml":
                    return self._reply({})
                if "/preupload/" in self.path:
                    return self._reply({"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                                                  for f in json.loads(body)["files"]]})
                if "/commit/" in self.path:
                    hub.files = {}
                    for line in body.decode().splitlines():
                        item = json.loads(line)
                        if item.get("key") == "file":
                            hub.files[item["value"]["path"]] = base64.b64decode(item["value"]["content"])
                    repo = self.path.split("/api/datasets/", 1)[1].split("/commit/", 1)[0]
                    return self._reply({"commitUrl": f"http://{self.headers['Host']}/datasets/{repo}/commit/{'0' * 40}",
                                        "commitOid": "0" * 40})
                self._reply({"error": "not scripted"}, 404)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": SERVE_POLL}, daemon=True)

    def __enter__(self) -> "HubServer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
