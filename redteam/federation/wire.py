"""The wire stages of a round: encode (compression with error feedback), chunk (+ sign),
transport (the simulated network, where transport attacks act). See :mod:`.stages`."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np
import torch

from ..errors import RedteamError
from ..transport.chunking import UpdateManifest, build_manifests, new_nonces, params_digest
from ..transport.network import HEADER_INDEX
from ..transport.signing import sign_update
from ..types import AttackContext, ChunkDelivery, Surface

#: the data-parallel run (:class:`~.loop.Federation`), whose public attributes the stages read;
#: named here, not imported (it imports this module)
Federation = Any

__all__ = ["encode", "chunk", "transport", "Chunked"]


# ------------------------------------------------------------------ encode, chunk, transport
def encode(fed: "Federation", part_t: torch.Tensor, sent: torch.Tensor) -> Any:
    """Compress each row, with the client's error-feedback residual (client state). A lossless
    codec (``none``) sends every row exactly, so its residual is zero and none is kept: no
    ``(clients × d)`` state at paper scale (4.5 GB for 100 clients of a ResNet-18)."""
    ef = fed.compressor.error_feedback and not fed.compressor.codec.lossless
    residual = fed.states.rows("residual", part_t, (sent.shape[1],)) if ef else None
    comp = fed.compressor.compress(sent, residual, fed.torch_rng["codec"])
    if ef and comp.residual is not None:
        fed.states.put("residual", part_t, comp.residual)
    return comp


@dataclass
class Chunked:
    uploads: dict[int, tuple[UpdateManifest, list[bytes]]]
    headers: dict[int, bytes]
    digest: str
    keys: Any
    sign_s: float


def chunk(fed: "Federation", rnd: int, part: np.ndarray, comp: Any, params: torch.Tensor, signed: bool) -> Chunked:
    """Each payload cut into content-addressed chunks under a manifest (signed with ``signed_chunks``)."""
    sc = fed.scenario
    digest = params_digest(params)
    keys = fed.enrollment.keys if signed else None
    headers: dict[int, bytes] = {}
    clients = np.asarray(part).tolist()
    # one nonce draw and one manifest builder call for the round (the same bytes, in the
    # same stream order, as one new_nonce/build_manifest per client)
    nonces = new_nonces(fed.rng["network"], len(clients))
    built, texts = build_manifests(comp.payloads, round=rnd, clients=clients, parent_digest=digest,
                                   codec=fed.codec_label, chunk_size=sc.transport.chunk_size, nonces=nonces)
    uploads = dict(zip(clients, built))
    t_sign = time.perf_counter()
    if keys is not None:
        for c, (m, _) in uploads.items():
            headers[c] = sign_update(m, keys[c])
    else:  # the unsigned header is the manifest's canonical JSON
        headers = dict(zip(clients, texts))
    sign_s = time.perf_counter() - t_sign if keys is not None else 0.0
    return Chunked(uploads, headers, digest, keys, sign_s)


def transport(fed: "Federation", rnd: int, ch: Chunked, actx: AttackContext | None, verifier: Any,
              history: dict[int, tuple[ChunkDelivery, ...]], keep: int,
              client_steps: dict[int, int] | None = None) -> tuple[Any, dict[str, Any]]:
    """The simulated network, with the transport attack acting on the deliveries (``client_steps``:
    the local steps each client ran, under the ``partial`` straggler policy)."""
    sc = fed.scenario
    uploads, headers, digest, keys = ch.uploads, ch.headers, ch.digest, ch.keys
    tamper = None
    if actx is not None and Surface.TRANSPORT in fed.attack.surfaces:
        mal = set(actx.malicious)

        def signer(m: UpdateManifest) -> bytes:
            if m.client not in mal:
                raise RedteamError(f"signer: client {m.client} is not malicious; the attacker holds only "
                                   "its own clients' keys")
            return sign_update(m, keys[m.client]) if keys is not None else m.to_json()

        state = {
            "own_uploads": {c: (headers[c], tuple(uploads[c][1])) for c in actx.malicious if c in uploads},
            "signer": signer,
            "signed": keys is not None,
            "codec": fed.compressor.codec,
            "dim": fed.spec.dim,
            "chunk_size": sc.transport.chunk_size,
            "parent_digest": digest,
        }
        if keep:
            state["history"] = MappingProxyType(dict(history))
        ctx_t = dataclasses.replace(actx, state=MappingProxyType(state))
        tamper = lambda deliveries: fed.attack.tamper_chunks(deliveries, ctx_t)  # noqa: E731

    verify_s = [0.0]

    def open_header(author: int, header: bytes) -> UpdateManifest:
        t = time.perf_counter()
        try:
            return verifier.open(author, header, round=rnd, parent_digest=digest)
        finally:
            verify_s[0] += time.perf_counter() - t

    tx = fed.network.transmit(
        rnd, uploads, sc.federation.local_steps, fed.rng["network"], tamper,
        parent_digest=digest, headers=headers, open_header=open_header if verifier is not None else None,
        max_payload_len=fed.compressor.codec.payload_size(fed.spec.dim),
        client_steps=client_steps,
    )
    if keep:
        history[rnd] = tuple(
            [ChunkDelivery(c, HEADER_INDEX, c, headers[c], rnd) for c in uploads]
            + [ChunkDelivery(c, i, c, chk, rnd) for c, (_, chs) in uploads.items() for i, chk in enumerate(chs)]
        )
        for old in [r for r in history if r <= rnd - keep]:
            del history[old]
    header_bytes = sum(map(len, headers.values()))
    timing: dict[str, Any] = {"header_bytes": header_bytes}
    if keys is not None:
        plain = sum(len(m.to_json()) for m, _ in uploads.values())
        timing.update(signature_overhead_bytes=header_bytes - plain, sign_s=ch.sign_s, verify_s=verify_s[0])
    return tx, timing
