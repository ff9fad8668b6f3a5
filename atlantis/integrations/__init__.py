"""Enqueue from a web framework's own transaction: Django and SQLAlchemy.

Each module takes the framework's connection, finds the psycopg 3 connection under it and
calls the public API (:func:`atlantis.enqueue` and the others) on it, so the job is written
in the framework's transaction: committed with it, or gone with its rollback. Import the
module you need (``atlantis.integrations.django``, ``atlantis.integrations.sqlalchemy``);
``import atlantis`` imports neither, and neither framework is a dependency of atlantis.
"""
