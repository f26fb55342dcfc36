"""Where the submission roads meet, every annotation names the real type: the prepared
run, resume and sweep; the road Protocols; the roads' methods and the lookups behind them.
None is `Any`, or holds it (a tuple, a Callable, an optional of `Any`), so mypy checks what
passes between the pipelines and the roads."""

from __future__ import annotations

import inspect
import os
import typing

import pytest

from launcher.runner import direct, lookup, manage, prepared, remote, remote_sweep, road, submission_road
from launcher.config.sites import LoadedSite
from launcher.resolution.jobplan import JobPlan
from launcher.runner.bundle import PathSource
from launcher.schedulers.slurm.scheduler import SlurmScheduler

# The names the modules import for type checking only (a cost at run time), and `os`,
# which RunRef names in a string ("os.PathLike[str]").
NAMED_ONLY = {"PathSource": PathSource, "SlurmScheduler": SlurmScheduler, "os": os, "JobPlan": JobPlan,
              "LoadedSite": LoadedSite, "PreparedResume": prepared.PreparedResume}

PREPARED = [prepared.Prepared, prepared.PreparedResume, prepared.PreparedSweep]
ROADS = [prepared.Road, prepared.ResumeRoad, direct.Direct, road.OverSSH, submission_road.SubmittedOverSSH]
FUNCTIONS = [remote.check_upstreams, remote._mirror_records, remote_sweep._queued, remote_sweep._put_records,
             lookup.find_sweep]


def holds_any(hint: object) -> bool:
    if hint is typing.Any:
        return True
    parts = hint if isinstance(hint, (list, tuple)) else typing.get_args(hint)    # Callable's parameters: a list
    return any(holds_any(part) for part in parts)


def untyped(obj: typing.Any, *, skip: tuple[str, ...] = ()) -> list[str]:
    """The names of `obj`'s annotations (a class's fields, a function's parameters and
    return) that are or hold `Any`, but for `skip`."""
    hints = typing.get_type_hints(obj, localns=NAMED_ONLY)
    return [name for name, hint in hints.items() if name not in skip and holds_any(hint)]


def methods(cls: type) -> list[typing.Callable[..., object]]:
    return [member for name, member in vars(cls).items() if inspect.isfunction(member) and not name.startswith("__")]


@pytest.mark.parametrize("cls", PREPARED, ids=lambda c: c.__name__)
def test_a_prepared_submission_holds_typed_parts(cls):
    assert untyped(cls) == []
    scheduler = getattr(cls, "scheduler", None)
    if isinstance(scheduler, property):
        assert untyped(scheduler.fget) == []


@pytest.mark.parametrize("cls", ROADS, ids=lambda c: c.__name__)
def test_every_method_of_a_road_is_typed(cls):
    assert methods(cls)
    found = {method.__name__: names for method in methods(cls) if (names := untyped(method))}
    assert found == {}


@pytest.mark.parametrize("function", FUNCTIONS, ids=lambda f: f.__name__)
def test_what_the_roads_hand_each_other_is_typed(function):
    assert untyped(function) == []


def test_a_listing_names_its_sweep_by_a_typed_reference():
    assert untyped(manage.list_runs, skip=("return",)) == []          # its rows are JSON


@pytest.mark.parametrize("hint", [typing.Any, tuple[typing.Any, ...], typing.Optional[typing.Any],
                                  typing.Callable[[typing.Any], int], typing.Mapping[str, tuple[typing.Any, str]]])
def test_the_check_sees_any_wherever_it_stands(hint):
    assert holds_any(hint)
    assert not holds_any(typing.Callable[[int], tuple[str, ...]])
