"""Secure aggregation (Bonawitz et al., CCS 2017; semi-honest server): the server learns the sum of the
round's updates and nothing about any one of them, and the sum survives clients that drop mid-round.

One round, for the sampled clients U (threshold t = ceil(2|U|/3) unless set):
  0 keys     client i -> server: two X25519 public keys (c_i: encrypts shares; s_i: agrees masks);
             server -> every client: the roster (U, t and all of U's keys)
  1 shares   client i draws a self-mask seed b_i, splits b_i and its secret s key into t-of-|U| Shamir shares
             (pycryptodome), and sends share j to client j through the server, AES-GCM encrypted under
             HKDF(c_i x c_j): the server routes ciphertexts it cannot read
  2 input    client i (trained) sends y_i = x_i + PRG(b_i) + sum_{j>i} PRG(s_ij) - sum_{j<i} PRG(s_ij)  mod 2^64,
             s_ij = HKDF(s_i x s_j), x_i = [n_i * update_i (fixed point, 2^-24) ..., n_i]
  3 unmask   server -> survivors: who dropped; each survivor returns its shares of b_j for survivors j and of
             s_j for dropped j; from t shares the server rebuilds them, removes every survivor's self mask and
             the dropped clients' pairwise masks, and has sum_i x_i exactly (integers mod 2^64)
The server then divides by sum n_i: the example-weighted mean of the survivors' updates, as FedAvg's.

Covers the methods whose upload is a dense update averaged by the server (FedAvg, FedProx, LoRA, VeRA,
FLITE's latent, FedNL, FedALA, FedSSI, FedZO); refused with robust aggregation (it needs each update) and for
the zeroth-order methods (the server replays each client's seeds). The price: no per-client validation of
values (a bad client can only hurt the sum; the masked message itself is still decoded and checked), 8 bytes
per coordinate on the wire, and the protocol's own messages, all counted. Limits: semi-honest server
(no signatures: a server that lies about who dropped could unmask a client); fewer than t survivors fails
the round (the global state is kept); a client that drops before the setup completes (keys, shares, inbox)
is left out and the setup starts again with the others (fresh keys; every attempt's bytes count).

Transport: `Round` drives the phases through `call(phase, {client: request}) -> {client: reply}` (a missing
reply = a dropped client). In-process the clients are objects here; on Flower (engine/flower_app.py) each phase
is one exchange of QUERY messages and a client keeps its secrets between phases in its node's private state
(`Client.dump` / `Client.restore`; they never enter a message). The same bytes cross the wire on both.
"""
from __future__ import annotations

import math
import secrets

import numpy as np
import torch
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from Crypto.Protocol.SecretSharing import Shamir

from lightfed.config import ConfigError
from lightfed.wire import Spec, WireError, decode, encode

FRAC = 24                    # fixed point: 2^-24 per unit of n_i * value
RANGE = 2.0**30              # |n_i * value| is clipped here: sum_i stays far below 2^63 / 2^24
KEY = Spec("bytes", max_len=32)
MAX_BYTES = 2**31            # a masked input: 8 bytes per coordinate


def _dec(blob: bytes, schema: dict, kind: str) -> dict:
    return decode(blob, schema, kind=kind, max_bytes=MAX_BYTES)


def _keys32(fields: dict) -> dict:
    """Every public key (and revealed secret) is exactly 32 bytes; the wire only bounds the length."""
    for k, v in fields.items():
        if len(v) != 32:
            raise WireError(k, f"{len(v)} bytes, an X25519 key or a secret share is 32")
    return fields


def check(cfg, method_cls) -> None:
    if not cfg.secagg:
        return
    if method_cls.dp != "delta":
        raise ConfigError(f"secagg: method {cfg.method!r} needs each client's upload as it is (its server replays, "
                          "decompresses or sums it): secure aggregation covers dense averaged updates only")
    if cfg.robust != "mean":
        raise ConfigError(f"secagg with robust = {cfg.robust!r}: robust aggregation needs each update; use mean")


def _kdf(shared: bytes, info: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(shared)


def _pub(k: X25519PrivateKey) -> bytes:
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
    return k.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def _raw(k: X25519PrivateKey) -> bytes:
    from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat
    return k.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())


