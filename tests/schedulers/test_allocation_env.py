"""`glaunch run` reads the allocation from Slurm's variables: one that is set but not
Slurm's is named with its value (exit 2), never read as "not set"."""

import pytest

from launcher import api
from launcher.errors import ConfigError
from launcher.schedulers.slurm.allocation import Allocation


@pytest.mark.parametrize("environ, message", [
    ({"SLURM_JOB_ID": "abc"}, "SLURM_JOB_ID='abc' is set but not a Slurm job id"),
    ({"SLURM_JOB_ID": "12\x1b[2J"}, "SLURM_JOB_ID='12\\x1b[2J' is set but not a Slurm job id"),
    ({"SLURM_JOB_ID": "12", "SLURM_JOB_NUM_NODES": "two"}, "SLURM_JOB_NUM_NODES='two' is set but not a number"),
    ({"SLURM_JOB_ID": "12", "SLURM_NNODES": "-1"}, "SLURM_NNODES='-1' is set but not a number"),
])
def test_slurm_variables_set_but_not_slurms_are_named(environ, message):
    with pytest.raises(ConfigError) as caught:
        Allocation.of(environ)
    assert message in caught.value.message and caught.value.exit_code == 2


def test_outside_an_allocation_glaunch_run_says_so(tmp_path, isolated_env, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert Allocation.of({}) is None
    with pytest.raises(ConfigError, match="SLURM_JOB_ID is not set"):
        api.run("examples/torch_ddp.yaml", site="local-slurm", environ={})


def test_an_allocation_is_read(tmp_path):
    allocation = Allocation.of({"SLURM_JOB_ID": "77", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "n[1-2]"})
    assert (allocation.job_id, allocation.nodes, allocation.nodelist) == ("77", 2, "n[1-2]")
