"""glaunch mirrors two private pieces of submitit (pinned in pyproject.toml): the task
command its executors run, and its per-task log names. If submitit changes them, this fails."""

import shlex

import submitit
from submitit.core.utils import JobPaths
from submitit.slurm.slurm import SlurmExecutor


def test_submitit_version_is_the_pinned_one():
    assert submitit.__version__ == "1.5.4"


def test_task_command_matches_submitit(tmp_path):
    from launcher.rendering.render import submitit_command
    from launcher.resolution.jobplan import JobPlan, Launch

    executor = object.__new__(SlurmExecutor)
    executor.folder = tmp_path / "my logs"
    executor.python = shlex.quote("/opt/py env/bin/python")
    launch = object.__new__(Launch)
    object.__setattr__(launch, "python", ("/opt/py env/bin/python",))
    plan = object.__new__(JobPlan)
    object.__setattr__(plan, "launch", launch)
    object.__setattr__(plan, "log_dir", str(tmp_path / "my logs"))
    assert submitit_command(plan) == executor._submitit_command_str


def test_log_names_match_submitit(tmp_path):
    from launcher.rundir.layout import RunDir

    paths = JobPaths(tmp_path, job_id="42", task_id=3)
    assert paths.stdout.name == "42_3_log.out" == RunDir(tmp_path).task_log("42", 3, "out").name
    assert paths.stderr.name == "42_3_log.err" == RunDir(tmp_path).task_log("42", 3, "err").name
    assert paths.submitted_pickle.name == "42_submitted.pkl"
