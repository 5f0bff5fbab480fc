# syntax=docker/dockerfile:1
#
# The weft image: one binary, /usr/local/bin/weft; each Deployment or DaemonSet in deploy/ picks its
# subcommand through `args:` (scheduler-extender, controller, agent, webhook).
#
#   docker build -t registry.example.com/platform/weft:0.1.0 .
#
# Build it where a Docker engine and crates.io are reachable; the project's CI machines have neither
# engine nor registry access for images, so CI lints this file's manifests but does not build it
# (docs/deploy.md, "Image").
#
# NVML: built with the `nvml` feature, but libnvidia-ml.so.1 is NOT in the image. nvml-wrapper opens
# it at run time (dlopen), and the NVIDIA container toolkit mounts the host driver's copy into the
# node agent's container (NVIDIA_VISIBLE_DEVICES / RuntimeClass nvidia). Without it the binary runs
# and reports that NVML is unavailable; every other component never loads it.

ARG RUST_IMAGE=rust:1.95-bookworm
# glibc of Debian 12, like the builder, plus libgcc_s; no shell, no package manager; UID 65532.
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot

FROM ${RUST_IMAGE} AS build
WORKDIR /src
# rust-toolchain.toml pins the exact toolchain; install it if the image's differs (a no-op if not).
COPY rust-toolchain.toml ./
RUN rustup toolchain install
COPY Cargo.toml Cargo.lock ./
COPY crates ./crates
# Caches survive between builds (BuildKit); the binary is copied out of the cached target dir.
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked -p weft --features nvml \
    && install -D -m 0755 target/release/weft /out/weft

FROM ${RUNTIME_IMAGE}
LABEL org.opencontainers.image.title="weft" \
      org.opencontainers.image.description="GPU topology-aware placement and wiring for Kubernetes" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/weft /usr/local/bin/weft
# distroless' nonroot user; the node agent's DaemonSet overrides it (docs/deploy.md).
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/weft"]
CMD ["--help"]
