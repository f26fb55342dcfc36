"""`glaunch sites ...`: find, inspect and check site profiles (a group of launcher.cli)."""

from __future__ import annotations

import json
import sys

import click

from launcher import api
from launcher.errors import ConfigError
from launcher.views.sites_text import format_check, format_site, format_sites, invalid, validated
from launcher.views.text import printable


@click.group()
def sites() -> None:
    """Find, inspect and check site profiles."""


@sites.command("list")
@click.option("--json", "as_json", is_flag=True)
def sites_list(as_json):
    """The profiles found on the search path (first match of a name wins): where each comes
    from and which files of the same name it shadows."""
    found = api.sites()
    data = {key: found[key] for key in ("sites", "search_path", "profiles")}
    click.echo(json.dumps(data, indent=2) if as_json else format_sites(found))


@sites.command("show")
@click.argument("site")
@click.option("--json", "as_json", is_flag=True)
def sites_show(site, as_json):
    """SITE resolved through its extends chain, with the file each value came from."""
    shown = api.sites(site)
    click.echo(json.dumps(shown, indent=2) if as_json else format_site(shown))


@sites.command("validate")
@click.argument("profiles", nargs=-1, required=True)
def sites_validate(profiles):
    """Load and check each profile (name or file); exit 2 if any is bad."""
    bad = 0
    for item in profiles:
        try:
            click.echo(validated(item, api.sites(item)["file"]))
        except ConfigError as exc:
            bad += 1
            click.echo(invalid(item, exc), err=True)
    if bad:
        sys.exit(2)


@sites.command("check")
@click.argument("site")
@click.option("--json", "as_json", is_flag=True)
def sites_check(site, as_json):
    """SITE against the live cluster (scontrol, sacctmgr): every difference in profile terms;
    exit 3 where a job would be refused, never start, or run on other hardware. Also which
    torch the profile's environment gives the nodes, as the login node finds it."""
    report = api.check_site(site)
    click.echo(json.dumps(report.to_json(), indent=2) if as_json else format_check(report))
    if report.fatal:
        sys.exit(3)


@sites.command("detect")
@click.option("--name", help="Profile name (default: Slurm's ClusterName).")
@click.option("-o", "--output", type=click.Path(dir_okay=False),
              help="Where to write it (default: ~/.config/glaunch/sites/NAME.yaml, your own profiles; "
                   "'-' prints it). Never inside the profiles shipped with glaunch.")
@click.option("--login", metavar="[USER@]HOST[:PORT]",
              help="Ask the cluster of this login node over SSH (an ~/.ssh/config alias too); the profile "
                   "then submits through it.")
def sites_detect(name, output, login):
    """Write a profile skeleton from the Slurm cluster this machine submits to (or the one
    --login reaches)."""
    _, text, path = api.detect_site(name, write_to=False if output == "-" else output or True, login=login)
    if path is None:
        click.echo(printable(text, lines=True), nl=False)
        return
    click.echo(printable(f"wrote {path}; check it with: glaunch sites validate {path}"))
