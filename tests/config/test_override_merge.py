"""KEY=VALUE overrides merge one after another, as layers do, in time linear in their number."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.config.load import _nested, parse_overrides
from launcher.config.merge import merge_layer, merge_layers
from launcher.config.sourcemap import Origin, Provenance

REPO = Path(__file__).resolve().parents[2]
FILE = {"a": {"b": {"c": "x"}, "d": [1, 2]}, "e": "y", "h": {"lr": 1}}

OVERRIDES = [
    ["a.b.c=1", "a.b.c=2", "a.b={g: 3}", "a.b.c=4"],
    ["a.b=5", "a.b.c=6", "a.z=7", "a.b=8"],
    ["a={b: {c: 9}}", "a.d=[3]", "a.d.e=1", "a=10", "a.b.c=11"],
    ["e.f=1", "h.k0=0", "h.k1=1", "h.k0=2", "h={k2: 2}", "h.k1=3", "e=z"],
    ["a.b.g.h=1", "a.y=2", "a.b.g=3", "a.b=null", "a.b.c=[1, {x: 2}]", "a.b.c=4"],
]


def one_at_a_time(data, overrides):
    provenance = Provenance()
    merged = merge_layer({}, data, provenance, lambda _key: Origin("exp.yaml"))
    for key, value in parse_overrides(overrides):
        merged = merge_layer(merged, _nested(key, value), provenance, lambda _key: Origin("command line"))
    return merged, provenance.origins


@pytest.mark.parametrize("overrides", OVERRIDES, ids=lambda overrides: overrides[0])
def test_merging_the_overrides_at_once_is_merging_them_one_at_a_time(overrides):
    data = copy.deepcopy(FILE)
    layers = [_nested(key, value) for key, value in parse_overrides(overrides)]
    given = copy.deepcopy(layers)
    provenance = Provenance()
    merged = merge_layer({}, data, provenance, lambda _key: Origin("exp.yaml"))
    merged = merge_layers(merged, layers, provenance, lambda _key: Origin("command line"))
    expected, origins = one_at_a_time(FILE, overrides)
    assert repr(merged) == repr(expected)           # the same keys in the same order
    assert provenance.origins == origins
    assert data == FILE and layers == given         # neither the file's data nor an override changed


def test_twenty_thousand_overrides_of_one_mapping_load_in_seconds():
    script = """if True:
        from launcher.config.load import load_experiment
        overrides = ([f"hparams.k{i}={i}" for i in range(10000)] + [f"hparams.k{i % 100}=x{i}" for i in range(5000)]
                     + [f"model.params={i + 1}e6" for i in range(5000)])
        exp = load_experiment("examples/torch_ddp.yaml", overrides)
        print(len(exp.config.hparams), exp.config.hparams["k7"], exp.config.model.params)
    """
    try:
        proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail("loading 20,000 overrides still ran after 20 s")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["10001", "x4907", "5000000000.0"]
