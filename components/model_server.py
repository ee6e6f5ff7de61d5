"""What every model server shares (LlamaServer, EmbedServer, InferenceEngine): the workload,
its Service, probes sized for a cold start, security, and the optional Ingress, PDB and VPA.

llama.cpp runs in single-model mode rather than router mode. Single-model rather than router mode, for two reasons the seed learned in production: the
router answers /health 200 as soon as it listens, while models still download behind it, so
pods went Ready with nothing to serve; and every model on a router's port shows up in the WebUI
picker, the embedding model included. A single-model server answers 503 (or refuses the
connection while downloading) until its weights are resident, which is what the probes need.
"""

from __future__ import annotations

import hashlib

from dataclasses import dataclass
from typing import ClassVar, Optional

import pulumi
import pulumi_kubernetes as k8s

from policy.rules import COLD_START_ANNOTATION, HEALTH_ANNOTATION

from .budget import StartupBudget
from .capacity import ServerPlan, facts_for
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
    assert model.hf_repo is not None
    args = ["--hf-repo", model.hf_repo]
    if model.role == "embedding":
        args.append("--embeddings")  # serves POST /v1/embeddings
        facts = facts_for(model)
        if facts is not None and facts.pooling is not None:
            # Explicit: the pooling the planner checked the micro-batch against is the one that runs,
            # whatever a re-uploaded GGUF declares.
            args += ["--pooling", facts.pooling]
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
        # --no-ui: the pinned build (b10731) logs --no-webui as a deprecated alias (seen running it).
        args.append("--no-ui")
    # Explicit on purpose: the default port is moving from 8080 to 9931 across builds.
    args += ["--host", "0.0.0.0", "--port", str(model.port)]
    if model.metrics:
        args.append("--metrics")
    if model.api_key is not None:
        args += ["--api-key-file", f"{API_KEY_DIR}/{model.api_key.secret_key}"]
    return args + list(model.extra_args)


HF_HOME_DIR = "/home/engine"  # HOME for engines: the Hugging Face cache defaults to $HOME/.cache/huggingface
HF_CACHE = f"{HF_HOME_DIR}/.cache/huggingface"
SCRATCH = "/tmp"
# Init and sidecar containers get requests and limits too: an unbounded init container can
# still OOM the node while 100 GiB of weights stream through the page cache.
PREFETCH_RESOURCES = {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"cpu": "2", "memory": "2Gi"}}
# Read-only root: every path a container writes is a volume (the weights, /tmp), so nothing an
# attacker drops survives a restart and the image cannot be modified in place.
CONTAINER_SECURITY = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "readOnlyRootFilesystem": True,
}
SCRATCH_VOLUME = {"name": "scratch", "mountPath": SCRATCH}
# Mesa's and RADV's shader caches, and anything else that honours XDG, land on the scratch volume.
SCRATCH_ENV = [{"name": "XDG_CACHE_HOME", "value": f"{SCRATCH}/cache"}]
# Checks of the external scanner (checkov) that do not fit these workloads, each with its reason;
# written on the workload and its pods as checkov.io/skipN annotations, and listed in the README.
CHECKOV_WAIVERS = {
    "CKV_K8S_43": "pinned to a build tag that the config validates; a digest is accepted where wanted",
    "CKV_K8S_15": "pinned tags never move, so Always would only make every restart depend on the registry",
    "CKV_K8S_40": "UID 1000 owns the model cache (the seed's CephFS volume); fsGroup, not the UID, grants access",
}
CILIUM_WAIVER = {
    "CKV2_K8S_6": "governed by the namespace's CiliumNetworkPolicy (endpointSelector {}), which checkov does not read",
}


KEY_FINGERPRINT_ANNOTATION = "inference-plane/api-key-fingerprint"


def key_fingerprint(key: str) -> str:
    return hashlib.scrypt(key.encode(), salt=b"inference-plane/api-key", n=2**14, r=8, p=1, dklen=8).hex()


