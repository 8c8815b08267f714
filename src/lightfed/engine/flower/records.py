"""What a Flower Message carries besides lightfed's bytes: a client's stats (numbers in a MetricRecord, the
rest as JSON) and the size of Flower's own envelope."""
from __future__ import annotations

import json

from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict

def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def pack_stats(stats: dict) -> RecordDict:
    """A client's stats -> MetricRecord (numeric leaves, nested keys joined by '.') + JSON for the rest."""
    nums, other = {}, []

    def walk(path: tuple, v):
        if isinstance(v, dict) and v and all(isinstance(k, str) and "." not in k for k in v):
            for k, x in v.items():
                walk(path + (k,), x)
        elif _is_num(v) or (isinstance(v, list) and v and all(type(x) is type(v[0]) and _is_num(x) for x in v)):
            nums[".".join(path)] = v
        else:
            other.append([list(path), v])

    for k, v in stats.items():
        if "." in k:
            other.append([[k], v])
        else:
            walk((k,), v)
    rd = RecordDict({"stats": MetricRecord(nums)})
    if other:
        rd["stats-other"] = ConfigRecord({"json": json.dumps(other)})
    return rd


def unpack_stats(content: RecordDict) -> dict:
    out: dict = {}

    def put(path: list, v):
        d = out
        for h in path[:-1]:
            d = d.setdefault(h, {})
        d[path[-1]] = v

    for k, v in content["stats"].items():
        put(k.split("."), v)
    if "stats-other" in content:
        for path, v in json.loads(content["stats-other"]["json"]):
            put(path, v)
    return out


def message_bytes(msg: Message, sizes: dict | None = None) -> int:
    """Bytes of the objects Flower ships for a Message: it pushes each object, deflated, once (objects
    are content-addressed). Call inside flwr's no_object_id_recompute() with one `sizes` cache per round:
    then a broadcast record shared by all messages is serialized and hashed once, not once per message."""
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
    sizes = {} if sizes is None else sizes
    total = 0
    for oid, o in get_all_nested_objects(msg).items():
        if oid not in sizes:
            sizes[oid] = len(o.deflate())
        total += sizes[oid]
    return total
