"""Batched (vmap) local training against a plain per-client loop written independently."""

import torch

from redteam.federation.params import ParamSpec
from redteam.federation.training import BatchedTrainer, LocalTraining, StackedData
from redteam.types import ClientData
from redteam.workloads.digits import Digits
from redteam.workloads.synthetic import Synthetic


def _setup(workload, n=5, seed=0):
    ds = workload.load(seed)
    g = torch.Generator().manual_seed(seed)
    model = workload.build_model(g)
    spec = ParamSpec.of(model)
    sizes = [30 + 7 * i for i in range(n)]
    start = 0
    clients = []
    for s in sizes:
        clients.append(ClientData(ds.train_x[start : start + s], ds.train_y[start : start + s]))
        start += s
    return ds, model, spec, StackedData.stack(clients), clients


def _reference_loop(model, spec, flat, clients, cfg, generator, n):
    """One model per client, torch.optim.SGD, batches drawn exactly as documented."""
    out = []
    offsets = [0]
    for c in clients[:-1]:
        offsets.append(offsets[-1] + len(c))
    # the batched trainer draws one (n, B) uniform matrix per step for all clients
    draws = [torch.rand((n, cfg.batch_size), generator=generator, dtype=torch.float64) for _ in range(cfg.steps)]
    for i, c in enumerate(clients):
        params = {k: v.clone().requires_grad_(True) for k, v in spec.unflatten(flat.clone()).items()}
        opt = torch.optim.SGD(list(params.values()), lr=cfg.lr)
        for step in range(cfg.steps):
            idx = torch.floor(draws[step][i] * len(c)).long()
            out_ = torch.func.functional_call(model, params, (c.x[idx],))
            loss = torch.nn.functional.cross_entropy(out_, c.y[idx])
            if cfg.prox_mu:
                glob = spec.unflatten(flat)
                loss = loss + cfg.prox_mu / 2 * sum(((params[k] - glob[k]) ** 2).sum() for k in params)
            opt.zero_grad()
            loss.backward()
            opt.step()
        out.append(torch.cat([params[k].detach().reshape(-1) for k in spec.names]))
    return torch.stack(out)


def test_batched_equals_per_client_loop_digits():
    wl = Digits()
    ds, model, spec, data, clients = _setup(wl)
    flat = spec.flatten(model)
    cfg = LocalTraining(steps=4, batch_size=8, lr=0.3)
    tr = BatchedTrainer(wl, model, spec)
    got = tr.train(flat, data, torch.arange(5), cfg, torch.Generator().manual_seed(7))
    want = _reference_loop(model, spec, flat, clients, cfg, torch.Generator().manual_seed(7), 5)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_fedprox_term_matches_reference():
    wl = Synthetic(samples=400)
    ds, model, spec, data, clients = _setup(wl, n=3)
    flat = spec.flatten(model)
    cfg = LocalTraining(steps=5, batch_size=4, lr=0.2, prox_mu=0.5)
    tr = BatchedTrainer(wl, model, spec)
    got = tr.train(flat, data, torch.arange(3), cfg, torch.Generator().manual_seed(1))
    want = _reference_loop(model, spec, flat, clients, cfg, torch.Generator().manual_seed(1), 3)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_epochs_mask_stops_small_clients():
    wl = Synthetic(samples=400)
    ds, model, spec, data, clients = _setup(wl, n=2)
    flat = spec.flatten(model)
    # sizes 30 and 37, batch 30, 1 epoch -> 1 step and 2 steps
    cfg1 = LocalTraining(epochs=1.0, batch_size=30, lr=0.5)
    tr = BatchedTrainer(wl, model, spec)
    got = tr.train(flat, data, torch.arange(2), cfg1, torch.Generator().manual_seed(3))
    ref = tr.train(flat, data, torch.arange(2), LocalTraining(steps=1, batch_size=30, lr=0.5),
                   torch.Generator().manual_seed(3))
    torch.testing.assert_close(got[0], ref[0])  # client 0 stopped after one step
    assert not torch.allclose(got[1], ref[1])  # client 1 took a second step


def test_subset_of_clients_and_determinism():
    wl = Digits()
    ds, model, spec, data, clients = _setup(wl)
    flat = spec.flatten(model)
    tr = BatchedTrainer(wl, model, spec)
    cfg = LocalTraining(steps=3, batch_size=4)
    a = tr.train(flat, data, torch.tensor([1, 3]), cfg, torch.Generator().manual_seed(5))
    b = tr.train(flat, data, torch.tensor([1, 3]), cfg, torch.Generator().manual_seed(5))
    assert a.shape == (2, spec.dim) and torch.equal(a, b)


