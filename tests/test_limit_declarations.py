"""`concurrency` and `rate` limits of `.atl` jobs (issue 21): the grammar, the model
(``Limit``, its label and its JSON), the checks (each refusal at file:line:column, naming
the token) and the reload's round trip. What the database does with them is tested with
the store."""

from __future__ import annotations

import re

import orjson
import pytest

from atlantis.declarations import Field, JobDecl, Limit, parse_atl, read_atl
from atlantis.declarations.codegen import generate_module
from atlantis.errors import DeclarationError
from atlantis.supervisor.appload import decl_from_dict, decl_to_dict
from tests.docs import bad_input_text

# The issue's block, verbatim but for its `...` line (which stands for the rest of a job).
ISSUE_EXAMPLE = """\
job ImportContacts in directory {
  args { account_id varchar(64) not null }
  concurrency 1 by account_id     # at most 1 running per account_id value, fleet-wide
  concurrency 4                   # and at most 4 running in all
  rate 100/1m by account_id       # at most 100 starts per minute per account
}
"""

ISSUE_LIMITS = (
    Limit("concurrency", 1, None, ("account_id",)),
    Limit("concurrency", 4, None, ()),
    Limit("rate", 100, 60.0, ("account_id",)),
)


def one(text: str) -> JobDecl:
    (decl,) = parse_atl(text, "jobs.atl")
    return decl


def test_the_issue_example_parses_verbatim() -> None:
    decl = one(ISSUE_EXAMPLE)
    assert decl.limits == ISSUE_LIMITS
    assert [limit.source for limit in decl.limits] == [
        "jobs.atl:3:3", "jobs.atl:4:3", "jobs.atl:5:3",
    ]  # fmt: skip
    assert [limit.label for limit in decl.limits] == [
        "concurrency 1 by account_id", "concurrency 4", "rate 100/1m by account_id",
    ]  # fmt: skip
    # Everything else is as without the limits.
    assert decl == JobDecl(
        "ImportContacts", "directory", (Field("account_id", "varchar", 64, not_null=True),),
        limits=ISSUE_LIMITS,
    )


def test_the_job_types_row_carries_the_limits_in_declaration_order() -> None:
    assert one(ISSUE_EXAMPLE).to_json()["limits"] == [
        {"kind": "concurrency", "n": 1, "by": ["account_id"]},
        {"kind": "concurrency", "n": 4, "by": []},
        {"kind": "rate", "n": 100, "period": 60.0, "by": ["account_id"]},
    ]
    reordered = one(
        "job J in ns {\n  rate 5/5s\n  args { a int }\n  concurrency 2 by a\n}\n"
    ).to_json()["limits"]
    assert reordered == [
        {"kind": "rate", "n": 5, "period": 5.0, "by": []},
        {"kind": "concurrency", "n": 2, "by": ["a"]},
    ]


def test_a_job_without_limits_has_none() -> None:
    decl = one("job J in ns {\n  retries 2\n}\n")
    assert decl.limits == ()
    assert decl.to_json()["limits"] == []


def test_several_by_fields_keep_their_order() -> None:
    decl = one(
        "job J in ns {\n"
        "  args { tenant text, region varchar(8), n int, day date, id uuid, ok boolean }\n"
        "  concurrency 2 by region, tenant\n"
        "  concurrency 3 by tenant, region, n\n"
        "  rate 10/1s by day, id, ok\n"
        "}\n"
    )
    assert [limit.by for limit in decl.limits] == [
        ("region", "tenant"), ("tenant", "region", "n"), ("day", "id", "ok"),
    ]  # fmt: skip
    assert decl.limits[0].label == "concurrency 2 by region, tenant"
    assert decl.to_json()["limits"][2] == {
        "kind": "rate", "n": 10, "period": 1.0, "by": ["day", "id", "ok"],
    }  # fmt: skip


def test_the_keywords_stay_names_elsewhere() -> None:
    """`concurrency`, `rate` and `by` are keywords only where a modifier or `by` may be."""
    decl = one(
        "job J in ns {\n"
        "  args { rate int, by text, concurrency bigint }\n"
        "  unique (rate, by)\n"
        "  concurrency 1 by by, rate\n"
        "  rate 2/1m by concurrency\n"
        "}\n"
    )
    assert [f.name for f in decl.fields] == ["rate", "by", "concurrency"]
    assert decl.unique == ("rate", "by")
    assert decl.limits == (
        Limit("concurrency", 1, None, ("by", "rate")),
        Limit("rate", 2, 60.0, ("concurrency",)),
    )
    assert [limit.label for limit in decl.limits] == [
        "concurrency 1 by by, rate", "rate 2/1m by concurrency",
    ]  # fmt: skip


def test_limits_share_a_line_with_commas_and_a_null_field_may_key() -> None:
    decl = one(
        "job J in ns { args { a text }, concurrency 1, retries 2, rate 3/1h by a\n"
        "  concurrency 1 by a }\n"
    )
    assert decl.retries == 2
    assert decl.limits == (
        Limit("concurrency", 1), Limit("rate", 3, 3600.0, ("a",)),
        Limit("concurrency", 1, None, ("a",)),
    )  # fmt: skip


