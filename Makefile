# plonedeploy: one entry point for building, running, load-testing and testing the stack.
#
#   make demo    fresh machine -> build, start, create the site, A/B load test (DEMO_AB_ARGS: 2 rounds,
#                each an A/B and an A/A control run of 10 s warm-up + 20 s measured), report, stop
#   make test    unit tests, real buildouts of the recipe, and the end-to-end integration test
#
# Other targets: canary (CANARY_RELEASE=<other build>: a canary deploy judged, docs/explanation/canary.md),
# canarybench (its sensitivity benchmark, CANARY_BENCH_ARGS),
# multihost (Ansible over SSH into four network namespaces), blobbench (the
# matrix's blob preset: blob-sendfile on/off, direct and through HAProxy, needs wrk), matrix (benchmark matrix of the
# WSGI servers, needs wrk and the running stack; docs/how-to/benchmarks.md), storagebench (ZEO vs RelStorage
# on stacks of its own, needs wrk and PostgreSQL 15; docs/how-to/benchmarks.md), system, venv, ansible-venv, build, start, site, status, ab, stop, pins, clean.
# Load tools: python -m loadtests <subcommand> (python -m loadtests --help; docs/reference/loadtests.md).
# Variables: AB_ARGS (passed to python -m loadtests ab, e.g. AB_ARGS="--rounds 6 --duration 30 --control";
#            make demo uses DEMO_AB_ARGS unless AB_ARGS is given;
#            AB_ARGS="--balance leastconn,roundrobin" compares HAProxy balance modes),
#            PYTEST_ARGS (passed to pytest, e.g. PYTEST_ARGS="-m 'not integration'"), PYTEST_WORKERS (make test's xdist workers, 2),
#            BLOBBENCH_ARGS (passed to python -m loadtests blob, e.g. BLOBBENCH_ARGS="--runs 1 --connections 1,8"),
#            MATRIX_ARGS (passed to python -m loadtests matrix, e.g. MATRIX_ARGS="--quick" or "--resume var/reports/matrix-<ts>").
#            STORAGEBENCH_ARGS (passed to python -m loadtests storage, e.g. STORAGEBENCH_ARGS="--rounds 1 --paths /Plone,write").
#            STORAGE (zeo or relstorage: the config make build uses, buildout.cfg or relstorage.cfg),
#            MULTIHOST_STORAGE (zeo or relstorage: the storage make multihost deploys),
#            SERVICE_USER (who runs ZEO and the ZEO clients when started as root: plonedeploy as
#            root, empty otherwise; SERVICE_USER= runs everything as root), BALANCER_USER, VARNISH_JAIL.

