"""Deterministic parameter initialisation shared by the built-in workloads."""

from __future__ import annotations

import math

import torch


def init_linear_(layer: torch.nn.Linear, generator: torch.Generator) -> None:
    """Kaiming-uniform weights and uniform bias as torch's default, but from ``generator``.

    torch's own ``reset_parameters`` draws from the global RNG; redteam never uses
    global random state, so the same bounds are drawn from the explicit generator.
    """
    fan_in = layer.weight.shape[1]
    bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
    with torch.no_grad():
        layer.weight.uniform_(-bound, bound, generator=generator)
        if layer.bias is not None:
            layer.bias.uniform_(-bound, bound, generator=generator)


def init_conv_(layer: torch.nn.Conv2d, generator: torch.Generator) -> None:
    fan_in = layer.weight[0].numel()
    bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
    with torch.no_grad():
        layer.weight.uniform_(-bound, bound, generator=generator)
        if layer.bias is not None:
            layer.bias.uniform_(-bound, bound, generator=generator)


def init_module_(module: torch.nn.Module, generator: torch.Generator) -> torch.nn.Module:
    for m in module.modules():
        if isinstance(m, torch.nn.Linear):
            init_linear_(m, generator)
        elif isinstance(m, torch.nn.Conv2d):
            init_conv_(m, generator)
    return module


# -- further layer types (added for redteam.workloads.nets; init_module_ above is unchanged) --------------


def init_norm_(layer: torch.nn.Module, generator: torch.Generator | None = None) -> None:
    """A normalisation layer's affine parameters as torch's default: weight 1, bias 0.

    Nothing random is drawn (``generator`` is accepted for a uniform signature). Covers
    ``GroupNorm``, ``LayerNorm`` and the ``BatchNorm``/``InstanceNorm`` family; a layer
    without affine parameters is left as it is.
    """
    weight = getattr(layer, "weight", None)
    bias = getattr(layer, "bias", None)
    with torch.no_grad():
        if weight is not None:
            weight.fill_(1.0)
        if bias is not None:
            bias.zero_()


def init_embedding_(layer: torch.nn.Embedding, generator: torch.Generator) -> None:
    """N(0, 1) embedding rows as torch's default, drawn from ``generator``."""
    with torch.no_grad():
        layer.weight.normal_(0.0, 1.0, generator=generator)


def init_lstm_(layer: torch.nn.Module, generator: torch.Generator) -> None:
    """Every weight and bias of an LSTM uniform in ±1/√hidden_size as torch's default
    (``torch.nn.LSTM.reset_parameters``), drawn from ``generator`` in parameter order.

    ``layer`` is a ``torch.nn.LSTM`` or any module with ``hidden_size`` that holds its
    parameters directly (``redteam.workloads.nets.LoopLSTM``).
    """
    hidden = int(layer.hidden_size)  # type: ignore[arg-type]
    bound = 1.0 / math.sqrt(hidden) if hidden > 0 else 0.0
    with torch.no_grad():
        for p in layer.parameters(recurse=False):
            p.uniform_(-bound, bound, generator=generator)


_LSTM_NAMES = ("weight_ih_l", "weight_hh_l", "bias_ih_l", "bias_hh_l")


def _is_lstm(m: torch.nn.Module) -> bool:
    if isinstance(m, torch.nn.LSTM):
        return True
    names = [n for n, _ in m.named_parameters(recurse=False)]
    return hasattr(m, "hidden_size") and bool(names) and all(n.startswith(_LSTM_NAMES) for n in names)


def init_net_(module: torch.nn.Module, generator: torch.Generator) -> torch.nn.Module:
    """Initialise every parameter of ``module`` from ``generator`` alone, module by module
    in ``module.modules()`` order: ``Linear`` and ``Conv2d`` as :func:`init_module_`,
    normalisation layers by :func:`init_norm_`, ``Embedding`` by :func:`init_embedding_`,
    LSTMs by :func:`init_lstm_`.

    A module type that holds parameters of its own and is none of these is an error (a
    ``TypeError`` naming it), so no parameter is left with torch's global-RNG
    initialisation or, for a module built on the ``meta`` device and materialised with
    ``to_empty``, with uninitialised memory.
    """
    norms = (torch.nn.GroupNorm, torch.nn.LayerNorm, torch.nn.modules.batchnorm._NormBase)
    for name, m in module.named_modules():
        if next(m.parameters(recurse=False), None) is None:
            continue
        if isinstance(m, torch.nn.Linear):
            init_linear_(m, generator)
        elif isinstance(m, torch.nn.Conv2d):
            init_conv_(m, generator)
        elif isinstance(m, norms):
            init_norm_(m, generator)
        elif isinstance(m, torch.nn.Embedding):
            init_embedding_(m, generator)
        elif _is_lstm(m):
            init_lstm_(m, generator)
        else:
            raise TypeError(f"init_net_: no deterministic initialisation for {name or 'the module'} "
                            f"({type(m).__name__}); add one to redteam/workloads/_init.py")
    return module
