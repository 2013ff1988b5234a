"""The Streamlit app (``kdw app``, or ``streamlit run app.py`` in a clone): one module per page,
listed once in :data:`workbench.app.main.PAGES`, with what they share in
:mod:`workbench.app.common`, the entry script :mod:`workbench.app.main`, the first-run
demo build in :mod:`workbench.app.first_run` and background trainings in
:mod:`workbench.app.jobs`."""

# The server's settings, as the clone's .streamlit/config.toml holds them for streamlit run
# (tests/app/test_app_command.py keeps the two equal); kdw app (workbench.app.serve) passes them on
# its command line.
# Local use only: the app binds to this machine and sends nothing anywhere.
SERVER_OPTIONS = {
    "server.address": "localhost",
    "server.headless": True,
    "server.maxUploadSize": 2,  # MiB; the pages check uploaded files further
    "server.fileWatcherType": "poll",  # see .streamlit/config.toml
    "browser.gatherUsageStats": False,
    "client.toolbarMode": "minimal",
}
