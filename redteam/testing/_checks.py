"""Shared machinery of the contract checks (private): failures, refusals, comparisons.

A *failure* is an ``AssertionError`` whose first line names the plugin and the broken
property, followed by what was seen and the input that showed it (a reproduce line).
A *refusal* is a plugin raising a :class:`~redteam.errors.RedteamError` on an input it
documents it cannot handle (Krum with n < 3, ALIE with an attacker majority): it is
counted, not failed; a plugin that refuses every generated input fails with the
refusals listed, so a requirement the kit cannot meet is said out loud.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, NoReturn

from redteam.errors import RedteamError

if TYPE_CHECKING:
    import torch

# the property names a report lists and a failure names
P_DECLARATION = "declaration: a frozen dataclass whose own parameters re-validate"
P_SURFACES = "declaration: every overridden hook's surface is listed in `surfaces`"
P_RUNS = "runs on valid input (or refuses it with a RedteamError)"
P_SHAPE = "shapes, dtypes and device preserved"
P_FINITE = "finite in → finite out"
P_DETERMINISTIC = "deterministic under the seed"
P_MUTATION = "no mutation of inputs"
P_LABELS = "labels stay in range"
P_STATE = "takes its own Decision.state back next round"
P_PERMUTATION = "invariance to permuting clients"
P_IDENTITY = "identity on identical rows"
P_NONFINITE = "non-finite rows rejected with a reason"

#: relative tolerance of the comparisons that allow rounding (permutation, identity)
TOLERANCE = {"float64": 1e-7, "float32": 1e-4, "float16": 2e-2, "bfloat16": 5e-2}

REFUSED = object()


def fail(label: str, prop: str, detail: str, where: str) -> NoReturn:
    raise AssertionError(f"{label} breaks the contract «{prop}»: {detail}\n    input: {where}")


@dataclass
class Tally:
    """How many inputs each hook handled, and the refusals met (message → count)."""

    done: dict[str, int] = field(default_factory=dict)
    refusals: dict[str, dict[str, int]] = field(default_factory=dict)

    def ok(self, hook: str) -> None:
        self.done[hook] = self.done.get(hook, 0) + 1

    def refuse(self, hook: str, message: str) -> None:
        seen = self.refusals.setdefault(hook, {})
        seen[message] = seen.get(message, 0) + 1

    def require(self, label: str, hooks: list[str], hint: str) -> None:
        """Fail when a hook handled no input at all, listing what it said."""
        for hook in hooks:
            if self.done.get(hook, 0) == 0:
                said = self.refusals.get(hook, {})
                lines = "\n".join(f"      {m}  (×{k})" for m, k in list(said.items())[:5]) or "      (nothing)"
                raise AssertionError(
                    f"{label}: {hook} refused every input the kit generated, so no contract could be "
                    f"checked. It said:\n{lines}\n    {hint}"
                )

    def refused(self) -> tuple[str, ...]:
        return tuple(f"{hook}: {m} (×{k})" for hook, said in self.refusals.items() for m, k in said.items())


def call(label: str, hook: str, fn: Callable[[], Any], where: str, tally: Tally | None) -> Any:
    """Run one hook; a RedteamError is a refusal (``REFUSED``) when ``tally`` is given,
    any other exception (or a refusal where none is allowed) a failure."""
    try:
        return fn()
    except AssertionError:
        raise
    except RedteamError as exc:
        if tally is None:
            raise AssertionError(
                f"{label} breaks the contract «{P_RUNS}»: {hook} refused an input it had just accepted "
                f"in another form: {type(exc).__name__}: {exc}\n    input: {where}"
            ) from exc
        tally.refuse(hook, f"{type(exc).__name__}: {exc}")
        return REFUSED
    except Exception as exc:
        raise AssertionError(
            f"{label} breaks the contract «{P_RUNS}»: {hook} raised {type(exc).__name__}: {exc}\n"
            f"    input: {where}\n    (a plugin that cannot handle an input must raise a redteam error "
            f"such as InvalidParameter naming the parameter and the bound)"
        ) from exc


def tensors_of(obj: Any, names: tuple[str, ...]) -> dict[str, "torch.Tensor"]:
    """The tensors among ``obj``'s attributes ``names`` and inside its ``state`` mapping."""
    import torch

    out: dict[str, torch.Tensor] = {}
    for name in names:
        v = getattr(obj, name, None)
        if isinstance(v, torch.Tensor):
            out[name] = v
    _walk(getattr(obj, "state", None), "state", out, 0)
    return out


def _walk(v: Any, path: str, out: dict[str, Any], depth: int) -> None:
    import torch

    if isinstance(v, torch.Tensor):
        out[path] = v
    elif depth < 4 and isinstance(v, Mapping):
        for k, x in v.items():
            _walk(x, f"{path}[{k!r}]", out, depth + 1)
    elif depth < 4 and isinstance(v, (list, tuple)):
        for i, x in enumerate(v):
            _walk(x, f"{path}[{i}]", out, depth + 1)


def snapshot(tensors: Mapping[str, "torch.Tensor"]) -> dict[str, tuple["torch.Tensor", "torch.Tensor"]]:
    return {k: (v, v.detach().clone()) for k, v in tensors.items()}


def mutated(snap: Mapping[str, tuple["torch.Tensor", "torch.Tensor"]]) -> list[str]:
    return [k for k, (now, before) in snap.items() if not same(now, before)]


def same(a: Any, b: Any) -> bool:
    """Bit-for-bit equality of two tensors (NaN equals NaN; shape, dtype, device too)."""
    import torch

    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return bool(a == b)
    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        return False
    if a.dtype.is_floating_point or a.dtype.is_complex:
        return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())
    return bool(torch.equal(a, b))


def max_gap(a: "torch.Tensor", b: "torch.Tensor") -> float:
    import torch

    if a.numel() == 0:
        return 0.0
    gap = (a.to(torch.float64) - b.to(torch.float64)).abs()
    return float(torch.nan_to_num(gap, nan=float("inf")).max())


def close(a: "torch.Tensor", b: "torch.Tensor", rtol: float, scale: float) -> bool:
    """|a − b| ≤ rtol·(scale + |b|) elementwise, NaN only where both are NaN."""
    import torch

    a64, b64 = a.to(torch.float64).cpu(), b.to(torch.float64).cpu()
    both_nan = torch.isnan(a64) & torch.isnan(b64)
    ok = (a64 - b64).abs() <= rtol * (scale + b64.abs())
    return bool((ok | both_nan | (a64 == b64)).all())


def regenerate(g: "torch.Generator", state: "torch.Tensor") -> "torch.Generator":
    """A fresh generator on ``g``'s device in the given state."""
    import torch

    fresh = torch.Generator(device=g.device)
    fresh.set_state(state)
    return fresh


def dtype_name(t: "torch.Tensor") -> str:
    return str(t.dtype).removeprefix("torch.")


def finite(t: "torch.Tensor") -> bool:
    import torch

    return bool(torch.isfinite(t).all()) if t.dtype.is_floating_point else True
