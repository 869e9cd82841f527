"""The HTTP sink (``type: http``): events to an ingestion API, in sessions (seed 2).

An API like DataSet's ``addEvents`` takes one request per session at a time, at most
6 MB per payload, and has servers that restart now and then. :class:`Delivery` feeds it
from one Spark task, which owns its sessions (the job partitions events by session key):

* **Sessions**: the key is the values of the ``group_by`` fields; they leave the event's
  attributes and go into the session info. Each session fills its own buffer until the
  next event would pass ``max_payload_bytes`` (measured before compression), and the
  buffer is published when full, when older than ``max_lifetime_seconds``, or when the
  input ends.
* **One request in flight per session**; at most ``parallel`` requests in flight in all
  (requests of different sessions overlap, on threads). While a session's request is in
  flight, its next buffer fills; when that one is full too, reading stops until the
  request ends. Buffered and in-flight bytes stay under ``max_buffer_bytes``: the durable
  log is the buffer, not memory.
* **Retries**: connection errors, timeouts, 429 and 5xx are retried with exponential
  backoff and jitter (half to all of the delay, retry.Backoff), ``Retry-After`` honoured,
  for up to ``retry_max_elapsed_seconds``; each session keeps its own error state (one
  session's success never clears another's). A request that timed out may have been
  stored: its events are counted as possible duplicates. With ``hold_seconds`` (the
  job's), a request still failing after that long is handed back: the session sends
  nothing more in this task (order holds), the others go on, and the job runs the send
  again later, from the driver, holding no Spark slot while it waits.
* **Credentials refused** (401, 403, 407): no event causes them, so the payload is never
  split for them (it took about 2N requests to learn that of N events): they are retried
  like an API that is down, then handed back or failed with the answer.
* **Terminal answers** (other 4xx, and 501/505, which no retry changes): the payload is
  split in halves and each half sent again, down to single events, so that only the
  events the API refuses fail, with the response; the rest is delivered. Events whose
  retries run out fail with the last response. Failed events are returned to the job,
  which writes them to failed/: none is dropped (seed 2's library drops them).
* **Trimming**: an event larger than the payload limit on its own keeps its smallest
  attributes whole while they fit, the first string that does not fit is truncated, the
  rest is dropped, and the event gets ``eventpipe_trimmed: true`` and is counted.
* **Bounds**: an answer's body is read up to :data:`MAX_ANSWER_BYTES` (the reason keeps
  its start); sessions with nothing buffered or in flight are let go at each sweep, so
  memory follows the sessions in use, not every ``group_by`` value ever seen.
* **Progress**: each request's outcome (the session, its last row, what was delivered,
  what failed and why) is appended to a progress directory the moment it is
  known. A task that starts again (a resumed run, a Spark task retry) skips what a
  record covers, so a crash resends at most the request each session had in flight.
  Every request carries ``X-Eventpipe-Session`` and an ``Idempotency-Key`` that is the
  same when the same events are sent again, for APIs that can drop repeats.

The parts, by role (Vector's ``sinks/http`` and ``sinks/util/retries.rs`` as the model):
``sink.py`` (what the job asks of the destination), ``settings.py`` (a task's settings),
``delivery.py`` (session buffers, publishing, splitting a refused payload),
``payload.py`` (encoding and trimming), ``sending.py`` (requests, retries, hand-back)
and ``progress.py`` (the records).
"""

from eventpipe.destinations.http.delivery import Delivery, Stats, deliver, deliver_batches
from eventpipe.destinations.http.payload import TRIMMED_ATTRIBUTE, session_id, trim
from eventpipe.destinations.http.settings import HttpSettings
from eventpipe.destinations.http.sink import Ga4Sink, HttpSink, HttpTasks

__all__ = [
    "TRIMMED_ATTRIBUTE",
    "Delivery",
    "Ga4Sink",
    "HttpSettings",
    "HttpSink",
    "HttpTasks",
    "Stats",
    "deliver",
    "deliver_batches",
    "session_id",
    "trim",
]
