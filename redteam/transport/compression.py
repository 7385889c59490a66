"""Delta compression codecs and client-side error feedback.

A codec turns one flattened float32 delta row ``(d,)`` into ``bytes`` and back. Every
codec is a frozen dataclass whose fields are its parameters; ``codec.spec`` is the
canonical text (``"topk(fraction=0.1, indices='uint32')"``) that update manifests carry.

Codecs (registry names, :data:`CODECS`):

* ``none``: dense float32, lossless.
* ``fp16`` / ``bf16``: IEEE half precision (Micikevicius et al., "Mixed Precision
  Training", ICLR 2018) and bfloat16 (Kalamkar et al., arXiv:1905.12322, 2019), round to
  nearest even; finite values beyond the format's range saturate to its largest finite
  value (the error-feedback residual keeps the rest).
* ``int8``: block-wise absmax quantization (Dettmers et al., "8-bit Optimizers via
  Block-wise Quantization", ICLR 2022): per block of ``block_size`` values,
  scale = absmax/127 and q = round(x/scale) ∈ [−127, 127]; ``rounding="stochastic"``
  rounds up with probability equal to the fractional part (Gupta et al., "Deep Learning
  with Limited Numerical Precision", ICML 2015), which is unbiased.
* ``topk`` / ``randk``: keep the k largest-magnitude / k uniformly random coordinates
  (Stich, Cordonnier & Jaggi, "Sparsified SGD with Memory", NeurIPS 2018). With error
  feedback neither is rescaled; ``randk(rescale=True)`` multiplies by d/k, the unbiased
  variant (Wangni et al., NeurIPS 2018). k = ``k`` if given, else max(1, round(ρ·d)),
  capped at d; ρ defaults to 0.1.

Error feedback (Stich et al. 2018; Karimireddy et al., "Error Feedback Fixes SignSGD and
other Gradient Compression Schemes", ICML 2019) lives in :class:`Compressor`: the residual
``e`` is explicit state the caller keeps per client. p = Δ + e; sent = C(p); e ← p − sent.

Wire format (all little-endian). A 16-byte header, then the body::

    offset size field
    0      4    magic  b"RTDC"
    4      1    version = 1
    5      1    codec id: none=0 fp16=1 bf16=2 int8=3 topk=4 randk=5
    6      1    value dtype: f32=1 f16=2 bf16=3 i8=4
    7      1    flags: bit 0 = sparse index set is a bitmap; other bits must be 0
    8      4    dim d (uint32), must equal the receiver's expected dimension
    12     4    count (uint32): d for dense codecs, block_size for int8, k for sparse

    none   d × f32
    fp16   d × f16
    bf16   d × uint16 (the upper 16 bits of each float32)
    int8   ceil(d / block_size) × f32 scales (finite, ≥ 0), then d × int8 in [−127, 127]
    sparse k × f32 values in increasing index order, then either
           k × uint32 indices, strictly increasing, < d            (flags bit 0 clear)
           ceil(d / 8) bytes bitmap, LSB first, exactly k bits set,
           padding bits zero                                      (flags bit 0 set)

``len(payload)`` is exactly what travels. Decoding treats the bytes as untrusted: any
inconsistency, and any non-finite decoded value, raises :class:`~redteam.errors.DecodeError`
with a one-line reason; parsing uses ``struct`` and ``numpy.frombuffer`` only.

Decode bound (every codec, a receiver-side convention, not part of any paper): with
``max_abs = M`` set, a payload that decodes to any value with ``|x| > M`` is a
``DecodeError`` naming the value and the coordinate. Nothing is clamped when encoding:
the bound is what the receiver accepts. The default, ``None``, is no bound (the codecs
as published). :meth:`Codec.payload_size` is the exact length of a valid payload, so a
receiver can also refuse an announced length beyond it before fetching anything.
"""

from __future__ import annotations

import difflib
import math
import struct
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Sequence

import numpy as np

from redteam.errors import DecodeError, InvalidParameter, UnknownPlugin
from redteam.types import _check_fields, param_error

if TYPE_CHECKING:
    import torch

__all__ = [
    "MAGIC",
    "VERSION",
    "HEADER",
    "Codec",
    "Dense",
    "Float16",
    "BFloat16",
    "Int8",
    "TopK",
    "RandK",
    "CODECS",
    "make_codec",
    "Compressor",
    "CompressResult",
]

MAGIC = b"RTDC"
VERSION = 1
HEADER = struct.Struct("<4sBBBBII")  # magic, version, codec id, dtype, flags, dim, count
_F32, _F16, _BF16, _I8 = 1, 2, 3, 4
_DTYPE_NAMES = {_F32: "f32", _F16: "f16", _BF16: "bf16", _I8: "i8"}
_FLAG_BITMAP = 0x01
_U32_MAX = 2**32 - 1
_CODEC_NAMES = {0: "none", 1: "fp16", 2: "bf16", 3: "int8", 4: "topk", 5: "randk"}
# what numpy/struct/torch may raise on hostile bytes; turned into DecodeError
_PARSE_ERRORS = (struct.error, ValueError, IndexError, TypeError, OverflowError, RuntimeError, MemoryError)


