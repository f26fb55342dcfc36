"""task.json, the job's task spec: built from the plan, read back equal, and refused with
a clear error (file and key) when damaged or not glaunch's; the pickled task holds only
the run directory."""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import signal
from pathlib import Path

import pytest

from launcher.rundir import launch
from launcher.rundir.layout import TASK_FILE, RunDir
from launcher.rundir.taskspec import TaskSpec, TaskSpecError, read_task_spec, write_task_spec

REPO = Path(__file__).resolve().parents[2]

SPEC = TaskSpec(launcher="srun", script="/home/alice/exp/train.py", module=None, args=("--lr", "3e-4", ""),
                nodes=2, ranks_per_node=4, world_size=8, run_dir="/home/alice/runs/r1", run_id="r1",
                requeue_max=3, crash_retries=1, exclude_bad_nodes=False, watchdog_stall_s=600.0,
                watchdog_first_step_s=1800.0, code_path="/home/alice/runs/r1/code")


def test_the_plan_gives_the_spec_and_task_json_reads_back_equal():
    from test_golden import render_case, task_text

    for launcher in ("srun", "torchrun"):
        files = render_case("local-slurm", launcher)
        spec = TaskSpec.from_json(task_text("local-slurm", launcher))
        assert spec.launcher == launcher and spec.world_size == spec.nodes * spec.ranks_per_node
        assert spec.exclude_bad_nodes is True and spec.requeue_max >= 0
        # job.sbatch describes what the task runs, from the same spec.
        assert " ".join(launch.entry_words(spec)) in files["job.sbatch"]
        assert TaskSpec.from_json(spec.to_json()) == spec


def test_round_trip_and_the_words(tmp_path):
    write_task_spec(tmp_path, dataclasses.replace(SPEC, run_dir=str(tmp_path)))
    assert (tmp_path / TASK_FILE).is_file() and RunDir(tmp_path).task_file == tmp_path / TASK_FILE
    back = read_task_spec(tmp_path)
    assert back == dataclasses.replace(SPEC, run_dir=str(tmp_path)) and isinstance(back.args, tuple)
    assert launch.entry_words(SPEC) == ["/home/alice/exp/train.py", "--lr", "3e-4", ""]
    module = dataclasses.replace(SPEC, script=None, module="pkg.train")
    assert launch.entry_words(module) == ["-m", "pkg.train", "--lr", "3e-4", ""]
    assert launch.torchrun_args(SPEC, node_rank="0", master_addr="h", master_port="1", job_id="5")[:2] == [
        "--nnodes=2", "--nproc-per-node=4"]


def damaged(**changes):
    data = json.loads(SPEC.to_json())
    for key, value in changes.items():
        if value is KeyError:
            del data[key]
        else:
            data[key] = value
    return json.dumps(data)


@pytest.mark.parametrize("text,key,words", [
    ("", None, "not JSON"),
    ("[1, 2]", None, "a JSON list, not an object"),
    ('{"format": 1,', None, "not JSON"),
    (damaged(format=1), "format", "format 1: this glaunch reads format 2"),
    (damaged(watchdog_slow_node="drain"), "watchdog_slow_node", "'drain': expected one of report, exclude"),
    (damaged(watchdog_stall_auto="yes"), "watchdog_stall_auto", "is not true or false"),
    (damaged(format=KeyError), "format", "format None"),
    (damaged(nodes=KeyError), "nodes", "missing"),
    (damaged(surprise=1), None, "not a field of the task spec: 'surprise'"),
    (damaged(launcher="mpirun"), "launcher", "'mpirun': expected one of srun, torchrun"),
    (damaged(script="train.py"), "script", "'train.py' is not an absolute path"),
    (damaged(module="pkg.train"), "script", "exactly one of script and module"),
    (damaged(script=None, module="-c"), "module", "'-c' is not a Python module name"),
    (damaged(args="--lr 3"), "args", "a string, not a list of words"),
    (damaged(args=["ok", 3]), "args", "word 1: a number, not text"),
    (damaged(args=["a\x00b"]), "args", "word 0: holds a NUL character"),
    (damaged(nodes=0), "nodes", "0 is less than 1"),
    (damaged(nodes=True), "nodes", "True is not a whole number"),
    (damaged(nodes=2.0), "nodes", "2.0 is not a whole number"),
    (damaged(world_size=9), "world_size", "9 is not nodes x ranks_per_node (2 x 4)"),
    (damaged(nodes=1 << 21, ranks_per_node=1, world_size=1 << 21), "world_size", "2097152 ranks: more than"),
    (damaged(run_dir="runs/r1"), "run_dir", "not an absolute path"),
    (damaged(run_id="r\n1"), "run_id", "holds a control character"),
    (damaged(requeue_max=-1), "requeue_max", "-1 is less than 0"),
    (damaged(exclude_bad_nodes="yes"), "exclude_bad_nodes", "'yes' is not true or false"),
    (damaged(watchdog_stall_s=-5), "watchdog_stall_s", "-5 is not a number of seconds >= 0"),
    (damaged(watchdog_first_step_s="1800"), "watchdog_first_step_s", "'1800' is not a number of seconds"),
    (damaged(code_path=7), "code_path", "a number, not text"),
    (damaged(nodes=int("9" * 4000)), "nodes", "99999... is more than 2147483647"),
    (damaged(nodes=KeyError).replace('"launcher"', '"nodes": ' + "9" * 5000 + ', "launcher"'), None, "not JSON"),
    (damaged(script="/x" * 500 + "\x00"), "script", "holds a NUL character"),
])
def test_a_damaged_or_hostile_task_json_is_a_clear_error(tmp_path, text, key, words):
    (tmp_path / TASK_FILE).write_text(text)
    with pytest.raises(TaskSpecError) as info:
        read_task_spec(tmp_path)
    error = info.value
    assert error.file == str(tmp_path / TASK_FILE) and error.key == key
    assert words in error.message and len(str(error)) < 400, str(error)


