"""What every model server shares (LlamaServer, EmbedServer, OpenAIServer): the workload,
its Service, probes sized for a cold start, security, and the optional Ingress, PDB and VPA.

llama.cpp runs in single-model mode rather than router mode, for two reasons the seed learned in production: the
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

from common.constants import COLD_START_ANNOTATION, COMPONENT_LABEL, HEALTH_ANNOTATION, service_fqdn
from config.ingress import TRAEFIK_MIDDLEWARES, ingress_annotations, program_annotations, source_middleware
from config.types import ClusterConfig, ModelCacheConfig, ModelServer, NodePool
from engines import ServerBuild
from planning.capacity import ServerPlan
from planning.startup import StartupBudget

from .meta import VALUE_NOTES_ANNOTATION, labels, metadata, selector, token, value_notes
from .namespace import clients_policy
from .admission_proxy import room_files
from .security import checkov_waivers
from .pod import (KEY_FINGERPRINT_ANNOTATION, config_map_name, key_fingerprint, pod_programs, pod_spec,
                  programs_config_map_name)
from .programs import PROGRAMS_ANNOTATION, code_hash, config_map_data, program_files
from .rpc import SPLIT_LABEL, HelperArgs, RpcHelpers
from .workloads import WorkloadParts, build



@dataclass(frozen=True)
class ModelServerArgs:
    model: ModelServer
    namespace: str
    node_pool: NodePool
    cache: ModelCacheConfig
    cluster: ClusterConfig
    # Memory request/limit and start-up budget, from the capacity plan.
    plan: ServerPlan
    # The server as its engine builds it (engines.server_builds): args, files, probes, credentials ...
    build: ServerBuild
    # The API key file's content, when this program creates the Secret (a Pulumi secret).
    api_key_value: Optional[pulumi.Input[str]] = None
    # Every node pool of the stack: a split's helpers run on theirs.
    pools: Optional[dict[str, NodePool]] = None


def renamed_from(old_name: str, new_name: str, old_types: tuple[str, ...] = ()) -> Optional[pulumi.ResourceOptions]:
    """Options that keep a component's resources when its Pulumi name or type changes: stacks
    brought up before components were named by their config key know them by the old name, and
    older releases by an older type. Children named after their parent inherit the alias."""
    aliases = [pulumi.Alias(name=old_name)] if old_name != new_name else []
    for old_type in old_types:
        aliases.append(pulumi.Alias(type_=token(old_type)))
        if old_name != new_name:
            aliases.append(pulumi.Alias(name=old_name, type_=token(old_type)))
    return pulumi.ResourceOptions(aliases=aliases) if aliases else None


class ModelServerBase(pulumi.ComponentResource):
    """A model server's workload (Deployment or StatefulSet), its Service and optional extras.

    Named by the model's config key, which never changes when the server is renamed (``name``
    is only the Kubernetes objects' name): a rename updates the objects, it does not re-create
    the component's Secret under a name still taken."""

    type_name: ClassVar[str]
    former_type_names: ClassVar[tuple[str, ...]] = ()
    role: ClassVar[Optional[str]]

    workload: pulumi.CustomResource
    service: k8s.core.v1.Service
    ingress: Optional[k8s.networking.v1.Ingress]
    api_key_secret: Optional[k8s.core.v1.Secret]
    budget: StartupBudget
    url: pulumi.Output[str]
    external_url: Optional[pulumi.Output[str]]

    def __init__(self, name: str, args: ModelServerArgs, opts: Optional[pulumi.ResourceOptions] = None):
        model, built = args.model, args.build
        self._check(model, built)  # before anything is registered
        if model.api_key is not None and model.api_key.from_config is not None and args.api_key_value is None:
            raise ValueError(f"{name}: api_key.from_config is set but no key value was passed")
        opts = pulumi.ResourceOptions.merge(opts, renamed_from(model.name, name, self.former_type_names))
        super().__init__(token(self.type_name), name, None, opts)
        ns = args.namespace
        self.budget = budget = args.plan.budget
        component = COMPONENT_LABEL[model.role]
        meta = metadata(model.name, ns, model.name, component)
        # Downloaded by an init container (a prefetch, a router's models) or by the engine as it starts.
        prefilled = model.prefetch is not None or built.library is not None
        cold_start = budget.load_seconds if prefilled else budget.download_seconds + budget.load_seconds
        workload_meta = metadata(
            model.workload_name,
            ns,
            model.name,
            component,
            annotations={
                COLD_START_ANNOTATION: str(cold_start),
                HEALTH_ANNOTATION: built.health_path,
                **checkov_waivers(args.cluster.cni),
            },
        )

        self.api_key_secret = None
        credentials = built.credentials
        if model.api_key is not None and model.api_key.from_config is not None and credentials is not None:
            key_file = model.api_key.secret_key
            token_key = credentials.metrics_token_key
            self.api_key_secret = k8s.core.v1.Secret(
                f"{name}-api-key",
                metadata=metadata(model.api_key.secret_name, ns, model.name, component, annotations={
                    VALUE_NOTES_ANNOTATION: value_notes({
                        key_file: "the server's API key; while rotating, two lines: the old key, then the new",
                        token_key: f"the first line of {key_file} (the metrics scrape's bearer token)",
                    }),
                }),
                type="Opaque",
                # The key file, and its first key alone as the metrics scrape's bearer token.
                string_data=pulumi.Output.secret(pulumi.Output.from_input(args.api_key_value).apply(
                    lambda value: {key_file: value, token_key: credentials.client_key(value)}
                )),
                opts=pulumi.ResourceOptions(parent=self),
            )

        self.config_files = None
        files = built.files
        template_meta: dict = {"labels": labels(model.name, component)}
        if files:
            # A router's preset and library: applied in place by its keeper (fetch, then the router's
            # reload keeps every unchanged model running), so a change restarts no pod.
            data = {file_name: content for folder in files.values() for file_name, content in folder.items()}
            self.config_files = k8s.core.v1.ConfigMap(
                f"{name}-files", metadata=metadata(config_map_name(model.name), ns, model.name, component), data=data,
                opts=pulumi.ResourceOptions(parent=self))
        self.programs = None
        code = program_files(pod_programs(model, built, args.plan))
        # Beside the code, the data a program reads at its start: read then, so a change of it (a router's budget
        # beside this server) restarts nothing.
        programs = {**code, **room_files(args.plan)}
        if programs:
            # The in-cluster programs the pod runs, as files; the template names their code's hash, so a
            # change to what runs restarts the pods and a changed comment does not.
            self.programs = k8s.core.v1.ConfigMap(
                f"{name}-programs", metadata=metadata(programs_config_map_name(model), ns, model.name, component),
                data=config_map_data(programs), opts=pulumi.ResourceOptions(parent=self))
            template_meta.setdefault("annotations", {})[PROGRAMS_ANNOTATION] = code_hash(code)
        self.rpc_helpers = None
        if args.plan.split is not None:
            # The helpers first: the main server's init container waits for them (components/rpc.py).
            template_meta["labels"] = {**template_meta["labels"], SPLIT_LABEL: model.name}
            self.rpc_helpers = RpcHelpers(name, HelperArgs(model=model, plan=args.plan, namespace=ns,
                                                           pools=dict(args.pools or {}), cluster=args.cluster),
                                          selector(model.name), parent=self)
        pod_waivers = checkov_waivers(args.cluster.cni, pod=True)
        if pod_waivers:
            template_meta.setdefault("annotations", {}).update(pod_waivers)
        if self.api_key_secret is not None:
            # llama.cpp reads --api-key-file once, at start: a rotated key must restart the pods, so
            # the pod template carries a fingerprint of the key (scrypt, so a weak key is not cheap to
            # guess from it; not secret, so the Deployment's state stays readable).
            template_meta.setdefault("annotations", {})[KEY_FINGERPRINT_ANNOTATION] = pulumi.Output.unsecret(
                pulumi.Output.from_input(args.api_key_value).apply(key_fingerprint)
            )
        self.workload, self.service = build(WorkloadParts(
            name=name,
            model=model,
            metadata=workload_meta,
            service_metadata=meta,
            template={"metadata": template_meta,
                      "spec": pod_spec(model, args.node_pool, args.cache, args.plan, built, programs)},
            budget=budget,
            depends_on=[r for r in (self.api_key_secret, self.config_files, self.programs) if r is not None]
            + (self.rpc_helpers.resources if self.rpc_helpers is not None else []),
            parent=self,
        ))
        self.url = self.service.metadata.apply(lambda m: f"http://{service_fqdn(m['name'], m['namespace'])}:{model.port}")

        self.clients_policy = None
        if model.in_cluster_clients:
            # Its in-cluster clients from other namespaces (a RAG app's), to this server's pods and port alone.
            kind, spec = clients_policy(args.cluster.cni, ns, selector(model.name), model.port, list(model.in_cluster_clients))
            policy_meta = metadata(f"{model.name}-clients", ns, model.name, component)
            child = pulumi.ResourceOptions(parent=self)
            self.clients_policy = (
                k8s.apiextensions.CustomResource(f"{name}-clients", api_version="cilium.io/v2", kind=kind,
                                                 metadata=policy_meta, spec=spec, opts=child)
                if kind == "CiliumNetworkPolicy" else
                k8s.networking.v1.NetworkPolicy(f"{name}-clients", metadata=policy_meta, spec=spec, opts=child))

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

    def _check(self, model: ModelServer, built: ServerBuild) -> None:
        if self.role is not None and model.role != self.role:
            raise ValueError(f"{self.type_name} serves role {self.role!r}, not {model.role!r}")
        wanted = built.component_type
        if wanted != self.type_name:
            raise ValueError(f"{model.name}: engine {model.engine} runs as {wanted}, not {self.type_name}")

    def _vpa(self, name: str, model: ModelServer, meta: dict) -> pulumi.CustomResource:
        # No depends_on: the VPA names its target, and the recommender picks it up whenever it
        # appears (waiting would hold the VPA back for the StatefulSet's hour-long first start).
        return k8s.apiextensions.CustomResource(
            f"{name}-vpa",
            api_version="autoscaling.k8s.io/v1",
            kind="VerticalPodAutoscaler",
            metadata=meta,
            spec={
                "targetRef": {"apiVersion": "apps/v1", "kind": model.workload.kind, "name": model.workload_name},
                "updatePolicy": {"updateMode": model.workload.vpa_update_mode},
                # CPU only: memory is pinned by the capacity plan (the seed's #2711).
                "resourcePolicy": {
                    "containerPolicies": [{"containerName": model.name, "controlledResources": ["cpu"]}]
                },
            },
            opts=pulumi.ResourceOptions(parent=self),
        )

    def _ingress(self, name: str, args: ModelServerArgs) -> k8s.networking.v1.Ingress:
        model, exposure, cluster = args.model, args.model.exposure, args.cluster
        controller = cluster.ingress
        if exposure is None or controller is None:  # refused by config.checks.stack_problems
            raise ValueError(f"{model.name}: exposure needs exposure settings and an ingress controller")
        ours = program_annotations(cluster.cert_manager_issuer, controller.kind, exposure, args.namespace, model.name)
        depends: list[pulumi.Resource] = [self.service]
        if TRAEFIK_MIDDLEWARES in ours:
            # Only the listed client ranges reach the server (the annotation names this Middleware).
            depends.append(k8s.apiextensions.CustomResource(
                f"{name}-sources",
                api_version="traefik.io/v1alpha1",
                kind="Middleware",
                metadata=metadata(source_middleware(model.name), args.namespace, model.name, COMPONENT_LABEL[model.role]),
                spec={"ipAllowList": {"sourceRange": list(exposure.source_ranges)}},
                opts=pulumi.ResourceOptions(parent=self),
            ))
        backend = {"service": {"name": model.name, "port": {"number": model.port}}}
        # Every path, or the engine's exact client paths (an embedding server's, a router's).
        exact = args.build.client_paths
        paths = ([{"path": "/", "pathType": "Prefix", "backend": backend}] if exact is None else
                 [{"path": path, "pathType": "Exact", "backend": backend} for path in exact])
        # No public-DNS label, so only the LAN's DNS publishes the record; the source ranges above.
        return k8s.networking.v1.Ingress(
            f"{name}-ingress",
            metadata=metadata(
                model.name,
                args.namespace,
                model.name,
                COMPONENT_LABEL[model.role],
                annotations=ingress_annotations(ours, exposure),
            ),
            spec={
                "ingressClassName": controller.class_name,
                "tls": [{"hosts": [exposure.host], "secretName": exposure.tls_secret}],
                "rules": [{"host": exposure.host, "http": {"paths": paths}}],
            },
            opts=pulumi.ResourceOptions(parent=self, depends_on=depends),
        )