def _as_rows(x: "torch.Tensor", what: str) -> "torch.Tensor":
    """``x`` as a contiguous float32 CPU matrix ``(n, d)``; shape errors name ``what``."""
    import torch

    if not isinstance(x, torch.Tensor):
        raise InvalidParameter(f"{what}: expected a torch.Tensor, got {type(x).__name__}")
    if x.ndim != 2 or x.shape[1] < 1 or x.shape[1] > _U32_MAX:
        raise InvalidParameter(f"{what}: expected shape (n, d) with 1 ≤ d < 2³², got {tuple(x.shape)}")
    if not x.is_floating_point():
        raise InvalidParameter(f"{what}: expected a floating-point tensor, got {x.dtype}")
    return x.detach().to(device="cpu", dtype=torch.float32).contiguous()


def _check_dim(d: Any) -> int:
    if isinstance(d, bool) or not isinstance(d, int) or not 1 <= d <= _U32_MAX:
        raise InvalidParameter(f"expected_dim = {d!r}: must be an integer in [1, 2³² − 1]")
    return d


@dataclass(frozen=True, slots=True)
class Codec:
    """Base of every codec. Subclasses set the class attributes and three hooks.

    * :meth:`encode` / :meth:`encode_many`: one row / a batch of rows to payloads;
    * :meth:`decode` / :meth:`decode_many`: payloads back to rows, rejecting bad bytes;
    * :attr:`spec`: canonical ``name(param=value, ...)`` text, ``None`` params omitted.
    """

    name: ClassVar[str] = ""
    codec_id: ClassVar[int] = -1
    dtype_code: ClassVar[int] = _F32
    allowed_flags: ClassVar[int] = 0
    needs_generator: ClassVar[bool] = False
    lossless: ClassVar[bool] = False  # True: decode(encode(x)) == x for finite float32 x (no error feedback needed)
    summary: ClassVar[str] = ""
    reference: ClassVar[str] = ""

    #: Largest |value| a decoded payload may hold (None = no bound); see the module docstring.
    max_abs: float | None = None

    def __post_init__(self) -> None:
        _check_fields(self)

    def validate_max_abs(self, v: float | None) -> None:
        if v is None:
            return
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise param_error(self, "max_abs", v, "must be a finite number > 0 (or unset: no bound)")

    @property
    def spec(self) -> str:
        values = [(f.name, getattr(self, f.name)) for f in fields(self)]
        parts = [f"{name}={value!r}" for name, value in values if value is not None]
        return f"{self.name}({', '.join(parts)})"

    # -- hooks for subclasses --------------------------------------------------------
    def expected_count(self, d: int) -> int:
        """The header's ``count`` this codec writes (and demands) at dimension ``d``."""
        return d

    def _compress(self, x: "torch.Tensor", generator: "torch.Generator | None") -> tuple["torch.Tensor", Any]:
        """Batched selection/quantization: ``(sent (n, d), wire parts)``."""
        raise NotImplementedError

    def _body(self, parts: Any, i: int) -> tuple[int, bytes]:
        """Row ``i``'s ``(flags, body bytes)``."""
        raise NotImplementedError

    def _parse(self, view: memoryview, flags: int, d: int, count: int) -> "torch.Tensor":
        """Decode the body (header already checked); raise DecodeError on any problem."""
        raise NotImplementedError

    def _body_rows(self, parts: Any) -> np.ndarray | None:
        """Optional: every row's body at once, ``uint8 (n, body size)``, where each row's
        :meth:`_body` is ``(0, that row's bytes)``; ``None`` where not provided."""
        return None

    def _parse_rows(self, bodies: np.ndarray, flags: int, d: int, count: int) -> "torch.Tensor | None":
        """Optional: :meth:`_parse` of many bodies at once (``uint8 (n, body size)``, every
        row's header the same and checked), the same values; ``None`` where not provided."""
        return None

    # -- public API ------------------------------------------------------------------
    def encode(self, x: "torch.Tensor", generator: "torch.Generator | None" = None) -> bytes:
        """Encode one float row ``(d,)``."""
        if getattr(x, "ndim", None) != 1:
            shape = tuple(getattr(x, "shape", ()))
            raise InvalidParameter(f"{self.spec}.encode: expected a 1-D row (d,), got shape {shape}")
        return self.encode_many(x[None, :], generator)[0][0]

    def encode_many(
        self, x: "torch.Tensor", generator: "torch.Generator | None" = None
    ) -> tuple[list[bytes], "torch.Tensor"]:
        """Encode every row of ``x`` ``(n, d)`` at once; returns ``(payloads, sent)``.

        ``sent`` (float32, on ``x``'s device) is exactly what the receiver decodes.
        Non-finite inputs are serialized as they are (the decoder then rejects them).
        """
        rows = _as_rows(x, f"{self.spec}.encode_many")
        if self.needs_generator and generator is None:
            raise InvalidParameter(f"{self.spec}: encoding needs a torch.Generator (generator=None given)")
        sent, parts = self._compress(rows, generator)
        n, d = rows.shape
        count = self.expected_count(d)
        bodies = self._body_rows(parts) if n > 1 else None
        if bodies is not None:  # one body width, flags 0: every payload is the header + its row
            packed = HEADER.pack(MAGIC, VERSION, self.codec_id, self.dtype_code, 0, d, count)
            if bodies.shape[1] > _BATCH_ROW_BYTES:  # a large row: header and row joined, one copy
                return [b"".join((packed, row)) for row in bodies], sent.to(x.device)
            # small rows (where per-row calls cost more than the bytes): every payload at once
            head = np.frombuffer(packed, np.uint8)
            width = head.size + bodies.shape[1]
            buf = np.empty((n, width), np.uint8)
            buf[:, : head.size] = head
            buf[:, head.size:] = bodies
            blob = buf.tobytes()
            return [blob[i : i + width] for i in range(0, n * width, width)], sent.to(x.device)
        payloads = []
        for i in range(n):
            flags, body = self._body(parts, i)
            payloads.append(HEADER.pack(MAGIC, VERSION, self.codec_id, self.dtype_code, flags, d, count) + body)
        return payloads, sent.to(x.device)

    def payload_size(self, d: int) -> int:
        """Exact length in bytes of this codec's payload for one row of dimension ``d``."""
        d = _check_dim(d)
        return HEADER.size + self._body_size(d, self._flags(d))

    def _flags(self, d: int) -> int:
        return 0

    def _body_size(self, d: int, flags: int) -> int:
        return 4 * d

    def decode(self, data: bytes, expected_dim: int) -> "torch.Tensor":
        """Decode an untrusted payload into a float32 row ``(expected_dim,)``.

        Raises :class:`DecodeError` (never anything else) when the bytes are not a valid
        payload of this codec at this dimension, or decode to a non-finite value.
        """
        import torch

        d = _check_dim(expected_dim)
        try:
            view = memoryview(data).cast("B")
        except (TypeError, ValueError):
            raise DecodeError(f"{self.name} payload: expected bytes, got {type(data).__name__}") from None
        try:
            flags, count = self._check_header(view, d)
            out = self._parse(view, flags, d, count)
        except DecodeError:
            raise
        except _PARSE_ERRORS as exc:
            raise DecodeError(f"{self.name} payload: malformed ({type(exc).__name__}: {exc})") from None
        finite = torch.isfinite(out)
        if not bool(finite.all()):
            j = int((~finite).nonzero()[0, 0])
            raise DecodeError(f"{self.name} payload: non-finite value {float(out[j])} at coordinate {j}")
        if self.max_abs is not None:
            over = out.abs() > self.max_abs
            if bool(over.any()):
                j = int(over.nonzero()[0, 0])
                raise DecodeError(f"{self.name} payload: value {float(out[j])!r} at coordinate {j} exceeds "
                                  f"max_abs = {self.max_abs!r}")
        return out

    def decode_many(self, payloads: Sequence[bytes | None], d: int) -> tuple["torch.Tensor", list[str | None]]:
        """Decode a batch: ``(rows (n, d), errors)``; a failed or ``None`` row is zeros."""
        import torch

        d = _check_dim(d)
        uniform = self._decode_uniform(payloads, d)
        if uniform is not None:
            return uniform
        out = torch.zeros(len(payloads), d, dtype=torch.float32)
        errors: list[str | None] = []
        parsed: list[int] = []
        stacked: list[int] = []
        values: list[torch.Tensor] = []
        checked: dict[tuple[bytes, int], tuple[int, int]] = {}  # header bytes, length -> (flags, count)
        for i, data in enumerate(payloads):
            if data is None:
                errors.append("no payload")
                continue
            try:  # the per-row checks of decode; the value checks run once on the batch below
                view = memoryview(data).cast("B")
                key = (bytes(view[: HEADER.size]), len(view))
                if key not in checked:  # the header check depends on these bytes and the length only
                    checked[key] = self._check_header(view, d)
                flags, count = checked[key]
                value = self._parse(view, flags, d, count)
                if value.shape == (d,) and value.dtype == torch.float32:
                    values.append(value)
                    stacked.append(i)
                else:
                    out[i] = value
                errors.append(None)
                parsed.append(i)
            except (TypeError, ValueError, DecodeError, *_PARSE_ERRORS):
                errors.append(_decode_error(self, data, d))
        if stacked:
            out[stacked] = torch.stack(values)
        if parsed:
            bad = _bad_rows(out[parsed], self.max_abs)
            for j in bad.nonzero().flatten().tolist():  # decode names the first bad value
                i = parsed[j]
                out[i] = 0.0
                errors[i] = _decode_error(self, payloads[i], d)
        return out, errors

    def _decode_uniform(self, payloads: Sequence[bytes | None], d: int
                        ) -> tuple["torch.Tensor", list[str | None]] | None:
        """:meth:`decode_many` in one piece when every payload is ``bytes`` of one length
        with one header that passes the check (a round of honest clients), for a codec with
        :meth:`_parse_rows`: the same rows and errors. ``None`` (the row-by-row path) otherwise."""
        import torch

        n = len(payloads)
        if n < 2 or not all(type(p) is bytes for p in payloads) or len(set(map(len, payloads))) != 1:
            return None
        size = len(payloads[0])
        if size < HEADER.size:
            return None
        if size - HEADER.size > _BATCH_ROW_BYTES:  # large rows: each body copied once, into its row
            head0 = payloads[0][: HEADER.size]  # type: ignore[index]
            if any(p[: HEADER.size] != head0 for p in payloads):  # type: ignore[index]
                return None
            bodies = np.empty((n, size - HEADER.size), np.uint8)
            for i, p in enumerate(payloads):
                bodies[i] = np.frombuffer(p, np.uint8, size - HEADER.size, HEADER.size)  # type: ignore[arg-type]
        else:
            buf = np.frombuffer(b"".join(payloads), np.uint8).reshape(n, size)  # type: ignore[arg-type]
            head = buf[:, : HEADER.size]
            if not bool((head == head[0]).all()):
                return None
            bodies = buf[:, HEADER.size:]
        try:
            flags, count = self._check_header(memoryview(payloads[0]).cast("B"), d)  # type: ignore[arg-type]
            out = self._parse_rows(bodies, flags, d, count)
        except (DecodeError, *_PARSE_ERRORS):
            return None
        if out is None or tuple(out.shape) != (n, d) or out.dtype != torch.float32:
            return None
        bad = _bad_rows(out, self.max_abs)
        errors: list[str | None] = [None] * n
        for i in bad.nonzero().flatten().tolist():  # decode names the first bad value
            out[i] = 0.0
            errors[i] = _decode_error(self, payloads[i], d)
        return out, errors

    def _check_header(self, view: memoryview, d: int) -> tuple[int, int]:
        name = self.name
        if len(view) < HEADER.size:
            raise DecodeError(f"{name} payload: truncated header ({len(view)} bytes, need {HEADER.size})")
        magic, version, cid, dtype, flags, dim, count = HEADER.unpack_from(view, 0)
        if magic != MAGIC:
            raise DecodeError(f"{name} payload: bad magic {magic!r}, expected {MAGIC!r}")
        if version != VERSION:
            raise DecodeError(f"{name} payload: unsupported version {version} (this decoder reads {VERSION})")
        if cid != self.codec_id:
            other = _CODEC_NAMES.get(cid, "unknown")
            raise DecodeError(f"{name} payload: codec id {cid} ({other}), expected {self.codec_id} ({name})")
        if dtype != self.dtype_code:
            raise DecodeError(
                f"{name} payload: value dtype code {dtype} ({_DTYPE_NAMES.get(dtype, 'unknown')}), "
                f"expected {self.dtype_code} ({_DTYPE_NAMES[self.dtype_code]})"
            )
        if flags & ~self.allowed_flags:
            raise DecodeError(f"{name} payload: flags 0x{flags:02x} set bits this codec does not define")
        if dim != d:
            raise DecodeError(f"{name} payload: dimension {dim}, expected {d}")
        want = self.expected_count(d)
        if count != want:
            raise DecodeError(f"{name} payload: header count {count}, {self.spec} at d={d} expects {want}")
        body = len(view) - HEADER.size
        need = self._body_size(d, flags)
        if body != need:
            raise DecodeError(f"{name} payload: body is {body} bytes, header implies {need}")
        return flags, count


