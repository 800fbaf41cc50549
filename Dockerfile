# One image, one binary: sluice (controller, csi, sidecar, run).
# The toolchain go.mod names (its toolchain line): the golang image sets GOTOOLCHAIN=local,
# which builds with the image's own Go whatever go.mod says (golang:1.26 gave 1.26.8, with
# standard-library vulnerabilities go1.26.10 fixes). The tag pins that version, and
# GOTOOLCHAIN=auto fetches go.mod's toolchain should the tag ever lag behind it
# (cmd/sluice TestImageBuildsWithGoModsToolchain keeps them equal).
FROM golang:1.26.10 AS build
ENV GOTOOLCHAIN=auto
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/sluice ./cmd/sluice

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/sluice /usr/local/bin/sluice
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/sluice"]