def checkov_waivers(cni: str, pod: bool = False) -> dict[str, str]:
    """The skip annotations: on the workload all of them, on its pods only the network-policy one
    (checkov judges that check on the pod; fewer pod annotations, fewer rollouts when one changes)."""
    waivers = {} if pod else dict(CHECKOV_WAIVERS)
    if cni == "cilium":
        waivers.update(CILIUM_WAIVER)
    return {f"checkov.io/skip{i}": f"{check}={reason}" for i, (check, reason) in enumerate(sorted(waivers.items()), 1)}


# Annotations the policy pack reads (what the startup probe must outlast, the health path) are
# the pack's own names: COLD_START_ANNOTATION, HEALTH_ANNOTATION.


def _probe(path: str, period: int, **extra: int) -> dict:
    return {"httpGet": {"path": path, "port": "http"}, "periodSeconds": period, **extra}


def health_path(model: ModelServer) -> str:
    return model.openai.health_path if model.openai is not None else HEALTH_PATH


def metrics_path(model: ModelServer) -> Optional[str]:
    if model.openai is not None:
        return model.openai.metrics_path
    return "/metrics" if model.metrics else None


def engine_args(model: ModelServer) -> list[str]:
    return list(model.openai.args) if model.openai is not None else llama_args(model)


def _cache_mount(model: ModelServer, cache: ModelCache) -> tuple[dict, list[dict]]:
    """Where the weights live for this server: its volume mount and environment."""
    if model.workload.cache_volume is not None:
        # Prefetched into a claim per replica at the default Hugging Face cache path; the engine
        # itself never downloads (HF_HUB_OFFLINE) and makes no outbound connections.
        # HF_HOME explicitly: huggingface_hub derives it from XDG_CACHE_HOME when unset, and
        # XDG_CACHE_HOME points at the scratch volume (SCRATCH_ENV), where no weights are.
        env = [{"name": "HOME", "value": HF_HOME_DIR}, {"name": "HF_HOME", "value": HF_CACHE},
               {"name": "HF_HUB_OFFLINE", "value": "1"}]
        return {"name": "weights", "mountPath": HF_CACHE}, env
    # Where --hf-repo caches the weights: on the shared volume the download is a one-time cost,
    # and the server stays off a home directory it cannot write as a non-root UID.
    return {"name": "models", "mountPath": cache.mount_path}, [{"name": "LLAMA_CACHE", "value": cache.mount_path}]


def container_spec(model: ModelServer, pool: NodePool, cache: ModelCache, plan: ServerPlan) -> dict:
    budget = plan.budget
    requests: dict[str, str] = {"cpu": model.resources.cpu_request, "memory": plan.memory_request}
    limits: dict[str, str] = {"cpu": model.resources.cpu_limit, "memory": plan.memory_limit}
    if model.gpu_layers > 0 and pool.gpu_resource:
        requests[pool.gpu_resource] = limits[pool.gpu_resource] = "1"
    mount, env = _cache_mount(model, cache)
    env = env + SCRATCH_ENV
    mounts = [mount, SCRATCH_VOLUME]
    if model.api_key is not None:
        mounts.append({"name": "api-key", "mountPath": API_KEY_DIR, "readOnly": True})
    if model.openai is not None:
        env += [{"name": k, "value": v} for k, v in sorted(model.openai.env.items())]
    health = health_path(model)
    return {
        "name": model.name,
        "image": model.image,
        "args": engine_args(model),
        "env": env,
        "ports": [{"name": "http", "containerPort": model.port, "protocol": "TCP"}],
        "securityContext": dict(CONTAINER_SECURITY),
        "resources": {"requests": requests, "limits": limits},
        # Sized for a cold start: the download (unless prefetched) plus the load; then liveness.
        "startupProbe": _probe(health, budget.probe_period_seconds, failureThreshold=budget.probe_failure_threshold),
        "readinessProbe": _probe(health, budget.probe_period_seconds),
        # Generous: a long prompt keeps the server busy, and a restart costs a full model load.
        "livenessProbe": _probe(health, 30, timeoutSeconds=10, failureThreshold=6),
        "volumeMounts": mounts,
    }


