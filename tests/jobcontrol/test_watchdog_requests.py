"""The watchdog's requests on Slurm: scancel calls the job controller makes in the same
process (no text between the watchdog and a shell). What the ranks' heartbeats name as
their step reaches scancel only as a step's number; scancel runs bounded, with a stand-in
on PATH that records its arguments (no cluster needed: what scancel does is Slurm's)."""

from __future__ import annotations

import os

from launcher.jobcontrol import watchdog
from launcher.jobcontrol.watchdog import SlurmSteps


def test_requests_become_scancel_calls_on_the_job_and_its_steps():
    calls: list[list[str]] = []
    records = {0: {"job_step": "0"}, 1: {"job_step": "0"}, 2: {"job_step": "12"}, 3: {"job_step": None}}
    steps = SlurmSteps("4242", lambda: records, calls.append)
    steps.signal(28)
    steps.end()
    assert calls == [["--signal=28", "4242"], ["--signal=KILL", "4242.0"], ["--signal=KILL", "4242.12"]]


def test_hostile_step_names_never_reach_scancel(monkeypatch):
    calls: list[list[str]] = []
    records = {0: {"job_step": "0; touch pwned"}, 1: {"job_step": "$(touch pwned)"}, 2: {"job_step": "../5"},
               3: {"job_step": "-KILL"}, 4: {"job_step": "٣"}, 5: {"job_step": 7}}
    # No rank names a step: the job's steps come from squeue, whose answer is read the same way.
    monkeypatch.setattr(watchdog, "run_command", lambda words, say=None: "4242.0\n4242.batch\n4242.$(x)\n4242.extern\n")
    SlurmSteps("4242", lambda: records, calls.append).end()
    assert calls == [["--signal=KILL", "4242.0"]]


def test_scancel_runs_bounded_and_a_failure_is_said(tmp_path, monkeypatch, capsys):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    (bin_dir / "scancel").write_text(f'#!/bin/bash\nprintf "%s\\n" "$*" >> {calls}\nexit "${{STATUS:-0}}"\n')
    (bin_dir / "scancel").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    assert watchdog.scancel(["--signal=28", "4242"]) is True
    monkeypatch.setenv("STATUS", "1")
    assert watchdog.scancel(["--signal=KILL", "4242.1"]) is False
    assert calls.read_text().splitlines() == ["--signal=28 4242", "--signal=KILL 4242.1"]
    assert "scancel --signal=KILL: exit status 1" in capsys.readouterr().err
