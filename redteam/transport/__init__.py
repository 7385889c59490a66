"""Transport: delta compression, BitTorrent-v2-style chunking, and the simulated network.

* :mod:`.compression`: codecs (``none``, ``fp16``, ``bf16``, ``int8``, ``topk``,
  ``randk``) with an explicit, untrusted-input-safe wire format, and client-side error
  feedback (:class:`Compressor`);
* :mod:`.chunking`: SHA-256 chunks, BEP 52 Merkle roots and proofs, the update manifest
  that issue 4 signs, verified reassembly;
* :mod:`.network`: heterogeneous links, loss, relays, retries, deadline/stragglers,
  churn, and the hook through which transport attacks act.
"""

from .chunking import (
    DEFAULT_CHUNK_SIZE,
    ManifestError,
    UpdateManifest,
    build_manifest,
    check_chunk,
    chunk_digest,
    count_chunks,
    merkle_proof,
    merkle_root,
    new_nonce,
    params_digest,
    reassemble,
    split,
    verify_proof,
)
from .compression import (
    CODECS,
    BFloat16,
    Codec,
    CompressResult,
    Compressor,
    Dense,
    Float16,
    Int8,
    RandK,
    TopK,
    make_codec,
)
from .network import Network, NetworkConfig, TamperHook, TransmitResult

__all__ = [
    # compression
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
    # chunking
    "DEFAULT_CHUNK_SIZE",
    "ManifestError",
    "UpdateManifest",
    "build_manifest",
    "split",
    "count_chunks",
    "chunk_digest",
    "check_chunk",
    "merkle_root",
    "merkle_proof",
    "verify_proof",
    "params_digest",
    "new_nonce",
    "reassemble",
    # network
    "NetworkConfig",
    "Network",
    "TransmitResult",
    "TamperHook",
]
