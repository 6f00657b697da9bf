#!/usr/bin/env python3
"""The registries of the compat suite, run inside the test's network namespace.

One HTTPS server (Python's standard library only) shaped like the real services the agent's
tools talk to, under their real names (the daemon's static resolver table points them here):

- PyPI: /simple/compat-demo/ and a real wheel under /packages/ (pip, with hashes)
- npm:  /compat-demo (the packument) and a real tarball under /compat-demo/-/ (npm install)
- git smart HTTP: /compat/*.git through `git http-backend` as CGI (clone and push)

Usage: registry.py ADDR PORT CERT KEY ROOT GIT_ROOT
It writes the fixtures under ROOT, prints "ready" and serves until killed.
"""
import base64
import hashlib
import http.server
import io
import json
import os
import socketserver
import ssl
import subprocess
import sys
import tarfile
import zipfile


def wheel(root):
    name = "compat_demo-1.0.0-py3-none-any.whl"
    files = {
        "compat_demo/__init__.py": b"VALUE = 'compat-demo works'\n",
        "compat_demo-1.0.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: compat-demo\nVersion: 1.0.0\n",
        "compat_demo-1.0.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: agenshield-compat\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append("compat_demo-1.0.0.dist-info/RECORD,,")
    files["compat_demo-1.0.0.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for path, data in files.items():
            z.writestr(path, data)
    data = buf.getvalue()
    os.makedirs(f"{root}/packages", exist_ok=True)
    with open(f"{root}/packages/{name}", "wb") as f:
        f.write(data)
    sha = hashlib.sha256(data).hexdigest()
    os.makedirs(f"{root}/simple/compat-demo", exist_ok=True)
    with open(f"{root}/simple/compat-demo/index.html", "w") as f:
        f.write(
            "<!DOCTYPE html><html><body>\n"
            f'<a href="/packages/{name}#sha256={sha}">{name}</a>\n'
            "</body></html>\n"
        )


def npm_package(root):
    pkg = json.dumps({"name": "compat-demo", "version": "1.0.0", "main": "index.js"}).encode()
    index = b"module.exports = 'compat-demo works';\n"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for path, data in (("package/package.json", pkg), ("package/index.js", index)):
            info = tarfile.TarInfo(path)
            info.size = len(data)
            info.mode = 0o644
            t.addfile(info, io.BytesIO(data))
    tgz = buf.getvalue()
    os.makedirs(f"{root}/compat-demo/-", exist_ok=True)
    with open(f"{root}/compat-demo/-/compat-demo-1.0.0.tgz", "wb") as f:
        f.write(tgz)
    integrity = "sha512-" + base64.b64encode(hashlib.sha512(tgz).digest()).decode()
    doc = {
        "name": "compat-demo",
        "dist-tags": {"latest": "1.0.0"},
        "versions": {
            "1.0.0": {
                "name": "compat-demo",
                "version": "1.0.0",
                "main": "index.js",
                "dist": {
                    "tarball": "https://registry.npmjs.org/compat-demo/-/compat-demo-1.0.0.tgz",
                    "shasum": hashlib.sha1(tgz).hexdigest(),
                    "integrity": integrity,
                },
            }
        },
    }
    # A directory and a file cannot share the name: the packument is served for the bare path.
    with open(f"{root}/compat-demo.json", "w") as f:
        json.dump(doc, f)


class Handler(http.server.SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        sys.stderr.write("registry: " + (fmt % args) + "\n")

    def do_GET(self):
        if self.path.startswith("/compat/"):
            return self.git()
        if self.path.split("?")[0] == "/compat-demo":
            self.path = "/compat-demo.json"
        return super().do_GET()

    def do_POST(self):
        if self.path.startswith("/compat/"):
            return self.git()
        self.send_error(405)

    def git(self):
        path, _, query = self.path.partition("?")
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = self.read_chunked()
        env = {
            "GIT_PROJECT_ROOT": GIT_ROOT,
            "GIT_HTTP_EXPORT_ALL": "1",
            "REMOTE_USER": "agent",
            "PATH_INFO": path,
            "QUERY_STRING": query,
            "REQUEST_METHOD": self.command,
            "CONTENT_TYPE": self.headers.get("Content-Type", ""),
            "CONTENT_LENGTH": str(len(body)),
            "HTTP_CONTENT_ENCODING": self.headers.get("Content-Encoding", ""),
            "GIT_PROTOCOL": self.headers.get("Git-Protocol", ""),
            "PATH": "/usr/local/bin:/usr/bin:/bin",
        }
        out = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True).stdout
        head, _, payload = out.partition(b"\r\n\r\n")
        if not _:
            head, _, payload = out.partition(b"\n\n")
        status = 200
        headers = []
        for line in head.decode("latin-1").splitlines():
            k, _, v = line.partition(":")
            if k.lower() == "status":
                status = int(v.strip().split()[0])
            elif k:
                headers.append((k, v.strip()))
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def read_chunked(self):
        data = b""
        while True:
            size = int(self.rfile.readline().strip().split(b";")[0], 16)
            if size == 0:
                self.rfile.readline()
                return data
            data += self.rfile.read(size)
            self.rfile.readline()


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


if __name__ == "__main__":
    addr, port, cert, key, root, GIT_ROOT = sys.argv[1:7]
    wheel(root)
    npm_package(root)
    os.chdir(root)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    srv = Server((addr, int(port)), Handler)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    print("ready", flush=True)
    srv.serve_forever()
