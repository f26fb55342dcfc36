"""What the renderer itself refuses. The stages before it refuse every value a rendered file
could not carry (tests/config/test_bad_input_config.py, tests/resolution/test_bad_input_resolution.py);
ds_config.json is the one file the renderer checks again as it writes it, so that no value
JSON cannot hold (NaN, an infinity: DeepSpeed's reader would take them and train on NaN)
is ever written. Each row: the plan's DeepSpeed config and the fragments of the
ConfigError it must raise."""

import dataclasses
import json

import pytest

from launcher.errors import ConfigError
from launcher.rendering.render import render_ds_config


@dataclasses.dataclass
class Training:
    """What render_ds_config reads of a JobPlan's training part."""

    ds_config: dict


@dataclasses.dataclass
class Plan:
    """What render_ds_config reads of a JobPlan."""

    training: Training
    experiment_file: str = "exp.yaml"


# (id, ds_config, fragments of the error)
CASES = [
    ("nan", {"a": float("nan")}, ["exp.yaml: deepspeed", "not valid JSON"]),
    ("infinity", {"optimizer": {"params": {"lr": float("inf")}}}, ["exp.yaml: deepspeed", "not valid JSON"]),
    ("minus-infinity", {"a": -float("inf")}, ["exp.yaml: deepspeed", "not valid JSON"]),
    ("nan-in-a-list", {"optimizer": {"params": {"betas": [0.9, float("nan")]}}},
     ["exp.yaml: deepspeed", "not valid JSON"]),
    ("no-json-type", {"a": b"bytes"}, ["exp.yaml: deepspeed", "not valid JSON", "bytes"]),
]


@pytest.mark.parametrize("ds_config,fragments", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_refused(ds_config, fragments):
    with pytest.raises(ConfigError) as info:
        render_ds_config(Plan(Training(ds_config)))
    assert info.value.key == "deepspeed" and info.value.exit_code == 2
    for fragment in fragments:
        assert fragment in str(info.value), f"{fragment!r} not in {str(info.value)!r}"


def test_ds_config_json_never_holds_raw_control_characters():
    text = render_ds_config(Plan(Training({"path": "a\x7fb\x1b\x9b"})))
    assert all(c.isprintable() or c == "\n" for c in text) and json.loads(text)["path"] == "a\x7fb\x1b\x9b"
