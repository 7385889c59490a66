import pytest
import torch

from redteam.errors import InvalidParameter
from redteam.federation.server_opt import FedAdam, FedAvg, Nesterov, make_server_optimizer


def test_fedavg_by_hand():
    opt = FedAvg(lr=0.5)
    p, _ = opt.step(torch.tensor([1.0, 2.0]), torch.tensor([2.0, -2.0]), opt.init(torch.zeros(2)))
    assert p.tolist() == [2.0, 1.0]


def test_fedadam_first_two_steps_by_hand():
    # Reddi et al. 2021, Alg. 2 without bias correction, beta1=0.5, beta2=0.75, tau=1, lr=1
    # step 1: m = 0.5*Δ = 1, v = 0.25*Δ² = 1 -> w = 0 + 1/(1+1) = 0.5     (Δ = 2)
    # step 2: Δ = 2: m = 0.5*1 + 0.5*2 = 1.5, v = 0.75*1 + 0.25*4 = 1.75
    #         w = 0.5 + 1.5/(sqrt(1.75)+1)
    opt = FedAdam(lr=1.0, beta1=0.5, beta2=0.75, tau=1.0)
    s = opt.init(torch.zeros(1))
    p, s = opt.step(torch.zeros(1), torch.tensor([2.0]), s)
    assert p.item() == pytest.approx(0.5)
    p, s = opt.step(p, torch.tensor([2.0]), s)
    assert p.item() == pytest.approx(0.5 + 1.5 / (1.75**0.5 + 1))


def test_nesterov_matches_torch_sgd_nesterov():
    # DiLoCo's outer step is PyTorch SGD(nesterov=True) on the pseudo-gradient g = -Δ
    w = torch.tensor([1.0, -1.0, 0.5], requires_grad=True)
    ref = torch.optim.SGD([w], lr=0.7, momentum=0.9, nesterov=True)
    opt = Nesterov(lr=0.7, momentum=0.9)
    p = w.detach().clone()
    s = opt.init(p)
    for delta in ([0.1, 0.2, -0.3], [0.0, -0.1, 0.4], [0.3, 0.3, 0.3]):
        d = torch.tensor(delta)
        w.grad = -d
        ref.step()
        p, s = opt.step(p, d, s)
        torch.testing.assert_close(p, w.detach())


@pytest.mark.parametrize("name,kw", [("fedavg", {"lr": 0}), ("fedadam", {"beta2": 1.0}), ("nesterov", {"momentum": -0.1})])
def test_bad_params(name, kw):
    with pytest.raises(InvalidParameter, match=list(kw)[0]):
        make_server_optimizer(name, **kw)


def test_unknown():
    with pytest.raises(InvalidParameter, match="fedavg"):
        make_server_optimizer("sgd")