def prefetch_container(model: ModelServer) -> dict:
    prefetch = model.prefetch
    assert prefetch is not None
    return {
        "name": "prefetch",
        "image": prefetch.image,
        "command": list(prefetch.command),
        "env": [
            {"name": "HF_REPO", "value": prefetch.repo},
            {"name": "HF_REVISION", "value": prefetch.revision},
            {"name": "HOME", "value": HF_HOME_DIR},
            # The same cache as the engine reads (see _cache_mount), never derived from XDG_CACHE_HOME.
            {"name": "HF_HOME", "value": HF_CACHE},
            {"name": "PYTHONUSERBASE", "value": f"{SCRATCH}/pip"},
        ],
        "securityContext": dict(CONTAINER_SECURITY),
        "resources": PREFETCH_RESOURCES,
        "volumeMounts": [{"name": "weights", "mountPath": HF_CACHE}, SCRATCH_VOLUME],
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
        # The device nodes are root:render and root:video; a non-root process needs the groups.
        security["supplementalGroups"] = list(pool.supplemental_groups)
    volumes: list[dict] = []
    if model.workload.cache_volume is None:
        volumes.append({"name": "models", "persistentVolumeClaim": {"claimName": cache.claim_name}})
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
    }
    if model.prefetch is not None:
        spec["initContainers"] = [prefetch_container(model)]
    volumes.append({"name": "scratch", "emptyDir": {"sizeLimit": "1Gi"}})
    spec["volumes"] = volumes
    if pool.instance_type:
        spec["nodeSelector"] = {"node.kubernetes.io/instance-type": pool.instance_type}
    if model.workload.one_per_node:
        # One engine per node: two would fight over one GPU and one pool of unified memory.
        spec["affinity"] = {
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": selector(model.name)}, "topologyKey": "kubernetes.io/hostname"}
                ]
            }
        }
    return spec


