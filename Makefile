# Two entry points do all set-up on a fresh machine: `make demo` and `make test`.
# Each installs only what is missing (Debian packages, then the virtualenv), so both are idempotent.

VENV     ?= .venv
PYTHON   ?= python3
STAMP    := $(VENV)/.installed-stamp
CDS_ARCHIVE := $(VENV)/share/fxgate/spark-classes.jsa
SUDO     := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
RUFF     := $(VENV)/bin/ruff
PYTEST_ARGS ?=

# The full soak (issue 3): at least 20 daemon SIGKILLs, 5 broker restarts, 50 connection flaps
# per QoS; with a route upstream, also 50 upstream flaps and 10 SIGKILLs of the forward process.
# Results go to bench/results/soak-*.json. `make test` runs a short schedule.
SOAK_KILLS    ?= 20
SOAK_RESTARTS ?= 5
SOAK_FLAPS    ?= 50
SOAK_FORWARD_KILLS ?= 10

.PHONY: demo test lint format bench soak system-deps deps clean

demo: deps
	$(VENV)/bin/fxgate demo

test: deps lint
	$(VENV)/bin/pytest $(PYTEST_ARGS)

BENCH_STAMP := $(VENV)/.bench-stamp
$(BENCH_STAMP): setup.cfg $(STAMP)
	$(VENV)/bin/pip install -q -e '.[test,bench]'
	touch $(BENCH_STAMP)

# Benchmarks run baseline and fxgate alternately in one run and report medians and ratios;
# results and the table (bench/results/README-table.md) in bench/results/ (issue 5).
bench: deps $(BENCH_STAMP)
	$(VENV)/bin/python -m bench.run $(BENCH_ARGS)

soak: deps
	FXGATE_SOAK_KILLS=$(SOAK_KILLS) FXGATE_SOAK_BROKER_RESTARTS=$(SOAK_RESTARTS) \
	FXGATE_SOAK_FLAPS=$(SOAK_FLAPS) FXGATE_SOAK_FORWARD_KILLS=$(SOAK_FORWARD_KILLS) \
	FXGATE_SOAK_RESULTS=bench/results \
	$(VENV)/bin/pytest -p no:cacheprovider -s tests/soak

lint: deps
	$(RUFF) check --config .ci/ruff.toml actors persistence spark tests bench
	$(RUFF) format --check --config .ci/ruff.toml actors persistence spark tests bench

format: deps
	$(RUFF) format --config .ci/ruff.toml actors persistence spark tests bench
	$(RUFF) check --fix --config .ci/ruff.toml actors persistence spark tests bench

deps: system-deps $(STAMP) $(CDS_ARCHIVE)

# The Spark JVM's class data archive (spark/cds.py): made once per install, mapped by every
# JVM start after it (Spark ready in about 3 s instead of 4-6). Without it everything works,
# only slower to start, so a failure to make it is said and does not stop the install.
$(CDS_ARCHIVE): $(STAMP)
	$(VENV)/bin/python -m spark.cds_archive $(CDS_ARCHIVE) || echo "continuing without the class data archive"

# mosquitto + clients always; a Java 17 runtime only when no `java` is on the PATH.
system-deps:
	@missing=""; \
	{ command -v mosquitto >/dev/null || [ -x /usr/sbin/mosquitto ]; } || missing="$$missing mosquitto"; \
	command -v mosquitto_pub >/dev/null || missing="$$missing mosquitto-clients"; \
	command -v java >/dev/null || missing="$$missing openjdk-17-jre-headless"; \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:$$missing"; \
		$(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing; \
	fi

$(STAMP): setup.cfg pyproject.toml
	[ -x $(VENV)/bin/python ] || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q -e '.[test]'
	touch $(STAMP)

clean:
	rm -rf $(VENV) .demo build *.egg-info .pytest_cache .ruff_cache
