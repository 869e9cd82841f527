"""Change data capture from PostgreSQL into the log (``eventpipe read SOURCE``).

A source reads a database the way seed 3's readers do: it copies the chosen tables,
then follows their changes, and writes each row and change to the log as an event,
under the source's id as key id, as a log writer of its own (``<host>-source-<id>``).

1. **Slot and snapshot.** On first use, a logical replication slot (``wal2json``) is
   created over a replication connection, exporting a snapshot: the slot's changes
   start exactly where the snapshot's view of the tables ends.
2. **Copy** (per table: ``copy``, then ``sync`` in the progress file). Each table whose
   ``schema.table`` matches ``tables`` is read in that snapshot, row by row, as events
   with ``_op: read``, after a ``truncate`` of the table: a copy cut short (the process
   died: the snapshot died with it) starts over with a new slot, and the writers that
   apply changes then start the table over too, so that a row copied before and
   deleted since does not stay.
3. **Sync.** The slot's changes are read (``pg_logical_slot_peek_changes``), whole
   transactions at a time: ``insert``, ``update``, ``delete`` and ``truncate``, each an
   event. Only after the log has fsynced them is the slot moved past them
   (``pg_replication_slot_advance``): a reader killed at any point resumes from the slot
   without losing a change, and the changes it logged but had not confirmed are logged
   again, with the same event ids.

An event is the row's columns as they are (numbers and booleans as JSON numbers and
booleans, ``bytea`` as hex digits, everything else as PostgreSQL's text: the forms
wal2json gives them in; a ``numeric`` that a float64 would not read back digit for digit
as PostgreSQL's text of it, :func:`values.loads`) and:

* ``_op``: ``read`` (the copy), ``insert``, ``update``, ``delete``, ``truncate``;
* ``_namespace``: ``schema.table``;
* ``_lsn`` and ``_seq``: the order of changes. ``_lsn`` is the WAL position of the
  change's commit (an integer; transactions come in the order they committed), ``_seq``
  its place in the transaction, from 1. The copy's rows carry the position just before
  the slot's starting point (where its first change may be), its truncate ``_seq`` 0;
* ``_key``: the row's primary key, its values as a JSON array in the key's column order
  (``[7]``, ``[7,"a"]``), the same text in the copy and in every change of the row;
  absent for a table without a primary key. A delete's is the key of the row deleted;
* ``_commit_time`` and ``_timestamp``: when the transaction committed (the copy: when
  it started);
* ``_old_key``: an update that changed the key: the key before (a delete's row is the
  replica identity: its key only, unless the table's identity is ``FULL``);
* ``src``: ``postgres``, ``api_key``: the source's id, ``eventn_ctx.event_id``: derived
  from the source, the slot, the change's position and its place in its transaction,
  so a change read twice has one id.

A value the WAL leaves out of an update (a large, TOASTed value the update did not
change) is read from the table by key: as it is when read, and a later change of it
follows in the changes, so the last change of every row is whole. The same holds for a
column added with a DEFAULT, which the rows that existed get without a change: each read
compares the tables' columns with the last read's, and a table given such a column is
read again whole (:meth:`PostgresSource._backfill`).

The reader is :mod:`.reader`; what it asks of the database beside the WAL is
:mod:`.catalog`; the forms of the values it writes, :mod:`.values`.
"""

from eventpipe.sources.postgres.reader import WAL2JSON, PostgresSource, Progress, ReadReport
from eventpipe.sources.postgres.values import exact_number, lsn_int

__all__ = ["WAL2JSON", "PostgresSource", "Progress", "ReadReport", "exact_number", "lsn_int"]
