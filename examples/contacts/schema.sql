-- Tables of the contact-import example (examples/contacts/app.py). Idempotent: the demo,
-- the tests and ensure_schema() run it every time.

-- One row per logical import (per account): the handler's source of truth for resume.
-- atlantis may run the same job more than once (a crash, a lost lease, a retry); the
-- next attempt reads next_cursor here and carries on from the last committed page.
CREATE TABLE IF NOT EXISTS contact_import_state (
  account_id    varchar(64) PRIMARY KEY,
  status        text NOT NULL,         -- 'running' | 'complete' | 'failed'
  next_cursor   text,                  -- upstream API page cursor
  pages_done    int NOT NULL DEFAULT 0,
  contacts_done int NOT NULL DEFAULT 0,
  started_at    timestamptz NOT NULL DEFAULT now(),
  updated_at    timestamptz NOT NULL DEFAULT now()
);

-- The destination. The primary key makes a re-imported page overwrite its rows instead
-- of adding a second copy: re-doing work after a crash is harmless.
CREATE TABLE IF NOT EXISTS contacts (
  account_id    varchar(64) NOT NULL,
  contact_id    text NOT NULL,
  name          text NOT NULL,
  email         text NOT NULL,
  imported_at   timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (account_id, contact_id)
);