PYTHON ?= python3
# .venv: tests, Locust, reports; .venv-buildout: zc.buildout alone (see docs/how-to/pins.md)
VENV := .venv
BUILDOUT_VENV := .venv-buildout
# make ab: 4 rounds with swapped slots, each also as A/A control (7.5 minutes, measured 23 Nov 2026: docs/results.md);
# make demo: 2 rounds of 20 s (about 4 minutes), intervals all the same (docs/tutorial/ab-report.md).
AB_ARGS ?= --rounds 4 --duration 30 --warmup 10 --control --users 10 --spawn-rate 10
DEMO_AB_ARGS ?= --rounds 2 --duration 20 --warmup 10 --control --users 10 --spawn-rate 10
PYTEST_ARGS ?=
# make test: two pytest-xdist workers, one per group of tests/conftest.py (the buildout stack;
# the Ansible converge, RelStorage and the recipe's buildouts); PYTEST_ARGS="-n 0" runs serially.
PYTEST_WORKERS ?= 2
BLOBBENCH_ARGS ?=
MATRIX_ARGS ?=
STORAGEBENCH_ARGS ?=
# Buildout's download cache: scripts/fetch_eggs.py fills DOWNLOAD_CACHE/dist with every pin
# of versions.cfg (pip download, in parallel) and installs the wheels into eggs/v5 (buildout's
# installer, in parallel); bin/buildout then installs only from there (install-from-cache).
# Point it at a directory shared by several checkouts to download each file once.
DOWNLOAD_CACHE ?= var/download-cache
# The storage of the stack make build configures: zeo (buildout.cfg) or relstorage
# (relstorage.cfg: PostgreSQL in var/postgresql instead of the ZEO server; docs/how-to/relstorage.md),
# e.g. make demo STORAGE=relstorage. The other targets use whatever the last build made.
STORAGE ?= zeo
# make multihost: zeo (inventories/multihost) or relstorage (inventories/multihost-relstorage:
# PostgreSQL on its own host). Not STORAGE: that would build this checkout for relstorage too.
MULTIHOST_STORAGE ?= zeo
BUILDOUT_CFG_zeo := buildout.cfg
BUILDOUT_CFG_relstorage := relstorage.cfg
BUILDOUT_CFG = $(or $(BUILDOUT_CFG_$(STORAGE)),$(error STORAGE=$(STORAGE) is invalid: expected zeo or relstorage))
# Who runs the ZEO server and the ZEO clients when bin/stack runs as root ([service] user of
# buildout.cfg, which [stack] and every client read; docs/how-to/operate.md "Users"): as root,
# plonedeploy, a system user make service-user creates once; not root, empty: everything runs
# as the invoking user, unchanged. Every ZEO client's script (bin/instance run for make site,
# the load tools' extra clients) drops to it when root starts it, so the blobs it writes are
# the ZEO server's user's. SERVICE_USER= (empty) builds without it: everything as root, with
# a warning from bin/stack. BALANCER_USER: who HAProxy runs as after binding its ports
# (Debian's haproxy, which make system's package makes; [haproxy] chroot = auto then confines
# it to the empty parts/haproxy/empty), and VARNISH_JAIL: unix (varnishd's cache process as
# Debian's vcache, its exporter as varnishlog), both with a service user only.
SERVICE_USER ?= $(if $(filter 0,$(shell id -u)),plonedeploy)
BALANCER_USER ?= $(if $(SERVICE_USER),haproxy)
VARNISH_JAIL ?= $(if $(SERVICE_USER),unix,none)

.PHONY: demo test multihost blobbench headline matrix storagebench system service-user venv ansible-venv build start site status ab canary canarybench stop pins clean

demo: system build
	@# Whatever happens, stop what was started (by PID).
	@set -e; trap '$(MAKE) --no-print-directory stop' EXIT; \
	  $(MAKE) --no-print-directory start; \
	  $(MAKE) --no-print-directory ab $(if $(filter command line environment,$(origin AB_ARGS)),,AB_ARGS="$(DEMO_AB_ARGS)")

