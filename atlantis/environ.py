"""The environment variables atlantis reads or sets: each name written here once."""

from __future__ import annotations

#: The database the supervisor, tide and the app's enqueue calls use.
DATABASE_URL = "ATLANTIS_DATABASE_URL"

#: The database URL handed to children instead of the supervisor's own.
HANDLER_DATABASE_URL = "ATLANTIS_HANDLER_DATABASE_URL"

#: Where atlantis-supervise LISTENs: a direct connection when its own URL goes through a
#: pooler (``--listen-database-url``). Never handed to a child.
LISTEN_DATABASE_URL = "ATLANTIS_LISTEN_DATABASE_URL"

#: The app to import: ``package.module:attribute``, the attribute a Registry.
APP = "ATLANTIS_APP"

#: The embedded PostgreSQL's home (data directory and socket).
HOME = "ATLANTIS_HOME"

#: ``never``: no command starts the embedded PostgreSQL; without a database URL each refuses
#: with one line (the container image sets it). ``auto``, the default: started when no URL
#: is given (atlantis.store.embedded.check_embedded).
EMBEDDED = "ATLANTIS_EMBEDDED"

#: tide's statement deadline.
TIDE_TIMEOUT = "ATLANTIS_TIDE_TIMEOUT"

#: ``0``: every process builds the `.atl` parser instead of loading the one kept in the
#: user's cache folder (atlantis.declarations.parser_cache).
PARSER_CACHE = "ATLANTIS_PARSER_CACHE"

#: The console's bearer token.
CONSOLE_TOKEN = "ATLANTIS_CONSOLE_TOKEN"

#: Set in every child: the token that marks its process tree.
TREE = "ATLANTIS_TREE"

#: Set by the supervisor for every process it starts (children, zygotes, the lease keeper,
#: and all they start): its worker id, by which a supervisor on the same host proves that
#: none of them is left (atlantis.supervisor.identity).
WORKER = "ATLANTIS_WORKER"

#: ``atlantis-supervise --name``: the supervisor's name, kept across its restarts (an
#: operator's drain or eviction is kept for it).
WORKER_NAME = "ATLANTIS_WORKER_NAME"

#: The test suite's PostgreSQL major (``16`` or ``18``, the default): its embedded server.
TEST_PG = "ATLANTIS_TEST_PG"

#: ``0``: the test suite runs every supervisor as the installed program instead of forking
#: it from a server that imported it once (tests/forkserver.py).
TEST_FORK = "ATLANTIS_TEST_FORK"

#: Not atlantis's own: the user's runtime folder, where the embedded server's socket goes
#: when ``ATLANTIS_HOME`` is too long for one.
XDG_RUNTIME_DIR = "XDG_RUNTIME_DIR"

#: Where per-user caches go (the `.atl` parser, atlantis.declarations.parser_cache); a
#: relative value is ignored, as the XDG spec asks.
XDG_CACHE_HOME = "XDG_CACHE_HOME"

#: The test kit's kill points (atlantis.testing.killpoints, set by assert_idempotent for the
#: supervisors it starts): the app whose handlers it wraps, where each run writes the kill
#: points it passes (a path prefix), and which point kills the child (1 on; 0: none).
TESTING_APP = "ATLANTIS_TESTING_APP"
TESTING_POINTS = "ATLANTIS_TESTING_POINTS"
TESTING_KILL_AT = "ATLANTIS_TESTING_KILL_AT"
