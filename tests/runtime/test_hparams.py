"""The experiment's hparams in the training script: GLAUNCH_HPARAMS read, and made the
defaults of the script's options, so that a sweep over them reaches the training."""

from __future__ import annotations

import argparse
import json

import pytest

from launcher import runtime as rt
from launcher.rundir.rankcontext import RuntimeConfigError


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="train.py")
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--seconds-per-step", type=float, default=0.0)
    p.add_argument("--steps", type=int, default=50)
    return p


@pytest.fixture
def hparams_file(tmp_path, monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)

    def write(values) -> None:
        path = tmp_path / "hparams.json"
        path.write_text(json.dumps(values) if not isinstance(values, str) else values)
        monkeypatch.setenv("GLAUNCH_HPARAMS", str(path))

    return write


def test_without_the_variable_there_are_none(monkeypatch):
    monkeypatch.delenv("GLAUNCH_HPARAMS", raising=False)
    assert rt.read_hparams() == {}
    assert rt.apply_hparams(parser()) == {}


def test_hparams_become_option_defaults_and_the_command_line_wins(hparams_file, capfd):
    hparams_file({"lr": 0.003, "seconds-per-step": "0.5", "warmup": 10})
    p = parser()
    assert rt.apply_hparams(p) == {"lr": 0.003, "seconds_per_step": "0.5"}
    args = p.parse_args([])
    assert (args.lr, args.seconds_per_step, args.steps) == (0.003, 0.5, 50)   # text converted as typed
    assert p.parse_args(["--lr", "0.1"]).lr == 0.1
    err = capfd.readouterr().err
    assert "hparams as option defaults: lr=0.003, seconds_per_step='0.5'" in err
    assert "hparams that match no option of train.py, unused: warmup" in err


def test_only_rank_0_says_so(hparams_file, capfd, monkeypatch):
    hparams_file({"lr": 0.003})
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert rt.apply_hparams(parser()) == {"lr": 0.003}
    assert capfd.readouterr().err == ""


@pytest.mark.parametrize("text,words", [("[1, 2]", "not an object"), ("{", "not JSON")])
def test_an_unreadable_file_names_the_variable(hparams_file, text, words):
    hparams_file(text)
    with pytest.raises(RuntimeConfigError, match=f"GLAUNCH_HPARAMS=.*{words}"):
        rt.read_hparams()
