"""Gradient inversion (``attacks/inversion.py``): the label rules on worked examples and on real
models, each attack rebuilding a digit from one client's single-step update made by the engine's
own trainer, noise defeating it, and bad parameters refused by name.

The victim everywhere: the digits workload's MLP (64-64-10, pixels in [0, 1]) at its seeded
initialisation, one client with one training image, one SGD step of lr 0.1."""

from __future__ import annotations

import math
import tomllib
from pathlib import Path

import pytest
import torch

from attacks._gradient_match import infer_labels, observed_gradient, total_variation
from attacks.inversion import DLG, IDLG, InvertingGradients
from redteam.errors import InvalidParameter
from redteam.federation.params import ParamSpec
from redteam.federation.training import BatchedTrainer, LocalTraining, StackedData
from redteam.privacy import label_recovery, match, ssim
from redteam.types import ClientData, Surface, UpdateObservation
from redteam.workloads.digits import Digits

LR = 0.1
SEEDS = (0, 1, 2)


@pytest.fixture(scope="module")
def digits():
    return Digits().load(0)


def _client_update(data, seed: int, index: int, batch: int = 1, *, model: str = "mlp", steps: int = 1,
                   params: torch.Tensor | None = None, lr: float = LR):
    wl = Digits(model=model)
    net = wl.build_model(torch.Generator().manual_seed(seed))
    spec = ParamSpec.of(net)
    trainer = BatchedTrainer(wl, net, spec)
    p = spec.flatten(net).detach() if params is None else params
    x, y = data.train_x[index:index + batch], data.train_y[index:index + batch]
    local = trainer.train(p, StackedData.stack([ClientData(x, y)]), torch.tensor([0]),
                          LocalTraining(steps=steps, batch_size=batch, lr=lr), torch.Generator().manual_seed(seed))
    return trainer, p, local[0] - p, x, y


def _observe(data, seed: int, batch: int = 1, noise: float = 0.0, steps: int = 1):
    trainer, p, update, x, y = _client_update(data, seed, 7 * seed, batch, steps=steps)
    if noise:
        g = torch.Generator().manual_seed(10_000 + seed)
        update = update + noise * float(update.norm()) / update.numel() ** 0.5 * torch.randn(update.shape, generator=g)
    obs = UpdateObservation(update=update, params=p, model=trainer.view(10, (64,)), lr=LR, local_steps=steps,
                            batch_size=batch, num_samples=batch, generator=torch.Generator().manual_seed(100 + seed))
    return obs, x, y


def _score(rec, x):
    images = torch.nan_to_num(rec.images, nan=0.5).clamp(0, 1)
    m = match(images, x, 1.0)
    return m.mean_psnr(), float(ssim(images[m.recon], x[m.truth], 1.0, image_shape=(8, 8)).mean())


# -- the label rules ----------------------------------------------------------------------------

class _CE:
    def loss(self, out, y):
        return torch.nn.functional.cross_entropy(out, y)


def _linear_view():
    net = torch.nn.Linear(2, 3)
    with torch.no_grad():
        net.weight.zero_()
        net.bias.zero_()
    spec = ParamSpec.of(net)
    return BatchedTrainer(_CE(), net, spec).view(3, (2,)), spec.flatten(net).detach()


def test_idlg_rule_on_a_hand_computed_gradient():
    # a linear layer with zero weights: softmax p = (1/3, 1/3, 1/3) for any input. For h = (1, 2)
    # and label 2, ∂CE/∂W_c = (p_c − [c = 2])·h: rows (1/3, 2/3), (1/3, 2/3), (−2/3, −4/3);
    # ∂CE/∂b = (1/3, 1/3, −2/3). Row sums 1, 1, −2: the label is the row with the negative sum.
    view, p = _linear_view()
    hand = torch.tensor([1 / 3, 2 / 3, 1 / 3, 2 / 3, -2 / 3, -4 / 3, 1 / 3, 1 / 3, -2 / 3])
    x = torch.tensor([[1.0, 2.0]])
    q = p.clone().requires_grad_(True)
    (auto,) = torch.autograd.grad(view.loss(view.forward(q, x), torch.tensor([2])), q)
    assert torch.allclose(auto, hand, atol=1e-7)  # the hand computation is right
    assert infer_labels(hand, view, 1).tolist() == [2]
    assert infer_labels(-hand, view, 1).tolist() != [2]  # a sign error would be caught


def test_batch_rule_on_a_hand_computed_gradient():
    # two samples, h₁ = (1, 0) with label 0 and h₂ = (0, 1) with label 2, zero weights (p = 1/3):
    # the mean gradient's rows are (−1/3, 1/6), (1/6, 1/6), (1/6, −1/3); row minima −1/3, 1/6, −1/3:
    # the two most negative rows are the labels {0, 2}
    view, p = _linear_view()
    x, y = torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([0, 2])
    q = p.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(view.loss(view.forward(q, x), y), q)
    assert torch.allclose(g[:6].reshape(3, 2), torch.tensor([[-1 / 3, 1 / 6], [1 / 6, 1 / 6], [1 / 6, -1 / 3]]))
    assert sorted(infer_labels(g, view, 2).tolist()) == [0, 2]


