"""The proof ``./scripts/demo --durable`` prints (examples/contacts/durable_demo.py): what the
database and the fake CRM say about one durable import that was killed and resumed.

Read from three places, none of them the handler's: ``atlantis.job_steps`` (which run
recorded each page, and the cursor it handed on), ``contact_writes`` (the demo's trigger's
count of the committed writes of each contact row) and the CRM's own log of the pages it
served. The import holds when every page is recorded once, in order, and every contact is
written exactly once, by two runs or more (the kill happened mid-import), and the only page
fetched twice is the one the killed run had in flight.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import psycopg

from examples.contacts.crm import FakeCRM
from examples.contacts.demo import DemoError


@dataclass
class PageRow:
    """One page: its step record, the contacts it wrote and how often it was fetched."""

    index: int
    run: int = 0
    """The run that recorded the page, 1 for the first (0: no record)."""
    attempt: int = 0
    cursor: str | None = None
    """The cursor the page was fetched at (the previous page's record hands it on)."""
    contacts: int = 0
    writes: int = 0
    """The committed writes of the page's contact rows (``contact_writes``): once each is
    ``contacts``."""
    max_writes: int = 0
    fetched: int = 0

    @property
    def name(self) -> str:
        return f"page-{self.index}"


@dataclass
class Proof:
    job_id: int
    account: str
    state: str
    result: Any
    expected_contacts: int
    expected_pages: int
    names: list[str] = field(default_factory=list)
    pages: list[PageRow] = field(default_factory=list)
    runs: int = 0

    def refetched(self) -> list[PageRow]:
        return [p for p in self.pages if p.fetched > 1]

    def problems(self) -> list[str]:
        """What does not hold, one phrase each; empty when the proof holds."""
        found: list[str] = []
        want = [f"page-{i}" for i in range(self.expected_pages)]
        if self.state != "complete":
            found.append(f"job {self.job_id} is {self.state}, not complete")
        if sorted(self.names) != sorted(want):
            found.append(f"the steps recorded are {self.names}, not page-0..page-"
                         f"{self.expected_pages - 1}")
        contacts = sum(p.contacts for p in self.pages)
        if contacts != self.expected_contacts:
            found.append(f"{contacts} contacts imported, not {self.expected_contacts}")
        twice = [p.name for p in self.pages if p.max_writes > 1 or p.writes != p.contacts]
        if twice:
            found.append(f"written more than once (or not counted): {', '.join(twice)}")
        if len(self.refetched()) > 1:
            found.append("fetched again after the kill: "
                         + ", ".join(p.name for p in self.refetched()))
        if any(p.fetched == 0 for p in self.pages):
            found.append("a page with contacts was never fetched: the CRM log disagrees")
        if self.runs < 2:
            found.append("every page was recorded by one run: the kill did not land mid-import")
        if [p.run for p in self.pages] != sorted(p.run for p in self.pages):
            found.append("the runs did not take the pages in turn")
        want_result = {"pages": self.expected_pages, "contacts": self.expected_contacts}
        if self.result != want_result:
            found.append(f"the job's result is {self.result}, not {want_result}")
        return found

    def check(self) -> None:
        found = self.problems()
        if found:
            raise DemoError("the proof does not hold: " + "; ".join(found))

    def table(self) -> str:
        lines = [f"  {'step':<9} {'contacts':>8} {'writes':>7} {'fetched':>8}  recorded by"]
        again = self.refetched()
        for p in self.pages:
            by = f"run {p.run} (attempt {p.attempt})" if p.run else "(no record)"
            note = ""
            if p.max_writes > 1:
                note = "  <- WRITTEN AGAIN"
            elif again == [p]:
                note = "  <- in flight at the kill: rolled back, then fetched again"
            elif p.fetched > 1:
                note = "  <- FETCHED AGAIN"
            lines.append(f"  {p.name:<9} {p.contacts:>8} {p.writes:>7} {p.fetched:>8}  {by}{note}")
        first = [p.name for p in self.pages if p.run == 1]
        later = [p.name for p in self.pages if p.run > 1]
        lines.append(f"  {len(self.pages)} pages, {sum(p.contacts for p in self.pages)} contacts,"
                     f" {sum(p.writes for p in self.pages)} committed writes of a contact row")
        if first and later:
            lines.append(f"  the first run recorded {first[0]}..{first[-1]}; the next ones "
                         f"{later[0]}..{later[-1]}, reading the first run's records back")
        problems = self.problems()
        lines.append("  " + ("proof holds: no page written twice" if not problems
                             else "PROOF FAILS: " + "; ".join(problems)))
        return "\n".join(lines)

    def summary(self) -> str:
        again = self.refetched()
        fetched = (f"only {again[0].name} (in flight at the kill) fetched twice"
                   if again else "no page fetched twice")
        return (f"job {self.job_id} imported {self.expected_contacts} contacts of "
                f"{self.account!r} in {self.expected_pages} transaction steps across "
                f"{self.runs} runs, a kill -9 between them: every contact written exactly "
                f"once, {fetched}")


def prove(url: str, crm: FakeCRM, job_id: int, account: str, *, page_size: int) -> Proof:
    """Read the proof of job ``job_id``. A contact's page is its index (the CRM's ids are
    ``c<index>``) divided by ``page_size``."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT state, result FROM atlantis.jobs WHERE id = %s",
                           (job_id,)).fetchone()
        if row is None:
            raise DemoError(f"job {job_id} is gone")
        steps = conn.execute(
            "SELECT name, run_id, attempt, value->>'cursor' FROM atlantis.job_steps"
            " WHERE job_id = %s AND kind = 'transaction' ORDER BY recorded_at, name",
            (job_id,)).fetchall()
        written = conn.execute(
            """SELECT substring(c.contact_id FROM 2)::int / %(size)s, count(*),
                      coalesce(sum(w.writes), 0), coalesce(max(w.writes), 0)
                 FROM contacts c LEFT JOIN contact_writes w USING (account_id, contact_id)
                WHERE c.account_id = %(account)s GROUP BY 1 ORDER BY 1""",
            {"size": page_size, "account": account}).fetchall()
    proof = Proof(job_id, account, row[0], row[1], crm.expected_contacts(account),
                  crm.expected_pages(account, page_size), names=[s[0] for s in steps])
    pages = {i: PageRow(i) for i in range(proof.expected_pages)}
    runs: dict[Any, int] = {}
    handed_on = {-1: ""}  # page-0 is fetched at the empty cursor
    for name, run_id, attempt, next_cursor in steps:
        index = int(name.removeprefix("page-")) if name.startswith("page-") else -2
        page = pages.setdefault(index, PageRow(index))
        page.run = runs.setdefault(run_id, len(runs) + 1)
        page.attempt = attempt
        handed_on[index] = next_cursor
    for index, contacts, writes, max_writes in written:
        page = pages.setdefault(index, PageRow(index))
        page.contacts, page.writes, page.max_writes = contacts, writes, max_writes
    for index, page in pages.items():
        page.cursor = handed_on.get(index - 1)
        if page.cursor is not None:
            page.fetched = crm.request_count(account, page.cursor)
    proof.pages = [pages[i] for i in sorted(pages)]
    proof.runs = len(runs)
    return proof
