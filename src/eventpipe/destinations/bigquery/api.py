"""BigQuery's APIs as the BigQuery destination calls them: Google's REST client (one
per credentials), the Storage Write API's (write.py), Google's errors as
eventpipe's (transient, configuration or terminal), a query job run within the
destination's deadline, and eventpipe's own tables made."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from eventpipe.destinations.bigquery.write import StorageWriter
from eventpipe.errors import ConfigError, TerminalError, TransientError, first_line
from eventpipe.schema.dialects import BIGQUERY

if TYPE_CHECKING:
    from google.cloud import bigquery

RETRY_SECONDS = 60.0
"""How long one API call retries (5xx, throttling, a connection refused) before the
destination calls the error transient: the run then resumes with its own backoff."""
_THROTTLED = {"rateLimitExceeded", "quotaExceeded", "backendError", "internalError",
              "jobBackendError", "jobInternalError"}  # fmt: skip


class BigQueryApi:
    """A destination's way to BigQuery: its project and dataset, credentials, addresses
    and deadline (the clients are thread-safe, made once and shared)."""

    def __init__(
        self,
        destination_id: str,
        project: str,
        dataset: str,
        location: str,
        credentials_file: str | None,
        endpoint: str | None,
        storage_endpoint: str | None,
        timeout_seconds: float,
    ) -> None:
        self.id = destination_id
        self.project = project
        self.dataset = dataset
        self.location = location
        self.credentials_file = credentials_file
        self.endpoint = endpoint
        self.storage_endpoint = storage_endpoint
        self.timeout_seconds = timeout_seconds
        self.call: dict[str, Any] = {"timeout": timeout_seconds}
        """Each API call's deadline and retries (set with the client: the library's own
        retry waits up to 10 minutes for a server that does not answer)."""
        self.job_retry: Any = None
        self._clients: dict[str | None, bigquery.Client] = {}
        self._storage: StorageWriter | None = None
        self._lock = threading.Lock()

    def client(self, credentials_file: str | None = None) -> bigquery.Client:
        """The client (one per credentials, made once): the credentials file's service
        account, Google's application default credentials, or none for an ``endpoint``
        without credentials (a stand-in)."""
        import os

        try:
            from google.api_core.client_options import ClientOptions
            from google.cloud import bigquery
        except ImportError:
            raise ConfigError(
                f"{self.id}: Google's BigQuery client is not installed",
                fix="pip install 'eventpipe[bigquery]'",
            ) from None
        key = credentials_file or self.credentials_file
        with self._lock:
            if key in self._clients:
                return self._clients[key]
            credentials = self.credentials(key)
            if (
                credentials is None
                and self.endpoint
                and not os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
            ):
                from google.auth.credentials import AnonymousCredentials

                credentials = AnonymousCredentials()  # type: ignore[no-untyped-call]
            from google.cloud.bigquery.retry import DEFAULT_JOB_RETRY, DEFAULT_RETRY

            self.call["retry"] = DEFAULT_RETRY.with_timeout(RETRY_SECONDS)
            self.job_retry = DEFAULT_JOB_RETRY.with_timeout(self.timeout_seconds)
            options = ClientOptions(api_endpoint=self.endpoint) if self.endpoint else None
            client = bigquery.Client(project=self.project, credentials=credentials,
                                     location=self.location, client_options=options)  # fmt: skip
            self._clients[key] = client
            return client

    def credentials(self, key: str | None) -> Any:
        """The service account of the JSON key file ``key``; None: none named."""
        if key is None:
            return None
        from google.oauth2 import service_account

        try:
            return service_account.Credentials.from_service_account_file(key)  # type: ignore[no-untyped-call]
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"{self.id}: the credentials file {key} cannot be read: {first_line(exc)}",
                fix="name a service account's JSON key file",
            ) from None

    def writer(self) -> StorageWriter:
        """The Storage Write API's client, as the loads' credentials (made once): a
        ``storage_endpoint`` without credentials is a stand-in, reached in plaintext."""
        import os

        with self._lock:
            if self._storage is None:
                credentials = self.credentials(self.credentials_file)
                plaintext = (credentials is None and bool(self.storage_endpoint)
                             and not os.environ.get("GOOGLE_APPLICATION_CREDENTIALS"))  # fmt: skip
                self._storage = StorageWriter(self.project, self.dataset, credentials,
                                              self.storage_endpoint, plaintext,
                                              self.timeout_seconds)  # fmt: skip
            return self._storage

    @contextmanager
    def errors(self, table: str | None = None) -> Iterator[None]:
        """Google's errors as eventpipe's: transient, configuration or terminal."""
        from google.api_core import exceptions as google
        from google.auth import exceptions as auth

        where = f"{self.id}.{table}" if table else self.id
        try:
            yield
        except (google.Unauthorized, auth.GoogleAuthError) as exc:
            raise ConfigError(
                f"BigQuery refused {where}'s credentials: {first_line(exc)}",
                fix="check credentials_file (or GOOGLE_APPLICATION_CREDENTIALS) and its roles",
            ) from None
        except google.GoogleAPICallError as exc:
            reasons = {
                str(e.get("reason"))
                for e in getattr(exc, "errors", None) or []
                if isinstance(e, dict)
            }
            code = int(exc.code or 0) if isinstance(exc.code, int) else 0
            message = f"bigquery ({where}): {first_line(exc)}"
            if code == 429 or code >= 500 or reasons & _THROTTLED:
                raise TransientError(message, table=table) from exc
            if code == 403 and "accessDenied" in reasons:
                raise ConfigError(message, fix="grant the service account the roles "
                                  "docs/destinations.md lists") from None  # fmt: skip
            raise TerminalError(message, table=table) from exc
        except (google.RetryError, ConnectionError, TimeoutError) as exc:
            raise TransientError(f"bigquery ({where}): {first_line(exc)}", table=table) from exc
        except OSError as exc:  # requests' connection errors are OSErrors
            raise TransientError(f"bigquery ({where}): {first_line(exc)}", table=table) from exc

    def ref(self, table: str) -> str:
        return f"{self.project}.{self.dataset}.{table}"

    def name(self, table: str) -> str:
        """A table's name in SQL (quoted)."""
        return BIGQUERY.quote(self.ref(table))

    def run(self, sql: str, table: str | None = None, **parameters: Any) -> Any:
        """Run ``sql`` (a script, maybe) as one query job within ``timeout_seconds``; its
        rows. Parameters are named (``@name``), typed from their Python values."""
        from google.cloud import bigquery

        config = bigquery.QueryJobConfig(
            default_dataset=f"{self.project}.{self.dataset}",
            query_parameters=[_parameter(bigquery, n, v) for n, v in parameters.items()],
        )
        with self.errors(table):
            job = self.client().query(sql, job_config=config, **self.call,
                                       job_retry=self.job_retry)  # fmt: skip
            return job.result(**self.call)

    def create(self, table: str, columns: dict[str, str]) -> None:
        """One of eventpipe's own tables, unless it exists."""
        from google.cloud import bigquery

        schema = [bigquery.SchemaField(name, kind) for name, kind in columns.items()]
        with self.errors(table):
            self.client().create_table(bigquery.Table(self.ref(table), schema=schema),
                                        exists_ok=True, **self.call)  # fmt: skip

    def get(self, table: str) -> Any:
        from google.api_core.exceptions import NotFound

        with self.errors(table):
            try:
                return self.client().get_table(self.ref(table), **self.call)
            except NotFound:
                return None


def _parameter(bigquery: Any, name: str, value: Any) -> Any:
    kind = "INT64" if isinstance(value, int) else "STRING"
    return bigquery.ScalarQueryParameter(name, kind, value)
