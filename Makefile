# The README's two commands are `make dev` and `make test`; .ci/run calls `make test`.
GO ?= go
PKGS := ./...

.PHONY: dev test test-short e2e lint verify build bench bench-placement fuzz

## dev: start the development stack (Postgres in .data/pg, embedded NATS, 2 brain replicas, client-zero's edge)
dev:
	@deploy/ensure-postgres.sh
	$(GO) build -o bin/devstack ./deploy/cmd/devstack
	@# exec, not go run: go run exits 1 after Ctrl-C, which make reports as an error.
	@exec bin/devstack up -pg-port $(PG_PORT)

# PG_PORT: the port of the cluster in .data/pg, for make dev, test, e2e and bench
# (.ci/run picks a free one when another checkout's cluster holds the default).
PG_PORT ?= 55432

# NORACE_TESTS are the tests that mean nothing under -race (they measure
# whether a flood outruns a replica): they skip there, saying so, and run
# again without it.
NORACE_TESTS := TestAPIFloodFromManyConnectionsDoesNotStallOtherTenants

## test: the whole suite against a real local Postgres and embedded NATS (what CI runs)
test:
	@deploy/ensure-postgres.sh
	@pg="$$($(GO) run ./deploy/cmd/devstack pg-env -pg-port $(PG_PORT))" && eval "$$pg" && $(GO) test -race -count=1 -timeout 25m $(PKGS) && \
		$(GO) test -count=1 -timeout 5m -run '^($(NORACE_TESTS))$$' -v ./tests/

## e2e: the shipped n8n workflows in a real n8n (from npm) with a real IMAP (dovecot) and SMTP server, alone (README "n8n")
e2e:
	@deploy/ensure-postgres.sh
	@tests/e2e/setup.sh
	@pg="$$($(GO) run ./deploy/cmd/devstack pg-env -pg-port $(PG_PORT))" && eval "$$pg" && $(GO) test -tags e2e -count=1 -v -timeout 30m ./tests/e2e/

## test-short: the tests that need no Postgres (the others skip and say so)
test-short:
	$(GO) test -short -count=1 $(PKGS)

## lint: vet, staticcheck (pinned, fetched by go run) and formatting
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
lint:
	$(GO) vet $(PKGS)
	$(GO) run $(STATICCHECK) -tags e2e,compose $(PKGS)
	@out="$$(gofmt -l .)"; if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

## verify: lint, and fail on any diff after go mod tidy
verify: lint
	$(GO) mod tidy
	git diff --exit-code go.mod go.sum

## build: the binaries into bin/ (brain, brain-eval, edge, devstack, brainctl)
build:
	$(GO) build -o bin/ ./brain/cmd/brain ./brain/cmd/brain-eval ./edge/cmd/edge ./deploy/cmd/devstack ./provision/cmd/brainctl

## bench: the turn, scale and NATS-cluster benchmarks and the LangGraph baseline of BENCHMARKS.md, with a summary (not part of test/CI)
bench:
	@PG_PORT=$(PG_PORT) tests/bench/run.sh

## bench-placement: the turn and the LangGraph baseline with Postgres sharing the cores and on a core of its own, rounds interleaved (BENCHMARKS.md; needs root, not part of test/CI)
bench-placement:
	@PG_PORT=$(PG_PORT) tests/bench/placement.sh

## fuzz: run each fuzz target for a while (FUZZTIME=30s by default)
FUZZTIME ?= 30s
fuzz:
	$(GO) test -run '^$$' -fuzz FuzzDecodeTurnSubmitRequest -fuzztime $(FUZZTIME) ./wire/
	$(GO) test -run '^$$' -fuzz FuzzScannerMatchesTheTokenWalk -fuzztime $(FUZZTIME) ./wire/
	$(GO) test -run '^$$' -fuzz FuzzTurnSubmitDecode -fuzztime $(FUZZTIME) ./edge/

## compose-config: validate compose.yaml and its NATS cluster override (needs the docker compose plugin, not a running daemon)
.PHONY: compose-config compose-images compose-test
compose-config:
	docker compose config -q
	docker compose -f compose.yaml -f deploy/compose.nats-cluster.yaml config -q

## compose-images: the Docker engine and compose plugin when missing, then the local images of deploy/local/images.env (deploy/images-local.sh)
compose-images:
	@deploy/ensure-docker.sh
	@deploy/images-local.sh

## compose-test: `docker compose up` of the whole stack on the local images, under its own project name (tests/compose; CI runs it)
compose-test: compose-images
	$(GO) test -tags compose -count=1 -timeout 45m -v ./tests/compose/

## compose-config-observability: validate compose.yaml with the observability override (README "Observability")
.PHONY: compose-config-observability
compose-config-observability:
	docker compose -f compose.yaml -f deploy/compose.observability.yaml --profile observability config -q
