"""``redteam limits``: the seven failure modes of peer-to-peer LLM training, computed.

A proposal's numbers (model sizes, codecs, peers and their links, GPUs, target tokens, a
centralized reference cluster) go in one TOML file; bandwidth, stragglers, VRAM and cost
come from stated formulas (:mod:`.formulas`) fed with the harness's own codecs, manifests
and network simulator (:mod:`.compute`); the non-IID gap is trained here; the security
envelope and provenance are summarised from their scenario stores.
"""

from .config import LimitsConfig, load_limits, parse_limits

__all__ = ["LimitsConfig", "load_limits", "parse_limits"]
