"""Text generation from trained language models: KV-cached decoding and sampling."""

from levanter.inference.sampling import KvCache, NonFiniteLogitsError, decode, init_cache, sample
from levanter.inference.text import SamplingConfig, generate_text

__all__ = ["KvCache", "NonFiniteLogitsError", "SamplingConfig", "decode", "generate_text", "init_cache", "sample"]
