"""The fmnist task's fresh head is fresh: no row of it is the head lightfed's own base was pretrained from."""
import pytest
import torch

from lightfed import assets
from lightfed.models.backbones import seeded
from lightfed.tasks import fmnist


@pytest.mark.parametrize("arch", ["small", "resnet18"])
def test_the_tasks_head_is_never_the_pretrainings_first_head(arch):
    with seeded(0):                              # the pretraining's network, as pretrained_base draws it
        first = fmnist.network(arch, False, 5).head.weight.detach()        # (5, features)
    for seed in (0, 1, 2):
        try:   # the same architecture from random weights: the base is not needed to draw the head
            task = fmnist.build(fmnist.Options(arch=arch, pretrained=False, train_size=10, test_size=10), seed)
        except assets.AssetMissing as e:
            pytest.skip(str(e))
        head = task.model.head.weight.detach()                               # (10, features)
        assert head.shape[1] == first.shape[1]
        # the base's features grew to fit `first`: a task head holding its rows would score 94-99% on classes 0-4
        # before any training (seed 0 did, before the head had its own stream)
        assert not any(torch.equal(head[i], first[j]) for i in range(10) for j in range(5)), seed
        assert torch.allclose(head.abs().max(), first.abs().max(), rtol=0.2)     # the same init scale


def test_a_base_pretrained_under_a_frozen_orthogonal_head_keeps_it_and_the_task_starts_from_it(tmp_path, monkeypatch):
    """base_head = orthogonal: the body trains under a frozen 10-row orthogonal head read on its rows 0-4 (classes
    0-4); the cached base holds that head unchanged, and the task's model starts with it (FLITE's head = keep then
    fine-tunes in the geometry the features grew to fit). The trained-head base holds no head. On the tiny twin, with
    fake images (the pretraining's code path is the full one's)."""
    from lightfed import seeds
    from lightfed.data import datasets
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 10, (60000,), generator=g)
    y[1200:30000] = 5 + y[1200:30000] % 5                 # classes 0-4 only in the first 1,200 (pretraining's share)
    fake = {"train_x": torch.randint(0, 256, (60000, 28, 28), generator=g, dtype=torch.uint8), "train_y": y,
            "test_x": torch.zeros(10000, 28, 28, dtype=torch.uint8), "test_y": torch.randint(0, 10, (10000,), generator=g)}
    fake["train_x"][:, :4, :4] = (y * 25).to(torch.uint8)[:, None, None]                    # learnable: the label
    monkeypatch.setattr(datasets, "load_fmnist", lambda path=None: fake)
    monkeypatch.setenv("LIGHTFED_CACHE", str(tmp_path))
    monkeypatch.setattr(fmnist, "PRETRAIN_VAL", 200)
    real = fmnist.network
    monkeypatch.setattr(fmnist, "network", lambda arch, tiny, n: real(arch, True, n))        # the tiny twin
    with seeded(0):
        init = real("resnet18", True, 10).state_dict()
    base = fmnist.pretrained_base("resnet18", 1, head="orthogonal")
    W = seeds.orthogonal(tuple(base["head.weight"].shape), fmnist.derive(0, 0x0E4D))
    assert base["head.weight"].shape[0] == 10 and torch.equal(base["head.weight"], W)         # frozen: unchanged
    assert torch.allclose(W @ W.T, torch.eye(10), atol=1e-5) and torch.equal(base["head.bias"], torch.zeros(10))
    body = [k for k in base if not k.startswith("head.") and base[k].is_floating_point()]
    assert any(not torch.equal(base[k], init[k]) for k in body)                              # the body trained
    rep = fmnist.base_report("resnet18", 1, head="orthogonal")
    assert rep["head"] == "orthogonal" and rep["heldout_images"] == 200 and rep["heldout_accuracy"] is not None
    assert fmnist.base_path("resnet18", 1, head="orthogonal") != fmnist.base_path("resnet18", 1)
    task = fmnist.build(fmnist.Options(arch="resnet18", pretrain_epochs=1, base_head="orthogonal", train_size=20,
                                       test_size=20), 0)
    assert torch.equal(task.model.head.weight.detach(), W) and task.info["base"]["head"] == "orthogonal"
    plain = fmnist.pretrained_base("resnet18", 1)
    assert not any(k.startswith("head.") for k in plain)
    with pytest.raises(fmnist.ConfigError, match="base_head"):
        fmnist.Options(base_head="frozen").check()