def test_one_limit_per_kind_and_set_of_fields_but_the_kinds_do_not_clash() -> None:
    decl = one(
        "job J in ns {\n  args { a int, b int }\n"
        "  concurrency 1 by a\n  concurrency 1 by a, b\n  concurrency 9\n"
        "  rate 1/1s by a\n  rate 9/1d\n}\n"
    )
    assert [limit.label for limit in decl.limits] == [
        "concurrency 1 by a", "concurrency 1 by a, b", "concurrency 9", "rate 1/1s by a",
        "rate 9/1d",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("written", "seconds", "label"),
    [
        ("1m", 60.0, "1m"), ("5s", 5.0, "5s"), ("1h", 3600.0, "1h"), ("90s", 90.0, "90s"),
        ("1m30s", 90.0, "90s"), ("1d", 86400.0, "1d"), ("24h", 86400.0, "1d"),
        ("1h30m", 5400.0, "90m"), ("1000ms", 1.0, "1s"), ("1500ms", 1.5, "1s500ms"),
    ],
)  # fmt: skip
def test_the_period_is_labelled_in_its_largest_whole_unit(
        written: str, seconds: float, label: str) -> None:
    (limit,) = one(f"job J in ns {{\n  rate 7/{written}\n}}\n").limits
    assert limit == Limit("rate", 7, seconds)
    assert limit.label == f"rate 7/{label}"
    assert limit.to_json() == {"kind": "rate", "n": 7, "period": seconds, "by": []}


def test_the_limits_survive_the_reload_round_trip() -> None:
    """The reload hands declarations from a fresh interpreter as JSON (appload)."""
    decl = one(ISSUE_EXAMPLE)
    back = decl_from_dict(orjson.loads(orjson.dumps(decl_to_dict(decl))))
    assert back == decl
    assert [limit.source for limit in back.limits] == [limit.source for limit in decl.limits]
    assert back.to_json() == decl.to_json()
    # A document of a release without limits reads as a job without them.
    old = decl_to_dict(one("job J in ns {}\n"))
    del old["limits"]
    assert decl_from_dict(old).limits == ()


def test_the_json_rebuilds_the_limits() -> None:
    doc = one(ISSUE_EXAMPLE).to_json()["limits"]
    rebuilt = tuple(
        Limit(d["kind"], d["n"], d.get("period"), tuple(d["by"])) for d in orjson.loads(
            orjson.dumps(doc))
    )
    assert rebuilt == ISSUE_LIMITS


def test_codegen_takes_a_limited_job() -> None:
    """Limits are not args: `tide gen` writes the same module with or without them."""
    unlimited = ISSUE_EXAMPLE.replace("  concurrency 1 by account_id", "  #").replace(
        "  concurrency 4", "  #").replace("  rate 100/1m by account_id", "  #")
    assert one(unlimited).limits == ()
    assert generate_module([one(ISSUE_EXAMPLE)], "jobs.atl") == generate_module(
        [one(unlimited)], "jobs.atl")


def test_a_workflow_takes_no_limits() -> None:
    with pytest.raises(DeclarationError, match=re.escape(
            "flows.atl:2:3: unknown workflow modifier 'concurrency'")):
        read_atl("workflow W in ns {\n  concurrency 1\n}\n", "flows.atl")


# --------------------------------------------------------------------------- refusals

ARGS = "  args { account_id varchar(64), tags text[], doc jsonb, n int }\n"

