"""What LlamaServer and EmbedServer share: a llama.cpp server in single-model mode.

Single-model rather than router mode, for two reasons the seed learned in production: the
router answers /health 200 as soon as it listens, while models still download behind it, so
pods went Ready with nothing to serve; and every model on a router's port shows up in the WebUI
picker, the embedding model included. A single-model server answers 503 (or refuses the
connection while downloading) until its weights are resident, which is what the probes need.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

import pulumi
import pulumi_kubernetes as k8s

from .budget import StartupBudget
from .capacity import ServerPlan
from .config import ClusterConfig, ModelCache, ModelServer, NodePool
from .meta import labels, metadata, selector, token

HEALTH_PATH = "/health"
API_KEY_DIR = "/run/secrets/llama-api-key"
RUN_AS = 1000  # any non-root UID; the cache volume is made group-writable for it through fsGroup


@dataclass(frozen=True)
class ModelServerArgs:
    model: ModelServer
    namespace: str
    node_pool: NodePool
    cache: ModelCache
    cluster: ClusterConfig
    # Memory request/limit and start-up budget, from the capacity plan.
    plan: ServerPlan
    # The API key file's content, when this program creates the Secret (a Pulumi secret).
    api_key_value: Optional[pulumi.Input[str]] = None


def llama_args(model: ModelServer) -> list[str]:
    """llama-server's command line, generated from the typed settings."""
    args = ["--hf-repo", model.hf_repo]
    if model.role == "embedding":
        args.append("--embeddings")  # serves POST /v1/embeddings
    args += ["--n-gpu-layers", str(model.gpu_layers), "--threads", str(model.threads), "--ctx-size", str(model.ctx_size)]
    if model.ubatch_size is not None:
        args += ["--ubatch-size", str(model.ubatch_size)]
    # Slots and host-RAM caches are set whenever the config sets them, so the plan counts what runs.
    if model.parallel is not None:
        args += ["--parallel", str(model.parallel)]
    if model.cache_ram_mib is not None:
        args += ["--cache-ram", str(model.cache_ram_mib)]
    if model.ctx_checkpoints is not None:
        args += ["--ctx-checkpoints", str(model.ctx_checkpoints)]
    if model.cors_origins is not None:
        args += ["--cors-origins", model.cors_origins]
    if not model.webui:
        args.append("--no-webui")
    # Explicit on purpose: the default port is moving from 8080 to 9931 across builds.
    args += ["--host", "0.0.0.0", "--port", str(model.port)]
    if model.metrics:
        args.append("--metrics")
    if model.api_key is not None:
        args += ["--api-key-file", f"{API_KEY_DIR}/{model.api_key.secret_key}"]
    return args + list(model.extra_args)


def _probe(path: str, period: int, **extra: int) -> dict:
    return {"httpGet": {"path": path, "port": "http"}, "periodSeconds": period, **extra}


def container_spec(model: ModelServer, pool: NodePool, cache: ModelCache, plan: ServerPlan) -> dict:
    budget = plan.budget
    requests: dict[str, str] = {"cpu": model.resources.cpu_request, "memory": plan.memory_request}
    limits: dict[str, str] = {"cpu": model.resources.cpu_limit, "memory": plan.memory_limit}
    if model.gpu_layers > 0 and pool.gpu_resource:
        requests[pool.gpu_resource] = limits[pool.gpu_resource] = "1"
    mounts = [{"name": "models", "mountPath": cache.mount_path}]
    if model.api_key is not None:
        mounts.append({"name": "api-key", "mountPath": API_KEY_DIR, "readOnly": True})
    return {
        "name": model.name,
        "image": model.image,
        "args": llama_args(model),
        # Where --hf-repo caches the weights: on the shared volume the download is a one-time cost,
        # and the server stays off a home directory it cannot write as a non-root UID.
        "env": [{"name": "LLAMA_CACHE", "value": cache.mount_path}],
        "ports": [{"name": "http", "containerPort": model.port, "protocol": "TCP"}],
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        "resources": {"requests": requests, "limits": limits},
        # Sized for a cold cache: the download plus the load, then liveness takes over.
        "startupProbe": _probe(
            HEALTH_PATH, budget.probe_period_seconds, failureThreshold=budget.probe_failure_threshold
        ),
        "readinessProbe": _probe(HEALTH_PATH, budget.probe_period_seconds),
        # Generous: a long prompt keeps the server busy, and a restart costs a full model load.
        "livenessProbe": _probe(HEALTH_PATH, 30, timeoutSeconds=10, failureThreshold=6),
        "volumeMounts": mounts,
    }


