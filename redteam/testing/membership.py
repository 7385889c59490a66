"""A membership-inference setting whose truth is known: for checking ``observes = "model"`` attacks.

:func:`membership_world` trains a small MLP on a random subset of scikit-learn's 8×8 digits (the
*members*) until it fits them better than the rest, and builds the
:class:`~redteam.types.ModelObservation` an observer of that model gets: the members shuffled with
as many held-out *non-members* as asked, a disjoint population to train shadow models on, and a
``train`` that repeats the target's own procedure. ``leak = False`` trains the target on a
third, disjoint subset instead, so the "members" were never seen: every attack's AUC should then
sit near 0.5 (the control that fails when the leak is removed).

:func:`check_membership_attack` is the contract such an attack meets on a small world: one finite
float score per candidate, the same scores under the same seed, its inputs left as they were.

Nothing is imported (torch, scikit-learn) until a function runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from redteam.types import ModelObservation, ModelView

if TYPE_CHECKING:
    import torch

__all__ = ["MembershipWorld", "membership_world", "mlp_view", "adam_trainer", "check_membership_attack"]


@dataclass(frozen=True, slots=True)
class MembershipWorld:
    """The observation an attack scores, and the hidden truth the metrics compare with."""

    observation: ModelObservation
    is_member: "torch.Tensor"  # (m,) bool, aligned with observation.candidates_x


def mlp_view(inputs: int, hidden: int, classes: int) -> ModelView:
    """A one-hidden-layer ReLU MLP (``inputs``-``hidden``-``classes``) over a flat row, as a
    :class:`ModelView` (cross-entropy loss; layers ``w1, b1, w2, b2`` in that order)."""
    import torch

    shapes = (("w1", (inputs, hidden)), ("b1", (hidden,)), ("w2", (hidden, classes)), ("b2", (classes,)))
    layers, at = [], 0
    for name, shape in shapes:
        n = 1
        for s in shape:
            n *= s
        layers.append((name, at, at + n, shape))
        at += n

    def parts(flat: "torch.Tensor") -> list["torch.Tensor"]:
        return [flat[a:b].reshape(shape) for _, a, b, shape in layers]

    def features(flat: "torch.Tensor", x: "torch.Tensor") -> "torch.Tensor":
        w1, b1, _, _ = parts(flat)
        return torch.relu(x.reshape(x.shape[0], inputs) @ w1 + b1)

    def forward(flat: "torch.Tensor", x: "torch.Tensor") -> "torch.Tensor":
        _, _, w2, b2 = parts(flat)
        return features(flat, x) @ w2 + b2

    return ModelView(forward=forward, loss=torch.nn.functional.cross_entropy, features=features,
                     layers=tuple(layers), head=("w2", "b2"), input_shape=(inputs,), num_classes=classes,
                     input_kind="vector")


def adam_trainer(view: ModelView, steps: int, lr: float, init_std: float = 0.1
                 ) -> Callable[["torch.Tensor", "torch.Tensor", "torch.Generator"], "torch.Tensor"]:
    """``train(x, y, generator) -> (d,)``: a fresh model (N(0, ``init_std``²) entries drawn from the
    generator) trained by ``steps`` full-batch Adam steps of learning rate ``lr`` on (x, y)."""
    import torch

    def train(x: "torch.Tensor", y: "torch.Tensor", generator: "torch.Generator") -> "torch.Tensor":
        p = torch.randn(view.dim, generator=generator, device=generator.device) * init_std
        p = p.to(x.device).requires_grad_()
        opt = torch.optim.Adam([p], lr=lr)
        for _ in range(steps):
            opt.zero_grad()
            view.loss(view.forward(p, x), y).backward()
            opt.step()
        return p.detach()

    return train


def membership_world(seed: int, *, members: int = 100, non_members: int = 300, leak: bool = True,
                     hidden: int = 64, steps: int = 80, lr: float = 0.03) -> MembershipWorld:
    """The target trained on ``members`` digits (or, ``leak = False``, on as many others), observed
    with ``members + non_members`` candidates; the population is every digit left (1,797 in all).

    The defaults (a 64-64-10 MLP, 80 Adam steps of 0.03 on 100 members) fit the members closely
    and reach about 85-93 % accuracy on the rest: a model that leaks membership, on purpose."""
    import torch
    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.tensor(data.data, dtype=torch.float32) / 16.0
    y = torch.tensor(data.target, dtype=torch.int64)
    if 2 * members + non_members >= y.numel():
        raise ValueError(f"membership_world: 2·members + non_members = {2 * members + non_members} leaves no "
                         f"population among the {y.numel()} digits")
    g = torch.Generator().manual_seed(int(seed))
    perm = torch.randperm(y.numel(), generator=g)
    mem = perm[:members]
    non = perm[members:members + non_members]
    stand_in = perm[members + non_members:2 * members + non_members]
    pop = perm[2 * members + non_members:]
    view = mlp_view(64, hidden, 10)
    train = adam_trainer(view, steps, lr)
    trained_on = mem if leak else stand_in
    target = train(x[trained_on], y[trained_on], g)
    cand = torch.cat([mem, non])
    truth = torch.cat([torch.ones(members, dtype=torch.bool), torch.zeros(non_members, dtype=torch.bool)])
    order = torch.randperm(cand.numel(), generator=g)
    cand, truth = cand[order], truth[order]
    obs = ModelObservation(params=target, model=view, candidates_x=x[cand], candidates_y=y[cand],
                           population_x=x[pop], population_y=y[pop], train=train, train_size=members,
                           generator=torch.Generator().manual_seed(1000 + int(seed)))
    return MembershipWorld(observation=obs, is_member=truth)


def check_membership_attack(attack: Any, *, seed: int = 0) -> "torch.Tensor":
    """Check an ``observes = "model"`` attack's :meth:`~redteam.types.Attack.membership_scores` on a
    small world (20 members, 30 non-members, 5 training steps) and return its scores. Raises
    ``AssertionError`` naming the attack and the property: ``(m,)`` floating scores, all finite;
    the same scores for the same world and seed; the observation's tensors left unchanged."""
    import torch

    name = type(attack).__name__

    def world() -> MembershipWorld:
        return membership_world(seed, members=20, non_members=30, steps=5)

    first = world()
    obs = first.observation
    tensors = ("params", "candidates_x", "candidates_y", "population_x", "population_y")
    before = {k: getattr(obs, k).clone() for k in tensors}
    got = attack.membership_scores(obs)
    m = int(obs.candidates_y.shape[0])
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != (m,) or not got.is_floating_point():
        raise AssertionError(f"{name}.membership_scores: must return a floating ({m},) tensor (one score per "
                             f"candidate), got {type(got).__name__} {tuple(getattr(got, 'shape', ()))} "
                             f"{getattr(got, 'dtype', '')}")
    if not bool(torch.isfinite(got).all()):
        raise AssertionError(f"{name}.membership_scores: returned {int((~torch.isfinite(got)).sum())} non-finite "
                             "scores (the ROC metrics need finite ones)")
    for k, v in before.items():
        if not torch.equal(v, getattr(obs, k)):
            raise AssertionError(f"{name}.membership_scores: modified the observation's {k}")
    again = attack.membership_scores(world().observation)
    if not torch.equal(got, again):
        raise AssertionError(f"{name}.membership_scores: not deterministic: two identical observations "
                             f"(seed {seed}) gave different scores")
    return got
