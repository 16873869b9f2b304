"""Errors a user can fix. The CLI prints these as one line (no traceback) and exits with status 2."""


class UserError(Exception):
    """Bad input: a config field, a path, a model spec, a data file. The message names the fix."""


class ConfigError(UserError):
    """A config field is missing, unknown, of the wrong type or out of range."""


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler stopping the job), raised by the CLI's handler so it stops a run exactly as
    Ctrl-C does: the run is marked interrupted and can be resumed."""
