"""The one error type users see: a one-line message that names the problem and the fix."""


class WorkbenchError(Exception):
    """A problem with the user's input or files, reported as one line without a traceback."""