def prg(seed: bytes, n: int) -> np.ndarray:
    """n uint64 words from a 32-byte seed (numpy's PCG64)."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(int.from_bytes(seed, "big")))).bit_generator.random_raw(n)


def split(secret: bytes, t: int, n: int) -> list[bytes]:
    """32-byte secret -> n shares of 32 bytes (two 16-byte Shamir halves); any t rebuild it."""
    a, b = Shamir.split(t, n, secret[:16]), Shamir.split(t, n, secret[16:])
    return [x[1] + y[1] for x, y in zip(a, b)]                      # share k is for index k + 1


def combine(shares: dict[int, bytes]) -> bytes:
    """{index (1-based): share} -> the secret."""
    a = Shamir.combine([(i, s[:16]) for i, s in shares.items()])
    b = Shamir.combine([(i, s[16:]) for i, s in shares.items()])
    return a + b


def to_fixed(fields: dict[str, torch.Tensor], names: list[str], n: int) -> np.ndarray:
    """[n * update (fixed point, int64 two's complement as uint64) ..., n]"""
    v = torch.cat([fields[k].detach().double().flatten() for k in names]).mul_(n).clamp_(-RANGE, RANGE)
    q = torch.round(v * 2.0**FRAC).to(torch.int64).numpy().view(np.uint64)
    return np.concatenate([q, np.array([n], dtype=np.uint64)])


def from_fixed(total: np.ndarray, names: list[str], shapes: dict) -> tuple[dict, int]:
    s = total.view(np.int64)
    n = int(s[-1])
    flat = torch.from_numpy(s[:-1].astype(np.float64) / 2.0**FRAC / n)
    out, i = {}, 0
    for k in names:
        m = math.prod(shapes[k])
        out[k] = flat[i: i + m].view(shapes[k]).float()
        i += m
    return out, n


class Client:
    def __init__(self, cid: int):
        self.cid, self.c, self.s, self.b = cid, X25519PrivateKey.generate(), X25519PrivateKey.generate(), secrets.token_bytes(32)

    def keys(self) -> bytes:                                                   # phase 0
        return encode({"c": _pub(self.c), "s": _pub(self.s)}, {"c": KEY, "s": KEY}, kind="secagg/keys")

    def shares(self, roster: bytes) -> bytes:                                  # phase 1
        self._adopt(roster)
        U, t = self.U, self.t
        bs, ss = split(self.b, t, len(U)), split(_raw(self.s), t, len(U))
        out = {}
        for k, j in enumerate(U):
            key = _kdf(self.c.exchange(X25519PublicKey.from_public_bytes(self.cpub[j])), b"secagg shares")
            nonce = secrets.token_bytes(12)
            out[f"to.{j}"] = nonce + AESGCM(key).encrypt(nonce, bs[k] + ss[k], f"{self.cid}->{j}".encode())
        return encode(out, {f"to.{j}": Spec("bytes", max_len=12 + 64 + 16) for j in U}, kind="secagg/shares")

    def _adopt(self, roster: bytes) -> None:
        f = _dec(roster, ROSTER, kind="secagg/roster")
        U = _ids(f["U"], "U")
        if self.cid not in U or not 1 <= f["t"] <= len(U):
            raise ValueError(f"secagg: a roster of {U[:8]}... with t = {f['t']} does not hold client {self.cid}")
        keys = _keys32(_dec(f["keys"], roster_schema(U), kind="secagg/roster-keys"))
        self.U, self.t, self.roster = U, f["t"], roster
        self.cpub = {j: keys[f"{j}.c"] for j in U}
        self.spub = {j: keys[f"{j}.s"] for j in U}

    def receive(self, inbox: bytes) -> None:                                    # phase 1, the server's delivery
        f = _dec(inbox, {f"from.{j}": Spec("bytes", max_len=92) for j in self.U}, kind="secagg/inbox")
        held = {}                     # all or nothing: a bad inbox leaves what the client held as it was
        for j in self.U:
            key = _kdf(self.c.exchange(X25519PublicKey.from_public_bytes(self.cpub[j])), b"secagg shares")
            ct = f[f"from.{j}"]
            held[j] = AESGCM(key).decrypt(ct[:12], ct[12:], f"{j}->{self.cid}".encode())   # (b_j share, s_j share)
            if len(held[j]) != 64:
                raise WireError(f"from.{j}", f"{len(held[j])} bytes of shares, expected 64")
        self.held, self.inbox = held, inbox

    def masked(self, x: np.ndarray) -> bytes:                                  # phase 2
        y = x + prg(self.b, len(x))
        for j in self.U:
            if j != self.cid:
                m = prg(_kdf(self.s.exchange(X25519PublicKey.from_public_bytes(self.spub[j])), b"secagg mask"), len(x))
                y = y + m if self.cid < j else y - m                        # uint64: mod 2^64
        return encode({"y": torch.from_numpy(y.view(np.int64).copy())}, {"y": Spec("tensor", (len(x),), "i64")}, kind="secagg/masked")

    def unmask(self, request: bytes) -> bytes:                                 # phase 3
        f = _dec(request, {"dropped": Spec("bytes", max_len=4 * len(self.U))}, kind="secagg/unmask")
        dropped = set(np.frombuffer(f["dropped"], dtype="<u4").tolist())
        if not dropped <= set(self.U):
            raise ValueError("secagg: the server named a dropped client outside the round")
        out = {f"{j}": self.held[j][32:] if j in dropped else self.held[j][:32] for j in self.U}
        return encode(out, {f"{j}": Spec("bytes", max_len=32) for j in self.U}, kind="secagg/reveal")

    def mask_upload(self, upload: bytes, up_schema: dict, kind: str) -> bytes:
        """Its own plain upload (a method's `.../up` message) -> the masked input that replaces it."""
        f = _dec(upload, up_schema, kind=kind)
        return self.masked(to_fixed(f, layout(up_schema)[0], int(f["_n"])))

    # between phases a client on another engine keeps this (node-private; never sent)
    def dump(self) -> bytes:
        return encode({"c": _raw(self.c), "s": _raw(self.s), "b": self.b, "roster": getattr(self, "roster", b""),
                       "inbox": getattr(self, "inbox", b"")}, SECRETS, kind="secagg/secrets")

    @classmethod
    def restore(cls, cid: int, blob: bytes) -> "Client":
        f = _dec(blob, SECRETS, kind="secagg/secrets")
        c = cls.__new__(cls)
        c.cid, c.b = cid, f["b"]
        c.c, c.s = X25519PrivateKey.from_private_bytes(f["c"]), X25519PrivateKey.from_private_bytes(f["s"])
        if f["roster"]:
            c._adopt(f["roster"])
        if f["inbox"]:
            c.receive(f["inbox"])
        return c


    def answer(self, phase: str, request: bytes) -> bytes:
        """Its reply to one setup or unmask phase (the transport's view of a client)."""
        return {"keys": lambda: self.keys(), "shares": lambda: self.shares(request),
                "inbox": lambda: self.receive(request) or b"", "unmask": lambda: self.unmask(request)}[phase]()


def step(cid: int, phase: str, request: bytes, held: bytes | None) -> tuple[bytes, bytes]:
    """A client's side of one phase on an engine that keeps no objects between messages:
    (phase, request, what it held) -> (reply, what to hold now). Every "keys" phase starts with fresh keys."""
    c = Client(cid) if phase == "keys" else Client.restore(cid, held or b"")
    return c.answer(phase, request), c.dump()


def roster_schema(U):
    return {f"{j}.{k}": KEY for j in U for k in ("c", "s")}


MAX_CLIENTS = 1 << 16
ROSTER = {"U": Spec("bytes", max_len=4 * MAX_CLIENTS), "t": Spec("int", lo=1, hi=MAX_CLIENTS), "keys": Spec("bytes", max_len=80 * MAX_CLIENTS)}
SECRETS = {"c": KEY, "s": KEY, "b": KEY, "roster": Spec("bytes", max_len=100 * MAX_CLIENTS),
           "inbox": Spec("bytes", max_len=100 * MAX_CLIENTS)}


def _ids(raw: bytes, field: str) -> list[int]:
    if len(raw) % 4:
        raise WireError(field, f"{len(raw)} bytes: client ids are 4 bytes each")
    U = np.frombuffer(raw, dtype="<u4").tolist()
    if U != sorted(set(U)):
        raise WireError(field, "client ids must be strictly increasing")
    return U


def layout(up_schema: dict) -> tuple[list[str], dict]:
    """The float tensors of a method's upload, in schema order: what the masked input holds (then _n)."""
    names = [k for k, sp in up_schema.items() if sp.kind == "tensor" and sp.codec not in ("i64", "i32")]
    return names, {k: tuple(up_schema[k].shape) for k in names}


class Server:
    """Routes the protocol's messages and unmasks the sum; sees keys, ciphertexts, masked vectors and the
    shares it asks for (self-mask shares of survivors, key shares of the dropped), never an update."""

    def __init__(self, U: list[int], threshold: int = 0):
        self.U, self.t = sorted(U), threshold or math.ceil(2 * len(U) / 3)
        self.pub, self.bytes = {}, {j: {"up": 0, "down": 0} for j in U}

    def _count(self, j, up=0, down=0):
        self.bytes[j]["up"] += up
        self.bytes[j]["down"] += down

    def roster(self, keys: dict[int, bytes]) -> bytes:
        for j, m in keys.items():
            self._count(j, up=len(m))
            f = _keys32(_dec(m, {"c": KEY, "s": KEY}, kind="secagg/keys"))
            self.pub[f"{j}.c"], self.pub[f"{j}.s"] = f["c"], f["s"]
        if len(keys) < self.t:
            raise RuntimeError(f"secagg: {len(keys)} clients sent keys, fewer than the threshold {self.t}")
        blob = encode({"U": np.array(self.U, dtype="<u4").tobytes(), "t": self.t,
                       "keys": encode(self.pub, roster_schema(self.U), kind="secagg/roster-keys")}, ROSTER, kind="secagg/roster")
        for j in self.U:
            self._count(j, down=len(blob))
        return blob

    def route(self, shares: dict[int, bytes]) -> dict[int, bytes]:
        box = {j: {} for j in self.U}
        for i, m in shares.items():
            self._count(i, up=len(m))
            f = _dec(m, {f"to.{j}": Spec("bytes", max_len=92) for j in self.U}, kind="secagg/shares")
            for j in self.U:
                box[j][f"from.{i}"] = f[f"to.{j}"]
        out = {j: encode(box[j], {f"from.{i}": Spec("bytes", max_len=92) for i in self.U}, kind="secagg/inbox") for j in self.U}
        for j, m in out.items():
            self._count(j, down=len(m))
        return out

    def unmask(self, masked: dict[int, bytes], dim: int, reveal) -> np.ndarray | None:
        """masked: {client: phase-2 message} from the survivors; reveal(client, request bytes) -> its phase-3
        reply (None if it is gone too). -> sum of the survivors' x, or None below the threshold."""
        req = self.unmask_request(masked, dim)
        if req is None:
            return None
        return self.unmask_finish({i: r for i in self.alive if (r := reveal(i, req)) is not None})

    def unmask_request(self, masked: dict[int, bytes], dim: int) -> bytes | None:
        """Phase 3's request to every survivor (who dropped), or None below the threshold."""
        self.ys, self.dim = {}, dim
        for i, m in masked.items():
            self._count(i, up=len(m))
            self.ys[i] = _dec(m, {"y": Spec("tensor", (dim,), "i64")}, kind="secagg/masked")["y"].numpy().view(np.uint64)
        self.alive = sorted(self.ys)
        if len(self.alive) < self.t:
            return None
        dropped = [j for j in self.U if j not in self.ys]
        req = encode({"dropped": np.array(dropped, dtype="<u4").tobytes()},
                     {"dropped": Spec("bytes", max_len=4 * len(self.U))}, kind="secagg/unmask")
        for i in self.alive:
            self._count(i, down=len(req))
        return req

    def unmask_finish(self, replies: dict[int, bytes]) -> np.ndarray | None:
        """The survivors' phase-3 replies -> the sum of their x, or None if fewer than t answered."""
        got = {}
        for i in self.alive:
            if i in replies:
                r = replies[i]
                self._count(i, up=len(r))
                got[i] = _keys32(_dec(r, {f"{j}": Spec("bytes", max_len=32) for j in self.U}, kind="secagg/reveal"))
        if len(got) < self.t:
            return None
        dim, alive = self.dim, self.alive
        dropped = [j for j in self.U if j not in self.ys]
        idx = {j: k + 1 for k, j in enumerate(self.U)}
        total = np.zeros(dim, dtype=np.uint64)
        for i in alive:
            total += self.ys[i]
            total -= prg(combine({idx[h]: got[h][f"{i}"] for h in got}), dim)            # i's self mask
        for d in dropped:                                                                  # d's pairwise masks
            sk = X25519PrivateKey.from_private_bytes(combine({idx[h]: got[h][f"{d}"] for h in got}))
            for i in alive:
                m = prg(_kdf(sk.exchange(X25519PublicKey.from_public_bytes(self.pub[f"{i}.s"])), b"secagg mask"), dim)
                total = total - m if i < d else total + m        # i added m when i < d, subtracted it when i > d
        return total


class Round:
    """The engine's side of one round: phases 0-1 at the start (before training), each client's masked
    input after its training (instead of its plain upload), phase 3 and the aggregate at the end.
    `call` carries the phases to the clients (None: in-process clients, held here)."""

    def __init__(self, U: list[int], threshold: int = 0, call=None):
        if call is None:
            self.clients: dict[int, Client] = {}
            call = self._local
        self.call, self.masked, self.spent = call, {}, {}
        self.failed, U = "", sorted(U)
        while True:                  # a client that drops during the setup is left out; the rest start again
            keys = self.call("keys", {i: b"" for i in U})
            self.server = server = Server(sorted(keys), threshold)
            if not server.U or len(server.U) < server.t:
                self.failed = f"secagg: {len(server.U)} of {len(U)} clients sent keys, fewer than the threshold {server.t}"
                break
            roster = server.roster(keys)
            ok = set(shares := self.call("shares", {i: roster for i in server.U}))
            if ok == set(server.U):
                ok = set(self.call("inbox", server.route(shares)))
                if ok == set(server.U):
                    break
            self._spend(server)          # strictly fewer clients each time: the loop ends
            U = sorted(ok)
        self.members = server.U if not self.failed else []

    def _local(self, phase: str, requests: dict[int, bytes]) -> dict[int, bytes]:
        if phase == "keys":                                # every setup attempt: fresh keys
            self.clients.update({i: Client(i) for i in requests})
        return {i: self.clients[i].answer(phase, b) for i, b in requests.items()}

    def _spend(self, server: Server) -> None:             # the bytes of a setup that started again
        for j, b in server.bytes.items():
            s = self.spent.setdefault(j, {"up": 0, "down": 0})
            s["up"] += b["up"]
            s["down"] += b["down"]

    def mask(self, cid: int, upload: bytes, method, up_schema) -> bytes:
        """Client side, in-process: its own plain upload -> the masked message that replaces it."""
        msg = self.clients[cid].mask_upload(upload, up_schema, kind=f"{method.name}/up")
        self.masked[cid] = msg
        return msg

    def aggregate(self, method, schema, state, rnd: int, sampled: list[int]):
        """Server side: unmask the survivors' sum; the method aggregates it as one upload holding their
        example-weighted mean (what FedAvg's weighted mean of their uploads is). schema: the uploads' (with `_n`)."""
        if not self.masked:
            return method.after_round(state, rnd, [], sampled), {"accepted": 0, "rejected": [],
                                                                 "failed": self.failed or "no masked input"}
        names, shapes = layout(schema)
        dim = sum(math.prod(s) for s in shapes.values()) + 1
        req = self.server.unmask_request(self.masked, dim)
        total = None if req is None else self.server.unmask_finish(self.call("unmask", {i: req for i in self.server.alive}))
        if total is None:
            return method.after_round(state, rnd, [], sampled), {
                "accepted": 0, "rejected": [], "failed": f"secagg: fewer than {self.server.t} survivors; global state kept"}
        mean, n = from_fixed(total, names, shapes)
        alive = sorted(self.masked)
        return method.after_round(method.aggregate(state, [(mean, float(n))], rnd), rnd, alive, sampled), \
            {"accepted": len(alive), "rejected": [], "secagg": {"threshold": self.server.t, "survivors": alive}}

    def overhead(self, cid: int) -> dict:
        """The protocol's bytes for this client (every setup attempt), beyond the masked input that replaced its upload."""
        b = self.server.bytes.get(cid, {"up": 0, "down": 0})
        s = self.spent.get(cid, {"up": 0, "down": 0})
        return {"up": b["up"] + s["up"] - len(self.masked.get(cid, b"")), "down": b["down"] + s["down"]}