BAD = [
    pytest.param(
        "  concurrency 1 by account\n",
        "jobs.atl:3:20: concurrency by field 'account' is not declared in args",
        id="by-field-not-declared",
    ),
    pytest.param(
        "  rate 10/1m by account_id, acount_id\n",
        "jobs.atl:3:29: rate by field 'acount_id' is not declared in args",
        id="rate-by-field-not-declared",
    ),
    pytest.param(
        "  concurrency 1 by tags\n",
        "jobs.atl:3:20: concurrency by field 'tags' is text[]; array and jsonb fields cannot "
        "key a limit",
        id="by-array-field",
    ),
    pytest.param(
        "  rate 1/1s by n, doc\n",
        "jobs.atl:3:19: rate by field 'doc' is jsonb; array and jsonb fields cannot key a limit",
        id="by-jsonb-field",
    ),
    pytest.param(
        "  concurrency 1 by n, account_id, n\n",
        "jobs.atl:3:35: field 'n' is listed twice in concurrency by",
        id="by-field-twice",
    ),
    pytest.param(
        "  concurrency 0\n",
        "jobs.atl:3:15: concurrency must be at least 1, not '0'",
        id="concurrency-zero",
    ),
    pytest.param(
        "  concurrency -2 by n\n",
        "jobs.atl:3:15: concurrency must be at least 1, not '-2'",
        id="concurrency-negative",
    ),
    pytest.param(
        "  concurrency 1.5\n",
        "jobs.atl:3:15: concurrency must be a whole number, not '1.5'",
        id="concurrency-not-whole",
    ),
    pytest.param(
        "  concurrency 1e3\n",
        "jobs.atl:3:15: concurrency must be a whole number, not '1e3'",
        id="concurrency-exponent",
    ),
    pytest.param(
        "  concurrency 2147483648\n",
        "jobs.atl:3:15: concurrency must be at most 2147483647, not '2147483648'",
        id="concurrency-too-large",
    ),
    pytest.param(
        "  rate 0/1m\n",
        "jobs.atl:3:8: rate must be at least 1, not '0'",
        id="rate-zero",
    ),
    pytest.param(
        "  rate 2.5/1m\n",
        "jobs.atl:3:8: rate must be a whole number, not '2.5'",
        id="rate-not-whole",
    ),
    pytest.param(
        "  rate 10/500ms by n\n",
        "jobs.atl:3:11: rate period must be at least 1s, not '500ms'",
        id="period-under-a-second",
    ),
    pytest.param(
        "  rate 10/0s\n",
        "jobs.atl:3:11: rate period must be at least 1s, not '0s'",
        id="period-zero",
    ),
    pytest.param(
        "  rate 10/60\n",
        "jobs.atl:3:11: duration '60' needs a unit: ms, s, m, h or d (as in 60s)",
        id="period-without-unit",
    ),
    pytest.param(
        "  rate 10/1x\n",
        "jobs.atl:3:11: invalid duration '1x' (use e.g. 500ms, 30s, 10m, 2h, 1d, 1h30m)",
        id="period-invalid",
    ),
    pytest.param(
        "  rate 10/200000000d\n",
        "jobs.atl:3:11: rate period '200000000d' is too long (at most 36500d, 100 years)",
        id="period-too-long",
    ),
    pytest.param(
        "  rate 10/m\n",
        "jobs.atl:3:11: unexpected 'm' (expected a duration such as 30s or 1h30m)",
        id="period-without-number",
    ),
    pytest.param(
        "  rate 10\n",
        "jobs.atl:3:10: unexpected end of line (expected '/')",
        id="rate-without-period",
    ),
    pytest.param(
        "  concurrency 1 by\n",
        "jobs.atl:3:19: unexpected end of line (expected a name)",
        id="by-without-field",
    ),
    pytest.param(
        "  concurrency 1 by n, account_id\n  concurrency 3 by account_id, n\n",
        "jobs.atl:4:3: duplicate concurrency limit by account_id, n (first at jobs.atl:3): a "
        "job may declare one concurrency limit per set of by fields",
        id="same-kind-same-fields-twice",
    ),
    pytest.param(
        "  rate 10/1s\n  concurrency 2\n  rate 100/1m\n",
        "jobs.atl:5:3: duplicate rate limit without by (first at jobs.atl:3): a job may "
        "declare one rate limit per set of by fields",
        id="same-kind-no-fields-twice",
    ),
    pytest.param(
        "  concurrency 1 by n, rate 10/1s\n",
        "jobs.atl:3:23: 'rate' reads as one more by field here (a comma after a by field "
        "continues the list of fields); put 'rate' on a line of its own",
        id="modifier-after-a-by-comma",
    ),
    pytest.param(
        "  concurency 1\n",
        "jobs.atl:3:3: unknown modifier 'concurency' (expected one of: args, retries, timeout, "
        "heartbeat, queue, priority, unique, backoff, stall, schedule, tz, overlap, concurrency, "
        "rate)",
        id="misspelt-modifier",
    ),
]


@pytest.mark.parametrize(("lines", "message"), BAD)
def test_refusals_name_file_line_column_and_token(lines: str, message: str) -> None:
    with pytest.raises(DeclarationError) as info:
        parse_atl("job J in ns {\n" + ARGS + lines + "}\n", "jobs.atl")
    assert str(info.value) == message


def test_the_fields_are_checked_wherever_args_is_written() -> None:
    """A limit may come before the args it keys by; the check waits for them."""
    decl = one("job J in ns {\n  concurrency 1 by a\n  args { a int }\n}\n")
    assert decl.limits == (Limit("concurrency", 1, None, ("a",)),)
    with pytest.raises(DeclarationError) as info:
        parse_atl("job J in ns {\n  concurrency 1 by a\n}\n", "jobs.atl")
    assert str(info.value) == "jobs.atl:2:20: concurrency by field 'a' is not declared in args"


def test_the_bad_input_table_quotes_every_refusal() -> None:
    """docs/reference/bad-input/ quotes each refusal above word for word (its rows name these
    ids)."""
    text = bad_input_text()
    missing = [str(case.values[1]) for case in BAD if f"`{case.values[1]}`" not in text]
    assert not missing, "docs/reference/bad-input/ lacks:\n" + "\n".join(missing)
