"""An async handler's steps (``atlantis.AsyncJobContext``): the rules of
:mod:`atlantis.steps`, on an async connection of the run's own (made in the handler's event
loop, closed in it: not kept between attempts)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

import orjson

from atlantis.steps import _MISSING, _Rules, encode, event_name

if TYPE_CHECKING:
    import psycopg

    from atlantis.protocol.fence import Fence


class AsyncStepBook(_Rules):
    """An async handler's steps: the same rules, on an async connection."""

    def __init__(self, fence: Fence, url: str | None) -> None:
        super().__init__(fence, url)
        self._conn: psycopg.AsyncConnection[Any] | None = None

    async def _open(self, name: str) -> psycopg.AsyncConnection[Any]:
        if self._conn is None:
            import psycopg

            from atlantis.store import steps as store

            try:
                self._conn = await psycopg.AsyncConnection.connect(
                    self.need_url(), **store.CONNECT_OPTIONS)
                self.loaded(await store.open_records_async(self._conn, self.fence), name)
            except psycopg.Error as exc:
                raise self.fail(exc, name) from exc
        return self._conn

    async def run_step(self, name: object, fn: Callable[..., Any], args: tuple[Any, ...],
                       kwargs: dict[str, Any]) -> Any:
        key = self.begin(name)
        conn = await self._open(key)
        value = self.recorded(key, "step")
        if value is not _MISSING:
            return value
        got = fn(*args, **kwargs)
        if inspect.isawaitable(got):
            got = await got
        text = encode(key, got)
        self.room(key, text)
        await self._write(conn, key, "step", text)
        return orjson.loads(text)

    async def _write(self, conn: psycopg.AsyncConnection[Any], name: str, kind: str,
                     text: str) -> None:
        import psycopg

        from atlantis.store import steps as store

        try:
            await store.record_async(conn, self.fence, name, kind, text)
        except psycopg.Error as exc:
            raise self.fail(exc, name) from exc
        self.wrote(name, kind, text)

    async def transaction(self, name: object, fn: Callable[..., Any], args: tuple[Any, ...],
                          kwargs: dict[str, Any]) -> Any:
        import psycopg

        from atlantis.store import steps as store

        key = self.begin(name)
        conn = await self._open(key)
        value = self.recorded(key, "transaction")
        if value is not _MISSING:
            return value
        async with store.AsyncStepTransaction(conn) as tx:
            self.inside = key
            try:
                got = fn(conn, *args, **kwargs)
                if inspect.isawaitable(got):
                    got = await got
            finally:
                self.inside = None
            text = encode(key, got)
            self.room(key, text)
            try:
                await tx.commit(self.fence, key, "transaction", text)
            except psycopg.OperationalError as exc:
                raise self.unknown_commit(key, exc) from exc
            except psycopg.Error as exc:  # the fence: nothing was committed
                raise self.fail(exc, key) from exc
        self.wrote(key, "transaction", text)
        return orjson.loads(text)

    async def sleep(self, name: object, seconds: float | None, until: datetime | None) -> None:
        import psycopg

        from atlantis.store import steps as store

        key = self.begin(name)
        conn = await self._open(key)
        self.recorded(key, "sleep")
        try:
            wake, due = await store.sleep_async(conn, self.fence, key, seconds, until)
        except psycopg.Error as exc:
            raise self.fail(exc, key) from exc
        if due:
            return
        raise self.suspend(key, wake)

    async def wait_for_event(self, name: object, event: str, seconds: float | None) -> Any:
        import psycopg

        from atlantis.store import steps as store

        key = self.begin(name)
        conn = await self._open(key)
        self.recorded(key, "event")
        try:
            got = await store.wait_event_async(conn, self.fence, key, event_name(event), seconds)
        except psycopg.Error as exc:
            raise self.fail(exc, key) from exc
        return self.waited(key, event, got)

    async def spawn(self, name: object, job: object, args: object,
                    options: dict[str, Any]) -> int:
        import psycopg

        from atlantis import children
        from atlantis.store import steps as store

        key = self.begin(name)
        conn = await self._open(key)
        value = self.recorded(key, "spawn")
        if value is not _MISSING:
            return children.spawned(key, value)
        params = children.spawn_params(key, job, args, options)
        try:
            child, fresh = await store.spawn_async(conn, self.fence, key, params)
        except psycopg.Error as exc:
            raise self.refused(exc, key) from exc
        self.wrote(key, "spawn", orjson.dumps({"job": child, "child": fresh}).decode())
        return child

    async def spawn_many(self, name: object, job: object, args_list: object,
                         options: dict[str, Any]) -> list[int]:
        import psycopg

        from atlantis import children
        from atlantis.store import steps as store

        key = self.begin(name)
        conn = await self._open(key)
        value = self.recorded(key, "spawn")
        if value is not _MISSING:
            return children.spawned_many(key, value)
        params = children.spawn_many_params(key, job, args_list, options)
        try:
            rows = await store.spawn_many_async(conn, self.fence, key, params)
        except psycopg.Error as exc:
            raise self.refused(exc, key) from exc
        ids = [i for i, _ in rows]
        self.wrote(key, "spawn", orjson.dumps({"jobs": ids}).decode())
        return ids

    async def join(self, name: object, ids: object, results: bool) -> list[Any]:
        import psycopg

        from atlantis import children
        from atlantis.store import steps as store

        key = self.begin(name)
        conn = await self._open(key)
        self.recorded(key, "join")
        wanted = children.job_ids(key, ids)
        try:
            rows = await store.join_async(conn, self.fence, key, wanted, bool(results))
        except psycopg.Error as exc:
            raise self.refused(exc, key) from exc
        return self.joined(key, rows, bool(results))

    async def aclose(self) -> None:
        if self._conn is not None:
            try:
                await self._conn.close()
            except Exception:
                pass
            self._conn = None
