"""One round of any method, as bytes. Every engine (in-process, Flower) calls exactly these three.

    server:  down = broadcast(method, state, rnd, cid)             -> bytes (the same for every client
                                                                       unless the method sends per client)
    client:  up, stats = client_round(method, model, down, data, ctx) -> bytes (+ local measurements)
    server:  state, report = aggregate(method, state, [(cid, up), ...], rnd, sampled=[cid, ...])

Every upload carries the method's fields plus `_n`: the number of training examples the client holds
(FedAvg's n_k, the aggregation weight; not the samples it processed, which with `local_steps` are the
same for every client and would make the mean uniform), a 4-byte int on the wire. The receiver decodes and validates every message before use; a message
that fails is refused with the reason, and the round goes on with the others.
"""
from __future__ import annotations

import torch

from lightfed import device, privacy
from lightfed.data.tensors import Data, size
from lightfed.methods.base import EXAMPLES, ClientContext, Method, Rejected
from lightfed.wire import Spec, WireError, decode, encode, kind_of



def up_schema(method: Method):
    return {**method.up_schema(), EXAMPLES: Spec("int", lo=1, hi=2**32 - 1)}


def broadcast(method: Method, state, rnd: int, cid: int | None = None, cache: dict | None = None) -> bytes:
    """`cache` (a dict per round): the shared broadcast ("down") is encoded once for all clients."""
    kind, fields, schema = method.downlink(state, rnd, cid)
    if cache is not None and kind == "down" and kind in cache:
        return cache[kind]
    blob = encode(fields, schema, kind=f"{method.name}/{kind}")
    if cache is not None and kind == "down":
        cache[kind] = blob
    return blob


def received(method: Method, state, rnd: int, max_bytes: int) -> dict:
    """The global model as a client holds it after decoding the shared broadcast (a lossy codec's
    rounding included): what the engines evaluate."""
    kind = f"{method.name}/down"
    fields = decode(broadcast(method, state, rnd), method.down_schema(), kind=kind, max_bytes=max_bytes)
    return {k: fields.get(k, v) for k, v in state.items()}


def client_round(method: Method, model: torch.nn.Module, down: bytes, data: Data, ctx: ClientContext,
                 max_bytes: int) -> tuple[bytes, dict]:
    """Decode the downlink, train, encode the upload. The one place where tensors change device: the decoded fields
    and the client's own state go to the run's device before `client_update`, the update and the state come back to
    the CPU after it (privacy and the wire work on CPU tensors), so a method never sees two devices."""
    kinds = {f"{method.name}/{k}": schema for k, schema in method.down_kinds(ctx).items()}
    kind = kind_of(down, kinds) or f"{method.name}/down"          # none of them: decode says why
    fields = decode(down, kinds.get(kind, method.down_schema()), kind=kind, max_bytes=max_bytes)
    torch.manual_seed(ctx.seed)   # dropout and anything else drawing from the global RNG: same in every engine
    kept = dict(ctx.state)        # the client's state changes only with an upload that went out
    if ctx.cfg.dp_clip > 0 and method.dp == "scalars":        # clipped + noised per step, inside the method's loop
        ctx.step_noise = lambda K: privacy.StepNoise(ctx.cfg, ctx.seed, K)
    dev, cpu = device.resolve(ctx.cfg.device), torch.device("cpu")
    try:
        fields = device.to(fields, dev)
        ctx.state.update(device.to(dict(ctx.state), dev))
        with device.using(ctx.cfg.device, ctx.cfg.dtype):
            update, stats = method.client_update(model, fields, data, ctx)
        update = device.to(update, cpu)
        ctx.state.update(device.to(dict(ctx.state), cpu))
        if ctx.cfg.dp_clip > 0 and method.dp == "delta":      # ("scalars": clipped + noised per step by the method)
            update, dp_stats = privacy.privatize(update, device.to(method.dp_reference(fields), cpu), ctx.cfg, ctx.seed)
            stats = {**stats, **dp_stats}
        return encode({**update, EXAMPLES: size(data)}, up_schema(method), kind=f"{method.name}/up"), stats
    except BaseException:
        ctx.state.clear()
        ctx.state.update(kept)
        raise


def aggregate(method: Method, state, uploads: list[tuple[int, bytes]], rnd: int, *, max_bytes: int,
              min_clients: int = 1, sampled: list[int] | None = None):
    """Decode + validate each upload, aggregate the valid ones. Returns (state, report).
    `sampled`: every client sent a downlink this round (default: those who uploaded)."""
    valid, rejected, accepted = [], [], []
    for cid, blob in uploads:
        try:
            f = decode(blob, up_schema(method), kind=f"{method.name}/up", max_bytes=max_bytes)
            if f[EXAMPLES] > method.cfg.max_examples:
                raise Rejected(f"{EXAMPLES}: {f[EXAMPLES]} examples claimed, more than max_examples = {method.cfg.max_examples}")
            method.validate(state, f, rnd)          # a method's own checks (e.g. replay of seeds)
            n = float(f.pop(EXAMPLES))
            valid.append((f, n))
            accepted.append(cid)
        except (WireError, Rejected) as e:
            rejected.append({"id": cid, "bytes": len(blob), "error": str(e)})
    report = {"accepted": len(valid), "rejected": rejected}
    sampled = sorted(set(sampled if sampled is not None else []) | {cid for cid, _ in uploads})
    if len(valid) < min_clients:
        report["failed"] = f"{len(valid)} valid replies < min_clients = {min_clients}; global state kept"
        return method.after_round(state, rnd, [], sampled), report
    return method.after_round(method.aggregate(state, valid, rnd), rnd, accepted, sampled), report
