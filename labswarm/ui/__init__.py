"""The manager's web dashboard at ``/ui``: overview, session and training-job pages, live over the APIs' event
streams.

Modules: :mod:`labswarm.auth.cookie` (the browser's credential, read by the manager's authentication),
:mod:`labswarm.ui.app` (the mounted app: login, pages, static files), :mod:`labswarm.ui.pages` (the pages' routes,
their dependencies in :mod:`labswarm.ui.deps`), :mod:`labswarm.ui.login`, :mod:`labswarm.ui.render` (the
templates), :mod:`labswarm.ui.views` (what the pages show, from the services). Templates (Jinja2) and static
files (CSS, a little JavaScript, the vendored uPlot) ship in the package; nothing is fetched from the internet
and no Node.js is needed. Nothing is imported here, so that the manager's authentication can import
:mod:`labswarm.auth.cookie` without the app.
"""
