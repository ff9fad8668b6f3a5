"""Log lines: one event a line, as text or JSON, with job id / run / attempt / queue fields."""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from types import TracebackType

import orjson

_FIELDS = ("job_id", "run", "attempt", "queue", "stream", "child_pid", "worker")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for name in _FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                doc[name] = value
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        try:
            return orjson.dumps(doc, default=str).decode()
        except orjson.JSONEncodeError:
            # A lone surrogate (an undecodable file name or argument, kept by Python with
            # surrogateescape) is not UTF-8: escape it as handler output is escaped, so the
            # line stays one JSON document rather than a logging error on stderr.
            clean = {k: _escape(v) if isinstance(v, str) else v for k, v in doc.items()}
            return orjson.dumps(clean, default=lambda v: _escape(str(v))).decode()


def _escape(text: str) -> str:
    """``text`` with surrogates turned back into the bytes they stand for, backslash-escaped."""
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("ascii")


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802
        return datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")


def setup(fmt: str, level: int = logging.INFO) -> None:
    """One handler on the root logger, so every line on stderr has the chosen format.

    Not only ours: asyncio's complaints, Python warnings and an uncaught exception would
    otherwise reach stderr as bare text and break a JSON log's one-document-a-line promise.
    Our loggers say INFO and up; other libraries only WARNING and up.
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    ours = logging.getLogger("atlantis")
    ours.handlers[:] = []
    ours.setLevel(level)
    ours.propagate = True
    logging.captureWarnings(True)

    def uncaught(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        logging.getLogger("atlantis").critical("uncaught exception", exc_info=(kind, exc, tb))

    sys.excepthook = uncaught
