# syntax=docker/dockerfile:1
# toolgate image: the sidecar and the admission webhook are the same binary.
#
#   docker build -t toolgate:0.1.0 .
#   docker build --target e2e -t toolgate:e2e .    # plus the fake tool, for deploy/kind/e2e.sh
#
# The runtime image is distroless (glibc, CA certificates, no shell) and runs as uid 65532.

FROM rust:1.95-slim-bookworm AS builder
WORKDIR /src
# The image's toolchain builds the release (Cargo.toml's rust-version holds the minimum);
# .dockerignore leaves rust-toolchain.toml out so no other toolchain is downloaded.
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin toolgate \
    && install -D -m 0755 target/release/toolgate /out/toolgate

# The integration tests' fake tool as a process (examples/fake_tool.rs): the kind test's sample
# tools (deploy/kind/sample-tools.yaml). Built only for the e2e target.
FROM builder AS e2e-builder
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --example fake_tool \
    && install -D -m 0755 target/release/examples/fake_tool /out/fake_tool

# The kind test's image: toolgate and, at /usr/local/bin/fake_tool, the fake tool.
FROM gcr.io/distroless/cc-debian12:nonroot AS e2e
COPY --from=builder /out/toolgate /usr/local/bin/toolgate
COPY --from=e2e-builder /out/fake_tool /usr/local/bin/fake_tool
USER 65532:65532
EXPOSE 15001 15002 15090 8443
ENTRYPOINT ["/usr/local/bin/toolgate"]
CMD ["serve", "--config", "/etc/toolgate/toolgate.yaml"]

# The release image (the default target): toolgate only.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=builder /out/toolgate /usr/local/bin/toolgate
USER 65532:65532
# agent, admin, telemetry (sidecar); 8443 (injector)
EXPOSE 15001 15002 15090 8443
ENTRYPOINT ["/usr/local/bin/toolgate"]
CMD ["serve", "--config", "/etc/toolgate/toolgate.yaml"]
