"""How a submission reaches its cluster: Slurm's commands on this machine (the direct road,
launcher.runner.direct), or SSH to the login node a Slurm profile's `login:` names, when
Slurm does not answer here (`road_of`). A run, sweep or resume is resolved the same way on
either road; the road gives the environment its paths are expanded with (the cluster
account's home and name over SSH), the plan as the cluster runs it, and the files as they
are shown, then launches it (over SSH: launcher.runner.remote and remote_sweep). A dry run
over SSH asks the cluster nothing: its paths are shown with $HOME and $USER
(launcher.runner.remote.shown)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Callable, Sequence, TypeAlias

from launcher.config.login import Login
from launcher.config.sites import LoadedSite
from launcher.errors import ConfigError
from launcher.resolution.jobplan import JobPlan
from launcher.resolution.resolve import transport_of
from launcher.runner.direct import DIRECT, Direct, with_conventions
from launcher.runner.prepared import Prepared, PreparedSweep
from launcher.runner.results import Run, Sweep
from launcher.runner.road import OverSSH
from launcher.runner.upstream import Upstream


@dataclasses.dataclass(frozen=True)
class SubmittedOverSSH(OverSSH):
    """The SSH road of a submission: through `login`, over `conn` (None for a dry run)."""

    @property
    def shown_only(self) -> bool:
        """A dry run: the cluster's paths are stand-ins, shown as $HOME and $USER."""
        return self.conn is None

    def environ(self, environ: Mapping[str, str]) -> dict[str, str]:
        """`environ` with HOME, USER and LOGNAME as the cluster's shell has them."""
        from launcher.runner import remote

        if self.conn is None:
            return remote.shown_environ(self._login(), environ)
        return remote.cluster_environ(self.conn, environ, submitting=True)

    def plan(self, plan: JobPlan) -> JobPlan:
        """The plan as its cluster runs it: with its entry script's conventions (the
        warning signal, read here before any path becomes the cluster's), from the code
        snapshot there."""
        from launcher.runner import remote

        return remote.on_cluster(with_conventions(plan))

    def files(self, files: Mapping[str, str]) -> dict[str, str]:
        """The rendered files as they are written and shown."""
        if not self.shown_only:
            return dict(files)
        from launcher.runner import remote

        return {name: remote.shown(text) for name, text in files.items()}

    def check_upstreams(self, upstreams: Sequence[Upstream]) -> None:
        """The runs waited for (--after) must be queued through the same login."""
        from launcher.runner import remote

        remote.check_upstreams(upstreams, self._login())

    def python_warning(self, loaded_site: LoadedSite, plan: JobPlan) -> str | None:
        from launcher.runner import remote

        return remote.python_warning(loaded_site, plan)

    def launch(self, prepared: Prepared, *, dry_run: bool, check: bool, here: Callable[[Prepared], Run]) -> Run:
        """Sent and queued over the connection; a dry run's bundle written into this
        machine's record folder (the cluster is not contacted)."""
        from launcher.runner import remote

        if self.conn is not None:
            if dry_run:
                self.close()
                raise ConfigError("a run prepared for submission over SSH is sent, not rendered here: prepare it "
                                  "with dry_run=True", file="command line", key="--dry-run")
            return remote.launch(prepared, self.conn, check=check)
        if not dry_run:
            raise ConfigError("a run prepared with dry_run=True over SSH is rendered, not sent: prepare it "
                              "again to submit it", file="command line", key="--dry-run")
        return remote.dry_run(prepared, login=self._login())

    def launch_sweep(self, prepared: PreparedSweep, *, dry_run: bool, check: bool,
                     here: Callable[[PreparedSweep, PreparedSweep], Sweep]) -> Sweep:
        """Sent and queued over the connection; a dry run written by `here` into this
        machine's record folder (the cluster is not contacted)."""
        from launcher.runner import remote_sweep

        if self.conn is not None:
            if not dry_run:
                return remote_sweep.launch(prepared, self.conn, check=check)
            self.close()
        if not dry_run:
            raise ConfigError("a sweep prepared with dry_run=True over SSH is rendered, not sent: prepare it again "
                              "to submit it", file="command line", key="--dry-run")
        return here(prepared, remote_sweep.rendered_here(prepared))

    def _login(self) -> Login:
        if self.login is None:
            raise ConfigError("a submission over SSH names the login node it goes through", key="login")
        return self.login


SubmissionRoad: TypeAlias = "Direct | SubmittedOverSSH"


def road_of(loaded_site: LoadedSite, runs_dir: str | None, *, dry_run: bool) -> SubmissionRoad:
    """The road of a submission to `loaded_site`: over SSH when the profile has `login:`
    and Slurm does not answer here (launcher.runner.remote.goes_remote), connected unless
    `dry_run`. Chosen before resolution, from the transport the plan will hold: the road
    gives the environment the plan's paths are expanded with."""
    login = transport_of(loaded_site.config).login
    if login is None:
        return DIRECT
    from launcher.runner import remote

    if not remote.goes_remote(login, loaded_site.config.scheduler):
        return DIRECT
    remote.check_runs_root(loaded_site.config.runs_root, runs_dir, str(loaded_site.path))
    return SubmittedOverSSH(login, None if dry_run else remote.connect(login))


