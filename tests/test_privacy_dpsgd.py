"""DP-SGD in the clients' local steps (Abadi et al., CCS 2016): per-example clipping, noise on the sum."""

from __future__ import annotations

import pytest
import torch

from redteam.federation.params import ParamSpec
from redteam.federation.training import BatchedTrainer, LocalTraining, StackedData
from redteam.types import ClientData


class _CE:
    def loss(self, out, y):
        return torch.nn.functional.cross_entropy(out, y)

    def correct(self, out, y):
        return out.argmax(-1) == y


def _setup():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    spec = ParamSpec.of(model)
    return model, spec, BatchedTrainer(_CE(), model, spec)


def _by_hand_step(model, spec, x, y, clip, lr):
    """One DP-SGD step without noise, from autograd on each example separately."""
    flat = spec.flatten(model)
    grads = []
    for i in range(x.shape[0]):
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(x[i:i + 1]), y[i:i + 1]).backward()
        g = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        grads.append(g * min(1.0, clip / float(g.norm())))
    return flat - lr * torch.stack(grads).mean(0)


def test_one_step_equals_per_example_clipping_by_hand():
    model, spec, trainer = _setup()
    # one client holding exactly one example: every draw of the batch is that example, so the
    # step is known without replaying the sampler; a second client with two distinct examples
    x1 = torch.tensor([[1.0, -2.0, 0.5, 3.0]])
    y1 = torch.tensor([1])
    data = StackedData.stack([ClientData(x1, y1), ClientData(x1 * 0.1, torch.tensor([0]))])
    clip = 0.05  # far below the gradient norms: clipping binds
    cfg = LocalTraining(steps=1, batch_size=3, lr=0.5, dp_clip=clip, dp_noise_multiplier=0.0)
    out = trainer.train(spec.flatten(model), data, torch.tensor([0, 1]), cfg, torch.Generator().manual_seed(1))
    want0 = _by_hand_step(model, spec, x1.repeat(3, 1), y1.repeat(3), clip, 0.5)
    want1 = _by_hand_step(model, spec, (x1 * 0.1).repeat(3, 1), torch.tensor([0, 0, 0]), clip, 0.5)
    assert torch.allclose(out[0], want0, atol=1e-6)
    assert torch.allclose(out[1], want1, atol=1e-6)
    # the step moved each client by at most lr · clip (each clipped gradient has norm ≤ clip)
    assert float((out[0] - spec.flatten(model)).norm()) <= 0.5 * clip + 1e-6


def test_without_clipping_binding_it_is_plain_sgd():
    model, spec, trainer = _setup()
    x = torch.tensor([[1.0, -2.0, 0.5, 3.0]])
    data = StackedData.stack([ClientData(x, torch.tensor([1]))])
    gen = torch.Generator().manual_seed(2)
    plain = trainer.train(spec.flatten(model), data, torch.tensor([0]), LocalTraining(steps=2, batch_size=1, lr=0.1),
                          gen)
    dp = trainer.train(spec.flatten(model), data, torch.tensor([0]),
                       LocalTraining(steps=2, batch_size=1, lr=0.1, dp_clip=1e6), torch.Generator().manual_seed(2))
    assert torch.allclose(plain, dp, atol=1e-6)


def test_noise_std_is_sigma_clip_over_batch():
    model, spec, trainer = _setup()
    x = torch.zeros((1, 4))
    data = StackedData.stack([ClientData(x, torch.tensor([0]))] * 400)
    sigma, clip, b, lr = 2.0, 0.5, 4, 1.0
    flat = spec.flatten(model)
    cfg_q = LocalTraining(steps=1, batch_size=b, lr=lr, dp_clip=clip, dp_noise_multiplier=0.0)
    cfg_n = LocalTraining(steps=1, batch_size=b, lr=lr, dp_clip=clip, dp_noise_multiplier=sigma)
    ids = torch.arange(400)
    quiet = trainer.train(flat, data, ids, cfg_q, torch.Generator().manual_seed(0))
    noisy = trainer.train(flat, data, ids, cfg_n, torch.Generator().manual_seed(0),
                          noise_generator=torch.Generator().manual_seed(5))
    dev = (noisy - quiet).to(torch.float64)
    assert float(dev.std()) == pytest.approx(lr * sigma * clip / b, rel=0.03)
