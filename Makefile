# What each entry point installs on a fresh machine (only what is missing, so each is idempotent):
#   make install  the gateway: a virtualenv in $(VENV) with fxgate and what `fxgate run` needs,
#                 nothing else (no JDK, no Maven, no Go, no test brokers, no test/docs/bench extras)
#   make dist     the same as a wheel in dist/, for `pip install` on a gateway (no checkout there)
#   make demo     the light install and mosquitto (Debian), then the demo; BROKER=hivemq or mochi
#                 builds that broker first (Maven and a JDK, or Go)
#   make spark    adds Spark to the install, for `fxgate sql`, `audit` and landing on a cluster:
#                 pyspark and delta-spark, a Java runtime (Debian), Delta Lake's jars (Maven)
#   make test     everything the suite needs: Spark, the test brokers and stores, the test tools

VENV     ?= .venv
PYTHON   ?= python3
# One stamp per layer of the virtualenv, each made by pip from setup.cfg (the extras there).
INSTALL_STAMP := $(VENV)/.install-stamp
SPARK_STAMP   := $(VENV)/.spark-stamp
STAMP    := $(VENV)/.installed-stamp
CDS_ARCHIVE := $(VENV)/share/fxgate/spark-classes.jsa
SUDO     := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
RUFF     := $(VENV)/bin/ruff
PYTEST_ARGS ?=
# The broker `make demo` starts: mosquitto, hivemq or mochi (`make demo BROKER=hivemq`).
BROKER   ?= mosquitto

# Delta Lake's jars for the Spark JVM (DESIGN §7.7), fetched from Maven Central by Maven's own
# client into the virtualenv, where spark/session.py looks for them (DELTA_VERSION and the file
# names are repeated there, and must be the delta-spark wheel's release). Only these two:
# delta-spark's other dependencies are pyspark's own jars, or Delta Kernel and Unity Catalog
# client jars that no table operation of ours loads (measured: append with txnAppId, read,
# OPTIMIZE, VACUUM, CONVERT TO DELTA). Nothing is downloaded at run time.
DELTA_VERSION          := 4.4.0
DELTA_SPARK_ARTIFACT   := io.delta:delta-spark_4.2_2.13
DELTA_STORAGE_ARTIFACT := io.delta:delta-storage
DELTA_JARS_DIR := $(VENV)/share/fxgate/jars
DELTA_ARTIFACTS := $(DELTA_SPARK_ARTIFACT) $(DELTA_STORAGE_ARTIFACT)
# group:artifact -> the file name Maven copies it to
delta_jar = $(DELTA_JARS_DIR)/$(word 2,$(subst :, ,$(1)))-$(DELTA_VERSION).jar
DELTA_JARS := $(foreach artifact,$(DELTA_ARTIFACTS),$(call delta_jar,$(artifact)))
MVN := mvn -B -q --strict-checksums

# The test brokers beside mosquitto (issue 25). HiveMQ CE embedded and its dependencies from
# Maven Central (the version pinned in its pom.xml), with the launcher compiled beside them;
# Mochi MQTT built from the Go module proxy's sources (pinned in go.mod and go.sum).
HIVEMQ_SOURCES  := actors/devtools/brokers/hivemq
HIVEMQ_DIR      := $(VENV)/share/fxgate/hivemq
HIVEMQ_LAUNCHER := $(HIVEMQ_DIR)/launcher/FxgateHiveMQ.class
MOCHI_SOURCES   := actors/devtools/brokers/mochi
MOCHI_BIN       := $(VENV)/share/fxgate/bin/fxgate-mochi
# Azurite, Microsoft's Azure Storage emulator, for the object-store tables' tests (issue 35): from
# the npm registry, the version pinned in package.json and package-lock.json, with the machine's
# Node.js (Debian's nodejs and npm when missing).
AZURITE_SOURCES := actors/devtools/azurite
AZURITE_DIR     := $(VENV)/share/fxgate/azurite
AZURITE_MAIN    := $(AZURITE_DIR)/node_modules/azurite/dist/src/blob/main.js
# SeaweedFS, a real S3-compatible server with the conditional writes delta-rs commits with, for
# the S3 tables' tests: its `weed` command built from the Go module proxy's sources at this
# version (a pseudo-version: the project publishes no module tags; its go.mod has a replace
# directive, so `go install module@version` refuses it and it is built in its module's folder).
SEAWEEDFS_VERSION := v0.0.0-20261109003541-7506e5f91cd6
SEAWEEDFS_BIN     := $(VENV)/share/fxgate/bin/weed
SEAWEEDFS_STAMP   := $(VENV)/share/fxgate/seaweedfs-$(SEAWEEDFS_VERSION).stamp

