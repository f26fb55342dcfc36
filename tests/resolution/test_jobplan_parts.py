"""The job plan is a record of typed, frozen parts (allocation, launch, training, recovery,
transport) beside the run's identity and paths: each value has one place, read through its
part."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from launcher.config.load import load_experiment
from launcher.config.login import Login
from launcher.config.sites import load_site
from launcher.resolution.jobplan import (
    Allocation, JobPlan, Launch, Recovery, SubmitContext, Training, Transport,
)
from launcher.resolution.resolve import resolve

REPO = Path(__file__).resolve().parents[2]
PARTS = {"allocation": Allocation, "launch": Launch, "training": Training, "recovery": Recovery,
         "transport": Transport}


def _plan(*overrides: str, site: str | Path = "local-slurm") -> JobPlan:
    environ = {"HOME": "/home/alice", "USER": "alice"}
    return resolve(load_experiment(REPO / "examples" / "torch_ddp.yaml", list(overrides)),
                   load_site(site, Path("/nonexistent"), environ),
                   SubmitContext(cwd="/home/alice/exp", python="/usr/bin/python3", environ=environ, run_id="parts-1"))


def test_a_resolved_plan_reads_each_setting_from_its_part():
    plan = _plan("resources.nodes=1", "resources.spare_nodes=1", "resources.time=01:30:00", "requeue.max=4",
                 "watchdog.slow_node=exclude", "checkpoint.every_steps=7")
    assert {name: type(getattr(plan, name)) for name in PARTS} == PARTS
    assert (plan.allocation.nodes, plan.allocation.allocated_nodes, plan.allocation.time) == (1, 2, "01:30:00")
    assert plan.launch.world_size == plan.launch.ranks_per_node
    assert (plan.training.checkpoint_every, plan.recovery.requeue_max) == (7, 4)
    assert (plan.recovery.watchdog_slow_node, plan.recovery.warning_signal, plan.recovery.peer) == ("exclude", "USR2",
                                                                                                   False)


def test_the_transport_holds_the_login_node_the_site_names(tmp_path):
    site = tmp_path / "far.yaml"
    site.write_text("name: far\nextends: local-slurm\nlogin: {host: login1.example.org, user: bob, port: 2222}\n")
    login = _plan(site=site).transport.login
    assert isinstance(login, Login)
    assert (login.host, login.user, login.port, login.jump) == ("login1.example.org", "bob", 2222, None)


def test_a_site_without_a_login_node_runs_slurms_commands_here():
    assert _plan().transport.login is None


def test_every_value_has_one_place():
    """No part repeats a field of another or of the plan itself (no flat copies kept beside
    the parts), and the parts are frozen like the plan."""
    top = {f.name for f in dataclasses.fields(JobPlan)}
    seen: dict[str, str] = {}
    for name, part in PARTS.items():
        for field in dataclasses.fields(part):
            assert field.name not in top, f"{name}.{field.name} is also JobPlan.{field.name}"
            assert field.name not in seen, f"{name}.{field.name} is also {seen[field.name]}.{field.name}"
            seen[field.name] = name
    plan = _plan()
    for name in PARTS:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(getattr(plan, name), dataclasses.fields(PARTS[name])[0].name, None)