# -- dense codecs --------------------------------------------------------------------


def _bad_rows(rows: "torch.Tensor", max_abs: float | None) -> "torch.Tensor":
    """Bool ``(n,)``: the rows holding a non-finite value or, with ``max_abs``, a value beyond it:
    :func:`redteam._rows.finite_rows`' screen by row sums (the entry-by-entry test over the whole
    matrix cost 2.3 ms a round for 25 rows of 25,450 values), then each row's largest magnitude
    for ``(|row| > max_abs).any()``."""
    from .._rows import finite_rows

    bad = ~finite_rows(rows)
    if max_abs is not None and rows.shape[1]:
        bad |= rows.abs().amax(dim=1) > max_abs
    return bad


def _decode_error(codec: Codec, data: Any, d: int) -> str:
    """The message :meth:`Codec.decode` gives for a payload it refuses."""
    try:
        codec.decode(data, d)
    except DecodeError as exc:
        return str(exc)
    raise AssertionError("decode_many: a payload refused in the batch was accepted alone")


#: rows up to this many body bytes are encoded as one batch (see Codec.encode_many)
_BATCH_ROW_BYTES = 1 << 16


def _copied(rows: np.ndarray) -> np.ndarray:
    """``rows`` as a C-contiguous, writable array of its own: itself if it already is one (a
    batch filled row by row), else a copy (a view into payload bytes is neither)."""
    if rows.flags.c_contiguous and rows.flags.writeable and rows.flags.owndata:
        return rows
    return np.array(rows, order="C", copy=True)


