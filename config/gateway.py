"""The gateway's configuration types (``StackConfig.gateway``): Envoy AI Gateway in front of the
model servers, its tiers, routes and clients. Checks between fields live in ``checks.py``."""

from __future__ import annotations

from typing import Annotated, Any, Iterable, Literal, Mapping, Optional

from pydantic import Field

from .values import (
    doc,
    ConfigKey,
    DnsLabel,
    DnsName,
    Duration,
    Hostname,
    HttpPath,
    Line,
    Memory,
    QualifiedName,
    Reason,
    Strict,
)


class RemoteProvider(Strict):
    """An OpenAI-compatible provider on the internet, reached over TLS with its own key."""

    host: Hostname = doc("The provider's API host.")
    port: Annotated[int, Field(ge=1, le=65535)] = doc("The provider's TLS port.", default=443)
    prefix: HttpPath = doc("Path before /chat/completions: /v1 for most, /api/v1 for OpenRouter.", default="/v1")
    api_key_config: Optional[ConfigKey] = doc("The Pulumi secret config key holding the provider's API key.", default=None)


class Tier(Strict):
    """Where a route's backend lives: one of this stack's model servers, or a remote provider."""

    local: Optional[DnsLabel] = doc("A models key.", default=None)
    remote: Optional[RemoteProvider] = doc("A provider on the internet.", default=None)


class RouteBackend(Strict):
    """One priority of a route."""

    tier: DnsLabel = doc("A gateway.tiers key.")
    model: Optional[Annotated[Line, Field(min_length=1, max_length=200)]] = doc(
        "The model name sent to this tier; null: the local engine's served name, or the public name.", default=None
    )


class Route(Strict):
    """One public model name, tried on its backends in order (priority 0, 1, ...)."""

    model: Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._:/@-]+$")] = doc(
        "The public model name clients send."
    )
    kind: Literal["chat", "embedding"] = doc("chat or embedding: their retry policies differ.", default="chat")
    backends: Annotated[list[RouteBackend], Field(min_length=1, max_length=16)] = doc("Tiers, in priority order.")


class ApiClient(Strict):
    """A client of the gateway."""

    key_config: Optional[ConfigKey] = doc(
        "A Pulumi secret config key holding this client's key; null: derived from the master key.", default=None
    )


# Retries a route gets at least: a 429 or 503 from a busy local server is worth a second and third try.
DEFAULT_RETRIES = 3


class Retry(Strict):
    """How a failed request moves to the next priority."""

    num_retries: Optional[Annotated[int, Field(ge=0, le=20)]] = doc(
        "Retries after the first attempt; null: at least 3, and enough for every route to reach its last tier (the "
        "attempts per priority times its tiers less one: Envoy's previous_priorities moves on after that many "
        "attempts). Fewer than a route needs is refused.", default=None)
    attempts_per_priority: Optional[Annotated[int, Field(ge=1, le=5)]] = doc(
        "Attempts on one priority before the next; null: as many as the route's largest local server has replicas, so a "
        "request that failed on one local replica is tried on the others before it leaves the cluster (Envoy Gateway "
        "adds the previous-hosts predicate to every retry). Fewer than that is refused.",
        default=None,
    )
    status_codes: list[Annotated[int, Field(ge=400, le=599)]] = doc(
        "Chat routes: upstream statuses that are retried.", default=[429, 500, 502, 503, 504]
    )
    embedding_status_codes: list[Annotated[int, Field(ge=502, le=504)]] = doc(
        "Embedding routes fail over only when the local server could not take the request (502/503/504 while it "
        "loads or restarts), never on 500: llama.cpp answers 500 to an input longer than its micro-batch, and "
        "re-sending that document to a remote tier would move private data off the cluster.",
        default=[502, 503, 504],
    )


class LlamaCppEmbeddingsPath(Strict):
    """A plain HTTPRoute straight to a llama.cpp embedding server, bypassing the AI gateway."""

    model: DnsLabel = doc("The models key of a llama.cpp embedding server.")
    path: HttpPath = doc("The path prefix on the gateway.", default="/llama-cpp/v1/embeddings")
    timeout: Duration = doc("A whole document batch can take minutes on an iGPU.", default="600s")


