-- Tables of the onboarding example (examples/onboarding/app.py), beside the contacts
-- example's (examples/contacts/schema.sql, which the import step writes). Idempotent: the
-- demo, the tests and ensure_schema() run it every time.

-- The accounts the workflow creates. `created_by` is the idempotency key of the step that
-- created the row (`{workflow_id}:create`): a second attempt of that step finds its own row
-- and succeeds without a second insert, and the compensation deletes only a row its own
-- workflow created.
CREATE TABLE IF NOT EXISTS accounts (
  account_id    varchar(64) PRIMARY KEY,
  created_by    text NOT NULL UNIQUE,
  created_at    timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- The welcome messages sent, one per idempotency key (`{workflow_id}:welcome`): a retried
-- attempt does not send a second one.
CREATE TABLE IF NOT EXISTS welcome_messages (
  idempotency_key text PRIMARY KEY,
  account_id    varchar(64) NOT NULL,
  body          text NOT NULL,
  sent_at       timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Every effect a handler had, recorded once under its idempotency key, in the transaction
-- of the effect where it has one. `detail` is what the first attempt did; a later attempt
-- of the same key returns it instead of doing the work again. The demo reads the trail
-- back in the order of `at`.
CREATE TABLE IF NOT EXISTS onboarding_journal (
  idempotency_key text PRIMARY KEY,
  workflow_id   bigint NOT NULL,
  step          text NOT NULL,
  compensation  boolean NOT NULL,
  account_id    varchar(64) NOT NULL,
  detail        jsonb NOT NULL,
  at            timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- The demo's switch for a mail provider that is down: while this table holds its one row,
-- SendWelcome fails for good (atlantis.Discard) with `reason`. A switch in a table, not in
-- the args, because a step takes its args from the workflow's.
CREATE TABLE IF NOT EXISTS mail_outage (
  only_row      boolean PRIMARY KEY DEFAULT true CHECK (only_row),
  reason        text NOT NULL
);
