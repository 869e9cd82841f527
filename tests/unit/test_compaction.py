"""What log compaction keeps of a source's changes (log/compaction.py): each key's newest
message, after its namespace's newest truncate, without deletes and keys moved away;
every keyless change once; lines it cannot read as they are."""

from __future__ import annotations

import json
from typing import Any

from eventpipe.log.compaction import Kept


def _line(op: str, lsn: int, seq: int = 1, ns: str = "public.t", **fields: Any) -> bytes:
    change = {"_op": op, "_namespace": ns, "_lsn": lsn, "_seq": seq, **fields}
    return json.dumps(change).encode() + b"\n"


def _kept(*lines: bytes) -> list[dict[str, Any]]:
    kept = Kept()
    for line in lines:
        kept.add(line)
    return [json.loads(line) if line.startswith(b"{") else line for line in kept.lines()]


def test_each_key_keeps_its_newest_message_in_the_order_of_changes() -> None:
    kept = _kept(
        _line("read", 9, 1, _key="[1]", v="a"),
        _line("read", 9, 2, _key="[2]", v="b"),
        _line("update", 20, 1, _key="[1]", v="a2"),
        _line("update", 15, 1, _key="[2]", v="b2"),  # committed earlier, read later
        _line("insert", 30, 2, _key="[3]", v="c"),
        _line("update", 30, 1, _key="[3]", v="c0"),  # the same transaction, seq first
    )
    assert [(k["_key"], k["v"]) for k in kept] == [("[2]", "b2"), ("[1]", "a2"), ("[3]", "c")]


def test_deleted_and_moved_keys_leave_nothing_and_a_key_back_again_remains() -> None:
    kept = _kept(
        _line("insert", 10, _key="[1]"),
        _line("insert", 11, _key="[2]"),
        _line("insert", 12, _key="[3]"),
        _line("delete", 13, _key="[1]"),
        _line("update", 14, _key="[20]", _old_key="[2]"),  # 2 moved to 20
        _line("delete", 15, _key="[3]"),
        _line("insert", 16, _key="[3]", v="again"),
        _line("delete", 17, _key="[4]"),  # never seen before: nothing to remove
    )
    assert [(k["_op"], k["_key"]) for k in kept] == [("update", "[20]"), ("insert", "[3]")]


def test_a_truncate_cuts_what_came_before_it_in_its_namespace_only() -> None:
    kept = _kept(
        _line("read", 1, 0, _key="[1]"),
        _line("insert", 2, 1, ns="public.other", _key="[1]"),
        _line("truncate", 3, 1),
        _line("truncate", 5, 1),
        _line("insert", 4, 1, _key="[2]"),  # before the newest truncate
        _line("insert", 6, 1, _key="[3]"),
        _line("insert", 2, 2, ns="public.keyless"),
    )
    assert [(k["_namespace"], k["_op"], k["_lsn"]) for k in kept] == [
        ("public.other", "insert", 2), ("public.keyless", "insert", 2),
        ("public.t", "truncate", 5), ("public.t", "insert", 6),
    ]  # fmt: skip


def test_keyless_changes_all_remain_once_and_unreadable_lines_as_they_are() -> None:
    first = _line("insert", 5, 1, ns="public.notes", body="x")
    kept = _kept(
        b"not json\n",
        first,
        first,  # logged twice by a reader that died: one change
        _line("delete", 6, 1, ns="public.notes", body="x"),
        b'{"event": "no envelope"}\n',
    )
    assert kept[:2] == [b"not json\n", {"event": "no envelope"}]
    assert [(k["_op"], k["_lsn"]) for k in kept[2:]] == [("insert", 5), ("delete", 6)]
