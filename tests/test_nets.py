"""The paper models of redteam.workloads.nets: shapes, parameter counts, deterministic init,
and the batched program (vmap(grad) over functional_call) against a per-client loop."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from torch.func import functional_call, grad, vmap

from redteam.errors import InvalidParameter
from redteam.federation.params import ParamSpec
from redteam.federation.training import BatchedTrainer, LocalTraining, StackedData
from redteam.types import ClientData
from redteam.workloads.base import Dataset, Workload
from redteam.workloads.nets import (
    LEAF_VOCAB,
    NORMS,
    CharLSTM,
    LoopLSTM,
    build_net,
    check_batchable,
)


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# small configurations: (name, build kwargs, input shape of one sample)
SMALL = {
    "resnet18": (dict(num_classes=5, in_channels=3, image_size=16, width=4), (3, 16, 16)),
    "vgg11": (dict(num_classes=5, in_channels=3, image_size=32, width=4), (3, 32, 32)),
    "lenet5": (dict(num_classes=5, in_channels=1, image_size=28), (1, 28, 28)),
    "cnn2": (dict(num_classes=10, in_channels=1, image_size=28, channels=2, hidden=8), (1, 28, 28)),
}
NORMED = ("resnet18", "vgg11", "lenet5")  # cnn2 has no normalisation option
CASES = [(n, norm) for n in NORMED for norm in NORMS] + [("cnn2", "none"), ("char_lstm", None)]


def _small(name: str, norm: str | None, seed: int = 0) -> torch.nn.Module:
    if name == "char_lstm":
        return CharLSTM(11, embed=4, hidden=6, layers=2, generator=_gen(seed))
    kw, _ = SMALL[name]
    return build_net(name, norm=norm, generator=_gen(seed), **kw)


def _inputs(name: str, lead: tuple[int, ...], seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = _gen(seed)
    if name == "char_lstm":
        x = torch.randint(0, 11, (*lead, 7), generator=g)
        return x, torch.randint(0, 11, (*lead, 7), generator=g)
    shape = SMALL[name][1]
    classes = SMALL[name][0]["num_classes"]
    return torch.rand((*lead, *shape), generator=g), torch.randint(0, classes, lead, generator=g)


def _loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


# -- shapes, sizes, initialisation ----------------------------------------------------------------


@pytest.mark.parametrize("name,norm", CASES)
def test_output_shape_and_flattened_input(name, norm):
    net = _small(name, norm)
    x, _ = _inputs(name, (4,))
    out = net(x)
    if name == "char_lstm":
        assert out.shape == (4, 7, 11)
        last = CharLSTM(11, embed=4, hidden=6, layers=2, generator=_gen(0), last_only=True)
        torch.testing.assert_close(last(x), out[:, -1])
    else:
        assert out.shape == (4, SMALL[name][0]["num_classes"])
        torch.testing.assert_close(net(x.flatten(1)), out)  # the repo's image workloads store flat pixels


def test_full_size_parameter_counts():
    def count(m):
        return sum(p.numel() for p in m.parameters())

    g = _gen()
    cifar = dict(num_classes=10, in_channels=3, image_size=32, generator=g)
    assert count(build_net("resnet18", **cifar)) == 11_173_962  # kuangliu's ResNet18() on CIFAR-10
    assert count(build_net("resnet18", norm="batch", **cifar)) == 11_173_962
    assert count(build_net("vgg11", norm="batch", **cifar)) == 9_231_114  # kuangliu's VGG('VGG11')
    assert count(build_net("lenet5", num_classes=10, in_channels=1, image_size=28, generator=g)) == 61_706
    assert count(build_net("lenet5", num_classes=10, in_channels=1, image_size=32, generator=g)) == 61_706
    assert count(build_net("cnn2", num_classes=10, in_channels=1, image_size=28, generator=g)) == 1_663_370
    lstm = CharLSTM(LEAF_VOCAB, generator=g)
    assert count(lstm) == 819_920
    assert count(lstm.lstm) == count(torch.nn.LSTM(8, 256, 2))


@pytest.mark.parametrize("name,norm", CASES)
def test_init_is_a_function_of_the_generator_only(name, norm):
    state = torch.get_rng_state()
    a = ParamSpec.of(_small(name, norm)).flatten(_small(name, norm, 0))
    b = ParamSpec.of(_small(name, norm)).flatten(_small(name, norm, 0))
    c = ParamSpec.of(_small(name, norm)).flatten(_small(name, norm, 1))
    assert torch.equal(torch.get_rng_state(), state)  # torch's global random state is never drawn from
    assert torch.isfinite(a).all()
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_norm_layers_start_at_weight_one_bias_zero():
    net = build_net("resnet18", num_classes=10, in_channels=3, image_size=32, width=4, generator=_gen())
    assert isinstance(net.bn1, torch.nn.GroupNorm) and net.bn1.num_groups == 2
    assert torch.equal(net.layer2[0].shortcut[1].weight, torch.ones(8))
    assert torch.equal(net.layer2[0].shortcut[1].bias, torch.zeros(8))


def test_cnn2_is_the_mnist_workloads_cnn():
    from redteam.workloads.mnist import MNIST5k

    ours = build_net("cnn2", num_classes=10, in_channels=1, image_size=28, generator=_gen(3))
    theirs = MNIST5k(model="cnn", hidden=512).build_model(_gen(3))
    assert type(ours) is type(theirs)
    torch.testing.assert_close(ParamSpec.of(ours).flatten(ours), ParamSpec.of(theirs).flatten(theirs), rtol=0, atol=0)


def test_loop_lstm_equals_torch_lstm():
    ours = LoopLSTM(5, 7, 2, generator=_gen())
    ref = torch.nn.LSTM(5, 7, 2, batch_first=True)
    ref.load_state_dict(ours.state_dict())  # same names, shapes and gate order
    x = torch.randn(3, 9, 5, generator=_gen(1))
    torch.testing.assert_close(ours(x), ref(x)[0], atol=1e-6, rtol=1e-5)


def test_bad_parameters_are_clear_errors():
    kw = dict(num_classes=10, in_channels=3, image_size=32, generator=_gen())
    with pytest.raises(InvalidParameter, match="unknown"):
        build_net("resnet50", **kw)
    with pytest.raises(InvalidParameter, match="depth"):
        build_net("resnet18", depth=4, **kw)
    with pytest.raises(InvalidParameter, match="norm"):
        build_net("resnet18", norm="layer", **kw)
    with pytest.raises(InvalidParameter, match="groups = 3"):
        build_net("resnet18", width=4, groups=3, **kw)
    with pytest.raises(InvalidParameter, match="cnn2"):
        build_net("cnn2", **kw)
    with pytest.raises(InvalidParameter, match="≥ 32"):
        build_net("vgg11", **{**kw, "image_size": 16})


# -- the batched program ---------------------------------------------------------------------------


@pytest.mark.parametrize("name,norm", CASES)
def test_batched_gradients_equal_a_per_client_loop(name, norm):
    """vmap(grad(loss)) over functional_call (the trainer's program) = autograd per client on a
    plain module loaded with that client's row, for 3 clients with their own rows and batches."""
    model = _small(name, norm)
    spec = ParamSpec.of(model)
    base = spec.flatten(model)
    rows = base + 0.05 * torch.randn(3, spec.dim, generator=_gen(7))
    xb, yb = _inputs(name, (3, 4))

    def loss(flat, x, y):
        return _loss(functional_call(model, spec.unflatten(flat), (x,)), y)

    got = vmap(grad(loss))(rows, xb, yb)
    plain = _small(name, norm, seed=5)  # another init: every parameter is overwritten below
    for c in range(3):
        torch.nn.utils.vector_to_parameters(rows[c].clone(), plain.parameters())
        gs = torch.autograd.grad(_loss(plain(xb[c]), yb[c]), list(plain.parameters()))
        want = torch.cat([g.reshape(-1) for g in gs])
        # batch norm's float32 variance is reduced in another order under vmap: a few ulps of the
        # statistics move single gradient entries by ~2e-5 (torch 2.13 CPU), hence its looser bound
        atol, rtol = (1e-4, 1e-3) if norm == "batch" else (1e-5, 1e-4)
        torch.testing.assert_close(got[c], want, atol=atol, rtol=rtol)


def test_batch_norm_evaluates_with_batch_statistics():
    net = build_net("resnet18", num_classes=5, in_channels=3, image_size=16, width=4, norm="batch", generator=_gen())
    x = torch.rand(6, 3, 16, 16, generator=_gen(1))
    train_out = net.train()(x)
    eval_out = net.eval()(x)
    torch.testing.assert_close(eval_out, train_out)  # no running statistics: eval = train
    alone = net(x[:3])  # the same samples, evaluated in another batch, give other outputs
    assert not torch.allclose(alone, eval_out[:3], atol=1e-4)
    assert list(net.buffers()) == []


def test_modules_with_buffers_are_rejected():
    with pytest.raises(InvalidParameter, match="running_mean"):
        check_batchable(torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.BatchNorm2d(2)))
    m = torch.nn.Linear(2, 2)
    m.register_buffer("scale", torch.ones(2))
    with pytest.raises(InvalidParameter, match="scale"):
        check_batchable(m)
    for name, norm in CASES:
        check_batchable(_small(name, norm))


