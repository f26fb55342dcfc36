"""The clusters' tests never overlap on one cluster: run a small session of stand-in cluster
tests through this suite's own conftest (its xdist groups and its per-cluster lock) under
pytest-xdist, and read back when each test ran and on which worker."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

# Stand-ins for the clusters' tests: marked as the live tests are, each records its interval.
STAND_INS = '''
import json, os, time
import pytest

pytestmark = pytest.mark.slurm


def record(cluster, i):
    started = time.time()
    time.sleep(0.6)
    line = dict(cluster=cluster, i=i, worker=os.environ.get("PYTEST_XDIST_WORKER"), start=started, end=time.time())
    with open(os.environ["TURNS_LOG"], "a") as log:
        log.write(json.dumps(line) + "\\n")


@pytest.mark.parametrize("i", range(3))
def test_on_main(i):
    record("main", i)


@pytest.mark.requires_slurm_defaults
@pytest.mark.parametrize("i", range(3))
def test_on_defaults(i):
    record("defaults", i)
'''

# The suite's conftest as it is, told that both clusters answer and hold no job.
STUB_CLUSTERS = '''
import slurmkit
cluster_answers = lambda cluster: True
slurmkit.wait_queue_drained = lambda cluster, limit_s: None
'''


def run_session(tmp_path: Path, dist: str) -> list[dict]:
    # A pytest of its own with two workers, each importing the suite's conftest: about 15 s
    # of CPU, which a machine busy with the clusters' tests stretches past 4 minutes.
    session = tmp_path / dist
    session.mkdir()
    (session / "conftest.py").write_text((TESTS / "conftest.py").read_text() + STUB_CLUSTERS)
    (session / "test_stand_ins.py").write_text(STAND_INS)
    (session / "locks").mkdir()
    log = session / "turns.jsonl"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
               TURNS_LOG=str(log), GLAUNCH_TEST_TURN_DIR=str(session / "locks"), GLAUNCH_REQUIRE_SLURM="0")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
                           "--dist", dist, "--rootdir", str(session), "-c", os.devnull, str(session)],
                          cwd=session, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return [json.loads(line) for line in log.read_text().splitlines()]


def overlaps(turns: list[dict], cluster: str) -> list[tuple[int, int]]:
    mine = sorted((t for t in turns if t["cluster"] == cluster), key=lambda t: t["start"])
    return [(a["i"], b["i"]) for a, b in zip(mine, mine[1:]) if b["start"] < a["end"]]


@pytest.mark.slow
def test_one_clusters_tests_keep_to_one_worker_one_at_a_time_and_the_two_clusters_run_side_by_side(tmp_path):
    turns = run_session(tmp_path, "loadgroup")
    assert len(turns) == 6
    for cluster in ("main", "defaults"):
        assert len({t["worker"] for t in turns if t["cluster"] == cluster}) == 1, turns
        assert overlaps(turns, cluster) == [], turns
    main_span = (min(t["start"] for t in turns if t["cluster"] == "main"),
                 max(t["end"] for t in turns if t["cluster"] == "main"))
    assert any(main_span[0] < t["start"] < main_span[1] for t in turns if t["cluster"] == "defaults"), turns


@pytest.mark.slow
def test_without_groups_the_cluster_lock_still_keeps_one_clusters_tests_apart(tmp_path):
    turns = run_session(tmp_path, "load")
    assert len(turns) == 6
    assert overlaps(turns, "main") == [] and overlaps(turns, "defaults") == [], turns
