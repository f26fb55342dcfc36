"""The project's exceptions. Each maps to one CLI exit code; none is a bug report."""

from __future__ import annotations


# A key is shown whole up to this length: a config may hold a key of any length (`? key`).
MAX_KEY_SHOWN = 200


class GlaunchError(Exception):
    """Base class: a message meant for the user, never a traceback."""

    exit_code = 1

    def __init__(self, message: str, *, file: str | None = None, key: str | None = None,
                 line: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.file = file
        self.key = key
        self.line = line

    def __str__(self) -> str:
        where = ""
        if self.file:
            where = self.file + (f":{self.line}" if self.line else "")
        if self.key:
            key = self.key
            if len(key) > MAX_KEY_SHOWN:
                key = f"{key[:MAX_KEY_SHOWN]}... ({len(key)} characters)"
            where = f"{where}: {key}" if where else key
        return f"{where}: {self.message}" if where else self.message


class ConfigError(GlaunchError):
    """Bad input: YAML, schema, overrides, impossible resources. Exit 2."""

    exit_code = 2


class SchedulerError(GlaunchError):
    """The scheduler refused the job or could not be reached. Exit 3."""

    exit_code = 3


class RunError(GlaunchError):
    """A run finished unsuccessfully, or its records or job cannot be read, written or
    acted on (an unknown run id is a ConfigError). Exit 1."""

    exit_code = 1
