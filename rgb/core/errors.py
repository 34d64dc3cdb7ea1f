"""The one error contract: a `UserError` is a problem the user can fix (bad input, a missing file, a refused
result), shown by the commands as one line, never as a traceback. Every error class a user can cause derives from
it (keeping the built-in base code catches it by, such as ValueError), so the commands catch this one class.
"""

from __future__ import annotations


def one_line(message) -> str:
    """The message with its whitespace (newlines included) folded into single spaces."""
    return " ".join(str(message).split())


class UserError(Exception):
    """An error the user can fix; its text is always one line."""

    def __str__(self) -> str:
        return one_line(super().__str__())


__all__ = ["UserError", "one_line"]