def _le(arr: np.ndarray, dtype: str) -> np.ndarray:
    return arr.astype(dtype, copy=False)


@dataclass(frozen=True, slots=True)
class Dense(Codec):
    """Dense float32, lossless: the uncompressed baseline."""

    name: ClassVar[str] = "none"
    codec_id: ClassVar[int] = 0
    summary: ClassVar[str] = "dense float32 (no compression)"
    lossless: ClassVar[bool] = True

    def _compress(self, x, generator):
        return x.clone(), _le(x.numpy(), "<f4")

    def _body(self, parts, i):
        return 0, parts[i].tobytes()

    def _body_rows(self, parts):
        return np.ascontiguousarray(parts).view(np.uint8)

    def _parse(self, view, flags, d, count):
        import torch

        return torch.from_numpy(np.frombuffer(view, "<f4", d, HEADER.size).astype(np.float32))

    def _parse_rows(self, bodies, flags, d, count):
        import torch

        return torch.from_numpy(_copied(bodies).view("<f4").astype(np.float32, copy=False))


def _saturate(x: "torch.Tensor", limit: float) -> "torch.Tensor":
    """Clamp finite values to ±limit; leave inf/nan as they are (the decoder rejects them)."""
    import torch

    return torch.where(torch.isfinite(x), x.clamp(-limit, limit), x)