def test_trainer_rejects_a_module_with_running_statistics():
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.BatchNorm2d(2), torch.nn.Flatten(),
                                torch.nn.Linear(2 * 4 * 4, 3))
    with pytest.raises(InvalidParameter, match="running-statistics buffers"):
        BatchedTrainer(Workload(), model, ParamSpec.of(model))


@dataclass(frozen=True, slots=True)
class _TinyCifar(Workload):
    """Random 3×32×32 images, 10 classes, ResNet-18 at width 4."""

    input_kind = "image"
    image_shape = (3, 32, 32)

    def load(self, seed: int) -> Dataset:
        g = _gen(seed)
        x = torch.randint(0, 256, (60, 3, 32, 32), generator=g, dtype=torch.uint8).float() / 255
        y = torch.randint(0, 10, (60,), generator=g)
        return Dataset(x[:48], y[:48], x[48:], y[48:], num_classes=10)

    def build_model(self, generator: torch.Generator) -> torch.nn.Module:
        return build_net("resnet18", num_classes=10, in_channels=3, image_size=32, width=4, generator=generator)


def test_two_rounds_of_batched_training_move_resnet18():
    wl = _TinyCifar()
    ds = wl.load(0)
    model = wl.build_model(_gen())
    spec = ParamSpec.of(model)
    data = StackedData.stack([ClientData(ds.train_x[i::4], ds.train_y[i::4]) for i in range(4)])
    tr = BatchedTrainer(wl, model, spec)
    flat0 = flat = spec.flatten(model)
    gen = _gen(1)
    for _ in range(2):
        local = tr.train(flat, data, torch.arange(4), LocalTraining(steps=2, batch_size=4, lr=0.05), gen)
        assert local.shape == (4, spec.dim) and torch.isfinite(local).all()
        assert not torch.equal(local[0], local[1])  # clients trained on their own data
        flat = local.mean(0)
    assert (flat - flat0).norm() > 0
    acc, loss = tr.evaluate(flat, ds.test_x, ds.test_y)
    assert 0.0 <= acc <= 1.0 and loss == loss
