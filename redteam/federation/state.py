"""What each client carries from round to round, in one place, keyed by client id.

A simulated client has memory across rounds: its worker momentum (a malicious client
keeps none under ``[federation] malicious_momentum = "raw"``, the default), its error-feedback
residual, its local optimizer's state (DiLoCo's inner AdamW), where it is in its own data
(epoch-style sampling), and — for the malicious ones — the attack's memory. All of it
lives in one :class:`ClientStates` per run, never in locals of the round loop:

* per-client tensors are rows of an ``(n_clients, …)`` matrix indexed by **client id**
  (not by the round's row position), read with :meth:`ClientStates.rows` and written back
  with :meth:`ClientStates.put` for the round's participating clients only;
* a tensor is allocated (zeros) on first use, so a run pays only for the state it uses;
* **churn rule: state is kept.** A client that goes offline keeps its rows untouched
  (no decay, no reset) and finds them as it left them when it rejoins; a client that
  never took part has zeros (and an AdamW step count of 0);
* ``attack`` is the attack's memory (:attr:`~redteam.types.AttackContext.attack_state`):
  a plain dict the attack may mutate, fresh for every run.

The defenses' per-client memory (FoolsGold's history) is kept by the merge, keyed by
client id as well (:class:`redteam.merge.DefenseMemory`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["ClientStates", "apply_momentum"]


@dataclass
class ClientStates:
    """Per-client state of one run (see the module docstring for the rules)."""

    n_clients: int
    device: torch.device
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    attack: dict[str, Any] = field(default_factory=dict)

    def ensure(self, name: str, shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The whole ``(n_clients, *shape)`` tensor ``name``, zeros when first asked for."""
        t = self.tensors.get(name)
        if t is None:
            t = torch.zeros((self.n_clients, *shape), dtype=dtype, device=self.device)
            self.tensors[name] = t
        return t

    def has(self, name: str) -> bool:
        return name in self.tensors

    def rows(self, name: str, clients: torch.Tensor, shape: tuple[int, ...] = (),
             dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """A copy of the rows of ``clients`` (client ids) of tensor ``name``."""
        return self.ensure(name, shape, dtype)[clients]

    def put(self, name: str, clients: torch.Tensor, values: torch.Tensor) -> None:
        """Write the rows of ``clients`` (client ids) of tensor ``name`` (allocated if new)."""
        t = self.ensure(name, tuple(values.shape[1:]), values.dtype)
        t[clients] = values.to(dtype=t.dtype)


def apply_momentum(states: ClientStates, clients: torch.Tensor, deltas: torch.Tensor, beta: float,
                   form: str = "sgd", raw: torch.Tensor | None = None) -> torch.Tensor:
    """Worker momentum over whole-round deltas; returns the vectors the clients send.

    Karimireddy, He & Jaggi, "Learning from History for Byzantine Robust Optimization",
    ICML 2021, and "Byzantine-Robust Learning on Heterogeneous Datasets via Bucketing",
    ICLR 2022: each client i keeps mᵢ across rounds and sends it instead of its fresh
    update. With ``Δᵢ`` the client's round delta (local − global):

    * ``form="sgd"`` (default; the issue's form and the authors' released code, i.e.
      PyTorch SGD momentum without dampening): mᵢ ← β·mᵢ + Δᵢ;
    * ``form="ema"`` (the ICML 2021 paper's Algorithm 2): mᵢ ← (1 − β)·Δᵢ + β·mᵢ.

    With one local SGD step Δᵢ = −η·gᵢ, so mᵢ is −η times the papers' momentum of
    gradients (exactly their setting). With several local steps the momentum runs over
    whole-round deltas: the client trains its local steps from the global model as usual
    and sends the momentum of its round deltas. ``β = 0`` sends Δᵢ unchanged (and keeps
    no state). Only the rows of ``clients`` advance (offline clients keep theirs).

    ``raw`` (bool, one entry per row of ``clients``; ``None``: none) marks rows that keep
    **no** momentum — the malicious clients under ``[federation] malicious_momentum =
    "raw"``, as the authors' release, where the bit-flipping and label-flipping workers are
    plain ``TorchWorker``s that send their fresh gradient while the honest ones are
    ``MomentumWorker``s. Such a row sends its round's *fresh term*, what the momentum update
    adds this round: Δᵢ under ``"sgd"``, (1 − β)·Δᵢ under ``"ema"`` (in both forms that is
    the release's raw gradient in the units of the honest momenta: the release's PyTorch
    momentum at lr η equals the EMA form at lr η/(1 − β) for every row only if the raw
    rows are scaled by (1 − β) too). Its ``momentum`` state is neither read nor written.
    """
    if beta == 0:
        return deltas
    if raw is not None and bool(raw.any()):
        raw = raw.to(device=deltas.device, dtype=torch.bool)
        keep = ~raw
        out = (1.0 - beta) * deltas if form == "ema" else deltas.clone()
        if bool(keep.any()):
            out[keep] = apply_momentum(states, clients[keep.to(clients.device)], deltas[keep], beta, form)
        return out
    m = states.rows("momentum", clients, (deltas.shape[1],), deltas.dtype)
    if form == "ema":
        m = (1.0 - beta) * deltas + beta * m
    else:
        m = beta * m + deltas
    states.put("momentum", clients, m)
    return m
