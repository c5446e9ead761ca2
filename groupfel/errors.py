"""Errors a user can act on. The CLI prints their message on one line (no traceback)."""


class InputError(ValueError):
    """Bad input (config, CSV, flag): the message names the field and the fix. Exit code 2."""


class PluginError(InputError):
    """A user's plug-in raised inside its own code: the CLI prints the plug-in's traceback (their
    bug to find), then one line naming the plug-in. Exit code 2."""

    def __init__(self, message: str, trace: str = ""):
        super().__init__(message, trace)
        self.trace = trace

    def __str__(self) -> str:
        return str(self.args[0])


class DivergenceError(RuntimeError):
    """Training produced a non-finite or exploding model; the message names the cause. Exit code 1."""


class InputWarning(UserWarning):
    """Input accepted with an adjustment the user should know about (e.g. device shares normalised).
    The CLI prints it once on one line; a run also records it in each arm's manifest.json."""


class WorkerLostError(RuntimeError):
    """A task kept losing its worker process or node (killed, out of memory); the message says how
    to resume. Exit code 1."""
