"""The experiment's ``hparams:`` inside the training script.

The launcher writes them to ``hparams.json`` in the run directory and names that file in
``GLAUNCH_HPARAMS``; :func:`read_hparams` reads it (an empty mapping in a run by hand, without
the variable). :func:`apply_hparams` makes them the defaults of an argparse parser's options
of the same name, so ``--sweep hparams.lr=1e-3,3e-3`` reaches ``--lr`` while an option
given on the command line (the experiment's ``entrypoint.args``) still wins::

    p = argparse.ArgumentParser()
    p.add_argument("--lr", type=float, default=1e-2)
    rt.apply_hparams(p)                  # hparams.lr, when there is one, is --lr's default
    args = p.parse_args()

A name matches an option's destination with ``-`` read as ``_`` (``seconds_per_step`` or
``seconds-per-step`` -> ``--seconds-per-step``). argparse converts a text default with the
option's ``type``, as if it had been typed. Rank 0's log lists what was taken and every
hparam that matches no option, which the script then never sees.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from launcher.rundir import envnames
from launcher.rundir.files import load_json_object
from launcher.rundir.rankcontext import RankContext, RuntimeConfigError, context, log


def read_hparams() -> dict[str, Any]:
    """The experiment's hparams (GLAUNCH_HPARAMS, the run's hparams.json); {} without the variable."""
    path = os.environ.get(envnames.HPARAMS, "")
    if not path:
        return {}
    try:
        return load_json_object(path)
    except (OSError, ValueError) as exc:
        why = (exc.strerror if isinstance(exc, OSError) else None) or str(exc)
        raise RuntimeConfigError(f"{envnames.HPARAMS}={path!r}: {why}") from None


def apply_hparams(parser: argparse.ArgumentParser, values: dict[str, Any] | None = None,
                  ctx: RankContext | None = None) -> dict[str, Any]:
    """Set `values` (default: :func:`read_hparams`) as the defaults of `parser`'s options of the
    same name; returns those taken, by destination. Rank 0 logs them and the names that
    match no option."""
    values = read_hparams() if values is None else values
    dests = {action.dest for action in parser._actions if action.dest != argparse.SUPPRESS}
    taken = {name.replace("-", "_"): value for name, value in values.items() if name.replace("-", "_") in dests}
    unused = sorted(name for name in values if name.replace("-", "_") not in dests)
    parser.set_defaults(**taken)
    if (ctx or context()).is_main and (taken or unused):
        said = [f"{name}={value!r}" for name, value in taken.items()]
        if said:
            log(f"hparams as option defaults: {', '.join(said)}")
        if unused:
            log(f"hparams that match no option of {parser.prog}, unused: {', '.join(unused)}")
    return taken
