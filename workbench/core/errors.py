"""The one error type users see: a one-line message that names the problem and the fix."""

import re
from collections.abc import Iterable
from typing import Any

# a URL's scheme; one slash too, as a path made of a URL shows it (``sqlite:/user:pw@/tmp``)
_SCHEME = r"\b[A-Za-z][A-Za-z0-9+.-]*:/{1,2}"
# the password of a URL (``scheme://user:PASSWORD@host``): what follows the user's colon
_CREDENTIALS = re.compile(rf"({_SCHEME}[^\s/:@]*:)[^\s/@]*@")
# a URL's user alone, which is often a token (``https://TOKEN@host``)
_USER = re.compile(rf"({_SCHEME})[^\s/:@]+@")
# the value of a query parameter named like a credential (``?token=``, ``&api_key=``,
# ``&X-Amz-Signature=``, ``&password=``)
_QUERY = re.compile(
    r"([?&;][^\s=&#?]*(?:token|key|secret|passw|pwd|sig|auth|credential)[^\s=&#?]*=)[^\s&#;]*",
    re.IGNORECASE,
)
MASK = "***"


def mask_secrets(text: str) -> str:
    """``text`` with every credential of a URL in it replaced by ``***``: a password
    (``postgresql://kd:***@db/optuna``), a user alone (``https://***@host``: often a token)
    and the value of a query parameter named like a credential (``?token=***``), as every
    message, record and log shows it."""
    text = _CREDENTIALS.sub(rf"\g<1>{MASK}@", text)
    text = _USER.sub(rf"\g<1>{MASK}@", text)
    return _QUERY.sub(rf"\g<1>{MASK}", text)


def listed(items: Iterable[Any], shown: int = 3) -> str:
    """``items`` on one line: the first ``shown``, then ``and N more``."""
    items = [str(item) for item in items]
    head = ", ".join(items[:shown])
    return head + (f" and {len(items) - shown} more" if len(items) > shown else "")


class WorkbenchError(Exception):
    """A problem with the user's input or files, reported as one line without a traceback; the
    password of a URL in the message is masked (:func:`mask_secrets`), wherever it is shown."""

    def __init__(self, message: object = "", *args: object) -> None:
        super().__init__(mask_secrets(str(message)), *args)


def first_line(error: BaseException) -> str:
    """The first line of an exception's message (a library's often runs to several)."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def one_line(text: str) -> str:
    """``text`` with each character that would break or rewrite a terminal line (newlines,
    carriage returns, other control and separator characters) written as its escape, so that
    a message quoting what a user gave stays one line."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)
