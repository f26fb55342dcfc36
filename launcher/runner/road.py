"""How a submission reaches its cluster: Slurm's commands on this machine, or SSH to the
login node a Slurm profile's `login:` names (when Slurm does not answer here). A run,
sweep or resume is resolved the same way on either road; the road gives the environment
its paths are expanded with (the cluster account's home and name over SSH), the plan as
the cluster runs it, and the files as they are shown. A dry run over SSH asks the cluster
nothing: its paths are shown with $HOME and $USER (launcher.runner.remote.shown)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from launcher.config.login import Login, login_of
from launcher.config.sites import LoadedSite
from launcher.resolution.jobplan import JobPlan
from launcher.runner import frameworks


@dataclass(frozen=True)
class Road:
    """`login`: the login node the submission goes through, None on the direct road;
    `conn`: the open connection to it, None for a dry run (and on the direct road)."""

    login: Login | None = None
    conn: Any = None                   # launcher.schedulers.ssh.connection.Connection

    @property
    def over_ssh(self) -> bool:
        return self.login is not None

    @property
    def shown_only(self) -> bool:
        """A dry run over SSH: the cluster's paths are stand-ins, shown as $HOME and $USER."""
        return self.login is not None and self.conn is None

    def environ(self, environ: Mapping[str, str]) -> dict[str, str]:
        """`environ` with HOME, USER and LOGNAME as the cluster's shell has them."""
        if self.login is None:
            return dict(environ)
        from launcher.runner import remote

        if self.conn is None:
            return remote.shown_environ(self.login, environ)
        return remote.cluster_environ(self.conn, environ, submitting=True)

    def plan(self, plan: JobPlan) -> JobPlan:
        """The plan as its cluster runs it: with its entry script's conventions (the
        warning signal, read here before any path becomes the cluster's); over SSH, from
        the code snapshot there."""
        plan = dataclasses.replace(plan, warning_signal=frameworks.warning_signal(plan.submitted_script))
        if self.login is None:
            return plan
        from launcher.runner import remote

        return remote.on_cluster(plan)

    def files(self, files: Mapping[str, str]) -> dict[str, str]:
        """The rendered files as they are written and shown."""
        if not self.shown_only:
            return dict(files)
        from launcher.runner import remote

        return {name: remote.shown(text) for name, text in files.items()}

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


DIRECT = Road()


def road_of(loaded_site: LoadedSite, runs_dir: str | None, *, dry_run: bool) -> Road:
    """The road of a submission to `loaded_site`: over SSH when the profile has `login:`
    and Slurm does not answer here (launcher.runner.remote.goes_remote), connected unless
    `dry_run`."""
    login = login_of(loaded_site.config.login)
    if login is None:
        return DIRECT
    from launcher.runner import remote

    if not remote.goes_remote(login, loaded_site.config.scheduler):
        return DIRECT
    remote.check_runs_root(loaded_site.config.runs_root, runs_dir, str(loaded_site.path))
    return Road(login, None if dry_run else remote.connect(login))
