# syntax=docker/dockerfile:1
#
# The weft image: the binary /usr/local/bin/weft, whose subcommand each Deployment or DaemonSet in
# deploy/ picks through `args:` (scheduler-extender, controller, agent, webhook, install-cni), and the
# CNI plugin /usr/local/bin/weft-cni, which the SR-IOV component's init container copies onto the
# node (`weft install-cni`; docs/sriov.md, "Deploy").
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
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
WORKDIR /src
# rust-toolchain.toml pins the exact toolchain; install it if the image's differs (a no-op if not).
COPY rust-toolchain.toml ./
RUN rustup toolchain install
COPY Cargo.toml Cargo.lock ./
COPY crates ./crates
# Caches survive between builds (BuildKit); the binaries are copied out of the cached target dir.
# weft-cni runs on the host, not in this image, so it is linked statically (glibc's crt-static): it
# then needs nothing of the host's C library, whatever its version. It is built for the host triple
# named explicitly, so RUSTFLAGS reach only it and not the build scripts and proc macros.
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked -p weft --features nvml \
    && install -D -m 0755 target/release/weft /out/weft \
    && triple="$(rustc -vV | sed -n 's/^host: //p')" \
    && RUSTFLAGS="-C target-feature=+crt-static" \
       cargo build --release --locked -p weft-cni --target "$triple" \
    && install -D -m 0755 "target/$triple/release/weft-cni" /out/weft-cni
# The release profile keeps debug info (profile.release debug = 1: ~380 MB for weft). The image
# ships the binaries stripped (~70 MB for weft); their debug info goes to the `symbols` stage,
# linked by build ID and by .gnu_debuglink, for users who need symbols (docs/deploy.md, "Image").
RUN for b in weft weft-cni; do \
      objcopy --only-keep-debug "/out/$b" "/out/$b.debug" \
      && objcopy --strip-debug --strip-unneeded --add-gnu-debuglink="/out/$b.debug" "/out/$b"; \
    done

# `docker build --target symbols --output type=local,dest=./weft-symbols .` writes weft.debug and
# weft-cni.debug, the debug info of exactly the binaries in the image built from the same sources.
FROM scratch AS symbols
COPY --from=build /out/weft.debug /out/weft-cni.debug /

FROM ${RUNTIME_IMAGE}
LABEL org.opencontainers.image.title="weft" \
      org.opencontainers.image.description="GPU topology-aware placement and wiring for Kubernetes" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/weft /usr/local/bin/weft
COPY --from=build /out/weft-cni /usr/local/bin/weft-cni
# distroless' nonroot user; the node agent's DaemonSet overrides it (docs/deploy.md).
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/weft"]
CMD ["--help"]
