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
