"""`glaunch sites ...`: find, inspect and check site profiles (a group of launcher.cli)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from launcher import api
from launcher.errors import ConfigError


@click.group()
def sites() -> None:
    """Find, inspect and check site profiles."""


@sites.command("list")
@click.option("--json", "as_json", is_flag=True)
def sites_list(as_json):
    """The profiles found on the search path (first match of a name wins)."""
    seen, shadowed = api.sites()
    lines = [f"{name:28s} {path}" for name, path in sorted(seen.items())]
    lines += [f"{name:28s} {path} (shadowed)" for name, path in shadowed]
    click.echo(json.dumps({"sites": seen}, indent=2) if as_json else "\n".join(lines) or "no site profiles found")


@sites.command("show")
@click.argument("site")
@click.option("--json", "as_json", is_flag=True)
def sites_show(site, as_json):
    """SITE resolved through its extends chain, with the file each value came from."""
    from launcher.views.status_text import printable

    shown = api.site_values(site)
    if as_json:
        click.echo(json.dumps(shown, indent=2))
        return
    click.echo(f"site {shown['site']}: {shown['file']}")
    click.echo("extends chain: " + " -> ".join(shown["chain"]))
    rows = shown["values"]
    width = max(len(r["key"]) for r in rows)
    for r in rows:
        click.echo(printable(f"  {r['key']:{width}s} = {json.dumps(r['value'])}    # {r['from']}"))


@sites.command("validate")
@click.argument("profiles", nargs=-1, required=True)
def sites_validate(profiles):
    """Load and check each profile (name or file); exit 2 if any is bad."""
    from launcher.views.status_text import printable

    bad = 0
    for item in profiles:
        try:
            path = api.validate_site(item)
            click.echo(f"ok    {printable(item)} ({printable(path)})")
        except ConfigError as exc:
            bad += 1
            click.echo(f"error {printable(item)}: {printable(exc, lines=True)}", err=True)
    if bad:
        sys.exit(2)


@sites.command("check")
@click.argument("site")
@click.option("--json", "as_json", is_flag=True)
def sites_check(site, as_json):
    """SITE against the live cluster (scontrol, sacctmgr): every difference in profile terms;
    exit 3 where a job would be refused, never start, or run on other hardware."""
    report = api.check_site(site)
    click.echo(json.dumps(report.to_json(), indent=2) if as_json else report.format())
    if report.fatal:
        sys.exit(3)


@sites.command("detect")
@click.option("--name", help="Profile name (default: Slurm's ClusterName).")
@click.option("-o", "--output", type=click.Path(dir_okay=False),
              help="Where to write it (default: ./site_configs/NAME.yaml; '-' prints it).")
def sites_detect(name, output):
    """Write a profile skeleton from the Slurm cluster this machine submits to."""
    profile_name, text = api.detect_site(name)
    if output == "-":
        click.echo(text, nl=False)
        return
    path = Path(output) if output else Path("site_configs") / f"{profile_name}.yaml"
    if path.exists():
        raise ConfigError(f"{path} already exists; choose another --output or --name", key="--output")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc.strerror or exc}", key="--output") from None
    click.echo(f"wrote {path}; check it with: glaunch sites validate {path}")
