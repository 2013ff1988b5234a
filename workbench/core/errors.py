"""The one error type users see: a one-line message that names the problem and the fix."""


class WorkbenchError(Exception):
    """A problem with the user's input or files, reported as one line without a traceback."""


def first_line(error: BaseException) -> str:
    """The first line of an exception's message (a library's often runs to several)."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def one_line(text: str) -> str:
    """``text`` with each character that would break or rewrite a terminal line (newlines,
    carriage returns, other control and separator characters) written as its escape, so that
    a message quoting what a user gave stays one line."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)
