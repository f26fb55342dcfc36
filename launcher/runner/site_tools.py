"""A site profile against its live cluster (`sites check`), and a profile skeleton read
from a cluster (`sites detect`). Slurm is asked here, or, where Slurm's commands do not
answer here and the profile has `login:` (detect: `--login`), on that login node over one
SSH connection, as the account there (launcher.runner.road)."""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

from launcher.config import sites as profiles
from launcher.config.login import Login, login_of
from launcher.config.schema import NAME_PATTERN
from launcher.config.sites import load_site, user_sites_dir
from launcher.errors import ConfigError
from launcher.runner.node_versions import environment_notes, environment_warnings
from launcher.runner.provenance import package_versions
from launcher.runner.road import slurm_answering
from launcher.schedulers.cluster import torchprobe
from launcher.schedulers.cluster.check import CheckReport
from launcher.schedulers.cluster.check import check_site as check_against_cluster
from launcher.schedulers.cluster.detect import query_cluster
from launcher.schedulers.cluster.facts import read_cluster
from launcher.schedulers.cluster.report import Difference


def check_site(site: str) -> CheckReport:
    """The profile against the live cluster: its fatal differences and warnings, each in
    profile terms, and which torch the profile's environment gives where Slurm's commands
    run (a difference from this machine's is a warning; one it cannot find out, a line
    saying why). ConfigError for a profile of a site that is no Slurm cluster."""
    loaded = load_site(site, Path.cwd(), os.environ, key="SITE")
    if loaded.config.scheduler != "slurm":
        # A local profile describes this machine: a Slurm cluster's partitions say nothing about it.
        origin = loaded.provenance.of("scheduler")
        raise ConfigError(f"site {loaded.config.name!r} runs jobs on this machine (scheduler: "
                          f"{loaded.config.scheduler}): there is no Slurm cluster to check it against",
                          file=origin.file if origin.line else str(loaded.path), line=origin.line, key="scheduler")
    with slurm_answering(login_of(loaded.config.login)) as (client, where):
        report = check_against_cluster(loaded.config, read_cluster(client))
        report.torch = torchprobe.probe(client, loaded.config, sys.executable, where=where)
    if report.torch.problem:
        report.fatal.append(Difference(report.torch.key, report.torch.problem, fatal=True))
    if report.torch.checked:
        planned = {"python": platform.python_version(), **package_versions(("torch",))}
        where = profiles.where_to_change(loaded.path)
        report.warnings += [Difference(report.torch.key, f"{text}; set it {where}", fatal=False)
                            for text in environment_warnings(planned, report.torch.versions)]
        report.notes += environment_notes(planned, report.torch.versions)
    advice = profiles.shipped_profile_advice(loaded.path)
    if advice and (report.fatal or report.warnings):
        report.notes.append(advice)     # the differences are fixed in a copy, not in the installed package
    return report


def detect_site(name: str | None = None, *, write_to: str | os.PathLike | bool = False,
                login: Login | None = None) -> tuple[str, str, Path | None]:
    """(profile name, profile text, the file written) for the Slurm cluster this machine
    submits to, or the one `login` reaches (the profile then names that login, and keeps
    its runs under ~/glaunch-runs there). `write_to`: a file, or True for NAME.yaml in the
    user's own profiles (~/.config/glaunch/sites/); never over a file that exists, never
    into the profiles shipped with glaunch (ConfigError naming --output)."""
    shipped = profiles.SHIPPED_SITES     # read at each call: the folder the search path reads last
    if name is not None and not NAME_PATTERN.fullmatch(name):
        raise ConfigError(f"{name!r}: use letters, digits, '.', '_' and '-'", key="--name")
    folder = user_sites_dir(os.environ) if write_to is True else None
    if write_to is True and folder is None:
        raise ConfigError("HOME is not set, so the folder of your own profiles (~/.config/glaunch/sites) is not "
                          "known: say where to write the profile with -o FILE", key="--output")
    if not isinstance(write_to, bool) and profiles.inside_folder(Path(write_to), shipped):
        raise ConfigError(f"{write_to} is inside the profiles shipped with glaunch ({shipped}), "
                          "which an upgrade replaces: write it to ~/.config/glaunch/sites/, ./site_configs/ of "
                          "your project, or a folder on GLAUNCH_SITE_PATH", key="--output")
    with slurm_answering(login, always=True) as (client, _):
        profile_name, text = query_cluster(client, name, login=login)
    if folder is not None:
        path = folder / f"{profile_name}.yaml"
    elif not isinstance(write_to, bool):
        path = Path(write_to)
    else:
        return profile_name, text, None
    if path.exists():
        raise ConfigError(f"{path} already exists; choose another --output or --name", key="--output")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc.strerror or exc}", key="--output") from None
    return profile_name, text, path
