import contextlib
import functools
import os
import time
from pathlib import Path

import pytest

from slurmkit import DEFAULTS, MAIN, cluster_env, cluster_turn, slurm_up

REPO = Path(__file__).resolve().parent.parent

# Slurm's commands, run here or by glaunch in a subprocess, reach the local cluster `main`
# through SLURM_CONF whatever the host's /etc/slurm holds; `slurm_defaults_env` switches a
# test to the second cluster.
os.environ.update(cluster_env(MAIN))
# Tests give each run an empty HOME; DeepSpeed's CPU ops are compiled once per machine, not
# once per test, when their build cache stays where it is.
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "torch_extensions"))

# scripts/test sets it once the clusters are up: their tests must run, never skip.
REQUIRE_SLURM = os.environ.get("GLAUNCH_REQUIRE_SLURM") == "1"


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true",
                     help="rewrite tests/golden/* from the current renderer instead of comparing")


@pytest.fixture
def update_golden(request):
    return request.config.getoption("--update-golden") or os.environ.get("GLAUNCH_UPDATE_GOLDEN") == "1"


@pytest.fixture
def isolated_env(tmp_path, monkeypatch):
    """HOME and the run index in tmp, so tests never touch the real ones."""
    env = dict(os.environ, HOME=str(tmp_path / "home"), GLAUNCH_STATE_DIR=str(tmp_path / "state"))
    (tmp_path / "home").mkdir()
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


# What makes a process a rank of a distributed job: a test of one process's runtime unsets it.
RANK_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
             "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture
