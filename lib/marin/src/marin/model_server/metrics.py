"""The engine's counters in Prometheus' text exposition format, for ``GET /metrics``."""

from __future__ import annotations

from levanter.inference.engine import EngineStats

# (name, type, help, the EngineStats field it reads)
_METRICS = (
    ("marin_serve_prompt_tokens_total", "counter", "Prompt tokens submitted.", "prompt_tokens"),
    ("marin_serve_generated_tokens_total", "counter", "Tokens generated.", "generated_tokens"),
    ("marin_serve_requests_finished_total", "counter", "Generation requests finished (any reason).", "finished_requests"),
    ("marin_serve_generated_tokens_per_second", "gauge", "Tokens generated per second over the last 10 s.", "tokens_per_second"),
    ("marin_serve_requests_waiting", "gauge", "Requests queued for a batch slot or cache blocks.", "waiting"),
    ("marin_serve_requests_running", "gauge", "Requests in the running batch.", "running"),
    ("marin_serve_kv_blocks_used", "gauge", "Key/value cache blocks held by requests.", "blocks_used"),
    ("marin_serve_kv_blocks_total", "gauge", "Key/value cache blocks in all.", "blocks_total"),
    ("marin_serve_compilations_total", "counter", "Programs compiled (a new shape bucket each).", "compilations"),
)


def prometheus_text(stats: EngineStats) -> str:
    lines = []
    for name, kind, help_text, attribute in _METRICS:
        value = getattr(stats, attribute)
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}",
                  f"{name} {value:.6g}" if isinstance(value, float) else f"{name} {value}"]
    return "\n".join(lines) + "\n"


__all__ = ["prometheus_text"]
