"""Where each configuration value came from: the file and line that set it last, so an
error can point at it."""

from __future__ import annotations

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


@dataclass
class Provenance:
    """Dotted key (list items as `key[i]`) -> the file (and line) that set it last."""

    origins: dict[str, Origin] = field(default_factory=dict)
    default_file: str = "(default)"

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

    def error(self, key: str, message: str) -> ConfigError:
        origin = self.of(key)
        return ConfigError(message, file=origin.file, key=key, line=origin.line)
