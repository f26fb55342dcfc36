"""The DeepSpeed JSON for a resolved run. Pure."""

from __future__ import annotations

from typing import Any, Mapping

from ..config.merge import deep_merge
from ..errors import ConfigError

BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


def build(*, world_size: int, global_batch: int, micro_batch: int, accumulation: int, zero_stage: int,
          offload_optimizer: str, offload_params: str, nvme_path: str | None, precision: str,
          extra: Mapping[str, Any], file: str) -> dict[str, Any]:
    zero: dict[str, Any] = {"stage": zero_stage}
    if offload_optimizer != "none":
        zero["offload_optimizer"] = _offload(offload_optimizer, nvme_path)
    if offload_params != "none":
        zero["offload_param"] = _offload(offload_params, nvme_path)
    config: dict[str, Any] = {
        "train_batch_size": global_batch,
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": accumulation,
        "zero_optimization": zero,
        "steps_per_print": 100,
        "wall_clock_breakdown": False,
    }
    if precision == "bf16":
        config["bf16"] = {"enabled": True}
    elif precision == "fp16":
        config["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16,
                          "loss_scale_window": 1000, "hysteresis": 2, "min_loss_scale": 1}
    config = deep_merge(config, extra)
    _check_batch(config, world_size, file)
    return config


def _offload(device: str, nvme_path: str | None) -> dict[str, Any]:
    block: dict[str, Any] = {"device": device, "pin_memory": True}
    if device == "nvme":
        block["nvme_path"] = nvme_path
    return block


def _check_batch(config: Mapping[str, Any], world_size: int, file: str) -> None:
    """DeepSpeed asserts train = micro * accumulation * world inside the job; say it now."""
    values = {}
    for key in BATCH_KEYS:
        value = config.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"must be a positive integer, got {value!r}", file=file, key=f"deepspeed.{key}")
        values[key] = value
    train, micro, accumulation = (values[k] for k in BATCH_KEYS)
    if train != micro * accumulation * world_size:
        raise ConfigError(
            f"train_batch_size {train} != micro {micro} x accumulation {accumulation} x world size "
            f"{world_size} (= {micro * accumulation * world_size})",
            file=file, key="deepspeed.train_batch_size")
