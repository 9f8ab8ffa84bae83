"""One error type for user mistakes, and the exit codes every command shares."""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAIL = 1  # a gate failed, or the user made a mistake (DlciError)
EXIT_USAGE = 2  # argparse's own code for a malformed command line
EXIT_INTERNAL = 3  # a bug in dl-ci: the traceback goes to a log file
EXIT_INTERRUPTED = 130  # Ctrl-C, as shells report SIGINT
SHOWN = 20  # mistakes printed for one file that has more; the rest are counted


class DlciError(Exception):
    """A user mistake: bad input, a missing file, an impossible request.

    The message names what is wrong and where (the file, line and key path, or the
    argument); the hint says how to fix it.

    >>> print(DlciError("budgets.pr.t4.max_loss: must be greater than 0, got -1",
    ...                 file="ladder.yaml", line=14, hint="use a loss such as 1.0"))
    ladder.yaml:14: budgets.pr.t4.max_loss: must be greater than 0, got -1
      hint: use a loss such as 1.0
    """

    def __init__(
        self,
        message: str,
        *,
        hint: str | None = None,
        file: str | None = None,
        line: int | None = None,
        exit_code: int = EXIT_FAIL,
    ) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.message = message
        self.hint = hint
        self.file = file
        self.line = line

    @property
    def location(self) -> str:
        """``file:line`` where known, else the file, else an empty string."""
        if self.file and self.line:
            return f"{self.file}:{self.line}"
        return self.file or ""

    def every(self) -> tuple[DlciError, ...]:
        """Each mistake this error stands for: itself (a file's several: dlci.schema.Problems)."""
        return (self,)

    def __str__(self) -> str:
        text = f"{self.location}: {self.message}" if self.location else self.message
        if self.hint:
            text += f"\n  hint: {self.hint}"
        return text
