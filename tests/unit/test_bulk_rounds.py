"""How a batch is split for ``ON CONFLICT DO UPDATE`` statements (projections/bulk.py): no key twice
in a part, and each key's rows in their original order across the parts."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from projections.bulk import rounds, unnest_insert

rows_of = st.lists(st.tuples(st.sampled_from("abcde"), st.integers()), max_size=40)


@given(rows_of)
def test_a_key_appears_once_per_part_and_keeps_its_order(rows: list[tuple[str, int]]) -> None:
    parts = rounds(rows, 0)
    assert sorted(tuple(r) for part in parts for r in part) == sorted(rows)
    for part in parts:
        assert len({r[0] for r in part}) == len(part)
    for key in {r[0] for r in rows}:
        assert [r for part in parts for r in part if r[0] == key] == [r for r in rows if r[0] == key]
    # as few parts as the most repeated key needs
    assert len(parts) == max((sum(r[0] == k for r in rows) for k in {r[0] for r in rows}), default=0)


@given(rows_of)
def test_without_a_key_the_batch_is_one_part(rows: list[tuple[str, int]]) -> None:
    assert rounds(rows, None) == [rows]


def test_the_statement_casts_what_it_passes_as_text() -> None:
    bulk = unnest_insert("t", "id text, at text::timestamptz, body text::jsonb, n bigint",
                         "ON CONFLICT (id) DO NOTHING", key="id")
    assert bulk.columns == ("id", "at", "body", "n") and bulk.key == 0
    assert bulk.sql == ("INSERT INTO t (id, at, body, n)\nSELECT id, at::timestamptz, body::jsonb, n\n"
                        "  FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[]) AS t(id, at, body, n)\n"
                        "ON CONFLICT (id) DO NOTHING")
