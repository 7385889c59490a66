"""Small helpers shared by the built-in attacks (not a plugin module).

* :func:`honest_rows`: the honest updates an attack bases itself on, following its
  ``knowledge`` field (``"omniscient"``: every honest row the trainer showed it;
  ``"own"``: only its own clients' honest rows);
* :func:`broadcast`: one ``(d,)`` vector as the ``(f, d)`` rows every malicious client sends;
* :func:`randn` / :func:`rand`: draws from ``ctx.generator`` only, moved to the rows' device;
* :func:`work`: the dtype statistics run in (float64 when small, float32 when large);
* :func:`pairwise_sq_dists`: squared Euclidean distances through the Gram matrix;
* :func:`fit_norm`: rows with an exact target norm that survive the cast to their dtype
  without crossing the bound (a float32 row scaled to M in float64 can come back at
  M·(1 + 1e-7) and be rejected by a strict ``‖Δ‖ ≤ M`` check).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from redteam.types import AttackContext, param_error

if TYPE_CHECKING:
    import torch

KNOWLEDGE = ("omniscient", "own")


def check_knowledge(obj: Any, v: str) -> None:
    if v not in KNOWLEDGE:
        raise param_error(obj, "knowledge", v, "must be 'omniscient' (all honest updates of the round) "
                                               "or 'own' (only the malicious clients' own honest updates)")


def honest_rows(knowledge: str, ctx: AttackContext) -> "torch.Tensor":
    """The honest rows the attack may use under its declared threat model."""
    return ctx.visible_updates if knowledge == "omniscient" else ctx.own_updates


def broadcast(vec: "torch.Tensor", ctx: AttackContext) -> "torch.Tensor":
    """``vec`` (d,) as ``(f, d)`` fresh rows in the dtype and device of ``ctx.own_updates``."""
    own = ctx.own_updates
    row = vec.to(dtype=own.dtype, device=own.device)
    return row.unsqueeze(0).expand(own.shape[0], -1).clone()


def _draw_dtype(like: "torch.Tensor") -> "torch.dtype":
    import torch

    return torch.float64 if like.dtype == torch.float64 else torch.float32


def randn(shape: tuple[int, ...], ctx: AttackContext, like: "torch.Tensor") -> "torch.Tensor":
    """Standard normal draws from ``ctx.generator`` (on its device), as ``like``'s dtype/device."""
    import torch

    g = ctx.generator
    t = torch.randn(shape, generator=g, device=g.device, dtype=_draw_dtype(like))
    return t.to(device=like.device, dtype=like.dtype)


def rand(shape: tuple[int, ...], ctx: AttackContext, like: "torch.Tensor",
         dtype: "torch.dtype | None" = None) -> "torch.Tensor":
    """Uniform [0, 1) draws from ``ctx.generator``, on ``like``'s device."""
    import torch

    g = ctx.generator
    t = torch.rand(shape, generator=g, device=g.device, dtype=dtype or _draw_dtype(like))
    return t.to(device=like.device)


#: matrices up to this many elements are processed in float64 (at most 128 MiB)
F64_LIMIT = 1 << 24


def work(x: "torch.Tensor") -> "torch.Tensor":
    """``x`` in the dtype the statistics run in.

    float64 for small inputs (exact worked examples, distance expansions without
    cancellation) and for float64 inputs; float32 for large float32/16 inputs, where a
    float64 copy would cost memory and time (100 × 10⁶ float64 is 800 MB) while float32
    sums stay accurate to ~1e-7 relative, far below any attack's own tolerance.
    """
    import torch

    if x.dtype == torch.float64 or x.numel() <= F64_LIMIT:
        return x.to(torch.float64)
    return x.to(torch.float32)


def pairwise_sq_dists(x: "torch.Tensor") -> "torch.Tensor":
    """``D[i, j] = ‖xᵢ − xⱼ‖²`` (float64, (h, h)) via the Gram matrix of the centred rows.

    Centring does not change distances and keeps the ``‖a‖² + ‖b‖² − 2⟨a, b⟩``
    expansion from cancelling catastrophically when the rows share a large offset.
    """
    import torch

    xw = work(x)
    xw = xw - xw.mean(dim=0, keepdim=True)
    gram = (xw @ xw.T).to(torch.float64)
    sq = gram.diagonal()
    d = (sq[:, None] + sq[None, :] - 2.0 * gram).clamp_min(0.0)
    d.fill_diagonal_(0.0)
    return d


def fit_norm(direction: "torch.Tensor", norm: float, like: "torch.Tensor") -> "torch.Tensor":
    """Rows ``norm · direction / ‖direction‖`` cast to ``like.dtype``, never above ``norm``.

    ``direction`` is ``(k, d)``; rows whose direction is zero stay zero. After the cast
    each row is measured as the norm rule measures it (:func:`defenses.norm.l2_norms`,
    float64-accumulated), and a row that landed above ``norm`` is
    shrunk by a few ulps (at most a handful of vectorized passes), so the result is
    the largest representable row at or below the bound, up to rounding.
    """
    import torch

    from defenses.norm import l2_norms  # one boundary: the norm rule's own measure

    dw = work(direction)
    lengths = torch.linalg.vector_norm(dw, dim=1, keepdim=True, dtype=torch.float64)
    scale = torch.where(lengths > 0, norm / lengths.clamp_min(1e-300), torch.zeros_like(lengths))
    out = (dw * scale.to(dw.dtype)).to(device=like.device, dtype=like.dtype)
    eps = torch.finfo(like.dtype).eps if like.dtype.is_floating_point else 0.0
    for _ in range(8):
        got = l2_norms(out, near=norm)
        over = got > norm
        if not bool(over.any()):
            break
        shrink = torch.where(over, (norm / got.clamp_min(1e-300)) * (1.0 - 2.0 * eps),
                             torch.ones_like(got))
        out = (work(out) * shrink[:, None].to(work(out).dtype)).to(like.dtype)
    return out


def check_image_shape(obj: Any, v: Any, *, allow_none: bool = True) -> None:
    """``image_shape`` is ``(H, W)`` or ``(C, H, W)`` with positive integer sizes (or unset)."""
    if v is None and allow_none:
        return
    if (not isinstance(v, (tuple, list)) or len(v) not in (2, 3)
            or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in v)):
        raise param_error(obj, "image_shape", v, "must be (H, W) or (C, H, W) with positive sizes"
                          + (", or unset" if allow_none else ""))
