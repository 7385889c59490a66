"""The models federated-learning papers train, written so that redteam's batched trainer
can train them across clients.

The trainer (:mod:`redteam.federation.training`) keeps one flat parameter row per client and
runs ``vmap(grad(loss))`` over ``torch.func.functional_call(model, spec.unflatten(row), (x,))``.
Every model here is plain ``torch.nn`` code that works under that transform: no in-place
updates of captured tensors, no buffers, and no kernels without a batching rule.

Image models (:func:`build_net`):

* ``"resnet18"``: ResNet-18 (He, Zhang, Ren & Sun, "Deep Residual Learning for Image
  Recognition", CVPR 2016) in its CIFAR form, as in kuangliu/pytorch-cifar's
  ``models/resnet.py`` and the FL backdoor benchmarks built on it (BackFed): a 3×3 stem
  convolution of stride 1 and no max-pool, four stages of two BasicBlocks (3×3 convolutions,
  post-activation, a 1×1 projection shortcut where the shape changes) of 64, 128, 256, 512
  channels (strides 1, 2, 2, 2), global average pooling and a linear layer. Convolutions have
  no bias. 11,173,962 parameters at ``width = 64`` on 10 classes with a normalisation layer
  of either kind (GroupNorm and BatchNorm both have one weight and one bias per channel);
  ``width`` scales every stage (``width, 2·width, 4·width, 8·width``). Parameter names follow
  kuangliu's (``conv1``, ``bn1``, ``layer1.0.conv1``, …, ``shortcut.0``, ``linear``) whatever
  the normalisation, so a checkpoint's weights map by name.
* ``"vgg11"`` (also ``"vgg13"``, ``"vgg16"``, ``"vgg19"``): VGG (Simonyan & Zisserman, "Very
  Deep Convolutional Networks for Large-Scale Image Recognition", ICLR 2015), configuration A
  for VGG-11 (64, M, 128, M, 256, 256, M, 512, 512, M, 512, 512, M: 8 convolutions 3×3 with
  bias, each followed by the normalisation and ReLU; M = 2×2 max-pool), in the CIFAR form of
  kuangliu/pytorch-cifar's ``models/vgg.py``: after the five pools a 32×32 input is 1×1, and one
  linear layer maps the 512 features to the classes (the paper's three 4096-wide dense layers
  are for 224×224 ImageNet). 9,231,114 parameters at ``width = 64`` on 10 classes. The features
  are averaged over the remaining spatial positions (a no-op at 32×32), so ``image_size`` may be
  any size ≥ 32. (BackFed's ``vgg_cifar.py`` lists VGG-13's configuration under the name
  ``VGG11`` and VGG-11's under ``VGG9``; here the names are the paper's.)
* ``"lenet5"``: LeNet-5 (LeCun, Bottou, Bengio & Haffner, "Gradient-Based Learning Applied to
  Document Recognition", Proc. IEEE 1998) in the modern variant most FL code uses: conv 6
  filters 5×5 → ReLU → 2×2 max-pool → conv 16 filters 5×5 (every input map connected, not the
  paper's partial table) → ReLU → 2×2 max-pool → dense 120 → ReLU → dense 84 → ReLU → dense to
  the classes (ReLU and max-pooling instead of the paper's scaled tanh and trainable
  subsampling, a linear output instead of its RBF units). A 28×28 input gets 2 pixels of zero
  padding in the first convolution (the paper's 32×32 geometry; 16·5·5 = 400 features before
  the dense layers), a 32×32 input none. 61,706 parameters on 1×28×28 or 1×32×32, 10 classes.
  Its default normalisation is ``"none"`` (the paper has none); with ``"group"`` or ``"batch"``
  a normalisation layer follows each convolution.
* ``"cnn2"``: the 2-convolution CNN of McMahan et al., "Communication-Efficient Learning of Deep
  Networks from Decentralized Data" (AISTATS 2017), which is
  :mod:`redteam.workloads.mnist`'s ``"cnn"`` model (the same class, re-exported as
  :data:`CNN2`): 1×28×28 inputs, 10 classes, ``channels`` (32) and ``hidden`` (512 here, the
  paper's) as width parameters, no normalisation. 1,663,370 parameters.

Character model: :class:`CharLSTM`, LEAF's and McMahan et al.'s Shakespeare model — an 8-dim
character embedding, two LSTM layers of 256 units, a linear layer to the vocabulary — predicting
the next character. Its LSTM is :class:`LoopLSTM`, the LSTM recurrence written with plain
tensor ops (one ``linear`` for the input projection of all steps, then a loop over time).
``torch.nn.LSTM`` cannot be relied on under ``vmap(grad(functional_call))``: on CUDA (torch
2.11, cuDNN, H100) it fails ("Cannot access data pointer of Tensor that doesn't have
storage"); on CPU (torch 2.13) it runs, with correct gradients, only through functorch's
fallback, a loop over the clients (it warns that ``aten::mkldnn_rnn_layer`` has no batching
rule). :class:`LoopLSTM` runs batched on both (on CUDA one ``vmap(grad)`` step of the full model
for 10 clients × 10 sequences × 80 characters took 147 ms, for 100 clients 183 ms; on 2 CPU
cores the fallback was about 1.2× faster than it at 10 clients). It keeps ``torch.nn.LSTM``'s
parameter names, shapes and gate order (i, f, g, o; two bias vectors per layer), so its outputs
equal ``torch.nn.LSTM(batch_first=True)``'s on the same weights and a checkpoint of one loads
into the other.

Normalisation under client batching (``norm``):

* ``"group"`` — ``torch.nn.GroupNorm`` with ``groups`` groups (default 2, the group-norm
  ResNet-18 setting of FL code following Reddi et al., "Adaptive Federated Optimization", ICLR
  2021; Wu & He 2018's own default is 32). The default of ``resnet18`` and ``vgg*``. Hsieh,
  Phanishayee, Mutlu & Gibbons, "The Non-IID Data Quagmire of Decentralized Machine Learning"
  (ICML 2020) find that skewed labels are particularly challenging for models with batch
  normalisation and "show that group normalization can recover much of the accuracy loss of
  batch normalization"; GroupNorm normalises each sample on its own, so it has no batch
  statistics and no running statistics to keep. (Zhong, Chen & Chao, "Making Batch
  Normalization Great in Federated Deep Learning", 2023, report that BatchNorm beats GroupNorm
  in many FL settings; ``"batch"`` is there to compare.)
* ``"batch"`` — ``torch.nn.BatchNorm2d(track_running_stats=False)``: **batch statistics in
  training and in evaluation alike**. There are no running mean and variance: in ``eval()``
  mode the layer still normalises with the statistics of the batch it is given, so an
  evaluation's outputs depend on which samples are evaluated together (the trainer's
  ``evaluate`` passes the whole test set as one batch), and a batch must have more than one
  value per channel. Under the batched trainer each client's layer uses its own minibatch's
  statistics, exactly as a per-client loop does.
* ``"none"`` — no normalisation layer (an identity; nothing else changes, so ``resnet18``'s
  convolutions stay bias-free).

Per-client running statistics (``BatchNorm``'s ``running_mean`` / ``running_var``, or any
other buffer) are **not supported**: the trainer passes only parameters — one flat vector per
client, which is also what travels, is attacked and is aggregated — so a buffer would be one
tensor shared by every client and never federated (with ``track_running_stats=True`` the
in-place update of the running statistics fails inside ``grad``; in ``eval()`` mode the
initial statistics would be used silently). ``BatchedTrainer`` refuses a model with a
normalisation layer that tracks running statistics (an ``InvalidParameter`` naming the layers)
and lets constant buffers through (read-only, the same for every client).
:func:`check_batchable` is stricter — it refuses any buffer, naming them — and every model here
passes it: :func:`build_net` and the classes call it on what they build.

Initialisation draws from the explicit ``generator`` only, never from torch's global random
state: each model is built on the ``meta`` device, materialised with ``to_empty`` and every
parameter initialised by :func:`redteam.workloads._init.init_net_` (torch's default
distributions: uniform ±1/√fan_in for convolutions and dense layers, weight 1 and bias 0 for
normalisation layers, N(0, 1) embeddings, uniform ±1/√hidden for the LSTM).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import InvalidParameter
from ._init import init_lstm_, init_module_, init_net_
from .mnist import _CNN as CNN2

__all__ = [
    "NORMS",
    "IMAGE_NETS",
    "build_net",
    "check_batchable",
    "ResNet18",
    "BasicBlock",
    "VGG",
    "VGG_CONFIGS",
    "LeNet5",
    "CNN2",
    "CharLSTM",
    "LoopLSTM",
    "LEAF_VOCAB",
]

NORMS = ("group", "batch", "none")

#: Simonyan & Zisserman's configurations A, B, D, E (channels at width 64; "M" a 2×2 max-pool).
VGG_CONFIGS: dict[str, tuple[int | str, ...]] = {
    "vgg11": (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"),
    "vgg13": (64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"),
    "vgg16": (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"),
    "vgg19": (64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M",
              512, 512, 512, 512, "M"),
}

IMAGE_NETS = ("resnet18", *VGG_CONFIGS, "lenet5", "cnn2")

#: LEAF's Shakespeare alphabet (``models/utils/language_utils.py``): 80 characters.
LEAF_VOCAB = 80


def check_batchable(module: nn.Module) -> None:
    """Raise :class:`~redteam.errors.InvalidParameter` if ``module`` has any buffer.

    The batched trainer trains one flat vector of *parameters* per client
    (:class:`~redteam.federation.params.ParamSpec`, ``functional_call``); a buffer — BatchNorm's
    running statistics above all — would be one tensor shared by all clients, never
    aggregated, and (for running statistics) updated in place inside ``grad``, which fails.
    """
    names = [n for n, _ in module.named_buffers()]
    if names:
        shown = ", ".join(names[:4]) + (f", … ({len(names)} in all)" if len(names) > 4 else "")
        raise InvalidParameter(
            f"{type(module).__name__} has buffers ({shown}): the batched trainer carries one flat vector of "
            "parameters per client and no per-client buffers, so running statistics are not supported; use "
            "GroupNorm (norm='group') or BatchNorm2d(track_running_stats=False) (norm='batch', batch statistics "
            "in training and evaluation), or make the buffer a parameter")


def _materialise(module: nn.Module, generator: torch.Generator) -> None:
    """A module built on the meta device: allocate on the CPU, initialise from ``generator``, check."""
    module.to_empty(device="cpu")
    init_net_(module, generator)
    check_batchable(module)


def _positive(model: str, name: str, v: Any, hi: int = 1 << 16) -> int:
    if not (isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= hi):
        raise InvalidParameter(f"net {model}: {name} = {v!r}: must be an integer in [1, {hi}]")
    return v


def _check_norm(model: str, norm: Any) -> str:
    if norm not in NORMS:
        raise InvalidParameter(f"net {model}: norm = {norm!r}: must be one of {', '.join(map(repr, NORMS))}")
    return str(norm)


def _norm(model: str, kind: str, channels: int, groups: int) -> nn.Module:
    if kind == "group":
        if channels % groups:
            raise InvalidParameter(f"net {model}: groups = {groups} does not divide a layer's {channels} channels "
                                   "(choose groups dividing every layer's width, or another width)")
        return nn.GroupNorm(groups, channels)
    if kind == "batch":
        return nn.BatchNorm2d(channels, track_running_stats=False)
    return nn.Identity()


class BasicBlock(nn.Module):
    """He et al.'s two-convolution residual block (post-activation), kuangliu's layout."""

    def __init__(self, cin: int, cout: int, stride: int, norm: str, groups: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = _norm("resnet18", norm, cout, groups)
        self.conv2 = nn.Conv2d(cout, cout, 3, stride=1, padding=1, bias=False)
        self.bn2 = _norm("resnet18", norm, cout, groups)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                          _norm("resnet18", norm, cout, groups))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet18(nn.Module):
    """ResNet-18, CIFAR form (module docstring). Inputs ``(B, C, S, S)`` or flattened ``(B, C·S·S)``."""

    def __init__(self, num_classes: int = 10, in_channels: int = 3, image_size: int = 32, norm: str = "group",
                 width: int = 64, groups: int = 2, *, generator: torch.Generator) -> None:
        super().__init__()
        self.in_channels, self.image_size = in_channels, image_size
        with torch.device("meta"):
            self.conv1 = nn.Conv2d(in_channels, width, 3, stride=1, padding=1, bias=False)
            self.bn1 = _norm("resnet18", norm, width, groups)
            cin = width
            for i, (mult, stride) in enumerate(((1, 1), (2, 2), (4, 2), (8, 2)), start=1):
                blocks = [BasicBlock(cin, width * mult, stride, norm, groups),
                          BasicBlock(width * mult, width * mult, 1, norm, groups)]
                setattr(self, f"layer{i}", nn.Sequential(*blocks))
                cin = width * mult
            self.linear = nn.Linear(cin, num_classes)
        _materialise(self, generator)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(-1, self.in_channels, self.image_size, self.image_size)
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layer4(self.layer3(self.layer2(self.layer1(out))))
        return self.linear(out.mean(dim=(-2, -1)))  # = kuangliu's avg_pool2d(out, 4) at 32×32


class VGG(nn.Module):
    """VGG-11/13/16/19, CIFAR form (module docstring). Inputs ``(B, C, S, S)`` or flattened."""

    def __init__(self, config: str = "vgg11", num_classes: int = 10, in_channels: int = 3, image_size: int = 32,
                 norm: str = "group", width: int = 64, groups: int = 2, *, generator: torch.Generator) -> None:
        super().__init__()
        if config not in VGG_CONFIGS:
            raise InvalidParameter(f"net vgg: config = {config!r}: must be one of {', '.join(VGG_CONFIGS)}")
        if image_size < 32:
            raise InvalidParameter(f"net {config}: image_size = {image_size}: must be ≥ 32 (five 2×2 max-pools)")
        self.in_channels, self.image_size = in_channels, image_size
        layers: list[nn.Module] = []
        cin = in_channels
        with torch.device("meta"):
            for v in VGG_CONFIGS[config]:
                if v == "M":
                    layers.append(nn.MaxPool2d(2, 2))
                else:
                    cout = int(v) * width // 64
                    layers += [nn.Conv2d(cin, cout, 3, padding=1), _norm(config, norm, cout, groups), nn.ReLU()]
                    cin = cout
            self.features = nn.Sequential(*layers)
            self.classifier = nn.Linear(cin, num_classes)
        _materialise(self, generator)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(-1, self.in_channels, self.image_size, self.image_size)
        return self.classifier(self.features(x).mean(dim=(-2, -1)))


class LeNet5(nn.Module):
    """LeNet-5, modern variant (module docstring). Inputs ``(B, C, S, S)`` or flattened."""

    def __init__(self, num_classes: int = 10, in_channels: int = 1, image_size: int = 28, norm: str = "none",
                 groups: int = 2, *, generator: torch.Generator) -> None:
        super().__init__()
        pad = 2 if image_size == 28 else 0
        side = ((image_size + 2 * pad - 4) // 2 - 4) // 2
        if side < 1:
            raise InvalidParameter(f"net lenet5: image_size = {image_size}: too small (28 or 32 are the usual sizes)")
        self.in_channels, self.image_size = in_channels, image_size
        with torch.device("meta"):
            self.conv1 = nn.Conv2d(in_channels, 6, 5, padding=pad)
            self.norm1 = _norm("lenet5", norm, 6, groups)
            self.conv2 = nn.Conv2d(6, 16, 5)
            self.norm2 = _norm("lenet5", norm, 16, groups)
            self.fc1 = nn.Linear(16 * side * side, 120)
            self.fc2 = nn.Linear(120, 84)
            self.fc3 = nn.Linear(84, num_classes)
        _materialise(self, generator)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(-1, self.in_channels, self.image_size, self.image_size)
        x = F.max_pool2d(F.relu(self.norm1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.norm2(self.conv2(x))), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc3(F.relu(self.fc2(x)))


class LoopLSTM(nn.Module):
    """A multi-layer LSTM (``batch_first``) written with plain tensor ops, so that it runs
    batched under ``vmap``.

    Parameters as ``torch.nn.LSTM``'s: per layer ``k``, ``weight_ih_l{k}`` ``(4H, in)``,
    ``weight_hh_l{k}`` ``(4H, H)``, ``bias_ih_l{k}`` and ``bias_hh_l{k}`` ``(4H,)``, gates in the
    order input, forget, cell, output; zero initial state. ``forward(x (B, T, in)) → (B, T, H)``,
    the last layer's hidden state at every step (no dropout, unidirectional). Initialised as
    ``torch.nn.LSTM`` (uniform ±1/√H) from ``generator`` when one is given, zeros otherwise
    (:class:`CharLSTM` initialises it with the rest of the model).
    """

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, *,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        for k in range(num_layers):
            cin = input_size if k == 0 else hidden_size
            self.register_parameter(f"weight_ih_l{k}", nn.Parameter(torch.zeros(4 * hidden_size, cin)))
            self.register_parameter(f"weight_hh_l{k}", nn.Parameter(torch.zeros(4 * hidden_size, hidden_size)))
            self.register_parameter(f"bias_ih_l{k}", nn.Parameter(torch.zeros(4 * hidden_size)))
            self.register_parameter(f"bias_hh_l{k}", nn.Parameter(torch.zeros(4 * hidden_size)))
        if generator is not None:
            init_lstm_(self, generator)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, hs = x.shape[0], x.shape[1], self.hidden_size
        for k in range(self.num_layers):
            w_ih = getattr(self, f"weight_ih_l{k}")
            w_hh = getattr(self, f"weight_hh_l{k}")
            bias = getattr(self, f"bias_ih_l{k}") + getattr(self, f"bias_hh_l{k}")
            xw = F.linear(x, w_ih, bias)  # (B, T, 4H): the input projection of every step at once
            h = x.new_zeros(b, self.hidden_size)
            c = x.new_zeros(b, self.hidden_size)
            outs = []
            for s in range(t):
                gates = xw[:, s] + F.linear(h, w_hh)
                sig = torch.sigmoid(gates)  # one kernel for the i, f, o gates (the g slice is unused)
                i, f, o = sig[:, :hs], sig[:, hs:2 * hs], sig[:, 3 * hs:]
                c = f * c + i * torch.tanh(gates[:, 2 * hs:3 * hs])
                h = o * torch.tanh(c)
                outs.append(h)
            x = torch.stack(outs, dim=1)
        return x

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.hidden_size}, num_layers={self.num_layers}, batch_first=True"


class CharLSTM(nn.Module):
    """LEAF's / McMahan et al.'s Shakespeare model: ``Embedding(vocab, embed)`` → ``layers``
    LSTM layers of ``hidden`` units (:class:`LoopLSTM`) → ``Linear(hidden, vocab)``.

    Input: character ids ``(B, T)`` (int64). Output: next-character logits at every position
    ``(B, T, vocab)`` — the unrolled language model McMahan et al. train, and the shape the
    ``Workload`` base's loss and accuracy accept with ``(B, T)`` targets — or, with
    ``last_only=True``, at the last position only, ``(B, vocab)``, as LEAF's reference model
    predicts the one character after an 80-character window. LEAF's vocabulary has 80
    characters (:data:`LEAF_VOCAB`): 819,920 parameters at the defaults (two bias vectors per
    LSTM layer, as ``torch.nn.LSTM``; LEAF's TensorFlow cell has one).
    """

    def __init__(self, vocab: int, embed: int = 8, hidden: int = 256, layers: int = 2, *,
                 generator: torch.Generator, last_only: bool = False) -> None:
        super().__init__()
        for name, v in (("vocab", vocab), ("embed", embed), ("hidden", hidden), ("layers", layers)):
            _positive("char_lstm", name, v)
        self.last_only = bool(last_only)
        with torch.device("meta"):
            self.embedding = nn.Embedding(vocab, embed)
            self.lstm = LoopLSTM(embed, hidden, layers)
            self.out = nn.Linear(hidden, vocab)
        _materialise(self, generator)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.lstm(self.embedding(tokens))
        if self.last_only:
            h = h[:, -1]
        return self.out(h)


_WIDTH_PARAMS = {
    "resnet18": {"width": 64, "groups": 2},
    **{k: {"width": 64, "groups": 2} for k in VGG_CONFIGS},
    "lenet5": {"groups": 2},
    "cnn2": {"channels": 32, "hidden": 512},
}
_DEFAULT_NORM = {"resnet18": "group", **{k: "group" for k in VGG_CONFIGS}, "lenet5": "none", "cnn2": "none"}


def build_net(name: str, *, num_classes: int, in_channels: int, image_size: int, norm: str | None = None,
              generator: torch.Generator, **width_params: int) -> nn.Module:
    """A fresh image model ``name`` (one of :data:`IMAGE_NETS`), initialised from ``generator``.

    ``norm``: ``"group"``, ``"batch"`` or ``"none"`` (module docstring); ``None`` (default) takes
    the model's own default (``"group"`` for ``resnet18`` / ``vgg*``, ``"none"`` for ``lenet5`` and
    ``cnn2``). ``width_params``: ``resnet18`` and ``vgg*`` take ``width`` (64) and ``groups``
    (2, GroupNorm's groups); ``lenet5`` takes ``groups``; ``cnn2`` takes ``channels`` (32) and
    ``hidden`` (512) and only 1×28×28 inputs, 10 classes and ``norm="none"``. Inputs may be
    ``(B, C, S, S)`` or flattened ``(B, C·S·S)``; outputs are ``(B, num_classes)`` logits.
    Bad values raise :class:`~redteam.errors.InvalidParameter`.
    """
    if name not in _WIDTH_PARAMS:
        raise InvalidParameter(f"net {name!r}: unknown; one of {', '.join(IMAGE_NETS)}")
    allowed = _WIDTH_PARAMS[name]
    extra = sorted(set(width_params) - set(allowed))
    if extra:
        raise InvalidParameter(f"net {name}: unknown parameter(s) {', '.join(extra)}; it takes "
                               f"{', '.join(allowed) or 'none'}")
    p = {**allowed, **width_params}
    for k, v in p.items():
        _positive(name, k, v)
    _positive(name, "num_classes", num_classes)
    _positive(name, "in_channels", in_channels, 64)
    _positive(name, "image_size", image_size, 4096)
    kind = _check_norm(name, _DEFAULT_NORM[name] if norm is None else norm)
    if not isinstance(generator, torch.Generator):
        raise InvalidParameter(f"net {name}: generator must be a torch.Generator (initialisation never uses "
                               "torch's global random state)")
    if name == "resnet18":
        return ResNet18(num_classes, in_channels, image_size, kind, p["width"], p["groups"], generator=generator)
    if name in VGG_CONFIGS:
        return VGG(name, num_classes, in_channels, image_size, kind, p["width"], p["groups"], generator=generator)
    if name == "lenet5":
        return LeNet5(num_classes, in_channels, image_size, kind, p["groups"], generator=generator)
    # cnn2: mnist.py's model, unchanged
    if (num_classes, in_channels, image_size, kind) != (10, 1, 28, "none"):
        raise InvalidParameter(f"net cnn2: McMahan et al.'s MNIST CNN (redteam.workloads.mnist) takes 1×28×28 "
                               f"inputs, 10 classes and no normalisation (got num_classes={num_classes}, "
                               f"in_channels={in_channels}, image_size={image_size}, norm={kind!r}); use lenet5 "
                               "for other shapes")
    with torch.device("meta"):
        net = CNN2(p["channels"], p["hidden"])
    net.to_empty(device="cpu")
    init_module_(net, generator)  # as MNIST5k(model="cnn").build_model: the same draws in the same order
    check_batchable(net)
    return net