def pod_spec(model: ModelServer, pool: NodePool, cache: ModelCache, plan: ServerPlan) -> dict:
    security: dict = {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS,
        "runAsGroup": RUN_AS,
        # Makes the cache volume group-writable so the weights can be cached.
        "fsGroup": RUN_AS,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if pool.supplemental_groups:
        security["supplementalGroups"] = list(pool.supplemental_groups)
    volumes: list[dict] = [{"name": "models", "persistentVolumeClaim": {"claimName": cache.claim_name}}]
    if model.api_key is not None:
        volumes.append(
            {"name": "api-key", "secret": {"secretName": model.api_key.secret_name, "defaultMode": 0o440}}
        )
    spec: dict = {
        # The server never talks to the API server.
        "automountServiceAccountToken": False,
        # Service links put <SERVICE>_PORT variables into the environment, and llama-server reads
        # LLAMA_ARG_* variables as flags: keep the environment to what is set here.
        "enableServiceLinks": False,
        "securityContext": security,
        "containers": [container_spec(model, pool, cache, plan)],
        "volumes": volumes,
    }
    if pool.instance_type:
        spec["nodeSelector"] = {"node.kubernetes.io/instance-type": pool.instance_type}
    return spec


class ModelServerBase(pulumi.ComponentResource):
    """A Deployment, its ClusterIP Service and optionally a LAN-only Ingress, for one model."""

    type_name: ClassVar[str]
    role: ClassVar[str]

    deployment: k8s.apps.v1.Deployment
    service: k8s.core.v1.Service
    ingress: Optional[k8s.networking.v1.Ingress]
    api_key_secret: Optional[k8s.core.v1.Secret]
    budget: StartupBudget
    url: pulumi.Output[str]
    external_url: Optional[pulumi.Output[str]]

    def __init__(self, name: str, args: ModelServerArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__(token(self.type_name), name, None, opts)
        model = args.model
        self._check(model)
        ns = args.namespace
        self.budget = budget = args.plan.budget
        component = "chat" if model.role == "chat" else "embeddings"

        self.api_key_secret = None
        if model.api_key is not None and model.api_key.from_config is not None:
            if args.api_key_value is None:
                raise ValueError(f"{name}: api_key.from_config is set but no key value was passed")
            self.api_key_secret = k8s.core.v1.Secret(
                f"{name}-api-key",
                metadata=metadata(model.api_key.secret_name, ns, model.name, component),
                type="Opaque",
                string_data={model.api_key.secret_key: pulumi.Output.secret(args.api_key_value)},
                opts=pulumi.ResourceOptions(parent=self),
            )

        deployment_spec = {
            "replicas": 1,
            # A rolling update would load a second copy of the weights onto the same GPU and into
            # the same node's memory before releasing the first.
            "strategy": {"type": "Recreate"},
            # Kubernetes' default of 600 s would mark a cold start as ProgressDeadlineExceeded,
            # which GitOps health checks report as a failure while the model is still downloading.
            "progressDeadlineSeconds": budget.wait_seconds,
            "selector": {"matchLabels": selector(model.name)},
            "template": {
                "metadata": {"labels": labels(model.name, component)},
                "spec": pod_spec(model, args.node_pool, args.cache, args.plan),
            },
        }
        wait = f"{budget.wait_seconds}s"
        depends = [self.api_key_secret] if self.api_key_secret else []
        self.deployment = k8s.apps.v1.Deployment(
            name,
            metadata=metadata(model.name, ns, model.name, component),
            spec=deployment_spec,
            # Pulumi's default 10-minute wait would fail a cold start: wait out the whole budget.
            opts=pulumi.ResourceOptions(
                parent=self,
                depends_on=depends,
                custom_timeouts=pulumi.CustomTimeouts(create=wait, update=wait),
            ),
        )
        # Created once the Deployment is ready: a Service created alongside would run its own
        # 10-minute clock waiting for endpoints while the model downloads.
        self.service = k8s.core.v1.Service(
            f"{name}-svc",
            metadata=metadata(model.name, ns, model.name, component),
            spec={
                "type": "ClusterIP",
                "selector": selector(model.name),
                "ports": [{"name": "http", "port": model.port, "targetPort": "http", "protocol": "TCP"}],
            },
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.deployment]),
        )
        self.url = self.service.metadata.apply(
            lambda m: f"http://{m['name']}.{m['namespace']}.svc.cluster.local:{model.port}"
        )

        self.ingress = None
        self.external_url = None
        if model.exposure is not None:
            self.ingress = self._ingress(name, args)
            self.external_url = self.ingress.spec.apply(lambda s: f"https://{s['rules'][0]['host']}")

        outputs = {"url": self.url, "startup_seconds": budget.startup_seconds}
        if self.external_url is not None:
            outputs["external_url"] = self.external_url
        self.register_outputs(outputs)

    def _check(self, model: ModelServer) -> None:
        if model.role != self.role:
            raise ValueError(f"{self.type_name} serves role {self.role!r}, not {model.role!r}")

    def _ingress(self, name: str, args: ModelServerArgs) -> k8s.networking.v1.Ingress:
        model, exposure, cluster = args.model, args.model.exposure, args.cluster
        assert exposure is not None
        # LAN-only: no public-DNS label, so only the LAN's DNS publishes the record.
        return k8s.networking.v1.Ingress(
            f"{name}-ingress",
            metadata=metadata(
                model.name,
                args.namespace,
                model.name,
                "chat",
                annotations={"cert-manager.io/cluster-issuer": cluster.cert_manager_issuer},
            ),
            spec={
                "ingressClassName": cluster.ingress.class_name,
                "tls": [{"hosts": [exposure.host], "secretName": exposure.tls_secret}],
                "rules": [
                    {
                        "host": exposure.host,
                        "http": {
                            "paths": [
                                {
                                    "path": "/",
                                    "pathType": "Prefix",
                                    "backend": {"service": {"name": model.name, "port": {"number": model.port}}},
                                }
                            ]
                        },
                    }
                ],
            },
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.service]),
        )
