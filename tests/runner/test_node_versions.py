"""What the nodes imported against what the run was submitted with: status's warnings
(launcher.runner.node_versions), and the start's versions folded from the files the nodes
wrote (launcher.rundir.startsummary.node_versions), hostile ones included."""

from __future__ import annotations

import json

import pytest

from launcher.rundir.layout import RunDir
from launcher.rundir.records import RunRecord
from launcher.rundir.startsummary import node_versions
from launcher.runner.node_versions import environment_warnings, version_warnings

PLANNED = {"python": "3.11.7", "packages": {"torch": "2.13.0+cpu", "deepspeed": "0.19.8"}}


def record(*starts: dict) -> RunRecord:
    return RunRecord.from_dict({"run_id": "r-1", "state": "COMPLETED", "requeue_max": 3, "crash_retries": 1,
                                "starts": [{"job_id": "7", "restart": i, **s} for i, s in enumerate(starts)],
                                "provenance": PLANNED})


SAME = {"python": "3.11.7", "torch": "2.13.0+cpu", "cuda": "12.8"}


@pytest.mark.parametrize(("nodes", "said"), [
    ({"node1": SAME, "node2": SAME}, []),
    ({"node1": SAME, "node2": {**SAME, "torch": "2.8.0"}},
     ["the nodes import different torch: 2.13.0+cpu on node1; 2.8.0 on node2",
      "the ranks import torch 2.8.0 on node2, not the 2.13.0+cpu the run was submitted with"]),
    ({"node1": {**SAME, "cuda": "12.4"}, "node2": SAME},
     ["the nodes import different cuda: 12.4 on node1; 12.8 on node2"]),
    ({"node1": {**SAME, "python": "3.10.12"}},
     ["the ranks import python 3.10.12 on node1, not the 3.11.7 the run was submitted with"]),
    # DeepSpeed installed where it was submitted but not imported by the script: nothing to say.
    ({"node1": SAME}, []),
])
def test_status_names_each_difference_from_the_submission_and_between_nodes(nodes, said):
    found = version_warnings(record({"state": "COMPLETED", "versions": nodes}))
    assert [w.split(": the nodes' environment")[0] for w in found] == said


def test_the_newest_start_that_recorded_versions_speaks():
    old = {"node1": {**SAME, "torch": "2.1.2"}}
    assert version_warnings(record({"versions": old}, {"versions": {"node1": SAME}})) == []
    assert version_warnings(record({"versions": {"node1": SAME}}, {})) == []
    assert len(version_warnings(record({"versions": {"node1": SAME}}, {"versions": old}))) == 1


def test_versions_files_are_checked_before_they_reach_run_json(tmp_path):
    rd = RunDir(tmp_path)
    rd.telemetry_dir.mkdir()
    files = {0: {"node": "node1", "node_index": 0, "versions": {"torch": "2.13.0", "python": "3.11.7",
                                                              "evil": "x", "cuda": "1" * 200, "nccl": "2.2\n1"}},
             1: {"node": "bad node\n", "versions": {"torch": "9"}},
             2: ["not", "an", "object"]}
    for node, data in files.items():
        rd.versions("7", 0, node).write_text(json.dumps(data))
    (rd.telemetry_dir / "versions_7_0_x.json").write_text(json.dumps(files[0]))
    assert node_versions(rd, "7", 0) == {"node1": {"torch": "2.13.0", "python": "3.11.7"}}


@pytest.mark.parametrize(("found", "said"), [
    ({"python": "3.11.7", "torch": "2.13.0+cpu", "executable": "/x"}, []),
    ({"python": "3.11.7", "torch": "2.8.0+cu128"},
     ["the profile's environment gives torch 2.8.0+cu128, not the 2.13.0+cpu this machine submits with"]),
    ({"python": "3.12.1", "error": "ModuleNotFoundError: No module named 'torch'"},
     ["the profile's environment gives python 3.12.1, not the 3.11.7 this machine submits with",
      "the profile's environment gives no torch, not the 2.13.0+cpu this machine submits with"]),
])
def test_sites_check_names_each_difference_of_the_profiles_environment(found, said):
    """What `sites check` found on the login node against the submitting environment."""
    warnings = environment_warnings({"python": "3.11.7", "torch": "2.13.0+cpu"}, found)
    assert [w.partition(":")[0] for w in warnings] == said
    assert all("decides which one a rank imports" in w for w in warnings)


def test_sites_check_has_nothing_to_compare_with_where_the_submitting_side_has_no_torch():
    assert environment_warnings({"python": "3.11.7"}, {"python": "3.11.7", "torch": "2.8.0"}) == []
