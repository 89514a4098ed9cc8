"""The CLI's failures, each with the exit code scripts can rely on (listed in ``--help``)."""

from __future__ import annotations

OK = 0
FAILED = 1
USAGE = 2
AUTH = 3
UNREACHABLE = 4
HUB_ERROR = 5
INTERRUPTED = 130

EXIT_CODES_HELP = (
    "Exit codes: 0 ok, 1 operation failed (e.g. a rental that failed, a refused request),"
    " 2 usage or bad input, 3 not logged in or token refused, 4 hub unreachable,"
    " 5 hub error (5xx), 130 interrupted; exec, terminal and ssh: the remote command's own"
    " once it ran."
)


class CliError(Exception):
    """One line for stderr and an exit code; never carries a token."""

    def __init__(self, message: str, code: int = FAILED) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