@dataclass(frozen=True, slots=True)
class _TwoByte(Codec):
    """Shared wire layout of the 16-bit codecs: d little-endian 2-byte values, no flags."""

    def _body(self, parts, i):
        return 0, parts[i].tobytes()

    def _body_rows(self, parts):
        return np.ascontiguousarray(parts).view(np.uint8)

    def _body_size(self, d, flags):
        return 2 * d


@dataclass(frozen=True, slots=True)
class Float16(_TwoByte):
    """IEEE 754 binary16, round to nearest even, saturating at ±65504."""

    name: ClassVar[str] = "fp16"
    codec_id: ClassVar[int] = 1
    dtype_code: ClassVar[int] = _F16
    summary: ClassVar[str] = "IEEE half precision (2× smaller)"
    reference: ClassVar[str] = "Micikevicius et al., ICLR 2018"

    def _compress(self, x, generator):
        import torch

        h = _saturate(x, 65504.0).to(torch.float16)
        return h.to(torch.float32), _le(h.numpy(), "<f2")

    def _parse(self, view, flags, d, count):
        import torch

        return torch.from_numpy(np.frombuffer(view, "<f2", d, HEADER.size).astype(np.float32))

    def _parse_rows(self, bodies, flags, d, count):
        import torch

        return torch.from_numpy(_copied(bodies).view("<f2").astype(np.float32))


_BF16_MAX = float(np.frombuffer(np.uint32(0x7F7F0000).tobytes(), np.float32)[0])


@dataclass(frozen=True, slots=True)
class BFloat16(_TwoByte):
    """bfloat16 (float32's exponent, 8-bit significand), round to nearest even."""

    name: ClassVar[str] = "bf16"
    codec_id: ClassVar[int] = 2
    dtype_code: ClassVar[int] = _BF16
    summary: ClassVar[str] = "bfloat16 (2× smaller, float32 range)"
    reference: ClassVar[str] = "Kalamkar et al., arXiv:1905.12322, 2019"

    def _compress(self, x, generator):
        import torch

        h = _saturate(x, _BF16_MAX).to(torch.bfloat16)
        return h.to(torch.float32), _le(h.view(torch.int16).numpy().view(np.uint16), "<u2")

    def _parse(self, view, flags, d, count):
        import torch

        hi = np.frombuffer(view, "<u2", d, HEADER.size).astype(np.uint32) << np.uint32(16)
        return torch.from_numpy(hi.view(np.float32))

    def _parse_rows(self, bodies, flags, d, count):
        import torch

        hi = _copied(bodies).view("<u2").astype(np.uint32) << np.uint32(16)
        return torch.from_numpy(hi.view(np.float32))


