// Package compose runs compose.yaml on a real Docker engine: the whole stack
// as a developer starts it with `docker compose up`, under a project name of
// its own (n8nbrain-composetest) on free loopback ports, so it never touches
// a developer's stack. `make compose-test` builds the images and runs it
// (`go test -tags compose ./tests/compose/`).
//
// Images: deploy/local/images.env by default (the local images
// deploy/images-local.sh builds); COMPOSE_TEST_IMAGES names another env
// file, or "upstream" for compose's defaults on a machine that can pull.
// Every request goes to 127.0.0.1 and the containers this test started.
package compose
