"""job.sbatch's loop of job steps, run by real bash without a cluster: the launch part of a
rendered job.sbatch with stand-ins for srun, scontrol and jobend on PATH. After "restart
NODES" the next step runs on those nodes with the next start number, rendezvous host and
port; "requeue NODES" requeues and keeps the job off them; "done" ends the script."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

GOLDEN = Path(__file__).parent.parent / "golden" / "local-slurm.srun.job.sbatch"
JOBEND = re.compile(r"/usr/bin/python3 -m launcher\.runtime\.jobend \S+")

STUBS = {
    # Each step: its --nodelist and what the ranks would read, then the next exit status.
    "srun": 'for a; do case $a in --nodelist=*) n=${a#*=};; esac; done\n'
            'printf "%s %s %s %s\\n" "$n" "$GLAUNCH_RESTART" "$MASTER_ADDR" "$MASTER_PORT" >> "$LOG/steps"\n'
            'exit "$(sed -n "$(wc -l < "$LOG/steps")p" "$LOG/statuses")"\n',
    "scontrol": 'case "$1 $2" in\n'
                '  "show hostnames") printf "n1\\nn2\\nn3\\n" ;;\n'
                '  "show job") ;;\n'
                '  *) printf "%s\\n" "$*" >> "$LOG/scontrol" ;;\n'
                'esac\n',
    # The end of each start answers the next line of $LOG/answers, and says what it was told.
    "jobend": 'case " $* " in\n'
              '  *" --watch "*) exit 0 ;;\n'
              '  *" --begin "*) echo "${BEGIN:-start ${START_NUMBER:-0}}"; exit "${BEGIN_STATUS:-0}" ;;\n'
              '  *) printf "%s\\n" "$*" >> "$LOG/ends"\n'
              '     sed -n "$(wc -l < "$LOG/ends")p" "$LOG/answers" ;;\n'
              'esac\n',
}


def launch_part() -> str:
    text = GOLDEN.read_text()
    start = text.index("glaunch_watchdog_requests() {")
    return JOBEND.sub("jobend", text[start:]).replace("sleep 300", "exit 0")


def run_loop(tmp_path: Path, answers: list[str], statuses: list[int], **env: str) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in STUBS.items():
        (bin_dir / name).write_text("#!/bin/bash\n" + body)
        (bin_dir / name).chmod(0o755)
    (tmp_path / "answers").write_text("".join(f"{a}\n" for a in answers))
    (tmp_path / "statuses").write_text("".join(f"{s}\n" for s in statuses))
    # What env.sh defines for the script (its rendezvous functions, simplified).
    prelude = ('set -eo pipefail\nglaunch_first_host() { printf "%s\\n" "${1:-n1}" | cut -d, -f1; }\n'
               'glaunch_master_port() { printf "%s\\n" "$((10000 + GLAUNCH_RESTART))"; }\n'
               'export GLAUNCH_RESTART=0 MASTER_ADDR=n1 MASTER_PORT=10000\n')
    return subprocess.run(["bash", "-c", prelude + launch_part()], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", LOG=str(tmp_path),
                                   SLURM_JOB_ID="4242", SLURM_JOB_NODELIST="n[1-3]", **env))


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_a_restart_runs_the_next_step_on_the_nodes_jobend_names(tmp_path):
    proc = run_loop(tmp_path, ["restart n2,n3", "done"], [1, 0])
    assert proc.returncode == 0, proc.stderr
    # Training on the first two nodes of three; then on the second and the spare, as start 1,
    # whose rendezvous host and port are its own.
    assert lines(tmp_path / "steps") == ["n1,n2 0 n1 10000", "n2,n3 1 n2 10001"]
    ends = lines(tmp_path / "ends")
    assert "--status 1" in ends[0] and "--step-nodes n1,n2 --allocation n1,n2,n3" in ends[0]
    assert "--status 0" in ends[1] and "--step-nodes n2,n3 " in ends[1]
    assert lines(tmp_path / "scontrol") == []
    assert "glaunch: start 1: a new step on n2,n3" in proc.stdout


def test_with_no_node_to_spare_the_job_requeues_without_it(tmp_path):
    proc = run_loop(tmp_path, ["restart n2,n3", "requeue n1,n2"], [1, 1])
    assert proc.returncode == 0, proc.stderr
    assert len(lines(tmp_path / "steps")) == 2
    assert lines(tmp_path / "scontrol") == ["requeue 4242", "update JobId=4242 ExcNodeList=n1,n2"]


def test_a_requeued_job_numbers_its_start_past_the_steps_restarted_before(tmp_path):
    proc = run_loop(tmp_path, ["done"], [0], START_NUMBER="3")
    assert proc.returncode == 0, proc.stderr
    assert lines(tmp_path / "steps") == ["n1,n2 3 n1 10003"]


def test_an_answer_that_is_no_node_list_ends_the_loop(tmp_path):
    proc = run_loop(tmp_path, ["restart $(touch PWNED)", "done"], [1, 0])
    assert len(lines(tmp_path / "steps")) == 1 and not list(tmp_path.rglob("PWNED*"))
    assert proc.returncode == 0, proc.stderr


def test_a_start_of_a_run_that_has_ended_runs_nothing_and_exits_0(tmp_path):
    proc = run_loop(tmp_path, ["done"], [0], BEGIN="end")
    assert proc.returncode == 0, proc.stderr
    assert lines(tmp_path / "steps") == [] and lines(tmp_path / "ends") == []
    assert lines(tmp_path / "scontrol") == []      # nothing requeues the job


def test_a_start_that_is_not_the_runs_runs_nothing_and_fails(tmp_path):
    proc = run_loop(tmp_path, ["done"], [0], BEGIN_STATUS="1")
    assert proc.returncode == 1
    assert lines(tmp_path / "steps") == [] and lines(tmp_path / "ends") == [] and lines(tmp_path / "scontrol") == []


def test_the_start_number_comes_from_the_beginning(tmp_path):
    proc = run_loop(tmp_path, ["done"], [0], BEGIN="start 3")
    assert proc.returncode == 0, proc.stderr
    assert lines(tmp_path / "steps") == ["n1,n2 3 n1 10003"]