@dataclass(frozen=True, slots=True)
class Int8(Codec):
    """Block-wise absmax int8: scale_b = max|x_b|/127, q = round(x/scale_b) ∈ [−127, 127].

    * ``block_size``: values per block (one float32 scale each); the last block may be
      short. Dettmers et al. (2022) use blocks of 2048 for optimizer state; 256 keeps the
      scale overhead at 1.6 % while following outliers more closely.
    * ``rounding``: ``"deterministic"`` (nearest, ties to even; |error| ≤ scale/2) or
      ``"stochastic"`` (⌊y + u⌋, u ~ U[0, 1): unbiased, |error| < scale; needs a generator).
    """

    block_size: int = 256
    rounding: Literal["deterministic", "stochastic"] = "deterministic"
    name: ClassVar[str] = "int8"
    codec_id: ClassVar[int] = 3
    dtype_code: ClassVar[int] = _I8
    summary: ClassVar[str] = "int8 with per-block absmax scales (4× smaller + scales)"
    reference: ClassVar[str] = "Dettmers et al., ICLR 2022; Gupta et al., ICML 2015"

    def validate_block_size(self, v: int) -> None:
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= _U32_MAX:
            raise param_error(self, "block_size", v, "must be an integer ≥ 1")

    def validate_rounding(self, v: str) -> None:
        if v not in ("deterministic", "stochastic"):
            raise param_error(self, "rounding", v, "must be 'deterministic' or 'stochastic'")

    @property
    def needs_generator(self) -> bool:  # type: ignore[override]
        return self.rounding == "stochastic"

    def expected_count(self, d):
        return self.block_size

    def _body_size(self, d, flags):
        return 4 * math.ceil(d / self.block_size) + d

    def _compress(self, x, generator):
        import torch
        import torch.nn.functional as F

        n, d = x.shape
        b = self.block_size
        nb = math.ceil(d / b)
        blocks = F.pad(x, (0, nb * b - d)).view(n, nb, b)
        scale = blocks.abs().amax(dim=2) / 127.0
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        y = blocks / safe[..., None]
        if self.rounding == "stochastic":
            q = torch.floor(y + torch.rand(y.shape, generator=generator, dtype=torch.float32))
        else:
            q = torch.round(y)
        q = torch.nan_to_num(q, nan=0.0, posinf=127.0, neginf=-127.0).clamp_(-127.0, 127.0)
        sent = (q * scale[..., None]).view(n, nb * b)[:, :d]
        q8 = q.to(torch.int8).view(n, nb * b)[:, :d].contiguous().numpy()
        return sent.contiguous(), (_le(scale.numpy(), "<f4"), q8)

    def _body(self, parts, i):
        scales, q8 = parts
        return 0, scales[i].tobytes() + q8[i].tobytes()

    def _parse(self, view, flags, d, count):
        import torch
        import torch.nn.functional as F

        b = self.block_size
        nb = math.ceil(d / b)
        scales = np.frombuffer(view, "<f4", nb, HEADER.size).astype(np.float32)
        bad = ~(np.isfinite(scales) & (scales >= 0))
        if bad.any():
            j = int(np.flatnonzero(bad)[0])
            raise DecodeError(
                f"int8 payload: scale of block {j} is {float(scales[j])}, expected finite and ≥ 0"
            )
        q = np.frombuffer(view, np.int8, d, HEADER.size + 4 * nb)
        if (q == -128).any():
            j = int(np.flatnonzero(q == -128)[0])
            raise DecodeError(
                f"int8 payload: value −128 at coordinate {j}, outside the symmetric range [−127, 127]"
            )
        qt = F.pad(torch.from_numpy(q.astype(np.float32)), (0, nb * b - d)).view(nb, b)
        return (qt * torch.from_numpy(scales)[:, None]).reshape(-1)[:d].contiguous()


