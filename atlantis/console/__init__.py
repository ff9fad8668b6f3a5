"""The web console, ``tide console``: live progress of long-running jobs in a browser.

An optional extra (``pip install 'atlantis-jobs[console]'``: Starlette, Jinja2, uvicorn).
Server-rendered pages (``pages.py``, ``templates/``), a JSON API under ``/api`` that the
pages' few lines of plain JavaScript use too (``api.py``, documented in
``docs/console-api.md``), and one LISTEN connection per process whose notifications are
fanned out to every browser as server-sent events (``events.py``). Reads and writes go
through the store layer (:mod:`atlantis.store.admin`, :mod:`atlantis.store.fleet`,
:mod:`atlantis.store.console_queries`) and :mod:`atlantis.operations`.
"""
