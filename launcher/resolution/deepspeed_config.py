"""The DeepSpeed JSON for a resolved run. Pure.

The experiment's raw `deepspeed:` block is merged last, then the keys glaunch relies on
are checked whoever set them; every error names `deepspeed.<path>`, an experiment key."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, TypeGuard

from launcher.config.merge import deep_merge
from launcher.config.sourcemap import ConfigKeyError

BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
OFFLOAD_DEVICES = ("none", "cpu", "nvme")


def build(*, world_size: int, global_batch: int, micro_batch: int, accumulation: int, zero_stage: int,
          offload_optimizer: str, offload_params: str, nvme_path: str | None, precision: str,
          extra: Mapping[str, Any]) -> dict[str, Any]:
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
    _check_json(extra, "deepspeed")
    config = deep_merge(config, extra)
    _check_batch(config, world_size)
    _check_zero(config, zero_stage)
    _check_precision(config, precision)
    return config


def _offload(device: str, nvme_path: str | None) -> dict[str, Any]:
    block: dict[str, Any] = {"device": device, "pin_memory": True}
    if device == "nvme":
        block["nvme_path"] = nvme_path
    return block


def _check_json(value: Any, key: str) -> None:
    """Plain JSON only, and no NaN or infinity anywhere: JSON has none, and DeepSpeed
    would train with them."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigKeyError(key, f"must be a finite number, got {value!r}")
    if isinstance(value, Mapping):
        for k, v in value.items():
            if not isinstance(k, str):
                raise ConfigKeyError(f"{key}.{k}", f"a DeepSpeed key is a string, got {type(k).__name__} {k!r}")
            _check_json(v, f"{key}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_json(v, f"{key}[{i}]")
    elif value is not None and not isinstance(value, (str, int, float, bool)):
        raise ConfigKeyError(key, f"{type(value).__name__} {value!r} is not a JSON value (quote it to make it text)")


def _check_batch(config: Mapping[str, Any], world_size: int) -> None:
    """DeepSpeed asserts train = micro * accumulation * world inside the job; say it now."""
    values: dict[str, int] = {}
    for key in BATCH_KEYS:
        value = config.get(key)
        if not _is_int(value) or value < 1:
            raise ConfigKeyError(f"deepspeed.{key}", f"must be a positive integer, got {value!r}")
        values[key] = value
    train, micro, accumulation = (values[k] for k in BATCH_KEYS)
    if train != micro * accumulation * world_size:
        raise ConfigKeyError("deepspeed.train_batch_size",
                             f"train_batch_size {train} != micro {micro} x accumulation {accumulation} x world size "
                             f"{world_size} (= {micro * accumulation * world_size})")


def _check_zero(config: Mapping[str, Any], zero_stage: int) -> None:
    zero = config.get("zero_optimization")
    if not isinstance(zero, Mapping):
        raise ConfigKeyError("deepspeed.zero_optimization", f"must be a mapping, got {zero!r}")
    stage = zero.get("stage")
    if not _is_int(stage) or not 0 <= stage <= 3:
        raise ConfigKeyError("deepspeed.zero_optimization.stage", f"{stage!r} is not a ZeRO stage (0..3)")
    if stage != zero_stage:
        raise ConfigKeyError("deepspeed.zero_optimization.stage", f"{stage} differs from strategy.zero_stage "
                             f"({zero_stage}), which the plan and checkpoints follow: set strategy.zero_stage")
    for block, least in (("offload_optimizer", 1), ("offload_param", 3)):
        offload = zero.get(block)
        if offload is None:
            continue
        key = f"deepspeed.zero_optimization.{block}"
        if not isinstance(offload, Mapping):
            raise ConfigKeyError(key, f"must be a mapping, got {offload!r}")
        device = offload.get("device", "none")
        if device not in OFFLOAD_DEVICES:
            raise ConfigKeyError(f"{key}.device", f"{device!r} is not one of {', '.join(OFFLOAD_DEVICES)}")
        if device != "none" and stage < least:
            raise ConfigKeyError(f"{key}.device", f"{block} needs ZeRO stage {least} or more, the stage is {stage}")
        if device == "nvme":
            path = offload.get("nvme_path")
            if not isinstance(path, str) or not path:
                raise ConfigKeyError(f"{key}.nvme_path", "NVMe offload needs a path (strategy.nvme_path)")


def _check_precision(config: Mapping[str, Any], precision: str) -> None:
    enabled = {}
    for name in ("fp16", "bf16"):
        block = config.get(name)
        if block is None:
            continue
        if not isinstance(block, Mapping):
            raise ConfigKeyError(f"deepspeed.{name}", f"must be a mapping, got {block!r}")
        value = block.get("enabled", False)
        if not isinstance(value, bool):
            raise ConfigKeyError(f"deepspeed.{name}.enabled", f"must be true or false, got {value!r}")
        enabled[name] = value
    if enabled.get("fp16") and enabled.get("bf16"):
        raise ConfigKeyError("deepspeed.fp16.enabled", "fp16 and bf16 cannot both be enabled (precision sets one)")
    for name in ("fp16", "bf16"):
        if enabled.get(name) and precision != name:
            raise ConfigKeyError(f"deepspeed.{name}.enabled",
                                 f"contradicts precision: {precision}; set precision instead")
        if name in enabled and not enabled[name] and precision == name:
            raise ConfigKeyError(f"deepspeed.{name}.enabled", f"false contradicts precision: {precision}")


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)
