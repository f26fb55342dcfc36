"""A profile key that needs a newer Slurm: `partitions.P.segment` (sbatch --segment, Slurm
24.11+, placing by topology/block) is rendered where set, and `sites check` (and submit's
check) refuses it on an older release, naming the key and the release it needs (sbatch 22.05
rejects the option), and warns where the cluster's topology is not in blocks. The clusters are
the releases recorded in tests/recorded/slurm-RELEASE/ (tests/schedulers/test_slurm_releases.py)."""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path

import pytest

from launcher.config.load import load_experiment
from launcher.config.sites import load_site
from launcher.errors import ConfigError
from launcher.resolution.jobplan import SubmitContext
from launcher.resolution.resolve import resolve
from launcher.schedulers.cluster.check import compare, site_mapping
from launcher.schedulers.cluster.facts import parse_cluster

REPO = Path(__file__).resolve().parents[2]
RECORDED = REPO / "tests" / "recorded"
ENVIRON = {"HOME": "/home/alice", "USER": "alice"}


def write_site(tmp_path: Path, partition_keys: str) -> Path:
    site = tmp_path / "blocks.yaml"
    site.write_text(f"name: blocks\nextends: local-slurm\npartitions:\n  debug:\n    {partition_keys}\n")
    return site


def plan_for(site: Path, *overrides: str):
    return resolve(load_experiment(REPO / "examples" / "torch_ddp.yaml", list(overrides)),
                   load_site(str(site), REPO, ENVIRON),
                   SubmitContext(cwd="/home/alice/exp", python="/usr/bin/python3", environ=ENVIRON, run_id="seg-1"))


def test_segment_is_rendered_as_sbatch_segment(tmp_path):
    from launcher.schedulers.slurm.script import sbatch_directives

    directives = sbatch_directives(plan_for(write_site(tmp_path, "segment: 2"), "resources.nodes=2"))
    assert "#SBATCH --segment=2" in directives
    assert not any("--segment" in d for d in sbatch_directives(plan_for(REPO / "site_configs" / "local-slurm.yaml",
                                                                        "resources.nodes=2")))


@pytest.mark.parametrize("value", ["0", "-1"])
def test_segment_below_one_is_bad_input(tmp_path, value):
    with pytest.raises(ConfigError, match=r"partitions\.debug\.segment: must be 1 or more"):
        plan_for(write_site(tmp_path, f"segment: {value}"), "resources.nodes=2")


def test_nodes_not_a_multiple_of_the_segment_are_bad_input(tmp_path):
    with pytest.raises(ConfigError) as caught:
        plan_for(write_site(tmp_path, "segment: 2"), "resources.nodes=1")
    assert "resources.nodes" in str(caught.value) and "partitions.debug.segment" in str(caught.value)


def recorded_cluster(release: str, topology: str | None = None):
    text = (RECORDED / f"slurm-{release}" / "scontrol.txt").read_text()
    if topology is not None:
        text = re.sub(r"^(TopologyPlugin\s+=).*$", rf"\1 {topology}", text, flags=re.M)
    return parse_cluster(text, user="root")


def check(tmp_path: Path, cluster):
    site = site_mapping(load_site(str(write_site(tmp_path, "segment: 2")), REPO, os.environ).config)
    return compare(copy.deepcopy(site), cluster)


def test_segment_on_slurm_22_05_is_refused_naming_the_release_it_needs(tmp_path):
    report = check(tmp_path, recorded_cluster("22.05", topology="topology/block"))
    (diff,) = report.fatal
    assert diff.key == "partitions.debug.segment"
    assert "Slurm 24.11 or later" in diff.message and "22.05.8" in diff.message and "--segment" in diff.message


def test_segment_without_topology_block_is_a_warning(tmp_path):
    # sbatch 24.11 takes --segment there (sbatch --test-only accepts it), but nothing is placed by it.
    report = check(tmp_path, recorded_cluster("24.11"))
    assert report.fatal == []
    (diff,) = report.warnings
    assert diff.key == "partitions.debug.segment"
    # 24.11 names its default topology topology/default (22.05: topology/none).
    assert "by topology/block" in diff.message and "TopologyPlugin=topology/default" in diff.message


def test_segment_on_24_11_with_topology_block_is_accepted(tmp_path):
    report = check(tmp_path, recorded_cluster("24.11", topology="topology/block"))
    assert report.fatal == [] and report.warnings == [], report.format()