# The full soak (issue 3): at least 20 daemon SIGKILLs, 5 broker restarts, 50 connection flaps
# per QoS; with a route upstream, also 50 upstream flaps and 10 SIGKILLs of the forward process.
# Results go to bench/results/soak-*.json. `make test` runs a short schedule, each soak at one QoS.
SOAK_KILLS    ?= 20
SOAK_RESTARTS ?= 5
SOAK_FLAPS    ?= 50
SOAK_FORWARD_KILLS ?= 10
# The daemon on a standalone Spark master killed at each of three moments (`make test`: one).
CLUSTER_FAULTS ?= 3

.PHONY: install dist demo spark test lint format bench soak docs system-deps deps delta-jars \
	brokers clean mosquitto-deps java-runtime jdk maven node go

install: $(INSTALL_STAMP)

# `pip wheel` builds fxgate's own wheel alone (--no-deps); `pip install dist/fxgate-*.whl` on the
# gateway fetches the pinned dependencies. build/ first: setuptools would put a module deleted
# since the last build, left there, into the wheel.
dist: $(VENV)/bin/python
	rm -rf build
	$(VENV)/bin/pip wheel -q --no-deps --wheel-dir dist .
	@ls dist/*.whl

# The demo needs the light install and a broker; the JVM and Go brokers only when asked for.
DEMO_BROKER_mosquitto := mosquitto-deps
DEMO_BROKER_hivemq    := mosquitto-deps $(HIVEMQ_LAUNCHER)
DEMO_BROKER_mochi     := mosquitto-deps $(MOCHI_BIN)
demo: $(INSTALL_STAMP) $(DEMO_BROKER_$(BROKER))
	$(VENV)/bin/fxgate demo --broker $(BROKER)

spark: $(SPARK_STAMP) $(DELTA_JARS) $(CDS_ARCHIVE)

test: deps lint
	$(VENV)/bin/pytest $(PYTEST_ARGS)

# The documentation site (docs/mkdocs.yml) into docs/site, in strict mode: a broken link, an
# anchor that is not there or a page outside the navigation fails the build. The configuration
# reference is generated from the schema first, and the benchmark plots are copied beside their
# page (tests/docs/test_site.py builds the same way).
DOCS_PLOTS := docs/pages/benchmarks/plots
docs: $(STAMP)
	$(VENV)/bin/python -m actors.config.reference --write docs/pages/reference/configuration.md
	rm -rf $(DOCS_PLOTS) && mkdir -p $(DOCS_PLOTS) && cp bench/results/*.png $(DOCS_PLOTS)/
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict -f docs/mkdocs.yml

BENCH_STAMP := $(VENV)/.bench-stamp
$(BENCH_STAMP): $(STAMP)
	$(VENV)/bin/pip install -q -e '.[spark,test,bench]'
	touch $(BENCH_STAMP)

# Benchmarks run baseline and fxgate alternately in one run and report medians and ratios;
# results and the table (bench/results/README-table.md) in bench/results/ (issue 5).
bench: deps $(BENCH_STAMP)
	$(VENV)/bin/python -m bench.run $(BENCH_ARGS)

soak: deps
	FXGATE_SOAK_KILLS=$(SOAK_KILLS) FXGATE_SOAK_BROKER_RESTARTS=$(SOAK_RESTARTS) \
	FXGATE_SOAK_FLAPS=$(SOAK_FLAPS) FXGATE_SOAK_FORWARD_KILLS=$(SOAK_FORWARD_KILLS) \
	FXGATE_SOAK_QOS=1,2 FXGATE_SOAK_RESULTS=bench/results FXGATE_CLUSTER_FAULTS=$(CLUSTER_FAULTS) \
	$(VENV)/bin/pytest -p no:cacheprovider -s tests/soak \
		tests/spark/test_cluster.py::test_a_daemon_on_a_standalone_master_lands_through_its_worker_and_sigkills_lose_no_read

lint: $(STAMP)
	$(RUFF) check --config .ci/ruff.toml actors persistence spark tests bench
	$(RUFF) format --check --config .ci/ruff.toml actors persistence spark tests bench

format: $(STAMP)
	$(RUFF) format --config .ci/ruff.toml actors persistence spark tests bench
	$(RUFF) check --fix --config .ci/ruff.toml actors persistence spark tests bench

deps: system-deps $(STAMP) $(DELTA_JARS) $(CDS_ARCHIVE) $(HIVEMQ_LAUNCHER) $(MOCHI_BIN) $(AZURITE_MAIN) \
	$(SEAWEEDFS_STAMP)

delta-jars: $(DELTA_JARS)

# All in one recipe (a grouped target): any missing jar fetches the set again, and jars of another
# release are removed so that the directory holds exactly what is pinned.
$(DELTA_JARS) &: | maven
	mkdir -p $(DELTA_JARS_DIR)
	rm -f $(DELTA_JARS_DIR)/delta-*.jar
	for artifact in $(DELTA_ARTIFACTS); do \
		$(MVN) dependency:copy -Dartifact=$$artifact:$(DELTA_VERSION) \
			-DoutputDirectory=$(DELTA_JARS_DIR) || exit 1; \
	done

# The test brokers beside mosquitto (variables above).
brokers: $(HIVEMQ_LAUNCHER) $(MOCHI_BIN)

$(HIVEMQ_LAUNCHER): $(HIVEMQ_SOURCES)/pom.xml $(HIVEMQ_SOURCES)/FxgateHiveMQ.java | maven jdk $(INSTALL_STAMP)
	rm -rf $(HIVEMQ_DIR)
	$(MVN) -f $(HIVEMQ_SOURCES)/pom.xml dependency:copy-dependencies \
		-DoutputDirectory=$(abspath $(HIVEMQ_DIR))/lib
	mkdir -p $(HIVEMQ_DIR)/launcher
	javac -d $(HIVEMQ_DIR)/launcher -cp '$(HIVEMQ_DIR)/lib/*' $(HIVEMQ_SOURCES)/FxgateHiveMQ.java

$(MOCHI_BIN): $(MOCHI_SOURCES)/main.go $(MOCHI_SOURCES)/go.mod $(MOCHI_SOURCES)/go.sum | go $(INSTALL_STAMP)
	mkdir -p $(dir $(MOCHI_BIN))
	cd $(MOCHI_SOURCES) && GOFLAGS=-mod=readonly go build -o $(abspath $(MOCHI_BIN)) .

$(SEAWEEDFS_STAMP): | go $(INSTALL_STAMP)
	mkdir -p $(dir $(SEAWEEDFS_BIN))
	module=$$(go mod download -json github.com/seaweedfs/seaweedfs@$(SEAWEEDFS_VERSION) \
		| $(VENV)/bin/python -c 'import json, sys; print(json.load(sys.stdin)["Dir"])') \
		&& cd "$$module" && go build -trimpath -ldflags='-s -w' \
		-o $(abspath $(SEAWEEDFS_BIN)).tmp ./weed
	mv $(SEAWEEDFS_BIN).tmp $(SEAWEEDFS_BIN)
	rm -f $(VENV)/share/fxgate/seaweedfs-*.stamp
	touch $(SEAWEEDFS_STAMP)

# `npm ci` installs exactly the lock file's packages; Azurite's declared engine (Node.js 22) is
# newer than Debian 12's Node.js 20, on which its Blob service runs (the tests say so).
$(AZURITE_MAIN): $(AZURITE_SOURCES)/package.json $(AZURITE_SOURCES)/package-lock.json | node $(INSTALL_STAMP)
	rm -rf $(AZURITE_DIR)
	mkdir -p $(AZURITE_DIR)
	cp $(AZURITE_SOURCES)/package.json $(AZURITE_SOURCES)/package-lock.json $(AZURITE_DIR)/
	cd $(AZURITE_DIR) && npm ci --omit=dev --no-audit --no-fund --ignore-scripts --loglevel=error
	touch $(AZURITE_MAIN)

# The Spark JVM's class data archive (spark/cds.py): made once per install, mapped by every
# JVM start after it (Spark ready in about 3 s instead of 4-6). Without it everything works,
# only slower to start, so a failure to make it is said and does not stop the install. Made
# after the Delta jars, from a session that has them, so that their classes are in it too;
# new jars make it again.
$(CDS_ARCHIVE): $(SPARK_STAMP) $(DELTA_JARS) | java-runtime
	$(VENV)/bin/python -m spark.cds_archive $(CDS_ARCHIVE) || echo "continuing without the class data archive"

# Debian packages, each only when the command it provides is missing: mosquitto and its clients
# (the demo's broker, the tests'); a Java 17 runtime when no `java` is on the PATH (Spark, the
# JVM brokers); a JDK when no `javac` is (it compiles HiveMQ's launcher); Maven (which fetches
# the Delta jars and HiveMQ) when no `mvn` is; Node.js and npm (Azurite). Go is not installed
# here: Debian's is older than Mochi's go.mod asks for; a missing `go` stops with what to do.
APT_GET_MISSING = if [ -n "$$missing" ]; then \
		echo "installing Debian packages:$$missing"; \
		$(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends \
			$$missing; \
	fi

mosquitto-deps:
	@missing=""; \
	{ command -v mosquitto >/dev/null || [ -x /usr/sbin/mosquitto ]; } || missing="$$missing mosquitto"; \
	command -v mosquitto_pub >/dev/null || missing="$$missing mosquitto-clients"; \
	$(APT_GET_MISSING)

java-runtime:
	@missing=""; command -v java >/dev/null || missing=" openjdk-17-jre-headless"; $(APT_GET_MISSING)

jdk: java-runtime
	@missing=""; command -v javac >/dev/null || missing=" openjdk-17-jdk-headless"; $(APT_GET_MISSING)

maven: java-runtime
	@missing=""; command -v mvn >/dev/null || missing=" maven"; $(APT_GET_MISSING)

node:
	@missing=""; command -v node >/dev/null || missing="$$missing nodejs"; \
	command -v npm >/dev/null || missing="$$missing npm"; \
	$(APT_GET_MISSING)

go:
	@command -v go >/dev/null || { echo "Go is missing: Mochi MQTT and SeaweedFS, test tools, \
	are built with the Go in $(MOCHI_SOURCES)/go.mod or newer (https://go.dev/doc/install)"; exit 1; }

# Everything the test suite starts.
system-deps: mosquitto-deps java-runtime jdk maven node go

# The gateway's virtualenv: fxgate and what `fxgate run` needs (setup.cfg's install_requires).
# Editable, as the other layers: the checkout is the installation (docs: operating/systemd).
$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

$(INSTALL_STAMP): setup.cfg pyproject.toml | $(VENV)/bin/python
	$(VENV)/bin/pip install -q -e .
	touch $(INSTALL_STAMP)

$(SPARK_STAMP): $(INSTALL_STAMP)
	$(VENV)/bin/pip install -q -e '.[spark]'
	touch $(SPARK_STAMP)

$(STAMP): $(SPARK_STAMP)
	$(VENV)/bin/pip install -q -e '.[spark,test]'
	touch $(STAMP)

clean:
	rm -rf $(VENV) .demo build dist *.egg-info .pytest_cache .ruff_cache docs/site $(DOCS_PLOTS)