# -- sparse codecs -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Sparse(Codec):
    """Shared fields and wire format of top-k and rand-k.

    * ``fraction`` ρ ∈ (0, 1] or ``k`` ≥ 1 (give at most one; neither means ρ = 0.1);
    * ``indices``: ``"uint32"`` (k × 4 bytes, the accounting of Stich et al.),
      ``"bitmap"`` (⌈d/8⌉ bytes) or ``"auto"`` (whichever is smaller for this d and k).
    """

    fraction: float | None = None
    k: int | None = None
    indices: Literal["uint32", "bitmap", "auto"] = "auto"
    allowed_flags: ClassVar[int] = _FLAG_BITMAP
    default_fraction: ClassVar[float] = 0.1

    def validate_fraction(self, v: float | None) -> None:
        if v is None:
            return
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and 0 < v <= 1):
            raise param_error(self, "fraction", v, "must be a number in (0, 1]")

    def validate_k(self, v: int | None) -> None:
        if v is None:
            return
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= _U32_MAX:
            raise param_error(self, "k", v, "must be an integer ≥ 1")
        if self.fraction is not None:
            both = f"give either fraction or k, not both (fraction = {self.fraction!r})"
            raise param_error(self, "k", v, both)

    def validate_indices(self, v: str) -> None:
        if v not in ("uint32", "bitmap", "auto"):
            raise param_error(self, "indices", v, "must be 'uint32', 'bitmap' or 'auto'")

    @property
    def spec(self) -> str:
        size = f"k={self.k!r}" if self.k is not None else f"fraction={self.fraction or self.default_fraction!r}"
        extra = [f"{f.name}={getattr(self, f.name)!r}" for f in fields(self)
                 if f.name not in ("fraction", "k") and not (f.name == "max_abs" and self.max_abs is None)]
        return f"{self.name}({', '.join([size, *extra])})"

    def expected_count(self, d: int) -> int:
        if self.k is not None:
            return min(self.k, d)
        rho = self.fraction if self.fraction is not None else self.default_fraction
        return max(1, min(d, round(rho * d)))

    def _bitmap(self, d: int, k: int) -> bool:
        if self.indices == "auto":
            return math.ceil(d / 8) < 4 * k
        return self.indices == "bitmap"

    def _flags(self, d):
        return _FLAG_BITMAP if self._bitmap(d, self.expected_count(d)) else 0

    def _body_size(self, d, flags):
        k = self.expected_count(d)
        return 4 * k + (math.ceil(d / 8) if flags & _FLAG_BITMAP else 4 * k)

    def _select(self, x: "torch.Tensor", k: int, generator) -> "torch.Tensor":
        raise NotImplementedError

    def _values(self, x: "torch.Tensor", idx: "torch.Tensor") -> "torch.Tensor":
        return x.gather(1, idx)

    def _compress(self, x, generator):
        import torch

        n, d = x.shape
        k = self.expected_count(d)
        idx = self._select(x, k, generator).sort(dim=1).values
        vals = self._values(x, idx)
        sent = torch.zeros_like(x).scatter_(1, idx, vals)
        bitmap = self._bitmap(d, k)
        if bitmap:
            mask = torch.zeros(n, d, dtype=torch.bool).scatter_(1, idx, True)
            index_bytes = np.packbits(mask.numpy(), axis=1, bitorder="little")
        else:
            index_bytes = _le(idx.to(torch.int64).numpy(), "<u4")
        return sent, (bitmap, _le(vals.numpy(), "<f4"), index_bytes)

    def _body(self, parts, i):
        bitmap, vals, index_bytes = parts
        return (_FLAG_BITMAP if bitmap else 0), vals[i].tobytes() + index_bytes[i].tobytes()

    def _parse(self, view, flags, d, k):
        import torch

        name = self.name
        vals = np.frombuffer(view, "<f4", k, HEADER.size).astype(np.float32)
        offset = HEADER.size + 4 * k
        if flags & _FLAG_BITMAP:
            bits = np.unpackbits(np.frombuffer(view, np.uint8, math.ceil(d / 8), offset), bitorder="little")
            if bits[d:].any():
                raise DecodeError(f"{name} payload: bitmap padding bits beyond d={d} are set")
            idx = np.flatnonzero(bits[:d])
            if idx.size != k:
                raise DecodeError(f"{name} payload: bitmap has {idx.size} bits set, header says k={k}")
        else:
            idx = np.frombuffer(view, "<u4", k, offset).astype(np.int64)
            if idx.size and int(idx.max()) >= d:
                j = int(np.flatnonzero(idx >= d)[0])
                raise DecodeError(
                    f"{name} payload: index {int(idx[j])} at position {j} is out of range [0, {d})"
                )
            steps = np.diff(idx)
            if (steps <= 0).any():
                j = int(np.flatnonzero(steps <= 0)[0]) + 1
                raise DecodeError(
                    f"{name} payload: indices not strictly increasing at position {j} "
                    f"({int(idx[j - 1])} then {int(idx[j])}: duplicate or unsorted)"
                )
        out = torch.zeros(d, dtype=torch.float32)
        out[torch.from_numpy(idx)] = torch.from_numpy(vals)
        return out


@dataclass(frozen=True, slots=True)
class TopK(_Sparse):
    """Top-k sparsification: keep the k coordinates of largest magnitude (per row).

    Stich, Cordonnier & Jaggi, "Sparsified SGD with Memory", NeurIPS 2018. Payload
    ≈ k·(4 + 4) bytes with uint32 indices, i.e. about 2ρ of dense float32.
    """

    name: ClassVar[str] = "topk"
    codec_id: ClassVar[int] = 4
    summary: ClassVar[str] = "top-k sparsification by magnitude (fp32 values + indices)"
    reference: ClassVar[str] = "Stich, Cordonnier & Jaggi, NeurIPS 2018"

    def _select(self, x, k, generator):
        import torch

        return torch.topk(x.abs(), k, dim=1, sorted=False).indices


