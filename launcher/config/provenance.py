"""Where each configuration value came from: the file and line that set it last, so an
error can point at it."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import ConfigError

# The origin named for KEY=VALUE overrides.
OVERRIDES = "command line"


@dataclass(frozen=True)
class Origin:
    file: str
    line: int | None = None


@dataclass
class Provenance:
    """Dotted key -> the file (and line) that set it last."""

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
            probe = probe.rpartition(".")[0]
        return Origin(self.default_file)

    def error(self, key: str, message: str) -> ConfigError:
        origin = self.of(key)
        return ConfigError(message, file=origin.file, key=key, line=origin.line)
