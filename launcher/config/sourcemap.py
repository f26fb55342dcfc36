"""Where each configuration value came from: the file and line that set it last, so an
error can point at it.

Loading builds one source map per configuration while it merges the layers (an
experiment's file and the command line's KEY=VALUE overrides; a site profile's `extends`
chain), and the loaded configuration carries it. Checks never see it: they are pure and
raise a `ConfigKeyError` naming the key path only. The boundary that loads or resolves
a configuration wraps them in `locating`, which looks the key up in the map and gives
the error its file and line.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from launcher.errors import ConfigError

# The origin named for KEY=VALUE overrides.
OVERRIDES = "command line"


@dataclass(frozen=True)
class Origin:
    file: str
    line: int | None = None


def parent_key(key: str) -> str:
    """`a.b[2]` -> `a.b` -> `a` -> ``."""
    if key.endswith("]") and "[" in key:
        return key[:key.rindex("[")]
    return key.rpartition(".")[0]


class ConfigKeyError(ConfigError):
    """What a check finds wrong with one key of a configuration, named by its dotted path
    (list items as `key[i]`; '' is the configuration as a whole). `site`: the key is the
    site profile's, for checks that read the experiment and the site together."""

    def __init__(self, key: str, message: str, *, site: bool = False) -> None:
        super().__init__(message, key=key)
        self.site = site


@dataclass
class Provenance:
    """The source map: dotted key (list items as `key[i]`) -> the file (and line) that set
    it last."""

    origins: dict[str, Origin] = field(default_factory=dict)
    default_file: str = "(default)"
    # What an error located in a file adds, if anything: how to change a profile shipped
    # with glaunch without editing the installed package.
    advice: Callable[[str], str | None] | None = None

    def of(self, key: str, *, exact: bool = False) -> Origin:
        """Where `key` was set; unless `exact`, a key no file set is blamed on the nearest
        enclosing key that was (the right place to point an error at)."""
        if exact:
            return self.origins.get(key, Origin(self.default_file))
        probe = key
        while probe:
            if probe in self.origins:
                return self.origins[probe]
            probe = parent_key(probe)
        return Origin(self.default_file)

    def set(self, key: str, origin: Origin) -> None:
        self.origins[key] = origin

    def forget_below(self, key: str) -> None:
        """Drop what is recorded inside `key`: a later layer replaced its value whole."""
        for known in [k for k in self.origins if k.startswith((key + ".", key + "["))]:
            del self.origins[known]

    def locate(self, error: ConfigKeyError) -> ConfigError:
        """`error` with the file and line of its key."""
        origin = self.of(error.key or "")
        advice = self.advice(origin.file) if self.advice is not None else None
        message = f"{error.message}; {advice}" if advice else error.message
        return ConfigError(message, file=origin.file, key=error.key or None, line=origin.line)

    def error(self, key: str, message: str) -> ConfigError:
        """An error about `key`, located."""
        return self.locate(ConfigKeyError(key, message))


@contextmanager
def locating(provenance: Provenance, site: Provenance | None = None) -> Iterator[None]:
    """The load or resolve boundary: a ConfigKeyError raised inside leaves it as a
    ConfigError with the key's file and line, from `site` for a site key where both
    configurations are in play, else from `provenance`."""
    try:
        yield
    except ConfigKeyError as exc:
        where = site if site is not None and exc.site else provenance
        raise where.locate(exc) from None
