"""Snowball: bidirectional elections on the clients' model updates.

Qin, Chen, Zhi, Yan & Deng, "Resisting Backdoor Attacks in Federated Learning via Bidirectional
Elections and Individual Perspective", AAAI 2024 (vol. 38 no. 13, pp. 14677–14685). Authors' code:
github.com/zhenqincn/Snowball, ``fl_core/anti_poison/snowball.py`` and ``main.py`` (commit
b4b81c698a4592f035eb32fe4527558a5fb978df, read for this implementation; none of it is copied).

**Bottom-up election** (per layer l, i.e. per parameter tensor of the chosen layers). Every client i
looks at the differences dᵢⱼ = uᵢˡ − uⱼˡ from its own layer update to everyone's (dᵢᵢ = 0) and
clusters them by k-means with ``ct`` + 1 clusters, the initial centres being dᵢᵢ and the ``ct``
differences of largest norm (its ``ct`` farthest peers). Client i votes for the clients in its own
cluster (itself included), with the weight of its clustering's Calinski–Harabasz score, min–max
normalised over the n clients of the layer; only clients with a positive score vote (when fewer
than ⌊n/10⌋ do, the ⌊n/10⌋ best scores vote). The votes of all layers add up, and the
⌈``bottom_up_fraction``·n⌉ most-voted clients are the *selectees*.

**Top-down election.** A variational auto-encoder learns the pairwise differences uᵢ − uⱼ (i ≠ j)
among the selectees (passed through a sigmoid), ``vae_initial`` epochs; then, while fewer than
⌊``vt``·n⌋ clients are selected, it is tuned ``vae_tuning`` epochs on the current selectees'
differences and every other client c is scored by the mean reconstruction error of ±(uₛ − u_c) over
the selectees s (each the mean of ``recon_samples`` latent draws); the ⌈``v_step``·n⌉ clients with
the lowest errors join (never past ⌊``vt``·n⌋). The aggregate is the sample-weighted mean of the
selected updates; everyone else is rejected.

Implementation notes:

* k-means is translation and reflection invariant, so client i's clustering of {uᵢ − uⱼ} is that of
  the updates {uⱼ} themselves started from uᵢ and its ``ct`` farthest peers. All n clusterings of a
  layer run at once on the n × n matrix of squared distances (a centroid is a mean of points, and its
  distance to a point is (1/|S|)·Σₛ D²ₛⱼ − (1/2|S|²)·Σₛₜ D²ₛₜ): Lloyd's iterations until no label
  changes (the authors: scikit-learn's ``KMeans(init=…, n_init=1)``, whose tolerance may stop a
  hair earlier); an emptied cluster keeps its previous centre (scikit-learn moves it to a far point;
  neither happens with distinct updates). The Calinski–Harabasz score follows scikit-learn's
  (1.0 when the clusters have no spread, 0 here for a single cluster, where scikit-learn raises).
* ``ct`` is capped at n − 2 (k-means needs at most n − 1 clusters for the score to exist).
* Conventions where the authors' code is silent or breaks: when every client of a layer has the same
  score the min–max normalisation divides 0 by 0 (NaN votes in the authors' code); here every
  weight is then 1 (BackFed's convention). The top-down election needs at least two selectees
  (the difference set of one is empty): ⌈``bottom_up_fraction``·n⌉ is raised to 2, as BackFed does.
  A candidate identical to every selectee (no non-zero difference; the authors test the *sum* of the
  difference) scores 0. Ties in votes or errors go to the lower row.
* ``layers``: which parameter tensors take part (read from ``ctx.model.layers``, the engine's model
  view). ``"first_last"`` (default) uses those of the first layer and of the output layer, as the
  authors' code does (``conv1`` and ``fc2`` of their CNNs); ``"all"`` uses every tensor (BackFed's
  choice for its MNIST net). Without a model view the whole row is one layer.
* ``warmup_rounds``: in rounds before it only the bottom-up election runs and its selectees alone
  are aggregated, as in the authors' code (25 rounds for MNIST, 30 Fashion-MNIST/Sent140, 80
  FEMNIST, 100 CIFAR-10); the default 0 runs both elections every round, as the paper describes.
* The VAE (encoder d → H → H → 2×L, softplus log-variance; decoder L → H → H → d, sigmoid; Kaiming-
  normal weights; sum-of-squares reconstruction + KL loss; Adam at 10⁻³, a new optimiser per
  training call; mini-batches of 8) is the authors'. It is drawn, shuffled and sampled from
  ``ctx.generator`` on the CPU in float32, so a seed gives one decision; it is not symmetric in the
  clients (the mini-batch order depends on the row order).

Defaults are the authors' (``main.py``): ct = 10, vt = 0.5, v_step = 0.05, hidden 256, latent 64,
270 initial and 30 tuning epochs; 10 % bottom-up selectees and 10 reconstruction samples are
hard-coded there.

BackFed (github.com/thinh-dao/BackFed, ``backfed/servers/anomaly_detection/snowball_server.py``)
ports the authors' code with other defaults (ct = 5, vt = 0.9, v_step = 0.1, hidden 64, latent 32,
50 initial and 10 tuning epochs, all four layers of its MNIST net) and the two conventions above.

Non-finite updates are rejected first (n counts the finite ones). With fewer than three finite
updates no election can be held: all of them are accepted (``Decision.state["note"]``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Mapping

from redteam.pipeline import Filter, FilterResult
from redteam.types import Decision, ServerContext

from ._common import check_choice, check_count, check_number, finite_rows, generator_of, rescale_pow2
from ._stats import filtered_mean_decision

if TYPE_CHECKING:
    import torch

__all__ = ["Snowball", "bottom_up_votes", "layer_blocks"]

#: the share of clients whose scores vote when fewer have a positive score (hard-coded 10 %)
_EFFECTIVE_SHARE = 0.1


# -------------------------------------------------------------------- bottom-up election
def _sq_distances(block: "torch.Tensor") -> "torch.Tensor":
    """All pairwise squared L2 distances of the rows of ``block`` ``(n, m)``, float64, from the
    differences themselves (no Gram cancellation), rows rescaled by a power of two when huge/tiny."""
    import torch

    x, _ = rescale_pow2(block.to(torch.float64))
    n = x.shape[0]
    out = torch.empty(n, n, dtype=torch.float64, device=x.device)
    for i in range(n):
        out[i] = (x - x[i]).square().sum(dim=1)
    return 0.5 * (out + out.T)


def _kmeans_all(d2: "torch.Tensor", k: int, max_iter: int = 300) -> "torch.Tensor":
    """Labels ``(n, n)``: row i is the k-means partition of the n points started from point i and
    its k − 1 farthest points (Lloyd to a fixed point), computed from squared distances alone."""
    import torch

    n = d2.shape[0]
    order = torch.argsort(d2, dim=1, stable=True)
    init = torch.cat([torch.arange(n, device=d2.device)[:, None], order[:, n - (k - 1):]], dim=1)  # (n, k)
    a = torch.nn.functional.one_hot(init, n).to(torch.float64)  # (n, k, n): centroid c of client i
    labels = None
    for _ in range(max_iter):
        cnt = a.sum(dim=2)  # (n, k)
        ad = a @ d2  # Σₛ D²ₛⱼ over each centroid's members
        cc = (ad * a).sum(dim=2)  # Σₛₜ D²ₛₜ
        dist = ad / cnt[..., None] - (cc / (2.0 * cnt * cnt))[..., None]
        new = dist.argmin(dim=1)  # (n, n): first minimum on ties
        if labels is not None and torch.equal(new, labels):
            break
        labels = new
        nxt = torch.nn.functional.one_hot(labels, k).permute(0, 2, 1).to(torch.float64)
        empty = nxt.sum(dim=2) == 0
        if bool(empty.any()):
            nxt[empty] = a[empty]
        a = nxt
    return labels


def _calinski_harabasz(d2: "torch.Tensor", labels: "torch.Tensor", k: int) -> "torch.Tensor":
    """The Calinski–Harabasz score of each row's partition (scikit-learn's definition)."""
    import torch

    n = d2.shape[0]
    m = torch.nn.functional.one_hot(labels, k).to(torch.float64)  # (n, n, k)
    size = m.sum(dim=1)  # (n, k)
    within = torch.einsum("ijc,jl,ilc->ic", m, d2, m) / (2.0 * size.clamp_min(1.0))
    w = within.sum(dim=1)
    total = d2.sum() / (2.0 * n)
    b = (total - w).clamp_min(0.0)
    used = (size > 0).sum(dim=1).to(torch.float64)
    score = torch.where(w > 0, b * (n - used) / (w * (used - 1.0)).clamp_min(1e-300), torch.ones_like(w))
    return torch.where(used >= 2, score, torch.zeros_like(score))


def bottom_up_votes(blocks: "list[torch.Tensor]", ct: int) -> "tuple[torch.Tensor, list[dict[str, Any]]]":
    """The bottom-up election: the votes ``(n,)`` (float64) each client receives over ``blocks``
    (one ``(n, mₗ)`` tensor per layer), and per layer the scores and each voter's cluster."""
    import torch

    n = blocks[0].shape[0]
    votes = torch.zeros(n, dtype=torch.float64, device=blocks[0].device)
    info: list[dict[str, Any]] = []
    k = min(ct, n - 2) + 1
    if k < 2:
        return votes, info
    for block in blocks:
        d2 = _sq_distances(block)
        labels = _kmeans_all(d2, k)
        score = _calinski_harabasz(d2, labels, k)
        member = labels == labels.diagonal()[:, None]  # (voter, candidate): in the voter's own cluster
        eff = score > 0
        least = int(n * _EFFECTIVE_SHARE)
        if int(eff.sum()) < least:
            eff = torch.zeros_like(eff)
            eff[torch.argsort(-score, stable=True)[:least]] = True
        lo, hi = float(score.min()), float(score.max())
        weight = (score - lo) / (hi - lo) if hi > lo else torch.ones_like(score)
        weight = torch.where(eff, weight, torch.zeros_like(weight))
        votes += weight @ member.to(torch.float64)
        info.append({"scores": score.tolist(), "weights": weight.tolist(),
                     "clusters": [member[i].nonzero().flatten().tolist() for i in range(n)]})
    return votes, info


