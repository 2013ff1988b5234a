"""What the app's server does as it starts, kept light so that it answers at once: the entry
script every session runs (:data:`ENTRY`), and :func:`at_launch`, the lifespan of the
``st.App`` of ``app.py`` and :mod:`workbench.app.server`, which starts the demo build
(:func:`workbench.app.first_run.start_demo`) beside the server, not when a browser first opens
a page."""

import sys
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

ENTRY = Path(__file__).resolve().with_name("main.py")


def _start_demo() -> None:
    from workbench.app.first_run import start_demo
    from workbench.core.errors import WorkbenchError, one_line

    try:
        start_demo()
    except WorkbenchError as error:  # an invalid $KDW_DEMO: said here and on every page
        print(f"kd-workbench: {one_line(str(error))}", file=sys.stderr, flush=True)


@asynccontextmanager
async def at_launch(_app: Any) -> AsyncIterator[None]:
    """Start the demo build in a thread (its imports take seconds) and serve meanwhile."""
    threading.Thread(target=_start_demo, name="kdw-demo-start", daemon=True).start()
    yield