@pytest.mark.parametrize("model, trained", [("mlp", False), ("mlp", True), ("cnn", False)])
def test_idlg_rule_is_right_for_every_class_on_real_models(digits, model, trained):
    params = None
    if trained:  # 60 steps of full training on 512 images from the seeded start
        wl = Digits(model=model)
        net = wl.build_model(torch.Generator().manual_seed(0))
        spec = ParamSpec.of(net)
        start = spec.flatten(net).detach()
        params = BatchedTrainer(wl, net, spec).train(
            start, StackedData.stack([ClientData(digits.train_x[:512], digits.train_y[:512])]), torch.tensor([0]),
            LocalTraining(steps=60, batch_size=64, lr=0.5), torch.Generator().manual_seed(0))[0]
    got, want = [], []
    for c in range(10):
        index = int(torch.nonzero(digits.train_y == c)[3])
        trainer, p, update, x, y = _client_update(digits, 0, index, model=model, params=params)
        view = trainer.view(10, (64,))
        g = observed_gradient(UpdateObservation(update, p, view, LR, 1, 1, 1, torch.Generator()))
        got.append(int(infer_labels(g, view, 1)))
        want.append(int(y))
    assert got == want == list(range(10))


# -- the attacks on one digit ---------------------------------------------------------------------

def test_observed_gradient_is_the_clients_gradient_for_one_sgd_step(digits):
    obs, x, y = _observe(digits, 0)
    q = obs.params.clone().requires_grad_(True)
    (true,) = torch.autograd.grad(obs.model.loss(obs.model.forward(q, x), y), q)
    assert torch.allclose(observed_gradient(obs), true, atol=1e-6, rtol=1e-4)


def test_observed_gradient_after_several_steps_is_their_mean(digits):
    # 5 steps of a small lr on one sample: Δ ≈ −5·η·g, so −Δ / (η·5) ≈ g (−Δ / η would be 5× too long)
    trainer, p, update, x, y = _client_update(digits, 0, 0, steps=5, lr=1e-3)
    obs = UpdateObservation(update, p, trainer.view(10, (64,)), 1e-3, 5, 1, 1, torch.Generator())
    q = p.clone().requires_grad_(True)
    (true,) = torch.autograd.grad(obs.model.loss(obs.model.forward(q, x), y), q)
    got = observed_gradient(obs)
    assert float((got - true).norm() / true.norm()) < 0.01


@pytest.mark.parametrize("seed", SEEDS)
def test_idlg_rebuilds_the_digit_and_its_label(digits, seed):
    # measured: 104-118 dB (float32's floor: the MLP's first layer gives the input away exactly)
    obs, x, y = _observe(digits, seed)
    rec = IDLG().reconstruct(obs)
    assert rec.images.shape == (1, 64) and rec.labels.dtype == torch.int64
    got_psnr, got_ssim = _score(rec, x)
    assert got_psnr > 60.0 and got_ssim > 0.999
    assert rec.labels.tolist() == y.tolist()


@pytest.mark.parametrize("seed", SEEDS)
def test_inverting_gradients_rebuilds_the_digit_and_its_label(digits, seed):
    # 200 iterations (the release's 24,000 are the default; measured at 200: 73-77 dB)
    obs, x, y = _observe(digits, seed)
    rec = InvertingGradients(max_iterations=200).reconstruct(obs)
    got_psnr, got_ssim = _score(rec, x)
    assert got_psnr > 40.0 and got_ssim > 0.99
    assert rec.labels.tolist() == y.tolist()
    assert float(rec.images.min()) >= 0.0 and float(rec.images.max()) <= 1.0  # the box


def test_dlg_rebuilds_the_digit_on_most_seeds(digits):
    # DLG is known to be fragile; on this victim it succeeded from every start measured (5 of 5 at
    # ≈ 100 dB). The claim tested: at least 2 of 3 seeds above 40 dB with the right label.
    wins = 0
    for seed in SEEDS:
        obs, x, y = _observe(digits, seed)
        rec = DLG(iterations=30).reconstruct(obs)
        wins += _score(rec, x)[0] > 40.0 and rec.labels.tolist() == y.tolist()
    assert wins >= 2


def test_a_batch_of_two_gets_both_labels(digits):
    obs, x, y = _observe(digits, 1, batch=2)
    assert len(set(y.tolist())) == 2
    rec = InvertingGradients(max_iterations=200).reconstruct(obs)
    assert rec.images.shape == (2, 64)
    assert label_recovery(rec.labels, y) == 1.0


