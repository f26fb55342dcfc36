"""What `glaunch sites check` finds: each difference between a site profile and the
cluster under the profile's dotted key, fatal or a warning, and how it is said (the
command's text, its JSON, the refusal `submit` raises).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from launcher.config.sites import shipped_profile_advice
from launcher.errors import SchedulerError
from launcher.schedulers.cluster.scontrol_text import one_line

if TYPE_CHECKING:
    from launcher.schedulers.cluster.torchprobe import TorchProbe


@dataclass(frozen=True)
class Difference:
    key: str            # the profile's dotted key (or the experiment's, for a job's request)
    message: str
    fatal: bool
    partition: str | None = None

    def __str__(self) -> str:
        return f"{self.key}: {self.message}"


@dataclass
class CheckReport:
    site: str
    cluster: str
    fatal: list[Difference] = field(default_factory=list)
    warnings: list[Difference] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    torch: TorchProbe | None = None      # which torch the profile's environment gives (sites check)
    slurm_version: str | None = None     # the cluster's release (scontrol's SLURM_VERSION), where known

    def to_json(self) -> dict[str, Any]:
        found: dict[str, Any] = {
            "site": self.site, "cluster": self.cluster, "slurm_version": self.slurm_version, "ok": not self.fatal,
            "fatal": [dataclasses.asdict(d) for d in self.fatal],
            "warnings": [dataclasses.asdict(d) for d in self.warnings], "notes": list(self.notes)}
        if self.torch is not None:
            found["torch"] = self.torch.to_json()
        return found

    def lines(self) -> list[str]:
        """What `glaunch sites check` prints, a line each; what the cluster named (a
        partition, a node, a feature) with its control characters and line breaks escaped."""
        cluster = self.cluster + (f" (Slurm {self.slurm_version})" if self.slurm_version else "")
        if not self.fatal and not self.warnings:
            head = f"site {self.site} matches Slurm cluster {cluster}"
        else:
            head = (f"site {self.site} against Slurm cluster {cluster}: {len(self.fatal)} fatal "
                    f"difference(s), {len(self.warnings)} warning(s)")
        lines = [head]
        lines += [f"  FATAL    {d}" for d in self.fatal]
        lines += [f"  warning  {d}" for d in self.warnings]
        lines += [f"  note     {n}" for n in self.notes]
        if self.torch is not None:
            lines.append(f"  {self.torch.line()}")
        return [one_line(line) for line in lines]

    def format(self) -> str:
        return "\n".join(self.lines())

    def error(self, site_file: str | None = None, site_ref: str | None = None) -> SchedulerError:
        """The refusal `submit` raises: every fatal difference, and what to do (what the
        cluster named escaped, as in :meth:`lines`). `site_ref`: how `glaunch sites check`
        finds the profile (its name, or its file's path where the name finds another or none)."""
        lines = [one_line(f"site {self.site} does not match Slurm cluster {self.cluster}; nothing was submitted:")]
        lines += [one_line(f"  {d}") for d in self.fatal]
        advice = shipped_profile_advice(site_file) if site_file else None
        lines.append(one_line(f"fix the profile (`glaunch sites check {site_ref or self.site}` lists every difference)")
                     + (f"; {advice}" if advice else ""))
        return SchedulerError("\n".join(lines), file=site_file)