def single_rank_env(monkeypatch, tmp_path):
    """This process as the only rank of a run in tmp: no rank or GLAUNCH_* variables from
    outside, the run and checkpoint directories under tmp_path."""
    for k in list(os.environ):
        if k in RANK_VARS or k.startswith("GLAUNCH_"):
            monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("GLAUNCH_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("GLAUNCH_CHECKPOINT_DIR", str(tmp_path / "ckpt"))


# A test that needs a local cluster says which: requires_slurm (`main`), requires_slurm_defaults
# or the slurm_defaults_env fixture (`defaults`); a `slurm` test that names neither needs
# `main`. The clusters are asked only when such a test is about to run: a session of other
# tests never waits on a controller that does not answer (sinfo takes ~20 s to give up).
requires_slurm = pytest.mark.requires_slurm
requires_slurm_defaults = pytest.mark.requires_slurm_defaults

NOT_UP = {MAIN: "local Slurm cluster is not up (scripts/local-slurm up)",
          DEFAULTS: "the second local Slurm cluster is not up (scripts/local-slurm up defaults)"}


def pytest_configure(config):
    config.addinivalue_line("markers", "requires_slurm: skips unless the local cluster `main` answers "
                                       "(fails instead under GLAUNCH_REQUIRE_SLURM=1)")
    config.addinivalue_line("markers", "requires_slurm_defaults: skips unless the local cluster `defaults` "
                                       "answers (fails instead under GLAUNCH_REQUIRE_SLURM=1)")


def clusters_needed(item) -> list[str]:
    needed = []
    if item.get_closest_marker("requires_slurm"):
        needed.append(MAIN)
    if on_defaults(item):
        needed.append(DEFAULTS)
    if not needed and item.get_closest_marker("slurm"):
        needed.append(MAIN)
    return needed


def on_defaults(item) -> bool:
    return bool(item.get_closest_marker("requires_slurm_defaults")) or "slurm_defaults_env" in item.fixturenames


def clusters_held(item) -> list[str]:
    """The clusters a test holds from its setup to its end: those it needs, but for `main`
    where the test runs on `defaults` and only its module says requires_slurm (a module of
    both clusters' tests; the test itself sends nothing to `main`). Held, `main` would keep
    such a test waiting behind every `main` test of the other worker. A test that is not a
    `slurm` test (it runs with the tests that need no cluster) holds none: it asks a cluster
    without taking its nodes (sbatch --test-only queues nothing), and holding it would keep
    its worker, with every test queued behind it, waiting out the clusters' whole stage."""
    if not item.get_closest_marker("slurm"):
        return []
    needed = clusters_needed(item)
    own = {marker.name for marker in item.own_markers}
    if on_defaults(item) and MAIN in needed and "requires_slurm" not in own:
        needed.remove(MAIN)
    return needed


# Each cluster's tests run one by one (each job takes both of its nodes, and preemption
# tests would preempt another test's job), but the two clusters' tests may run side by
# side: under `pytest -n 2 --dist loadgroup` each group keeps to one worker. A test that
# needs `defaults` goes with its tests (its jobs run there), and so do the script tests,
# which restart `defaults`.
def cluster_group(item) -> str:
    if DEFAULTS in clusters_needed(item) or item.module.__name__.endswith("test_local_slurm_script"):
        return "slurm-defaults"
    return "slurm-main"


@pytest.hookimpl(tryfirst=True)          # before xdist's loadgroup reads the groups
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("slurm"):
            item.add_marker(pytest.mark.xdist_group(cluster_group(item)))


@pytest.fixture(autouse=True)
def one_test_per_cluster(request):
    """A test that uses a cluster holds it (slurmkit.cluster_turn) from its setup to its end,
    the clusters in one order so two tests that each need both never wait on each other."""
    with contextlib.ExitStack() as held:
        for cluster in sorted(clusters_held(request.node)):
            held.enter_context(cluster_turn(cluster, request.node.nodeid))
        yield


@functools.cache
def cluster_answers(cluster: str) -> bool:
    """Whether the cluster answers, asked once per session (per xdist worker). Under
    GLAUNCH_REQUIRE_SLURM=1 a no fails every test of that cluster, so it is asked again
    before it stands: a controller busy for a moment is not a cluster that is down."""
    for attempt in range(3 if REQUIRE_SLURM else 1):
        if attempt:
            time.sleep(5)
        if slurm_up(cluster):
            return True
    return False


def need_cluster(cluster: str) -> None:
    """Skip the test when the cluster does not answer; fail it under GLAUNCH_REQUIRE_SLURM=1."""
    if not cluster_answers(cluster):
        if REQUIRE_SLURM:
            pytest.fail(f"{NOT_UP[cluster]}, and GLAUNCH_REQUIRE_SLURM=1 requires it", pytrace=False)
        pytest.skip(NOT_UP[cluster])


# A test marked requires_sshd logs in to the login node of scripts/local-sshd as its laptop
# user (runuser: root only); it skips when that cannot be done here, fails instead under
# GLAUNCH_REQUIRE_SSHD=1 (scripts/test sets it once the login node is up).
REQUIRE_SSHD = os.environ.get("GLAUNCH_REQUIRE_SSHD") == "1"


@functools.cache
def local_sshd() -> tuple[dict, str | None]:
    """(scripts/local-sshd env's GLAUNCH_SSHD_* settings, why its login node cannot be used
    from this process, or None when it can). Asked once per session (per xdist worker)."""
    import pwd
    import shlex
    import socket
    import subprocess

    try:
        out = subprocess.run([str(REPO / "scripts" / "local-sshd"), "env"], capture_output=True, text=True,
                             timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return {}, f"scripts/local-sshd env failed: {exc}"
    settings = dict(word.split("=", 1) for line in out.splitlines() for word in shlex.split(line)[1:2])
    if os.geteuid() != 0:
        return settings, "the local login node's tests run ssh as its laptop user: they need root"
    try:
        pwd.getpwnam(settings["GLAUNCH_SSHD_LAPTOP_USER"])
        with socket.create_connection(("127.0.0.1", int(settings["GLAUNCH_SSHD_PORT"])), timeout=5) as sock:
            sock.settimeout(5)
            if not sock.recv(64).startswith(b"SSH-"):
                raise OSError("no SSH banner")
    except (KeyError, OSError) as exc:
        return settings, f"the local login node is not up (scripts/local-sshd up): {exc}"
    return settings, None


def need_sshd() -> None:
    reason = local_sshd()[1]
    if reason:
        if REQUIRE_SSHD:
            pytest.fail(f"{reason}, and GLAUNCH_REQUIRE_SSHD=1 requires it", pytrace=False)
        pytest.skip(reason)


@pytest.fixture
def local_sshd_env():
    """scripts/local-sshd's settings (GLAUNCH_SSHD_PORT, _ALIAS, _USER, _LAPTOP_USER), once
    its login node answers."""
    need_sshd()
    return local_sshd()[0]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    for cluster in clusters_needed(item):
        need_cluster(cluster)
    if item.get_closest_marker("requires_sshd"):
        need_sshd()


@pytest.fixture
def slurm_defaults_env(isolated_env, monkeypatch):
    """isolated_env pointed at the second cluster (`defaults`, site local-slurm-defaults):
    SLURM_CONF in the returned environment and in os.environ, so glaunch subprocesses,
    slurmkit's helpers and in-process api calls all reach it. Skips when that cluster is
    not up, fails instead under GLAUNCH_REQUIRE_SLURM=1."""
    need_cluster(DEFAULTS)
    variables = cluster_env(DEFAULTS)
    for key, value in variables.items():
        monkeypatch.setenv(key, value)
    return dict(isolated_env, **variables)


# A Slurm site profile and an experiment that is valid on it: the bad-input tests each break one thing.
MYSITE_PROFILE = """\
name: mysite
scheduler: slurm
default_partition: gpu
partitions:
  gpu: {gpus_per_node: 4, gpu_mem_gb: 80, cpus_per_node: 32, mem_gb: 256, max_nodes: 8, max_time: "1-00:00:00"}
  cpu: {gpus_per_node: 0, max_nodes: 4}
"""
# requeue.max: 0 -- no checkpoint warning: stderr is empty unless something is wrong.
GOOD_EXPERIMENT = """\
name: good
entrypoint: {script: train.py}
resources: {nodes: 2, time: "01:00:00"}
requeue: {max: 0}
"""


@pytest.fixture
def mysite_workdir(tmp_path, monkeypatch, isolated_env):
    """The working directory: site_configs/mysite.yaml, train.py and exp.yaml (GOOD_EXPERIMENT)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "site_configs").mkdir()
    (tmp_path / "site_configs" / "mysite.yaml").write_text(MYSITE_PROFILE)
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "exp.yaml").write_text(GOOD_EXPERIMENT)
    return tmp_path


@pytest.fixture(scope="module")
def ds_estimators():
    """DeepSpeed's own estimator functions (CPU accelerator: no GPU here)."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs
    return estimate_zero2_model_states_mem_needs, estimate_zero3_model_states_mem_needs


@pytest.fixture
def laptop(tmp_path, isolated_env, local_sshd_env):
    """The environment of glaunch on a laptop: PATH without Slurm's commands (its ssh runs
    with the laptop user's ssh config, key and known hosts), no SLURM_CONF."""
    home = Path("/home") / local_sshd_env["GLAUNCH_SSHD_LAPTOP_USER"] / ".ssh"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # The link to the login node drops while CUT exists: ssh fails as on a dropped connection.
    cut = tmp_path / "cut"
    (bin_dir / "ssh").write_text(f"#!/bin/sh\nif [ -e {cut} ]; then echo 'Connection closed by 127.0.0.1 port 2222' >&2; "
                                 f"exit 255; fi\nexec /usr/bin/ssh -F {home}/config -i {home}/id_ed25519 "
                                 f"-o UserKnownHostsFile={home}/known_hosts \"$@\"\n")
    (bin_dir / "ssh").chmod(0o755)
    for tool in ("git", "tar"):
        (bin_dir / tool).symlink_to(f"/usr/bin/{tool}")
    env = {k: v for k, v in isolated_env.items() if not k.startswith(("SLURM_", "SBATCH_"))}
    env.update(PATH=str(bin_dir), PYTHONPATH=str(REPO), GLAUNCH_TEST_CUT=str(cut))
    return env
