-- atlantis schema, version 7: the web console (`tide console`).
--
-- Every write the console makes (cancel, retry, delete, pause, resume, one job or in bulk)
-- is recorded here: what, on what, when, from which client address, and the label of the
-- token that allowed it (ATLANTIS_CONSOLE_TOKEN may be `label:secret`).

CREATE TABLE atlantis.console_audit (
    id      bigserial PRIMARY KEY,
    at      timestamptz NOT NULL DEFAULT now(),
    action  text NOT NULL,          -- retry, cancel, delete, pause, resume, bulk-retry, ...
    target  text NOT NULL,          -- a job id, a queue name, or a bulk selection's summary
    detail  jsonb NOT NULL DEFAULT '{}',
    client  text,                   -- the client's address as the console saw it
    label   text,                   -- the token's label
    outcome text NOT NULL           -- what happened: the resulting state, a count, refused ...
);
CREATE INDEX console_audit_at_idx ON atlantis.console_audit (at DESC);
