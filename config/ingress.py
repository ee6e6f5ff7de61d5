"""What each ingress controller needs to carry a long streamed completion. Facts from the
controllers' sources (ingress-nginx dbb11b92 internal/ingress/controller/config/config.go,
traefik fd5a576d pkg/provider/kubernetes/ingress), summarised in docs/exposure.md."""

from __future__ import annotations

import fnmatch
from typing import TYPE_CHECKING

from common.quantity import MIB, parse_quantity

if TYPE_CHECKING:
    from config.types import Exposure

NGINX = "nginx.ingress.kubernetes.io"


TRAEFIK_MIDDLEWARES = "traefik.ingress.kubernetes.io/router.middlewares"
# ingress-nginx's allowlist under both its names (the newer one is read first,
# internal/ingress/annotations/ipallowlist): only exposure.source_ranges may set them.
SOURCE_RANGE_ANNOTATIONS = (f"{NGINX}/whitelist-source-range", f"{NGINX}/allowlist-source-range")


# Annotations a stack may add (exposure.annotations), by controller ("" for any), each with why it is safe:
# it changes presentation or a limit, never a promise the plan, the policies or the summary make. Matched
# on the whole key as the API server and the controllers compare keys (exactly, case and all), or on a
# prefix ending in '/'. Every other key is refused; the render's summary lists the ones added.
ALLOWED_ANNOTATIONS: dict[str, dict[str, str]] = {
    "": {
        "gethomepage.dev/": "a Homepage dashboard entry (name, icon, group): read by Homepage, by no controller",
        "kubernetes.io/description": "a description for people",
    },
    "ingress-nginx": {
        f"{NGINX}/limit-rps": "caps requests per second per client address, below what the server would serve",
        f"{NGINX}/limit-rpm": "caps requests per minute per client address",
        f"{NGINX}/limit-connections": "caps concurrent connections per client address",
        f"{NGINX}/limit-burst-multiplier": "the burst the two limits above allow",
    },
    "traefik": {
        # The user's middlewares run after the program's source check (ingress_annotations).
        TRAEFIK_MIDDLEWARES: "more Traefik middlewares (rate limits, headers), run after the source check",
    },
}


def annotation_allowed(name: str, kind: str) -> bool:
    """Whether a stack may add this Ingress annotation for this controller."""
    for allowed in (ALLOWED_ANNOTATIONS.get(""), ALLOWED_ANNOTATIONS.get(kind, {})):
        for key in allowed or {}:
            if name == key or (key.endswith("/") and name.startswith(key) and len(name) > len(key)):
                return True
    return False


# Why the keys a user is likeliest to reach for are not on the list (the message names what to use instead).
REFUSED_ANNOTATIONS: tuple[tuple[str, str], ...] = (
    # TLS: every Ingress terminates TLS with a certificate from cluster.cert_manager_issuer.
    (f"{NGINX}/ssl-redirect", "turns off the redirect to TLS (keys would cross plain HTTP)"),
    (f"{NGINX}/force-ssl-redirect", "changes how TLS is enforced"),
    (f"{NGINX}/ssl-passthrough", "hands TLS to the backend, which has no certificate"),
    (f"{NGINX}/backend-protocol", "changes the protocol to the server"),
    (f"{NGINX}/ssl-*", "changes TLS"),
    (f"{NGINX}/auth-tls-*", "changes client-certificate TLS"),
    ("traefik.ingress.kubernetes.io/router.tls*", "changes TLS"),
    ("cert-manager.io/*", "changes the certificate (its issuer is cluster.cert_manager_issuer)"),
    # CORS is the server's own cors_origins (one origin, or localhost).
    (f"{NGINX}/enable-cors", "answers browsers' CORS at the controller, past the server's cors_origins"),
    (f"{NGINX}/cors-*", "answers browsers' CORS at the controller, past the server's cors_origins"),
    # Snippets are raw controller configuration.
    (f"{NGINX}/*-snippet", "injects raw controller configuration the policies cannot read"),
    # Paths, hosts and the entry point: what reaches the server.
    (f"{NGINX}/rewrite-target", "rewrites the exact paths the Ingress admits into others (a router's model management)"),
    (f"{NGINX}/use-regex", "turns the admitted paths into patterns"),
    (f"{NGINX}/app-root", "redirects / elsewhere"),
    (f"{NGINX}/server-alias", "answers more host names than exposure.host"),
    ("traefik.ingress.kubernetes.io/router.pathmatcher", "changes how the admitted paths match"),
    ("traefik.ingress.kubernetes.io/router.entrypoints", "changes the entry point the Ingress listens on"),
    ("traefik.ingress.kubernetes.io/router.priority", "can put this route ahead of the source check"),
    ("kubernetes.io/ingress.class", "picks another controller (cluster.ingress.class_name)"),
    # Publication: no public DNS record is made (docs/exposure.md).
    ("external-dns.alpha.kubernetes.io/*", "publishes a DNS record for the API"),
    (f"{NGINX}/mirror-*", "copies every request, its key header and prompt, to another host"),
    (f"{NGINX}/auth-*", "hands the decision of who may connect to another service"),
    ("traefik.ingress.kubernetes.io/*", "changes Traefik's router for this Ingress"),
)


def annotation_refusal(name: str, kind: str) -> str | None:
    """Why a stack may not set this Ingress annotation on this controller, or None when it may."""
    if annotation_allowed(name, kind):
        return None
    why = next((why for pattern, why in REFUSED_ANNOTATIONS if fnmatch.fnmatchcase(name.lower(), pattern)), None)
    if why is not None:
        return why
    kinds = sorted(k for k in (kind, "") if k in ALLOWED_ANNOTATIONS)
    listed = ", ".join(key + ("*" if key.endswith("/") else "") for k in kinds for key in ALLOWED_ANNOTATIONS[k])
    return (f"is not among the annotations a stack may add for {kind} (config/ingress.py ALLOWED_ANNOTATIONS: "
            f"{listed}): what it changes is the program's to set (ask for a typed setting)")


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