class GatewayConfig(Strict):
    """Envoy AI Gateway in front of the model servers (the InferenceGateway component)."""

    name: DnsLabel = doc("The Gateway's name; prefixes its objects.", default="inference")
    class_name: DnsLabel = doc("The GatewayClass.", default="envoy-ai-gateway")
    create_class: bool = doc("Create the GatewayClass (false when the cluster already has it).", default=True)
    hostname: Hostname = doc("The listener's host name (on the tailnet: the MagicDNS name).")
    port: Annotated[int, Field(ge=1, le=65535)] = doc("The HTTPS listener's port.", default=443)
    tls_secret: DnsName = doc("The Secret cert-manager writes the listener's certificate to.")
    load_balancer_class: Optional[QualifiedName] = doc(
        "The Envoy Service's load-balancer class. tailscale: the Tailscale operator makes it a tailnet device, named "
        "after hostname's first label, so hostname must be its MagicDNS name (<device>.<tailnet>.ts.net). null: the "
        "cluster's default load balancer (k3s ServiceLB, MetalLB: an address on the LAN, where hostname must resolve "
        "to it); any other class: that controller's. Both need load_balancer_reason.", default="tailscale"
    )
    load_balancer_reason: Optional[Reason] = doc(
        "Required unless the class is tailscale (a cloud load balancer faces the internet; ServiceLB or MetalLB "
        "the LAN): who can reach the gateway, and how its hostname resolves there (said in the summary).", default=None)
    envoy_namespace: DnsLabel = doc("Where Envoy Gateway runs the Envoy pods.", default="envoy-gateway-system")
    client_ca_secret: Optional[DnsName] = doc(
        "Secret or ConfigMap with ca.crt: clients must present a certificate it signed. null: no mTLS.", default=None
    )
    buffer_limit: Memory = doc("Envoy Gateway's default of 32 KiB rejects ordinary chat payloads with 413.", default="50Mi")
    stream_idle_timeout: Duration = doc(
        "Ends a stream that sends nothing for this long; generation length itself is unbounded.", default="300s"
    )
    completion_idle_timeout: Duration = doc(
        "How long an AI route waits for the next byte from a model. A non-streamed completion sends nothing "
        "until it is done, so this must outlast the longest one; a stream silent this long is ended. Set on "
        "the AI routes (overriding stream_idle_timeout there).",
        default="1800s",
    )
    api_key_header: Annotated[str, Field(pattern=r"^[a-z0-9-]+$")] = doc(
        "The header clients send their gateway key in; `Authorization: Bearer <key>` works too (OpenAI SDKs). A client "
        "sending both is judged by this header (Envoy tries it first); both are stripped before forwarding, so a "
        "server behind the gateway never sees a client's key (a server reached directly reads Authorization first, "
        "as llama.cpp does).", default="x-api-key")
    clients: Annotated[dict[DnsLabel, ApiClient], Field(min_length=1)] = doc("Who may call the gateway.")
    master_key_config: Optional[ConfigKey] = doc(
        "Pulumi secret config key from which clients without key_config get their keys (HMAC).", default=None
    )
    tiers: Annotated[dict[DnsLabel, Tier], Field(min_length=1)] = doc("Where requests can go.")
    routes: list[Route] = doc("Public model names and their tiers.", default=[])
    catch_all: list[DnsLabel] = doc(
        "Tiers tried, in order, for any model no route names; the model name passes through.", default=[]
    )
    session_header: Annotated[str, Field(pattern=r"^[a-z0-9-]+$")] = doc(
        "Requests with one value stay on one pod (its KV cache).", default="x-sks-session-id"
    )
    retry: Retry = doc("Failover between priorities.", default=Retry())
    llamacpp_embeddings: Optional[LlamaCppEmbeddingsPath] = doc("A direct path to a llama.cpp embedding server.", default=None)

    def local_replicas(self, tier_names: Iterable[str], models: Mapping[str, Any]) -> int:
        """The most replicas any local server among these tiers runs (1 with none): the attempts a
        priority needs so that every local replica is tried before a request moves on."""
        replicas = [
            models[tier.local].workload.replicas
            for tier in (self.tiers.get(name) for name in tier_names)
            if tier is not None and tier.local is not None and tier.local in models
        ]
        return max(replicas, default=1)

    def retries_needed(self, priorities: int, attempts: int) -> int:
        """Retries for a rule of ``priorities`` tiers to reach its last: ``attempts`` on each of the others
        (Envoy's previous_priorities retry priority, update_frequency = attempts per priority), then one."""
        return attempts * (priorities - 1)

    def retries(self, priorities: int, attempts: int) -> int:
        """What a policy's rules get: the configured count, else the default of 3 or what they need."""
        if self.retry.num_retries is not None:
            return self.retry.num_retries
        return max(DEFAULT_RETRIES, self.retries_needed(priorities, attempts))

    def local_models(self) -> set[str]:
        """The models keys the gateway's Envoy pods reach (and must authenticate to)."""
        reached = {t.local for t in self.tiers.values() if t.local}
        if self.llamacpp_embeddings is not None:
            reached.add(self.llamacpp_embeddings.model)
        return reached

    def secret_config_refs(self) -> dict[str, str]:
        """Each secret config key the gateway names -> the first setting that names it."""
        refs: dict[str, str] = {}
        if self.master_key_config:
            refs[self.master_key_config] = "gateway.master_key_config"
        for name, client in self.clients.items():
            if client.key_config:
                refs.setdefault(client.key_config, f"gateway.clients.{name}.key_config")
        for name, tier in self.tiers.items():
            if tier.remote and tier.remote.api_key_config:
                refs.setdefault(tier.remote.api_key_config, f"gateway.tiers.{name}.remote.api_key_config")
        return refs

    def secret_config_keys(self) -> set[str]:
        return set(self.secret_config_refs())
