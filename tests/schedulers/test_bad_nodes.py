"""requeue.exclude_bad_nodes decided without a cluster: which node a failed start points
at, whether excluding it leaves the partition enough nodes (from recorded sinfo output),
and what run.json keeps of it."""

from __future__ import annotations

import pytest

from launcher.rundir.records import RecordError, RunRecord
from launcher.jobcontrol.jobend import blamed_node, exclusion, usable_nodes

# sinfo --noheader --Node --format='%N %T' on a partition of six nodes.
SINFO = """\
gpu001 idle
gpu002 mixed
gpu003 allocated
gpu004 drained
gpu005 down*
gpu006 idle*
gpu003 allocated
"""


def test_usable_nodes_from_sinfo():
    assert usable_nodes(SINFO) == ["gpu001", "gpu002", "gpu003"]
    assert usable_nodes("") == []
    assert usable_nodes("gpu[1-2] idle\n$(reboot) idle\nonly-a-name\n") == []


def test_blame_a_crash_on_its_first_failing_task_and_a_hang_on_its_silent_node():
    crash = {"restart": 0, "task": 3, "node": "gpu002", "error": "RuntimeError: x"}
    hang = {"node": "gpu003", "silent": []}
    assert blamed_node("crash", crash, hang) == "gpu002"
    assert blamed_node("hang", crash, hang) == "gpu003"
    assert blamed_node("hang", crash, {"node": None}) is None          # a hang of every rank alike
    assert blamed_node("timeout", crash, hang) is None
    assert blamed_node("crash", {"node": "gpu 002; rm -rf /"}, None) is None


def test_exclusion_while_the_partition_keeps_enough_nodes():
    usable = usable_nodes(SINFO)
    assert exclusion("gpu001", [], needed=2, usable=usable, partition="gpu") == (
        ["gpu001"], "gpu001 excluded from later starts")
    assert exclusion("gpu002", ["gpu001"], needed=1, usable=usable, partition="gpu") == (
        ["gpu001", "gpu002"], "gpu002 excluded from later starts")
    assert exclusion("gpu002", ["gpu001"], needed=2, usable=usable, partition="gpu") == (
        None, "gpu002 not excluded: partition gpu would keep 1 usable node(s), the job needs 2")


def test_no_exclusion_without_a_node_when_known_or_without_the_partitions_nodes():
    assert exclusion(None, ["gpu001"], needed=1, usable=["gpu001", "gpu002"], partition="gpu") == (None, None)
    assert exclusion("gpu001", ["gpu001"], needed=1, usable=["gpu001", "gpu002"], partition="gpu") == (
        None, "gpu001 already excluded")
    assert exclusion("gpu001", [], needed=1, usable=None, partition="gpu", why_unknown="sinfo: not found") == (
        None, "gpu001 not excluded: the partition's nodes are not known (sinfo: not found)")


def test_run_json_keeps_excluded_nodes_and_a_hang_counts_as_a_crash():
    record = RunRecord.from_dict({"run_id": "r", "crash_retries": 2, "excluded_nodes": ["gpu001"], "starts": [
        {"job_id": "5", "restart": 0, "reason": "hang", "bad_node": "gpu001", "exclusion": "gpu001 excluded",
         "hang": {"kind": "stall", "silent": [{"rank": 1, "node": "gpu001"}]}},
        {"job_id": "5", "restart": 1, "reason": "crash", "excluded_nodes": ["gpu001"]},
        {"job_id": "5", "restart": 2, "reason": "timeout"}]})
    assert record.crash_count() == 2 and record.crash_count(before=1) == 1
    # A resumed run's new job starts with the whole crash_retries budget.
    assert record.crash_count(job_id="5") == 2 and record.crash_count(job_id="9") == 0
    out = record.to_dict()
    assert out["excluded_nodes"] == ["gpu001"]
    assert out["starts"][0]["hang"]["kind"] == "stall" and "excluded_nodes" not in out["starts"][0]
    assert "hang" not in out["starts"][2] and "bad_node" not in out["starts"][2]
    assert RunRecord.from_dict(out).to_dict() == out


def test_damaged_node_lists_are_refused_or_dropped():
    with pytest.raises(RecordError, match=r"excluded_nodes: item 0: not a node name"):
        RunRecord.from_dict({"run_id": "r", "excluded_nodes": ["a b"]})
    record = RunRecord.from_dict({"run_id": "r"})
    start = record.record_start("5", 0, excluded_nodes="gpu001", bad_node="x;y", hang=[1])
    assert (start.excluded_nodes, start.bad_node, start.hang) == ([], None, None)
