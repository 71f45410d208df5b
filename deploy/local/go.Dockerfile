# The Go builder stage's base (GO_IMAGE of deploy/Dockerfile) where
# golang:1.26-bookworm cannot be pulled: the local Debian base plus the Go
# distribution as the Go module proxy serves it (golang.org/toolchain, the
# module GOTOOLCHAIN downloads). The build context is that module's folder.
# Laid out as the golang image is: GOROOT /usr/local/go, GOPATH /go.
ARG BASE_IMAGE
FROM ${BASE_IMAGE} AS toolchain
COPY . /usr/local/go
# Module zips keep no modes: the commands become executable again, as the
# go command itself does when it switches toolchains.
RUN chmod -R u+w,a+rX /usr/local/go \
 && chmod a+x /usr/local/go/bin/* /usr/local/go/pkg/tool/*/*

FROM ${BASE_IMAGE}
COPY --from=toolchain /usr/local/go /usr/local/go
ENV GOPATH=/go \
    PATH=/go/bin:/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
WORKDIR /go
RUN go version
