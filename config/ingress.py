"""What each ingress controller needs to carry a long streamed completion. Facts from the
controllers' sources (ingress-nginx dbb11b92 internal/ingress/controller/config/config.go,
traefik fd5a576d pkg/provider/kubernetes/ingress), summarised in docs/exposure.md."""

from __future__ import annotations

from typing import TYPE_CHECKING

from common.quantity import MIB, parse_quantity

if TYPE_CHECKING:
    from config.types import Exposure

NGINX = "nginx.ingress.kubernetes.io"


TRAEFIK_MIDDLEWARES = "traefik.ingress.kubernetes.io/router.middlewares"
# ingress-nginx's allowlist under both its names (the newer one is read first,
# internal/ingress/annotations/ipallowlist): only exposure.source_ranges may set them.
SOURCE_RANGE_ANNOTATIONS = (f"{NGINX}/whitelist-source-range", f"{NGINX}/allowlist-source-range")


def source_middleware(server: str) -> str:
    """The Traefik Middleware admitting only exposure.source_ranges to a server's Ingress."""
    return f"{server}-sources"


def controller_annotations(kind: str, exposure: "Exposure", namespace: str, server: str) -> dict[str, str]:
    """The Ingress annotations the program sets for this controller (they win over the user's)."""
    if kind == "ingress-nginx":
        body_mib = -(-int(parse_quantity(exposure.max_body)) // MIB)
        sources = {}
        if exposure.source_ranges is not None:
            # The older name: every ingress-nginx release reads it (allowlist-source-range, the new
            # one, is an alias only in recent ones; internal/ingress/annotations/ipallowlist).
            sources = {SOURCE_RANGE_ANNOTATIONS[0]: ",".join(exposure.source_ranges)}
        return {
            **sources,
            # Defaults 60 s: the gap between two reads; the first token of a long prompt (or a whole
            # non-streamed answer) can take longer than that.
            f"{NGINX}/proxy-read-timeout": str(exposure.timeout_seconds),
            f"{NGINX}/proxy-send-timeout": str(exposure.timeout_seconds),
            # Default "1m": a long chat history or a pasted document is larger.
            f"{NGINX}/proxy-body-size": f"{body_mib}m",
            # Off already by default; stated so that a cluster-wide "on" cannot hold back the stream.
            f"{NGINX}/proxy-buffering": "off",
            # Default "on": the whole body is spooled before the server sees the request.
            f"{NGINX}/proxy-request-buffering": "off",
        }
    # Traefik streams responses (flushes every 100 ms, SSE at once) and has no body limit unless a
    # Buffering middleware sets one; it has no per-Ingress timeout annotation. Its entrypoint's
    # 60 s readTimeout bounds reading the request only (an upload slower than that), not the answer.
    if kind == "traefik" and exposure.source_ranges is not None:
        # A CRD middleware is referred to as <namespace>-<name>@kubernetescrd.
        return {TRAEFIK_MIDDLEWARES: f"{namespace}-{source_middleware(server)}@kubernetescrd"}
    return {}


def program_annotations(cert_manager_issuer: str, kind: str, exposure: "Exposure", namespace: str,
                        server: str) -> dict[str, str]:
    """Every Ingress annotation the program sets: the certificate's issuer and the controller's."""
    return {"cert-manager.io/cluster-issuer": cert_manager_issuer,
            **controller_annotations(kind, exposure, namespace, server)}


def ingress_annotations(ours: dict[str, str], exposure: "Exposure") -> dict[str, str]:
    """The user's annotations under the program's (the config refuses a contradicting one), except
    Traefik's middlewares, which run in order: the source check first, then the user's."""
    merged = {**exposure.annotations, **ours}
    if TRAEFIK_MIDDLEWARES in ours and TRAEFIK_MIDDLEWARES in exposure.annotations:
        merged[TRAEFIK_MIDDLEWARES] = f"{ours[TRAEFIK_MIDDLEWARES]},{exposure.annotations[TRAEFIK_MIDDLEWARES]}"
    return merged