test: system build ansible-venv
	$(VENV)/bin/pytest -n $(PYTEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

system:
	bash scripts/install-system.sh

venv: $(VENV)/.installed

# The kit's own distributions, editable (their sources stay the checkout's): the load tools
# and the tests import plonedeploy.stack, .recipe and .runtime as installed packages.
# --no-deps: their requirements are pinned in requirements.txt; --no-build-isolation: built
# with this venv's pinned setuptools (docs/explanation/architecture.md, "Packages").
KIT_DISTRIBUTIONS := -e recipes/plonedeploy.runtime -e recipes/plonedeploy.recipe

$(VENV)/.installed: requirements.txt constraints.txt recipes/plonedeploy.recipe/setup.py recipes/plonedeploy.runtime/setup.py
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip==$$(sed -n 's/^pip==//p' requirements.txt)
	$(VENV)/bin/pip install --quiet -r requirements.txt -c constraints.txt
	$(VENV)/bin/pip install --quiet --no-deps --no-build-isolation $(KIT_DISTRIBUTIONS)
	touch $@

ansible-venv: ansible/.venv/.installed

# The filter plugins import plonedeploy.recipe's and plonedeploy.stack's plain-Python rules
# (edge, storage, tls, rules) from this venv: the recipe's distribution, editable, without its
# buildout requirements (--no-deps), built with setuptools of its own (pip's build isolation).
ansible/.venv/.installed: ansible/requirements.txt ansible/constraints.txt recipes/plonedeploy.recipe/setup.py
	$(PYTHON) -m venv ansible/.venv
	ansible/.venv/bin/pip install --quiet -r ansible/requirements.txt -c ansible/constraints.txt
	ansible/.venv/bin/pip install --quiet --no-deps -e recipes/plonedeploy.recipe
	touch $@

$(BUILDOUT_VENV)/.installed: requirements-buildout.txt
	$(PYTHON) -m venv $(BUILDOUT_VENV)
	$(BUILDOUT_VENV)/bin/pip install --quiet -r requirements-buildout.txt
	touch $@

# The service user: a system account with no home, no shell and no password (useradd
# --system --user-group). Idempotent: an existing user is left as it is.
service-user:
	@if [ -n "$(SERVICE_USER)" ]; then \
	  if getent passwd "$(SERVICE_USER)" >/dev/null; then echo "service user: $(SERVICE_USER) exists"; \
	  else useradd --system --user-group --home-dir /nonexistent --no-create-home --shell /usr/sbin/nologin \
	    --comment "plonedeploy services (ZEO, Zope)" "$(SERVICE_USER)" && \
	    echo "service user: created system user $(SERVICE_USER) (runs ZEO and the ZEO clients)"; fi; fi

build: venv $(BUILDOUT_VENV)/.installed service-user
	@# Buildout runs pip once per egg: no pip self-check (a PyPI request) in those runs.
	@start=$$(date +%s); export PIP_DISABLE_PIP_VERSION_CHECK=1; \
	  $(BUILDOUT_VENV)/bin/python scripts/fetch_eggs.py --cache $(DOWNLOAD_CACHE) --eggs-directory eggs/v5 && \
	  fetched=$$(date +%s) && \
	  $(BUILDOUT_VENV)/bin/buildout -c $(BUILDOUT_CFG) buildout:download-cache=$(DOWNLOAD_CACHE) buildout:install-from-cache=true \
	    service:user=$(SERVICE_USER) service:balancer-user=$(BALANCER_USER) \
	    service:varnish-jail=$(VARNISH_JAIL) && \
	  mkdir -p var && echo "$(abspath $(BUILDOUT_CFG))" > var/buildout-config && \
	  echo "build finished in $$(( $$(date +%s) - start )) s (fetch_eggs $$(( fetched - start )) s, bin/buildout $$(( $$(date +%s) - fetched )) s)"

start:
	@start=$$(date +%s); bin/stack start --no-wait-up && \
	  echo "stack started in $$(( $$(date +%s) - start )) s"
	@start=$$(date +%s); $(MAKE) --no-print-directory site && \
	  echo "site step finished in $$(( $$(date +%s) - start )) s"
	bin/stack wait-up

site:
	@# PLONEDEPLOY_EDITORS=on make site: also the logged-in load test's editors and documents.
	bin/instance run scripts/create_site.py

status:
	bin/stack status

ab:
	$(VENV)/bin/python -m loadtests ab $(AB_ARGS)

# A canary deploy of another build of this site (its var a link to this checkout's var) on the
# running stack, under Locust load, judged; the canary goes back onto this build at the end.
# The load tools' .venv runs it, not bin/stack: the judge and Locust are not in the build's Python
# (docs/explanation/canary.md#a-local-canary-deploy).
canary:
	@test -n "$(CANARY_RELEASE)" || { echo "make canary CANARY_RELEASE=<other build directory> [CANARY_ARGS=...]" >&2; exit 2; }
	$(VENV)/bin/python -m loadtests canary-deploy $(CANARY_RELEASE) $(CANARY_ARGS)

# The canary's sensitivity benchmark (7-10 minutes per release here; docs/explanation/canary.md#sensitivity).
canarybench:
	$(VENV)/bin/python -m loadtests canary-bench $(CANARY_BENCH_ARGS)

stop:
	@if [ -x bin/stack ]; then bin/stack stop; fi

multihost: build ansible-venv
	cd tests && ../$(VENV)/bin/python -m multihost --storage $(MULTIHOST_STORAGE)

blobbench:
	$(VENV)/bin/python -m loadtests blob $(BLOBBENCH_ARGS)

headline:
	$(VENV)/bin/python -m loadtests headline $(HEADLINE_ARGS)

matrix:
	$(VENV)/bin/python -m loadtests matrix $(MATRIX_ARGS)

# ZEO vs RelStorage on stacks of its own (var/storagebench, ports 9700-9744; no running
# stack needed; docs/results.md, 27 November 2026, "Measured"): about 30 minutes on 2 cores, 53 on a busy machine.
storagebench: build
	$(VENV)/bin/python -m loadtests storage $(STORAGEBENCH_ARGS)

pins: venv $(BUILDOUT_VENV)/.installed
	$(VENV)/bin/python scripts/update_pins.py

clean: stop
	rm -rf bin develop-eggs parts .installed.cfg
