"""Split a training set across clients: IID, Dirichlet(alpha) over labels, or by domain.

Every partitioner is a pure function of (labels or domains, number of clients, seed): the same
inputs give the same split in any process. Every client gets at least one example.
"""
from __future__ import annotations

import numpy as np


def iid(n: int, clients: int, seed: int) -> list[np.ndarray]:
    """A random permutation cut into `clients` near-equal shards."""
    if n < clients:
        raise ValueError(f"iid partition: {n} examples cannot give {clients} clients one each")
    perm = np.random.default_rng([seed, 1]).permutation(n)
    return [np.sort(s) for s in np.array_split(perm, clients)]


def dirichlet(labels: np.ndarray, clients: int, alpha: float, seed: int, min_size: int = 1) -> list[np.ndarray]:
    """Per class c, proportions p_c ~ Dir(alpha * 1_clients) split the examples of c.

    Small alpha gives each client few classes (alpha = 0.1 is strongly non-IID). Draws are
    repeated (same generator, so still deterministic) until every client has >= min_size
    examples, as in the usual FL benchmarks; after 100 tries the smallest shards are topped up
    from the largest one.
    """
    labels = np.asarray(labels)
    n = len(labels)
    if n < clients * min_size:
        raise ValueError(f"dirichlet partition: {n} examples cannot give {clients} clients {min_size} each")
    rng = np.random.default_rng([seed, 2])
    classes = np.unique(labels)
    for _ in range(100):
        shards: list[list[int]] = [[] for _ in range(clients)]
        for c in classes:
            idx = rng.permutation(np.flatnonzero(labels == c))
            p = rng.dirichlet(np.full(clients, alpha))
            cuts = (np.cumsum(p)[:-1] * len(idx)).astype(int)
            for k, part in enumerate(np.split(idx, cuts)):
                shards[k].extend(part.tolist())
        if min(len(s) for s in shards) >= min_size:
            break
    else:  # deterministic top-up: move examples from the largest shard to each short one
        for k in range(clients):
            while len(shards[k]) < min_size:
                big = max(range(clients), key=lambda j: len(shards[j]))
                shards[k].append(shards[big].pop())
    return [np.sort(np.array(s, dtype=np.int64)) for s in shards]


def by_domain(domains: np.ndarray, clients: int, seed: int) -> list[np.ndarray]:
    """Each client holds examples of one domain (natural non-IID split, e.g. one novel each).

    With more clients than domains a domain is shared by several clients (split IID inside);
    with fewer, domains are dealt round-robin so a client may hold several.
    """
    domains = np.asarray(domains)
    names = sorted(np.unique(domains).tolist())
    rng = np.random.default_rng([seed, 3])
    if clients <= len(names):
        shards = [[] for _ in range(clients)]
        for i, d in enumerate(names):
            shards[i % clients].extend(np.flatnonzero(domains == d).tolist())
        return [np.sort(np.array(s, dtype=np.int64)) for s in shards]
    # more clients than domains: client k gets domain k % D, each domain cut among its clients
    owners = {d: [k for k in range(clients) if k % len(names) == i] for i, d in enumerate(names)}
    shards = [None] * clients
    for d, ks in owners.items():
        idx = rng.permutation(np.flatnonzero(domains == d))
        if len(idx) < len(ks):
            raise ValueError(f"domain partition: domain {d!r} has {len(idx)} examples for {len(ks)} clients")
        for k, part in zip(ks, np.array_split(idx, len(ks))):
            shards[k] = np.sort(part)
    return shards


def split(kind: str, alpha: float | None, labels, domains, clients: int, seed: int) -> list[np.ndarray]:
    if kind == "iid":
        return iid(len(labels), clients, seed)
    if kind == "dirichlet":
        return dirichlet(labels, clients, alpha, seed)
    if kind == "domain":
        if domains is None:
            raise ValueError("this task has no domains; use iid or dirichlet:ALPHA")
        return by_domain(domains, clients, seed)
    raise ValueError(f"unknown partition {kind!r}")


def histograms(shards: list[np.ndarray], labels) -> list[dict[str, int]]:
    """Per-client label counts, for the results folder."""
    labels = np.asarray(labels)
    return [{str(k): int(v) for k, v in zip(*np.unique(labels[s], return_counts=True))} for s in shards]
