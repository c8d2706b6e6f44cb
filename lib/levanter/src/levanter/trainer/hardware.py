"""Peak dense bf16 FLOP/s of common accelerators, for model-FLOPs utilisation (MFU).

MFU = (model FLOPs per token x tokens per second) / (peak FLOP/s x devices). The table holds the
vendors' dense (not sparsity-doubled) bf16 figures per device, i.e. per chip for TPUs and per GPU;
a run computing in f32 is still compared to the bf16 peak, which is what people quote. CPUs have no
meaningful published peak, so their MFU is reported as ``None``.
"""

from __future__ import annotations

import jax

# Matched case-insensitively as substrings of ``jax.Device.device_kind``, first match wins, so
# more specific names come first.
PEAK_BF16_FLOPS_PER_DEVICE: tuple[tuple[str, float], ...] = (
    ("gb200", 2.5e15),
    ("b200", 2.25e15),
    ("h200", 989e12),
    ("h100 pcie", 756e12),
    ("h100", 989e12),  # SXM
    ("h800", 989e12),
    ("gh200", 989e12),
    ("a100", 312e12),
    ("a800", 312e12),
    ("l40s", 362e12),
    ("l40", 181e12),
    ("l4", 121e12),
    ("a10g", 70e12),
    ("a10", 125e12),
    ("rtx 4090", 165e12),
    ("rtx 3090", 71e12),
    ("v100", 125e12),  # fp16 tensor cores; V100 has no bf16
    ("mi300x", 1307e12),
    ("mi250x", 383e12),
    ("tpu v6", 918e12),  # v6e (Trillium)
    ("tpu v5p", 459e12),
    ("tpu v5 lite", 197e12),  # v5e reports "TPU v5 lite"
    ("tpu v5e", 197e12),
    ("tpu v5", 459e12),
    ("tpu v4", 275e12),
    ("tpu v3", 123e12),
    ("tpu v2", 45e12),
)


def peak_flops_per_device(device_kind: str | None = None) -> float | None:
    """The bf16 peak of one device of this kind, or ``None`` when unknown (e.g. any CPU)."""
    if device_kind is None:
        device = jax.devices()[0]
        if device.platform == "cpu":
            return None
        device_kind = device.device_kind
    kind = device_kind.lower()
    for name, flops in PEAK_BF16_FLOPS_PER_DEVICE:
        if name in kind:
            return flops
    return None


def model_flops_utilization(
    flops_per_token: float | None, tokens_per_second: float, num_devices: int, peak_per_device: float | None
) -> float | None:
    if not flops_per_token or not peak_per_device or tokens_per_second <= 0:
        return None
    return flops_per_token * tokens_per_second / (peak_per_device * num_devices)