def layer_blocks(updates: "torch.Tensor", model: Any, which: str) -> "tuple[list[slice], list[str]]":
    """The column slices (and names) of the layers Snowball inspects: every parameter tensor of the
    first and the output layer (``"first_last"``) or of all layers (``"all"``); the whole row when
    there is no model view (or it does not describe these rows)."""
    d = updates.shape[1]
    layers = tuple(getattr(model, "layers", ()) or ())
    if not layers or layers[-1][2] != d:
        return [slice(0, d)], ["row"]
    if which == "all":
        chosen = list(layers)
    else:
        first = layers[0][0].rsplit(".", 1)[0] if "." in layers[0][0] else layers[0][0]
        head = set(getattr(model, "head", ()) or ()) or {layers[-1][0]}
        chosen = [t for t in layers if (t[0].rsplit(".", 1)[0] if "." in t[0] else t[0]) == first or t[0] in head]
    chosen = [t for t in chosen if t[2] > t[1]]
    return [slice(int(a), int(b)) for _, a, b, _ in chosen], [str(t[0]) for t in chosen]


# -------------------------------------------------------------------- top-down election
class _VAE:
    """The authors' VAE as one flat parameter tensor (drawn from one generator), trained by Adam
    written out over that tensor (torch's Adam, β = (0.9, 0.999), ε = 10⁻⁸, in a few whole-buffer
    operations: no per-tensor loop and no optimiser module to import)."""

    def __init__(self, dim: int, hidden: int, latent: int, g: "torch.Generator") -> None:
        import torch

        shapes = [(hidden, dim), (hidden, hidden), (latent, hidden), (latent, hidden),
                  (hidden, latent), (hidden, hidden), (dim, hidden)]
        parts, self.spans = [], []
        at = 0
        for out_f, in_f in shapes:
            w = torch.randn(out_f * in_f, generator=g) * math.sqrt(2.0 / in_f)  # Kaiming normal (ReLU gain)
            b = (torch.rand(out_f, generator=g) * 2.0 - 1.0) / math.sqrt(in_f)  # torch's Linear bias
            parts += [w, b]
            self.spans.append((at, at + out_f * in_f, at + out_f * in_f + out_f, out_f, in_f))
            at += out_f * in_f + out_f
        self.flat = torch.cat(parts).requires_grad_()

    def _lin(self, x: "torch.Tensor", j: int) -> "torch.Tensor":
        a, b, c, out_f, in_f = self.spans[j]
        return x @ self.flat[a:b].view(out_f, in_f).T + self.flat[b:c]

    def encode(self, x: "torch.Tensor") -> "tuple[torch.Tensor, torch.Tensor]":
        import torch

        h = torch.relu(self._lin(torch.relu(self._lin(x, 0)), 1))
        return self._lin(h, 2), torch.nn.functional.softplus(self._lin(h, 3))

    def decode(self, z: "torch.Tensor") -> "torch.Tensor":
        import torch

        return torch.sigmoid(self._lin(torch.relu(self._lin(torch.relu(self._lin(z, 4)), 5)), 6))

    def train(self, data: "torch.Tensor", epochs: int, batch: int, g: "torch.Generator",
              lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
        """``epochs`` passes over ``data`` in shuffled mini-batches; a fresh Adam state per call, as
        the authors build a new optimiser in every call of their ``train_vae``."""
        import torch

        m = torch.zeros_like(self.flat)
        v = torch.zeros_like(self.flat)
        b1, b2 = betas
        t = 0
        rows = data.shape[0]
        for _ in range(epochs):
            perm = torch.randperm(rows, generator=g)
            for s in range(0, rows, batch):
                x = data[perm[s:s + batch]]
                mu, logvar = self.encode(x)
                z = mu + torch.exp(0.5 * logvar) * torch.randn(mu.shape, generator=g)
                loss = (self.decode(z) - x).square().sum() - 0.5 * (1.0 + logvar - mu.square() - logvar.exp()).sum()
                (grad,) = torch.autograd.grad(loss, self.flat)
                t += 1
                with torch.no_grad():
                    m.mul_(b1).add_(grad, alpha=1.0 - b1)
                    v.mul_(b2).addcmul_(grad, grad, value=1.0 - b2)
                    denom = (v.sqrt() / math.sqrt(1.0 - b2 ** t)).add_(eps)
                    self.flat.addcdiv_(m, denom, value=-lr / (1.0 - b1 ** t))

    def recon_error(self, x: "torch.Tensor", samples: int, g: "torch.Generator") -> "torch.Tensor":
        """Mean over ``samples`` latent draws of each row's sum of squared reconstruction errors."""
        import torch

        with torch.no_grad():
            mu, logvar = self.encode(x)
            z = mu + torch.exp(0.5 * logvar) * torch.randn((samples, *mu.shape), generator=g)
            return (self.decode(z) - x).square().sum(dim=-1).mean(dim=0)


def _pair_differences(rows: "torch.Tensor") -> "torch.Tensor":
    """uᵢ − uⱼ for every ordered pair i ≠ j of ``rows`` (sigmoid applied)."""
    import torch

    s = rows.shape[0]
    i, j = torch.meshgrid(torch.arange(s), torch.arange(s), indexing="ij")
    off = i != j
    return torch.sigmoid(rows[i[off]] - rows[j[off]])


@dataclass(frozen=True, slots=True)
class Snowball(Filter):
    """Snowball (Qin et al., AAAI 2024): bottom-up election by per-layer k-means votes, top-down
    election by a VAE on the selectees' pairwise differences.

    * ``ct``: the number of farthest peers that seed k-means (ct + 1 clusters; authors 10);
    * ``vt``: the share of clients finally selected, M in the paper (authors 0.5);
    * ``v_step``: the share added per top-down step, Mᴱ (authors 0.05);
    * ``bottom_up_fraction``: the share of most-voted clients that become selectees (authors 0.1);
    * ``vae_hidden`` / ``vae_latent``: Sᴴ / Sᴸ (256 / 64); ``vae_initial`` / ``vae_tuning``: the epochs
      Eⱽᴵ / Eⱽᵀ (270 / 30); ``recon_samples``: latent draws per reconstruction error (10);
    * ``layers``: ``"first_last"`` (authors) or ``"all"`` parameter tensors, from ``ctx.model``;
    * ``warmup_rounds``: rounds that run the bottom-up election only (default 0; module docstring).

    ``Decision.state``: the bottom-up votes and selectees, the order in which the top-down election
    picked clients up and the last reconstruction errors, the layers used.
    """

    ct: int = 10
    vt: float = 0.5
    v_step: float = 0.05
    bottom_up_fraction: float = 0.1
    vae_hidden: int = 256
    vae_latent: int = 64
    vae_initial: int = 270
    vae_tuning: int = 30
    recon_samples: int = 10
    layers: Literal["first_last", "all"] = "first_last"
    warmup_rounds: int = 0
    inspects_models: ClassVar[bool] = True
    symmetric: ClassVar[bool] = False  # the VAE's mini-batches follow the row order
    summary: ClassVar[str] = "Snowball: per-layer k-means votes, then a VAE enlarges the selectees"
    reference: ClassVar[str] = "Qin, Chen, Zhi, Yan & Deng, AAAI 2024"

    def validate_ct(self, v: int) -> None:
        check_count(self, "ct", v, allow_none=False, minimum=1)

    def validate_vt(self, v: float) -> None:
        check_number(self, "vt", v, low=0.0, low_open=True, high=1.0)

    def validate_v_step(self, v: float) -> None:
        check_number(self, "v_step", v, low=0.0, low_open=True, high=1.0)

    def validate_bottom_up_fraction(self, v: float) -> None:
        check_number(self, "bottom_up_fraction", v, low=0.0, low_open=True, high=1.0)

    def validate_vae_hidden(self, v: int) -> None:
        check_count(self, "vae_hidden", v, allow_none=False, minimum=1)

    def validate_vae_latent(self, v: int) -> None:
        check_count(self, "vae_latent", v, allow_none=False, minimum=1)

    def validate_vae_initial(self, v: int) -> None:
        check_count(self, "vae_initial", v, allow_none=False, minimum=0)

    def validate_vae_tuning(self, v: int) -> None:
        check_count(self, "vae_tuning", v, allow_none=False, minimum=0)

    def validate_recon_samples(self, v: int) -> None:
        check_count(self, "recon_samples", v, allow_none=False, minimum=1)

    def validate_layers(self, v: str) -> None:
        check_choice(self, "layers", v, ("first_last", "all"))

    def validate_warmup_rounds(self, v: int) -> None:
        check_count(self, "warmup_rounds", v, allow_none=False, minimum=0)

    def degradation(self, state: Mapping[str, Any], accepted: int) -> str | None:
        note = state.get("note")
        return str(note) if note else None

    def filter(self, updates: "torch.Tensor", ctx: ServerContext) -> FilterResult:
        import torch

        n_all = updates.shape[0]
        ok = finite_rows(updates)
        fin = ok.nonzero().flatten()
        n = int(fin.numel())
        accepted = torch.zeros(n_all, dtype=torch.bool, device=updates.device)
        reasons: dict[int, str] = {int(i): "non-finite update" for i in (~ok).nonzero().flatten().tolist()}
        rows = updates if n == n_all else updates.index_select(0, fin)
        spans, names = layer_blocks(updates, ctx.model, self.layers)
        state: dict[str, Any] = {"layers": names}
        if n < 3:
            accepted[fin] = True
            if n:
                state["note"] = f"Snowball: {n} finite update(s), too few for an election; all accepted"
            return FilterResult(updates=updates, accepted=accepted, reasons=reasons, state=state)
        votes, info = bottom_up_votes([rows[:, s] for s in spans], self.ct)
        ranking = torch.argsort(-votes, stable=True)
        first = min(n, max(math.ceil(self.bottom_up_fraction * n), 2))
        selected = ranking[:first].tolist()
        target = int(n * self.vt)
        state.update(votes=votes.tolist(), selectees=[int(fin[i]) for i in selected], target=target,
                     scores=[lay["scores"] for lay in info], clusters=min(self.ct, n - 2) + 1)
        if self.ct > n - 2:
            state["note"] = f"Snowball: ct = {self.ct} capped at n − 2 = {n - 2} (k-means of {n} updates)"
        picked: list[list[int]] = []
        errors: dict[int, float] = {}
        warm = int(ctx.round) < self.warmup_rounds
        if not warm and len(selected) < target:
            g = generator_of(ctx)
            flat = torch.cat([rows[:, s] for s in spans], dim=1).detach().to(device="cpu", dtype=torch.float64)
            flat32 = flat.to(torch.float32)
            vae = _VAE(flat.shape[1], self.vae_hidden, self.vae_latent, g)
            vae.train(_pair_differences(flat32[selected]), self.vae_initial, 8, g)
            step = math.ceil(n * self.v_step)
            while len(selected) < target:
                vae.train(_pair_differences(flat32[selected]), self.vae_tuning, 8, g)
                rest = [i for i in range(n) if i not in set(selected)]
                err = torch.empty(len(rest), dtype=torch.float64)
                base = flat[selected]
                for j, c in enumerate(rest):
                    diff = base - flat[c]
                    diff = diff[(diff != 0).any(dim=1)]
                    if diff.shape[0] == 0:
                        err[j] = 0.0
                        continue
                    x = torch.sigmoid(torch.cat([diff, -diff]).to(torch.float32))
                    err[j] = float(vae.recon_error(x, self.recon_samples, g).to(torch.float64).mean())
                take = torch.argsort(err, stable=True)[:min(step, target - len(selected))].tolist()
                errors = {int(fin[c]): float(e) for c, e in zip(rest, err.tolist())}
                new = [rest[t] for t in take]
                picked.append([int(fin[c]) for c in new])
                selected += new
        state.update(picked=picked, errors=errors, warmup=warm)
        chosen = fin[torch.tensor(selected, dtype=torch.long, device=fin.device)]
        accepted[chosen] = True
        rank_of = {int(i): r + 1 for r, i in enumerate(ranking.tolist())}
        for j in range(n):
            i = int(fin[j])
            if bool(accepted[i]):
                continue
            why = (f"Snowball: not elected (bottom-up votes {float(votes[j]):.4g}, rank {rank_of[j]} of {n}; "
                   f"{first} selectee(s)")
            if i in errors:
                why += f"; top-down reconstruction error {errors[i]:.4g} above the {target} picked"
            elif warm:
                why += "; warm-up round, top-down election not run"
            reasons[i] = why + ")"
        return FilterResult(updates=updates, accepted=accepted, reasons=reasons, state=state)

    def decide(self, updates: "torch.Tensor", ctx: ServerContext) -> Decision:
        return filtered_mean_decision(self.filter(updates, ctx), updates, ctx)
