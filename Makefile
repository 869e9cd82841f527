# eventpipe: `make run` starts it on embedded defaults, `make test` runs every test.
# Both set up what they need on a fresh machine (virtualenv, Python packages, Java, apt).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
# What running needs (make run): eventpipe without its test tools (Airflow, Selenium, the
# SDKs' Python packages). The tests' install ($(STAMP)) is a superset and counts for it.
RUN_STAMP := $(VENV)/.installed-run-stamp

.PHONY: sdks browser bigquery run test test-fast soak lint bench setup java spark-archive postgres clickhouse tools clean

# eventpipe run builds the class-data archive in the background when it is missing (the
# first start answers at once; later ones start Spark in half the time).
run: $(RUN_STAMP) java
	$(BIN)/eventpipe run

# TEST_WORKERS pytest processes, each module's tests in one of them (tests/conftest.py
# hands out the modules with slow tests first; xdist would reorder them by their number
# of tests); each worker has its Spark session and its
# PostgreSQL server. TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
# The sources are compiled to bytecode first: where PYTHONDONTWRITEBYTECODE is set (this
# machine sets it), each of the suite's many Python processes (commands, collectors,
# Spark's Python workers) compiled them again when it imported them, 0.1-0.2 s of CPU.
test: $(STAMP) java spark-archive postgres clickhouse bigquery tools sdks browser lint
	$(BIN)/python -m compileall -q src tests
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# The edit-test loop: lint, types, import contracts and the unit tests (a few minutes;
# make test runs everything).
test-fast: $(STAMP) java lint
	$(BIN)/pytest tests/unit

# The fault suite, many more times (tens of minutes): SOAK_KILLS collector kills under
# load, SOAK_CRASHES pipeline deaths per database. Prints acknowledged, loaded,
# duplicates and lost. Each test may take up to 2 hours (the suite's 300 s is per test).
# Then the hostile suite with random seeds: SOAK_EVENTS batches of generated events,
# SOAK_REQUESTS fuzzed requests (and an event of 6,000 keys).
SOAK_KILLS    ?= 500
SOAK_CRASHES  ?= 100
SOAK_EVENTS   ?= 300
SOAK_REQUESTS ?= 20000
soak: $(STAMP) java postgres
	EVENTPIPE_SOAK_KILLS=$(SOAK_KILLS) EVENTPIPE_SOAK_CRASHES=$(SOAK_CRASHES) \
		$(BIN)/pytest -s --timeout=7200 tests/faults
	EVENTPIPE_HOSTILE_EXAMPLES=$(SOAK_EVENTS) EVENTPIPE_HOSTILE_REQUESTS=$(SOAK_REQUESTS) \
		$(BIN)/pytest -s --timeout=7200 tests/hostile

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache

bench: $(STAMP) java
	scripts/ensure-apt.sh wrk postgresql libpostgresql-jdbc-java lz4 clickhouse-server clickhouse-client
	$(BIN)/python bench/ingest.py
	$(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	$(BIN)/python bench/batch.py
	$(BIN)/python bench/postgres.py
	$(BIN)/python bench/clickhouse.py
	$(BIN)/python bench/warehouses.py
	$(BIN)/python bench/object_storage.py
	$(BIN)/python bench/stream.py --destination duckdb
	$(BIN)/python bench/stream.py --destination postgres
	$(BIN)/python bench/http_sink.py
	$(BIN)/python bench/poison.py
	$(BIN)/python bench/archive.py
	$(BIN)/python bench/reprocess.py
	$(BIN)/python bench/state.py
	$(BIN)/python bench/metering.py
	$(BIN)/python bench/hostile.py
	$(BIN)/python bench/cluster.py
	$(BIN)/python bench/import.py

setup: $(STAMP) java spark-archive

java:
	@scripts/ensure-java.sh

# The JVM class-data archive of this machine's Java and Spark (processing/runtime/class_data.py):
# Spark's driver starts in about half the time. Built once (about 40 s), then up to date.
# A speed-up only: if it cannot be built (a read-only cache directory), make goes on.
spark-archive: $(RUN_STAMP) java
	@$(BIN)/eventpipe spark-archive || echo "warning: no class-data archive; Spark starts without it"

# The PostgreSQL destination's tests start a throwaway server of their own (tests/postgres.py);
# the change data capture tests read it through Debian's wal2json plugin.
postgres:
	@scripts/ensure-apt.sh postgresql
	@scripts/ensure-apt.sh postgresql-$$(ls /usr/lib/postgresql | sort -n | tail -1)-wal2json

# The ClickHouse destination's tests start a server of their own from Debian's package
# (tests/clickhouse.py), as they start PostgreSQL; its cluster tests, two of them
# replicating through Debian's ZooKeeper.
clickhouse:
	@scripts/ensure-apt.sh clickhouse-server zookeeper

# The archive's tests check that the standard `lz4` tool reads eventpipe's archive files;
# the pixel's test fetches it with `curl`, as a mail client would.
tools:
	@scripts/ensure-apt.sh lz4 curl

# The BigQuery destination's tests talk to bqemulator (BigQuery's REST API, DuckDB behind
# it), in a virtualenv of its own: it pins a sqlglot and a FastAPI that eventpipe's test
# tools do not take (tests/bigquery.py).
BIGQUERY_VENV := .venv-bigquery
bigquery: $(BIGQUERY_VENV)/.installed

$(BIGQUERY_VENV)/.installed: tests/bigquery-requirements.txt
	$(PYTHON) -m venv $(BIGQUERY_VENV)
	$(BIGQUERY_VENV)/bin/pip install --quiet -r tests/bigquery-requirements.txt
	@touch $@

# A real browser for tests/e2e/test_browser.py: Debian's Chromium and its driver.
browser:
	@scripts/ensure-apt.sh chromium chromium-driver

# The Node SDKs the collector's tests send with, pinned by tests/sdk/package-lock.json
# (npm install, which keeps to the lock: npm ci refuses this lock over optional
# platform packages, an npm bug).
sdks: tests/sdk/node_modules/.installed

tests/sdk/node_modules/.installed: tests/sdk/package-lock.json
	@command -v npm >/dev/null || scripts/ensure-apt.sh nodejs npm
	cd tests/sdk && npm install --no-audit --no-fund --loglevel=error
	@touch $@

$(STAMP): pyproject.toml scripts/setup-venv.sh
	PYTHON=$(PYTHON) scripts/setup-venv.sh $(VENV) dev
	@touch $@ $(RUN_STAMP)

$(RUN_STAMP): pyproject.toml scripts/setup-venv.sh
	PYTHON=$(PYTHON) scripts/setup-venv.sh $(VENV) run
	@touch $@

clean:
	rm -rf $(VENV) $(BIGQUERY_VENV) .pytest_cache .mypy_cache .ruff_cache