def test_noise_on_the_update_defeats_the_inversion(digits):
    # Gaussian noise of 10× the update's norm (what DP-FedAvg's noise does to one client's row):
    # the reconstruction is lost (measured over seeds 0-2: iDLG 5.9-7.1 dB, Inverting Gradients
    # 6.4-8.1 dB, SSIM ≤ 0.48; at 1× the norm still 19-24 dB, SSIM ≥ 0.95: the digit shows)
    obs, x, y = _observe(digits, 0, noise=10.0)
    for attack in (IDLG(iterations=5), InvertingGradients(max_iterations=200)):
        assert _score(attack.reconstruct(obs), x)[0] < 12.0
    clean, _, _ = _observe(digits, 0)
    assert _score(InvertingGradients(max_iterations=200).reconstruct(clean), x)[0] > 40.0


def test_the_box_binds_every_pixel(digits):
    obs, _, _ = _observe(digits, 0)
    rec = InvertingGradients(max_iterations=5, box=(0.25, 0.3)).reconstruct(obs)
    assert float(rec.images.min()) == 0.25 and float(rec.images.max()) == pytest.approx(0.3)


def test_total_variation_by_hand():
    # [[0, 1], [1, 1]]: horizontal |differences| 1 and 0 (mean 0.5), vertical 1 and 0 (mean 0.5)
    img = torch.tensor([[[[0.0, 1.0], [1.0, 1.0]]]])
    assert float(total_variation(img)) == pytest.approx(1.0)
    assert float(total_variation(torch.ones(2, 3, 4, 5))) == 0.0


def test_the_same_generator_gives_the_same_reconstruction(digits):
    a = InvertingGradients(max_iterations=20).reconstruct(_observe(digits, 0)[0])
    b = InvertingGradients(max_iterations=20).reconstruct(_observe(digits, 0)[0])
    assert torch.equal(a.images, b.images)


# -- contract and errors ------------------------------------------------------------------------------

def test_registered_as_privacy_observers():
    meta = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    entries = meta["project"]["entry-points"]["redteam.attacks"]
    assert entries["dlg"] == "attacks.inversion:DLG"
    assert entries["idlg"] == "attacks.inversion:IDLG"
    assert entries["inverting_gradients"] == "attacks.inversion:InvertingGradients"
    for cls in (DLG, IDLG, InvertingGradients):
        assert cls.surfaces == (Surface.PRIVACY,) and cls.observes == "update"
        assert cls.summary and cls.reference


@pytest.mark.parametrize("cls, kw, message", [
    (DLG, {"iterations": 0}, "DLG.iterations = 0: must be an integer ≥ 1"),
    (IDLG, {"lr": -1.0}, "IDLG.lr = -1.0: must be a finite number > 0"),
    (DLG, {"init": "zeros"}, "DLG.init = 'zeros': must be one of 'randn', 'rand'"),
    (IDLG, {"tol": math.nan}, "IDLG.tol = nan: must be a finite number ≥ 0"),
    (InvertingGradients, {"max_iterations": 2.5}, "InvertingGradients.max_iterations = 2.5: must be an integer"),
    (InvertingGradients, {"tv": -0.1}, "InvertingGradients.tv = -0.1: must be a finite number ≥ 0"),
    (InvertingGradients, {"box": (1.0, 0.0)}, "InvertingGradients.box = \\(1.0, 0.0\\): must be \\[lo, hi\\]"),
    (InvertingGradients, {"signed": "yes"}, "InvertingGradients.signed = 'yes': must be true or false"),
    (InvertingGradients, {"image_shape": (0, 8)}, "InvertingGradients.image_shape"),
])
def test_bad_parameters_are_refused_by_name(cls, kw, message):
    with pytest.raises(InvalidParameter, match=message):
        cls(**kw)


def test_bad_observations_are_refused_by_name(digits):
    obs, _, _ = _observe(digits, 0)
    with pytest.raises(InvalidParameter, match="learning rate must be a finite number > 0, got 0"):
        IDLG().reconstruct(UpdateObservation(obs.update, obs.params, obs.model, 0, 1, 1, 1, obs.generator))
    with pytest.raises(InvalidParameter, match="num_samples must be an integer ≥ 1, got 0"):
        IDLG().reconstruct(UpdateObservation(obs.update, obs.params, obs.model, LR, 1, 1, 0, obs.generator))
    with pytest.raises(InvalidParameter, match="two \\(d,\\) rows of one size"):
        IDLG().reconstruct(UpdateObservation(obs.update[:10], obs.params, obs.model, LR, 1, 1, 1, obs.generator))
    with pytest.raises(InvalidParameter, match="image_shape = \\[3, 3\\]: has 9 pixels"):
        InvertingGradients(image_shape=(3, 3)).reconstruct(obs)