@dataclass(frozen=True, slots=True)
class RandK(_Sparse):
    """Random-k sparsification: k coordinates drawn uniformly without replacement per row.

    Stich, Cordonnier & Jaggi (NeurIPS 2018) use rand-k unscaled with memory (error
    feedback). ``rescale=True`` multiplies the kept values by d/k, which makes the
    operator unbiased (Wangni et al., NeurIPS 2018) and is meant for use *without*
    error feedback. Indices travel explicitly, so the receiver never has to trust or
    replay the sender's random stream.
    """

    rescale: bool = False
    name: ClassVar[str] = "randk"
    codec_id: ClassVar[int] = 5
    needs_generator: ClassVar[bool] = True
    summary: ClassVar[str] = "random-k sparsification (seeded; optional unbiased d/k rescaling)"
    reference: ClassVar[str] = "Stich, Cordonnier & Jaggi, NeurIPS 2018"

    def validate_rescale(self, v: bool) -> None:
        if not isinstance(v, bool):
            raise param_error(self, "rescale", v, "must be true or false")

    def _select(self, x, k, generator):
        import torch

        keys = torch.rand(x.shape, generator=generator, dtype=torch.float32)
        return torch.topk(keys, k, dim=1, sorted=False).indices

    def _values(self, x, idx):
        vals = x.gather(1, idx)
        if self.rescale:
            vals = vals * (x.shape[1] / idx.shape[1])
        return vals


CODECS: dict[str, type[Codec]] = {c.name: c for c in (Dense, Float16, BFloat16, Int8, TopK, RandK)}


def make_codec(name: str, /, **params: Any) -> Codec:
    """Build the codec registered as ``name`` (see :data:`CODECS`) with ``params``."""
    if name not in CODECS:
        close = difflib.get_close_matches(str(name), list(CODECS), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise UnknownPlugin(f"unknown codec {name!r}{hint} (known: {', '.join(sorted(CODECS))})")
    cls = CODECS[name]
    allowed = [f.name for f in fields(cls)]
    for key in params:
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed, n=2, cutoff=0.5)
            hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise InvalidParameter(
                f"codec {name!r} has no parameter {key!r}{hint} (parameters: {', '.join(allowed) or 'none'})"
            )
    return cls(**params)


# -- error feedback ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CompressResult:
    """What :meth:`Compressor.compress` returns.

    * ``payloads``: one encoded update per client (``len`` = bytes on the wire);
    * ``sent``: ``(n, d)`` float32, exactly what the receiver decodes from ``payloads``;
    * ``residual``: the new error-feedback memory ``(n, d)`` (``None`` without EF).
    """

    payloads: list[bytes]
    sent: "torch.Tensor"
    residual: "torch.Tensor | None"

    @property
    def nbytes(self) -> int:
        return sum(len(p) for p in self.payloads)


@dataclass(frozen=True, slots=True)
class Compressor:
    """A codec plus client-side error feedback (Stich et al. 2018; Karimireddy et al. 2019).

    ``compress(updates, residual, generator)`` applies, for every client row at once:
    p = Δ + e (e = 0 when ``residual`` is None), sent = C(p), e ← p − sent. The residual
    is explicit state: the caller keeps it per client and passes it back next round.
    With ``error_feedback=False`` the residual argument is ignored and ``None`` returned.
    """

    codec: Codec
    error_feedback: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.codec, Codec):
            raise InvalidParameter(f"Compressor.codec = {self.codec!r}: expected a Codec (see make_codec)")
        if not isinstance(self.error_feedback, bool):
            raise InvalidParameter(
                f"Compressor.error_feedback = {self.error_feedback!r}: must be true or false"
            )

    def compress(
        self,
        updates: "torch.Tensor",
        residual: "torch.Tensor | None" = None,
        generator: "torch.Generator | None" = None,
    ) -> CompressResult:
        import torch

        rows = _as_rows(updates, "Compressor.compress: updates")
        p = rows
        if self.error_feedback and residual is not None:
            if tuple(residual.shape) != tuple(rows.shape):
                raise InvalidParameter(
                    f"Compressor.compress: residual shape {tuple(residual.shape)}, expected {tuple(rows.shape)}"
                )
            p = rows + residual.detach().to(device="cpu", dtype=torch.float32)
        payloads, sent = self.codec.encode_many(p, generator)
        new_residual = (p - sent).to(updates.device) if self.error_feedback else None
        return CompressResult(payloads=payloads, sent=sent.to(updates.device), residual=new_residual)

    def decode_many(self, payloads: Sequence[bytes | None], d: int) -> tuple["torch.Tensor", list[str | None]]:
        """The receiver side: :meth:`Codec.decode_many` of this compressor's codec."""
        return self.codec.decode_many(payloads, d)
