"""A long-lived worker per SuperNode, so a Flower deployment does not pay torch's import and the model's
build for every message (Flower 1.42 starts one client-app process per message).

    ClientApp process (per message; imports no torch)         node worker (one per node and config)
      request = header JSON + client state + down bytes  -->    Setup built once (task, method, model)
                                                                protocol.client_round(...) as always
      <-- reply = header JSON + client state + up bytes

The worker is started by the first message that finds none (`engine_options.node_worker = true`), runs
the same training code as the in-process handler (flower_app.train_core), keeps no client state (the
client app keeps it, as before), and exits after `worker_idle` seconds without a request. It listens on
a Unix socket in a folder only its user can enter; the frames are JSON and raw bytes, nothing executable.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HEAD = struct.Struct("<II")          # header length, number of blobs; then per blob its length (<Q), then data


def send(sock: socket.socket, header: dict, blobs: list[bytes]) -> None:
    h = json.dumps(header, default=float).encode()
    sock.sendall(HEAD.pack(len(h), len(blobs)) + h + b"".join(struct.pack("<Q", len(b)) for b in blobs))
    for b in blobs:
        sock.sendall(b)


def _exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        part = sock.recv(min(n - len(buf), 1 << 20))
        if not part:
            raise ConnectionError(f"node worker: connection closed with {n - len(buf)} bytes missing")
        buf += part
    return bytes(buf)


def receive(sock: socket.socket, max_bytes: int) -> tuple[dict, list[bytes]]:
    hlen, nb = HEAD.unpack(_exact(sock, HEAD.size))
    if hlen > 1 << 20 or nb > 16:
        raise ValueError(f"node worker: a frame with a {hlen}-byte header and {nb} blobs is not ours")
    header = json.loads(_exact(sock, hlen))
    sizes = [struct.unpack("<Q", _exact(sock, 8))[0] for _ in range(nb)]
    if sum(sizes) > max_bytes:
        raise ValueError(f"node worker: {sum(sizes)} bytes of blobs, more than {max_bytes}")
    return header, [_exact(sock, s) for s in sizes]


def socket_path(key: str, partition: int | None) -> Path:
    d = Path(tempfile.gettempdir()) / f"lightfed-{os.getuid()}"
    d.mkdir(mode=0o700, exist_ok=True)
    os.chmod(d, 0o700)
    return d / f"w-{key[:12]}-p{'x' if partition is None else partition}.sock"     # AF_UNIX paths: < 108 bytes


def alive(path: Path) -> bool:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(str(path))
            send(s, {"kind": "ping"}, [])
            return bool(receive(s, 0)[0].get("ok"))
    except (OSError, ValueError, ConnectionError):
        return False


def start(path: Path, *, idle: float, max_bytes: int, config: dict | None = None) -> subprocess.Popen | None:
    """Start the worker at `path` unless one answers; with `config` it builds the task and model at once
    (the ServerApp's first `query` warms every node's worker this way, before round 1)."""
    if alive(path):
        return None
    cmd = [sys.executable, "-m", "lightfed.engine.flower.node_worker", "--socket", str(path), "--idle", str(idle),
           "--max-bytes", str(max_bytes)]
    if config is not None:
        Path(str(path) + ".json").write_text(json.dumps(config))
        cmd += ["--config", str(path) + ".json"]
    with open(str(path) + ".log", "ab") as log:
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)


def call(path: Path, header: dict, blobs: list[bytes], *, max_bytes: int, idle: float, wait: float = 300.0):
    """Send one request to the worker at `path`, starting it first if none answers. -> (header, blobs)"""
    t0 = time.time()
    started = None
    if len(str(path).encode()) > 100:
        raise ValueError(f"node worker: socket path {path} is too long for a Unix socket (set TMPDIR shorter)")
    while True:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.connect(str(path))
                send(s, header, blobs)
                h, b = receive(s, max_bytes)
            if not h.get("ok"):
                raise RuntimeError(f"node worker: {h.get('error')}")
            return h, b
        except (FileNotFoundError, ConnectionRefusedError):
            if started is None:
                started = start(path, idle=idle, max_bytes=max_bytes) or False
            elif started and started.poll() is not None:
                tail = Path(str(path) + ".log").read_text(errors="replace")[-600:]
                raise RuntimeError(f"node worker at {path} exited ({started.returncode}): {tail}")
            if time.time() - t0 > wait:
                raise TimeoutError(f"node worker at {path} did not start within {wait:g} s (see {path}.log)")
            time.sleep(0.2)


def serve(path: Path, idle: float, max_bytes: int, config: Path | None = None) -> None:
    from lightfed import config as C
    from lightfed.engine.flower import train as F
    tmp = path.parent / f".{os.getpid()}.s"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(tmp))
    os.replace(tmp, path)               # atomically the one worker at this path (a racing second one takes over)
    ino = os.stat(path).st_ino
    srv.listen(4)
    srv.settimeout(idle)
    born = time.time()
    print(f"lightfed node worker {os.getpid()} on {path}", flush=True)
    if config is not None:                       # warm: build the task and model before the first message
        cfg = C.from_dict(json.loads(config.read_text()))
        F.setup(cfg, F.options(cfg))
    while True:
        try:
            conn, _ = srv.accept()
        except socket.timeout:
            break
        with conn:
            try:
                h, blobs = receive(conn, max_bytes)
                if h.get("kind") == "ping":
                    send(conn, {"ok": True}, [])
                    continue
                state, down = blobs
                from safetensors.torch import load, save
                cfg = C.from_dict(h["config"])
                up, new_state, stats, measure = F.train_core(cfg, int(h["round"]), int(h["cid"]), down,
                                                             dict(load(state)) if state else {})
                measure["process_age"] = time.time() - born
                blob = save({k: v.contiguous() for k, v in new_state.items()}) if new_state else b""
                send(conn, {"ok": True, "stats": stats, "measure": measure}, [blob, up])
            except Exception as e:  # noqa: BLE001 - the client app reports it as this client's failure
                try:
                    send(conn, {"ok": False, "error": f"{type(e).__name__}: {e}"}, [])
                except OSError:
                    pass
    srv.close()
    try:                                # leave the path to a worker that took it over
        if os.stat(path).st_ino == ino:
            os.unlink(path)
    except OSError:
        pass


def main(argv=None):
    ap = argparse.ArgumentParser(description="lightfed's per-node worker for Flower deployments")
    ap.add_argument("--socket", required=True)
    ap.add_argument("--idle", type=float, default=600.0)
    ap.add_argument("--max-bytes", type=int, default=2**31)
    ap.add_argument("--config", help="a JSON RunConfig: build its task and model at start")
    a = ap.parse_args(argv)
    serve(Path(a.socket), a.idle, a.max_bytes, Path(a.config) if a.config else None)


if __name__ == "__main__":
    main()