def test_task_json_missing_or_not_a_file(tmp_path):
    with pytest.raises(TaskSpecError, match=r"task\.json: missing"):
        read_task_spec(tmp_path)
    os.mkfifo(tmp_path / TASK_FILE)                 # never blocks on a FIFO in its place
    with pytest.raises(TaskSpecError, match=r"cannot be read: .* is not a regular file"):
        read_task_spec(tmp_path)


def test_a_spec_is_checked_when_made():
    with pytest.raises(TaskSpecError, match="not nodes x ranks_per_node"):
        dataclasses.replace(SPEC, nodes=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        SPEC.nodes = 3        # type: ignore[misc]


def test_the_pickled_task_is_the_run_directory_alone(tmp_path):
    from launcher.runtime.task import TrainingTask

    task = TrainingTask(tmp_path)
    data = pickle.dumps(task)
    assert len(data) < 200 and pickle.loads(data).run_dir == str(tmp_path)


def test_the_task_reads_task_json_and_a_damaged_one_is_its_crash(tmp_path, monkeypatch):
    """The task on the node: a task.json it cannot use ends it at once with the file's
    error, recorded in crash.json, before any rank runs."""
    import submitit

    from launcher.runtime.task import TrainingTask

    class Job:
        job_id, global_rank, local_rank, node, num_tasks = "41", 0, 0, 0, 1

    monkeypatch.setattr(submitit, "JobEnvironment", Job)
    for key in ("GLAUNCH_RUN_DIR", "GLAUNCH_RUN_ID", "GLAUNCH_JOB_ID"):
        monkeypatch.delenv(key, raising=False)
    (tmp_path / TASK_FILE).write_text(damaged(launcher="mpirun"))
    warnings = (signal.SIGUSR1, signal.SIGUSR2)
    before = [signal.getsignal(s) for s in warnings]
    try:
        with pytest.raises(TaskSpecError, match="launcher: 'mpirun'"):
            TrainingTask(tmp_path)()
        # The task's work is over, ended or not: a warning from now on is ignored, not the
        # default action Python's shutdown would put back (launcher.runtime.task).
        assert [signal.getsignal(s) for s in warnings] == [signal.SIG_IGN, signal.SIG_IGN]
    finally:
        for signum, handler in zip(warnings, before):
            signal.signal(signum, handler)
    crash = json.loads(RunDir(tmp_path).crash_file.read_text())
    assert crash["task"] == 0 and crash["job_id"] == "41" and crash["error"].startswith("TaskSpecError: ")
    assert os.environ["GLAUNCH_JOB_ID"] == "41" and "GLAUNCH_RUN_DIR" not in os.environ


@pytest.mark.parametrize("words, shown", [
    (["train.py", "--steps", "40"], "train.py --steps 40"),
    (["train.py", "--tag", "a b", ""], "train.py --tag 'a b' ''"),
    (["train.py", "line1\nline2"], "train.py $'line1\\nline2'"),     # one word, on one line
    (["train.py", "$(touch x)"], "train.py '$(touch x)'"),
    (["train.py", "nul\0byte"], "'train.py' 'nul\\x00byte'"),         # no shell word carries a NUL
])
def test_a_rank_s_command_line_in_its_log_is_one_its_words_can_be_read_back_from(words, shown):
    from launcher.runtime.task import shown_words

    assert shown_words(words) == shown
