"""Backdoor (trojan) data poisoning: a trigger that makes the model answer ``target``.

* Pixel-pattern trigger: Gu, Dolan-Gavitt & Garg, "BadNets: Identifying
  Vulnerabilities in the Machine Learning Model Supply Chain", arXiv:1708.06733 (2017):
  stamp a small bright pattern (bottom-right corner) on some training images and
  relabel them as the target class; carried to federated learning by Bagdasaryan et
  al. (AISTATS 2020) and Xie et al. (DBA, ICLR 2020).
* Trigger phrase for text: Bagdasaryan, Veit, Hua, Estrin & Shmatikov, "How To
  Backdoor Federated Learning", AISTATS 2020 (word prediction: sentences that end with
  the trigger phrase are trained to continue with the attacker's chosen word).

The ``trigger`` parameter is either

* a **pixel pattern**: a list of ``[row, col]`` positions in an image of shape
  ``image_shape`` (``(H, W)`` or ``(C, H, W)``; default ``(8, 8)``, the digits
  workload, whose inputs are flattened to 64 values in [0, 1]). Negative indices count
  from the bottom / right as in Python. Every channel of each listed pixel is set to
  ``value`` (default 1.0, white). The default pattern (``trigger`` unset) is the 2×2
  square in the bottom-right corner;
* a **token phrase**: a list of token ids, for text workloads whose inputs are int64
  token ids of shape (N, T). The phrase overwrites positions ``position … position + L − 1``
  (``position = -1``, the default, puts it at the end of the sequence). For sentence
  labels (y of shape (N,)) the label becomes ``target``. For next-token targets (y of
  shape (N, T) with y[:, t] = x[:, t + 1]) the targets are kept consistent with the
  rewritten input, y[:, p + i − 1] = phrase[i], and the token after the phrase becomes
  ``target``: y[:, p + L − 1] = target.

``fraction`` of the eligible samples (those whose label is not already ``target`` when
``exclude_target`` is true; every sample for next-token targets) are poisoned, chosen
from the generator passed in; ``mode="replace"`` stamps them in place, ``"append"``
adds triggered copies and keeps the clean originals. The default ``fraction = 0.5`` is
our choice (the papers vary it).

To boost the poisoned update past the aggregation, combine this data attack with
``model_replacement`` or ``norm_evasion`` on the update surface.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

from redteam.types import Attack, ClientData, Surface, param_error

from .label_flip import poison_indices

if TYPE_CHECKING:
    import torch

__all__ = ["Backdoor", "DEFAULT_PATTERN"]

DEFAULT_PATTERN: tuple[tuple[int, int], ...] = ((-2, -2), (-2, -1), (-1, -2), (-1, -1))


@dataclass(frozen=True, slots=True)
class Backdoor(Attack):
    """Stamp a trigger (pixel pattern or token phrase) on some samples; label them ``target``.

    Parameters: ``trigger`` (pixel positions ``[[r, c], …]`` or token ids ``[t₁, t₂, …]``;
    unset = 2×2 bottom-right square), ``value`` (pixel value), ``image_shape``,
    ``target`` (class or token), ``fraction`` (0, 1], ``mode`` (replace | append),
    ``position`` (phrase start, −1 = end), ``exclude_target``.
    """

    trigger: tuple[tuple[int, int], ...] | tuple[int, ...] | None = None
    value: float = 1.0
    image_shape: tuple[int, ...] = (8, 8)
    target: int = 0
    fraction: float = 0.5
    mode: Literal["replace", "append"] = "replace"
    position: int = -1
    exclude_target: bool = True
    surfaces: ClassVar[tuple[str, ...]] = (Surface.DATA,)
    summary: ClassVar[str] = "Backdoor: pixel-pattern or trigger-phrase poisoning towards a target class"
    reference: ClassVar[str] = "Gu et al., arXiv:1708.06733 (BadNets); Bagdasaryan et al., AISTATS 2020"

    # -- validation -------------------------------------------------------------------
    @property
    def trigger_kind(self) -> str:
        """``"pixels"`` or ``"phrase"``."""
        t = self.trigger
        if t is None or (len(t) and isinstance(t[0], (tuple, list))):
            return "pixels"
        return "phrase"

    def pattern(self) -> tuple[tuple[int, int], ...]:
        return DEFAULT_PATTERN if self.trigger is None else tuple(tuple(p) for p in self.trigger)  # type: ignore[misc]

    def validate_trigger(self, v: object) -> None:
        if v is None:
            return
        if not isinstance(v, (tuple, list)) or len(v) == 0:
            raise param_error(self, "trigger", v, "must be a non-empty list of [row, col] pixels or of token ids")
        if all(isinstance(p, (tuple, list)) for p in v):
            if not all(len(p) == 2 and all(isinstance(c, int) and not isinstance(c, bool) for c in p) for p in v):
                raise param_error(self, "trigger", v, "pixel positions must be [row, col] integer pairs")
        elif all(isinstance(t, int) and not isinstance(t, bool) for t in v):
            if min(v) < 0:  # type: ignore[type-var]
                raise param_error(self, "trigger", v, "token ids must be ≥ 0")
        else:
            raise param_error(self, "trigger", v, "must be all [row, col] pairs or all token ids, not a mix")

    def validate_value(self, v: float) -> None:
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)):
            raise param_error(self, "value", v, "must be a finite number")

    def validate_image_shape(self, v: tuple[int, ...]) -> None:
        if (not isinstance(v, (tuple, list)) or len(v) not in (2, 3)
                or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in v)):
            raise param_error(self, "image_shape", v, "must be (H, W) or (C, H, W) with positive sizes")
        if self.trigger_kind == "pixels":
            h, w = v[-2], v[-1]
            for r, c in self.pattern():
                if not (-h <= r < h and -w <= c < w):
                    raise param_error(self, "trigger", self.trigger,
                                      f"pixel ({r}, {c}) is outside an image of {h}×{w}")

    def validate_target(self, v: int) -> None:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise param_error(self, "target", v, "must be an integer ≥ 0 (a class or token id)")

    def validate_fraction(self, v: float) -> None:
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 1):
            raise param_error(self, "fraction", v, "must be in (0, 1]")

    def validate_mode(self, v: str) -> None:
        if v not in ("replace", "append"):
            raise param_error(self, "mode", v, "must be 'replace' or 'append'")

    def validate_position(self, v: int) -> None:
        if isinstance(v, bool) or not isinstance(v, int) or v < -1:
            raise param_error(self, "position", v, "must be −1 (end of the sequence) or an index ≥ 0")

    # -- the trigger ------------------------------------------------------------------
    def pixel_mask(self, device: "torch.device | str" = "cpu") -> "torch.Tensor":
        """Bool mask over the flattened image (C·H·W,) that is True on trigger pixels."""
        import torch

        shape = tuple(self.image_shape)
        img = torch.zeros(shape[-2:], dtype=torch.bool, device=device)
        rows = torch.tensor([r for r, _ in self.pattern()], dtype=torch.int64, device=device)
        cols = torch.tensor([c for _, c in self.pattern()], dtype=torch.int64, device=device)
        img[rows, cols] = True
        channels = shape[0] if len(shape) == 3 else 1
        return img.unsqueeze(0).expand(channels, -1, -1).reshape(-1)

    def apply(self, x: "torch.Tensor", y: "torch.Tensor") -> tuple["torch.Tensor", "torch.Tensor"]:
        """The triggered copies of samples (x, y): stamp and relabel every one of them."""
        import torch

        n = x.shape[0]
        if self.trigger_kind == "pixels":
            if not x.dtype.is_floating_point:
                raise param_error(self, "trigger", self.trigger,
                                  f"a pixel pattern needs float image inputs, got {x.dtype}")
            per = math.prod(self.image_shape)
            if math.prod(x.shape[1:]) != per:
                raise param_error(self, "image_shape", self.image_shape,
                                  f"inputs have {math.prod(x.shape[1:])} values per sample, expected {per}")
            mask = self.pixel_mask(x.device)
            flat = x.reshape(n, per)
            stamped = torch.where(mask[None, :], torch.full_like(flat, self.value), flat).reshape(x.shape)
            new_y = torch.full_like(y, self.target)
            return stamped, new_y
        if x.dtype.is_floating_point or x.ndim != 2:
            raise param_error(self, "trigger", self.trigger,
                              f"a token phrase needs int token ids of shape (N, T), got {x.dtype} {tuple(x.shape)}")
        phrase = torch.tensor(self.trigger, dtype=x.dtype, device=x.device)
        t_len, p_len = x.shape[1], phrase.shape[0]
        start = t_len - p_len if self.position == -1 else self.position
        if p_len > t_len or start + p_len > t_len:
            raise param_error(self, "position", self.position,
                              f"the phrase of {p_len} tokens does not fit at {start} in sequences of {t_len}")
        xs = x.clone()
        xs[:, start:start + p_len] = phrase
        if y.ndim == 1:
            return xs, torch.full_like(y, self.target)
        if y.shape != x.shape:
            raise param_error(self, "trigger", self.trigger,
                              f"labels of shape {tuple(y.shape)} are neither (N,) nor next-token "
                              f"targets {tuple(x.shape)}")
        ys = y.clone()
        lo = max(start - 1, 0)  # y[:, p + i − 1] = phrase[i] for p + i − 1 ≥ 0
        ys[:, lo:start + p_len - 1] = phrase[lo - (start - 1):].to(y.dtype)
        if start + p_len - 1 < t_len:
            ys[:, start + p_len - 1] = self.target
        return xs, ys

    def targeted_test(self, x: "torch.Tensor", y: "torch.Tensor") -> tuple["torch.Tensor", "torch.Tensor"]:
        """Test inputs for the attack success rate: the held-out samples whose true class is
        not ``target``, triggered, with ``target`` as the label the attacker wants
        (Bagdasaryan et al. 2020's backdoor accuracy; the attack success rate of
        :mod:`redteam.scoring`)."""
        if y.ndim == 1:
            keep = y != self.target
            x, y = x[keep], y[keep]
        return self.apply(x, y)

    def poison_data(self, data: ClientData, client: int, generator: "torch.Generator") -> ClientData:
        import torch

        x, y = data.x, data.y
        n = int(y.shape[0])
        eligible = (y != self.target) if (self.exclude_target and y.ndim == 1) else None
        idx = poison_indices(n, self.fraction, generator, eligible).to(x.device)
        if idx.numel() == 0:
            return data
        tx, ty = self.apply(x[idx], y[idx])
        if self.mode == "append":
            return ClientData(x=torch.cat([x, tx]), y=torch.cat([y, ty]))
        nx, ny = x.clone(), y.clone()
        nx[idx] = tx
        ny[idx] = ty
        return ClientData(x=nx, y=ny)
