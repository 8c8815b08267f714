import numpy as np
import pytest

from lightfed.data import partition


def _check_cover(shards, n):
    allidx = np.concatenate(shards)
    assert len(allidx) == n and len(np.unique(allidx)) == n, "every example in exactly one shard"
    assert all(len(s) >= 1 for s in shards), "every client non-empty"


@pytest.mark.parametrize("n,k", [(10, 10), (101, 7), (5000, 10)])
def test_iid_covers_and_balances(n, k):
    shards = partition.iid(n, k, seed=3)
    _check_cover(shards, n)
    assert max(map(len, shards)) - min(map(len, shards)) <= 1


@pytest.mark.parametrize("alpha", [0.05, 0.1, 1.0, 100.0])
def test_dirichlet_covers_and_skews(alpha):
    labels = np.repeat(np.arange(10), 200)
    shards = partition.dirichlet(labels, 10, alpha, seed=0)
    _check_cover(shards, len(labels))
    # mean number of classes holding >= 5% of a client's data: few for small alpha, all for large
    def classes_per_client(s):
        c = np.bincount(labels[s], minlength=10) / len(s)
        return (c >= 0.05).sum()
    mean_classes = np.mean([classes_per_client(s) for s in shards])
    if alpha <= 0.1:
        assert mean_classes <= 4
    if alpha >= 100:
        assert mean_classes == 10


def test_partitions_are_deterministic_and_seed_dependent():
    labels = np.random.default_rng(0).integers(0, 2, 1000)
    a = partition.dirichlet(labels, 10, 0.1, seed=1)
    b = partition.dirichlet(labels, 10, 0.1, seed=1)
    c = partition.dirichlet(labels, 10, 0.1, seed=2)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def test_dirichlet_two_classes_many_clients_nonempty():
    labels = np.array([0] * 30 + [1] * 10)
    _check_cover(partition.dirichlet(labels, 10, 0.01, seed=5), 40)


def test_domain_split():
    domains = np.array(["a"] * 10 + ["b"] * 20 + ["c"] * 5)
    three = partition.by_domain(domains, 3, seed=0)
    _check_cover(three, 35)
    assert all(len(set(domains[s])) == 1 for s in three), "one domain per client"
    six = partition.by_domain(domains, 6, seed=0)
    _check_cover(six, 35)
    assert all(len(set(domains[s])) == 1 for s in six)
    two = partition.by_domain(domains, 2, seed=0)
    _check_cover(two, 35)


def test_too_few_examples_is_a_clear_error():
    with pytest.raises(ValueError, match="cannot give 5 clients"):
        partition.iid(3, 5, seed=0)
    with pytest.raises(ValueError, match="no domains"):
        partition.split("domain", None, np.zeros(10), None, 2, 0)


def test_histograms():
    labels = np.array([0, 0, 1, 1, 1])
    h = partition.histograms([np.array([0, 2]), np.array([1, 3, 4])], labels)
    assert h == [{"0": 1, "1": 1}, {"0": 1, "1": 2}]