def test_unflatten_roundtrip():
    wl = Digits()
    model = wl.build_model(torch.Generator().manual_seed(0))
    spec = ParamSpec.of(model)
    flat = spec.flatten(model)
    assert spec.dim == 64 * 64 + 64 + 64 * 10 + 10 == 4810
    back = spec.unflatten(flat)
    for name, p in model.named_parameters():
        assert torch.equal(back[name], p.detach())


def test_digits_split_is_fixed_and_stratified():
    a, b = Digits().load(0), Digits().load(123)
    assert torch.equal(a.test_y, b.test_y)  # the held-out split does not move with the run seed
    assert len(a.test_y) + len(a.train_y) == 1797
    counts = torch.bincount(a.test_y, minlength=10)
    assert counts.min() >= 34 and counts.max() <= 38  # 20 % of each class (~36)
    assert float(a.train_x.max()) <= 1.0 and float(a.train_x.min()) >= 0.0


def test_interface_fits_a_sequence_model():
    """A tiny next-token model (int64 token inputs, (B, T, V) logits) trains through the
    same batched path, with the Workload base's loss/correct handling the time axis."""
    from dataclasses import dataclass

    from redteam.workloads.base import Dataset, Workload

    class TinyLM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(5, 8)
            self.out = torch.nn.Linear(8, 5)

        def forward(self, tokens):
            return self.out(self.emb(tokens))

    @dataclass(frozen=True, slots=True)
    class Counting(Workload):
        input_kind = "tokens"

        def load(self, seed):
            g = torch.Generator().manual_seed(seed)
            start = torch.randint(0, 5, (200, 1), generator=g)
            seq = (start + torch.arange(7)) % 5  # next token = current + 1 (mod 5)
            x, y = seq[:, :-1], seq[:, 1:]
            return Dataset(x[:160], y[:160], x[160:], y[160:], num_classes=5)

        def build_model(self, generator):
            m = TinyLM()
            with torch.no_grad():
                for p in m.parameters():
                    p.normal_(0.0, 0.3, generator=generator)
            return m

    wl = Counting()
    ds = wl.load(0)
    model = wl.build_model(torch.Generator().manual_seed(0))
    spec = ParamSpec.of(model)
    clients = [ClientData(ds.train_x[i::4], ds.train_y[i::4]) for i in range(4)]
    data = StackedData.stack(clients)
    tr = BatchedTrainer(wl, model, spec)
    flat = spec.flatten(model)
    before = tr.evaluate(flat, ds.test_x, ds.test_y)
    for _ in range(15):
        local = tr.train(flat, data, torch.arange(4), LocalTraining(steps=10, batch_size=8, lr=0.5),
                         torch.Generator().manual_seed(0))
        flat = local.mean(0)
    after = tr.evaluate(flat, ds.test_x, ds.test_y)
    assert after[0] > 0.95 > before[0]


def test_final_accuracy_last_k_by_hand():
    # accuracies 0.2, 0.4, 0.6, 0.9: last 1 = 0.9, last 3 = (0.4 + 0.6 + 0.9)/3 = 0.6333…, last 10 = all = 0.525
    from redteam.scoring import final_accuracy_last_k, summarize
    from redteam.types import RoundRecord

    recs = [RoundRecord(i, a, 1.0, [True], [False], [True]) for i, a in enumerate([0.2, 0.4, 0.6, 0.9])]
    assert final_accuracy_last_k(recs, 1) == 0.9
    assert abs(final_accuracy_last_k(recs, 3) - 1.9 / 3) < 1e-12
    assert abs(final_accuracy_last_k(recs, 10) - 0.525) < 1e-12
    assert abs(summarize(recs, last_k=2)["final_accuracy_last_k"] - 0.75) < 1e-12


def test_digits_standardize_uses_training_statistics():
    # "global": training pixels get mean 0 and std 1; the test split is shifted by the
    # *training* statistics: x_std = (x − μ_train)/σ_train, so x = x_std·σ + μ recovers [0, 1] pixels
    raw = Digits().load(0)
    g = Digits(standardize="global").load(0)
    mu, sd = raw.train_x.double().mean(), raw.train_x.double().std(unbiased=False)
    assert abs(float(g.train_x.double().mean())) < 1e-5 and abs(float(g.train_x.double().std(unbiased=False)) - 1) < 1e-5
    assert torch.allclose(g.test_x.double() * sd + mu, raw.test_x.double(), atol=1e-5)
    f = Digits(standardize="feature").load(0)
    col = raw.train_x.double().std(0, unbiased=False) > 0
    assert torch.allclose(f.train_x.double().mean(0), torch.zeros(64, dtype=torch.float64), atol=1e-5)
    assert torch.allclose(f.train_x.double().std(0, unbiased=False)[col], torch.ones(int(col.sum()), dtype=torch.float64),
                          atol=1e-4)
    import pytest

    from redteam.errors import InvalidParameter

    with pytest.raises(InvalidParameter, match="Digits.standardize"):
        Digits(standardize="zscore")
