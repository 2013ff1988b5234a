"""The Hugging Face Hub, asked only when it answers.

Without a network the libraries retry for about a minute before they give up; here one short
request tells first whether the hub answers. When it does not, or when ``HF_HUB_OFFLINE`` is set,
models come from the local cache only and a miss is one line saying how to use a local copy.
"""

from __future__ import annotations

import functools
import os

from workbench.core.errors import WorkbenchError

CHECK_SECONDS = 3.0
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")


def hub_offline() -> bool:
    """Whether offline mode is on: read from the environment now, not only when the libraries
    were imported."""
    from huggingface_hub import is_offline_mode

    return is_offline_mode() or any(
        os.environ.get(name, "").upper() in ("1", "ON", "YES", "TRUE") for name in OFFLINE_VARIABLES
    )


@functools.cache
def _endpoint_answers() -> bool:
    from huggingface_hub import constants, get_session

    try:  # through the library's session: its proxies and certificates
        get_session().head(constants.ENDPOINT, timeout=CHECK_SECONDS)
    except Exception:  # any failure to get an answer: the DNS, the route, the proxy, TLS
        return False
    return True


def hub_reachable() -> bool:
    """Whether the hub may be asked: offline mode is off and the hub answers (asked once per
    process)."""
    return not hub_offline() and _endpoint_answers()


def hub_unreachable(what: str, fix: str) -> WorkbenchError:
    """The one-line error for ``what`` that cannot be loaded without the hub, ending in how to
    do without it (``fix``)."""
    from huggingface_hub import constants

    why = "HF_HUB_OFFLINE is set" if hub_offline() else f"{constants.ENDPOINT} does not answer"
    return WorkbenchError(f"cannot load {what}: the hub is unreachable ({why}); {fix}")
