"""The one error type users see: a one-line message that names the problem and the fix."""


class WorkbenchError(Exception):
    """A problem with the user's input or files, reported as one line without a traceback."""


def first_line(error: BaseException) -> str:
    """The first line of an exception's message (a library's often runs to several)."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0]