class ModelServerBase(pulumi.ComponentResource):
    """A model server's workload (Deployment or StatefulSet), its Service and optional extras."""

    type_name: ClassVar[str]
    role: ClassVar[Optional[str]]

    workload: pulumi.CustomResource
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
        meta = metadata(model.name, ns, model.name, component)
        cold_start = budget.load_seconds if model.prefetch is not None else budget.download_seconds + budget.load_seconds
        workload_meta = metadata(
            model.name,
            ns,
            model.name,
            component,
            annotations={
                COLD_START_ANNOTATION: str(cold_start),
                HEALTH_ANNOTATION: health_path(model),
                **checkov_waivers(args.cluster.cni),
            },
        )

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

        template_meta: dict = {"labels": labels(model.name, component)}
        pod_waivers = checkov_waivers(args.cluster.cni, pod=True)
        if pod_waivers:
            template_meta["annotations"] = dict(pod_waivers)
        if self.api_key_secret is not None:
            # llama.cpp reads --api-key-file once, at start: a rotated key must restart the pods, so
            # the pod template carries a fingerprint of the key (scrypt, so a weak key is not cheap to
            # guess from it; not secret, so the Deployment's state stays readable).
            template_meta.setdefault("annotations", {})[KEY_FINGERPRINT_ANNOTATION] = pulumi.Output.unsecret(
                pulumi.Output.from_input(args.api_key_value).apply(key_fingerprint)
            )
        template = {
            "metadata": template_meta,
            "spec": pod_spec(model, args.node_pool, args.cache, args.plan),
        }
        wait = f"{budget.wait_seconds}s"
        depends: list[pulumi.Resource] = [self.api_key_secret] if self.api_key_secret else []
        service_spec: dict = {
            "type": "ClusterIP",
            "selector": selector(model.name),
            "ports": [{"name": "http", "port": model.port, "targetPort": "http", "protocol": "TCP"}],
        }
        stateful = model.workload.kind == "StatefulSet"
        if stateful:
            # Headless: the gateway resolves every ready pod. Named explicitly and created first,
            # so the StatefulSet's serviceName exists (and a headless Service has no await).
            service_spec["clusterIP"] = "None"
            self.service = k8s.core.v1.Service(
                f"{name}-svc", metadata=meta, spec=service_spec, opts=pulumi.ResourceOptions(parent=self)
            )
            self.workload = k8s.apps.v1.StatefulSet(
                name,
                metadata=workload_meta,
                spec=self._statefulset_spec(model, template),
                opts=pulumi.ResourceOptions(
                    parent=self,
                    depends_on=[*depends, self.service],
                    custom_timeouts=pulumi.CustomTimeouts(create=wait, update=wait),
                ),
            )
        else:
            deployment_spec = {
                "replicas": model.workload.replicas,
                # A rolling update would load a second copy of the weights onto the same GPU and
                # into the same node's memory before releasing the first.
                "strategy": {"type": "Recreate"},
                # Kubernetes' default of 600 s would mark a cold start ProgressDeadlineExceeded,
                # which GitOps health checks report as failure while the model still downloads.
                "progressDeadlineSeconds": budget.wait_seconds,
                "selector": {"matchLabels": selector(model.name)},
                "template": template,
            }
            self.workload = k8s.apps.v1.Deployment(
                name,
                metadata=workload_meta,
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
                metadata=meta,
                spec=service_spec,
                opts=pulumi.ResourceOptions(parent=self, depends_on=[self.workload]),
            )
        self.url = self.service.metadata.apply(
            lambda m: f"http://{m['name']}.{m['namespace']}.svc.cluster.local:{model.port}"
        )

        self.disruption_budget = None
        if model.workload.replicas > 1:
            # A node drain takes one replica at a time, never all of them.
            self.disruption_budget = k8s.policy.v1.PodDisruptionBudget(
                f"{name}-pdb",
                metadata=meta,
                spec={"maxUnavailable": 1, "selector": {"matchLabels": selector(model.name)}},
                opts=pulumi.ResourceOptions(parent=self),
            )
        self.autoscaler = None
        if model.workload.vpa_update_mode is not None:
            self.autoscaler = self._vpa(name, model, meta)

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
        if self.role is not None and model.role != self.role:
            raise ValueError(f"{self.type_name} serves role {self.role!r}, not {model.role!r}")

    def _statefulset_spec(self, model: ModelServer, template: dict) -> dict:
        spec: dict = {
            "replicas": model.workload.replicas,
            "serviceName": model.name,
            "selector": {"matchLabels": selector(model.name)},
            # All replicas start (and download) at once: OrderedReady would make the second wait
            # out the first one's hour-long cold start.
            "podManagementPolicy": "Parallel",
            "template": template,
        }
        volume = model.workload.cache_volume
        if volume is not None:
            spec["volumeClaimTemplates"] = [
                {
                    "metadata": {"name": "weights", "labels": labels(model.name, "model-cache")},
                    "spec": {
                        # Node-local: the weights live beside the engine that reads them.
                        "accessModes": ["ReadWriteOnce"],
                        "storageClassName": volume.storage_class,
                        "resources": {"requests": {"storage": volume.size}},
                    },
                }
            ]
            # Keep the prefetched weights when the StatefulSet is deleted or scaled down.
            spec["persistentVolumeClaimRetentionPolicy"] = {"whenDeleted": "Retain", "whenScaled": "Retain"}
        return spec

    def _vpa(self, name: str, model: ModelServer, meta: dict) -> pulumi.CustomResource:
        kind = model.workload.kind
        return k8s.apiextensions.CustomResource(
            f"{name}-vpa",
            api_version="autoscaling.k8s.io/v1",
            kind="VerticalPodAutoscaler",
            metadata=meta,
            spec={
                "targetRef": {"apiVersion": "apps/v1", "kind": kind, "name": model.name},
                "updatePolicy": {"updateMode": model.workload.vpa_update_mode},
                # CPU only: memory is pinned by the capacity plan (the seed's #2711).
                "resourcePolicy": {
                    "containerPolicies": [{"containerName": model.name, "controlledResources": ["cpu"]}]
                },
            },
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.workload]),
        )

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
