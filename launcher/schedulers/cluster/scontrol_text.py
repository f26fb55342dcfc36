"""What scontrol prints, read as text: the one-line records of `show partition/node -o`,
the `Key = value` lines of `show config`, GRES strings and host lists; and the one call
that asks for all of them. Pure, but for :func:`read_scontrol`.
"""

from __future__ import annotations

import re

from launcher.errors import SchedulerError
from launcher.schedulers.slurm.client import Client

# One scontrol process reads partitions, nodes and the configuration (its commands on
# stdin); -a includes hidden partitions, which a profile may well name.
SCONTROL_COMMANDS = "show partition\nshow node\nshow config\n"

# Gres=gpu:a100:4(S:0-1),gpu:h100:2  ->  ("a100", 4), ("h100", 2)
_GRES_GPU = re.compile(r"(?:^|,)gpu(?::(?P<type>[^:,(]+))?:(?P<count>\d+)")
_FIELD = re.compile(r"(\w+)=(\S*)")


def said(name: object) -> str:
    """A name from the cluster as a profile's comment or a terminal line can hold it: as it
    is when every character is printable, else quoted with control and invisible ones
    escaped (an escape sequence in a partition's name must not reach the terminal)."""
    text = str(name)
    return text if text.isprintable() else repr(text)


def one_line(text: str) -> str:
    """`text` with every character that is not printable (line breaks included) escaped."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def parse_records(text: str) -> list[dict[str, str]]:
    """One dict per line of `scontrol show ... -o` (KEY=VALUE words; values have no spaces,
    except OS=..., Reason=... and Comment=..., which are cut short harmlessly). A key's
    first occurrence wins: free text such as a drain Reason may hold `Gres=...` words."""
    records = []
    for line in text.splitlines():
        fields: dict[str, str] = {}
        for key, value in _FIELD.findall(line):
            fields.setdefault(key, value)
        if fields:
            records.append(fields)
    return records


def gpu_kinds(gres: str) -> dict[str | None, int]:
    """GPUs per type (None: untyped) in a node's Gres string; MIG slices count as GPUs."""
    kinds: dict[str | None, int] = {}
    for m in _GRES_GPU.finditer(gres or ""):
        kinds[m["type"]] = kinds.get(m["type"], 0) + int(m["count"])
    return kinds


def split_scontrol(text: str) -> tuple[str, str, dict[str, str]]:
    """scontrol's answer to SCONTROL_COMMANDS -> (partition records' text, node records'
    text, configuration settings). Records are told apart by their first key; the
    configuration is its `Key = value` lines."""
    parts, nodes = [], []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("PartitionName="):
            parts.append(stripped)
        elif stripped.startswith("NodeName="):
            nodes.append(stripped)
    return "\n".join(parts), "\n".join(nodes), parse_config(text)


def parse_config(text: str) -> dict[str, str]:
    """`scontrol show config` -> {setting: value}; SlurmctldHost[0] keeps its index."""
    return dict(re.findall(r"^([\w\[\]]+?)\s+=\s?(.*?)\s*$", text, re.M))


# The one scontrol call of read_scontrol, reading SCONTROL_COMMANDS on its stdin.
SCONTROL_CALL = ("scontrol", "-a", "-o")


def read_scontrol(client: Client, command: str) -> str:
    """scontrol's answer to SCONTROL_COMMANDS (through `client`): one call for partitions,
    nodes and settings."""
    if not client.has_command("scontrol"):
        raise SchedulerError(f"scontrol is not on PATH: run `{command}` on a Slurm login node")
    proc = client.call(*SCONTROL_CALL, input=SCONTROL_COMMANDS)
    if "PartitionName=" not in proc.stdout or "ClusterName" not in proc.stdout:
        said = (proc.stderr or proc.stdout).strip()
        raise SchedulerError(f"scontrol gave no partitions or no configuration: {said[:500]}")
    return proc.stdout


def expand_hostlist(text: str) -> list[str]:
    """Slurm's host list -> the names: `gpu[001-016,020],login1` -> gpu001 ... gpu016,
    gpu020, login1 (zero padding kept; several bracket groups in one name multiply)."""
    names: list[str] = []
    for item in re.findall(r"(?:[^,\[]|\[[^\]]*\])+", text or ""):
        expanded = [""]
        for literal, ranges in re.findall(r"([^\[]*)(?:\[([^\]]*)\])?", item):
            numbers = []
            for span in (ranges.split(",") if ranges else []):
                lo, _, hi = span.partition("-")
                if lo.isdigit() and (hi or lo).isdigit():
                    numbers += [f"{i:0{len(lo)}d}" for i in range(int(lo), int(hi or lo) + 1)]
            expanded = [e + literal + n for e in expanded for n in (numbers or [""])]
        names += [e for e in expanded if e]
    return names
