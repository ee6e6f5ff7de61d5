"""Reading the running stack's config from the Pulumi engine: the program's boundary."""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any, Optional

from common.constants import COMMIT_ID, OFFLINE_SECRET_PLACEHOLDER, PROJECT, TAILSCALE_CLASS, tailnet_device
from common.errors import ConfigError

from .checks import config_warnings
from .credentials import credential_roles
from .gateway import GatewayConfig
from .types import TOP_LEVEL_KEYS, Problem, StackConfig
from .validation import EngineChecks, path_part, validate_values


def read_pulumi_config() -> tuple[dict[str, Any], set[str]]:
    """Every config value in this project's namespace, decoded, and the keys that are secret.

    The only place that touches the SDK's private state: ``pulumi.Config`` reads one known key
    at a time and cannot list them, but unknown keys (typos) must be reported, so the whole
    mapping is read from the runtime (``CONFIG``, ``_SECRET_KEYS``) and from the environment the
    language host sets (``get_config_env`` / ``get_config_secret_keys_env``). Checked against
    pulumi 3.272 (requirements.txt pins it)."""
    from pulumi.runtime import config as runtime_config

    values: dict[str, Any] = {}
    merged = {**runtime_config.get_config_env(), **runtime_config.CONFIG.get()}
    prefix = f"{PROJECT}:"
    for full_key, text in merged.items():
        if not full_key.startswith(prefix):
            continue
        key = full_key[len(prefix):]
        try:
            values[key] = json.loads(text) if isinstance(text, str) and text[:1] in "[{" else text
        except json.JSONDecodeError:
            raise ConfigError([(key, "is not valid JSON structured config")]) from None
    secret = {
        k[len(prefix):]
        for k in (*runtime_config.get_config_secret_keys_env(), *runtime_config._SECRET_KEYS.get())
        if k.startswith(prefix)
    }
    return values, secret


# The Kubernetes provider's setting that makes Secret data changes updates in place. Without it a
# changed Secret is replaced, delete-first under its fixed name: readers (the gateway's policies,
# llama.cpp's scrape) briefly find no Secret at all (pulumi-kubernetes provider.go forceNew for
# Secret data unless enableSecretMutable).
SECRET_MUTABLE = "kubernetes:enableSecretMutable"


# Likewise for ConfigMaps: a router's preset and library change whenever a model is added or removed;
# replaced delete-first, the ConfigMap is briefly gone; updated in place, the kubelet refreshes the
# mounted files and the router's keeper applies them with no restart.
CONFIGMAP_MUTABLE = "kubernetes:enableConfigMapMutable"


def provider_flag(setting: str) -> bool:
    """A known key: the SDK's public reader is enough here."""
    import pulumi

    namespace, key = setting.split(":")
    return (pulumi.Config(namespace).get(key) or "").lower() == "true"


def secrets_mutable() -> bool:
    return provider_flag(SECRET_MUTABLE)


PROJECT_DIR = Path(__file__).resolve().parent.parent


def tailnet_name_problems(gateway: Optional[GatewayConfig], stack: str, project_dir: Path) -> list[Problem]:
    """A gateway on the tailnet claims a device name (its hostname's first label); the project's
    other stacks must not claim the same one on the same tailnet: Tailscale names the second device
    `<name>-1` (its KB 1098), which matches neither that gateway's listener nor its certificate.
    Only a stack with its own file is compared (a test run under another name is not a stack)."""
    if gateway is None or gateway.load_balancer_class != TAILSCALE_CLASS:
        return []
    if not (project_dir / f"Pulumi.{stack}.yaml").is_file():
        return []
    import yaml

    problems: list[Problem] = []
    for path in sorted(project_dir.glob("Pulumi.*.yaml")):
        other = path.name[len("Pulumi."):-len(".yaml")]
        if other == stack:
            continue
        try:
            document = yaml.safe_load(path.read_text()) or {}
            theirs = (document.get("config") or {}).get(f"{PROJECT}:gateway") or {}
            host, lb_class = theirs.get("hostname"), theirs.get("load_balancer_class", TAILSCALE_CLASS)
        except (OSError, yaml.YAMLError, AttributeError):
            continue  # that stack's own run reports its file
        if host == gateway.hostname and lb_class == TAILSCALE_CLASS:
            device, _, tailnet = gateway.hostname.partition(".")
            problems.append((
                "gateway.hostname",
                f"{gateway.hostname} is also the gateway of stack {other} ({path.name}): on one tailnet the second "
                f"device to join becomes {tailnet_device(host)}-1, which matches neither its listener nor its "
                f"certificate; give each stack a name of its own, e.g. {device}-{stack}.{tailnet}",
            ))
    return problems


def read_config(engine_checks: EngineChecks) -> StackConfig:
    """Read and validate the running stack's config (with each engine's checks, handed in)."""
    if not secrets_mutable():
        import pulumi

        pulumi.log.warn(
            f"{SECRET_MUTABLE} is not true: a rotated key replaces its Secret and readers briefly find none; "
            f"run: pulumi config set {SECRET_MUTABLE} true"
        )
    values, secret_keys = read_pulumi_config()
    structured = {k: v for k, v in values.items() if k in TOP_LEVEL_KEYS}
    try:
        stack = validate_values(structured, engine_checks)
    except ConfigError as error:
        # A misspelt top-level key (`model:`) leaves the real one missing: name the typo first.
        raise ConfigError(_top_level_typos(values) + error.problems) from None
    problems = _secret_key_problems(stack, values, secret_keys)
    import pulumi

    problems += tailnet_name_problems(stack.gateway, pulumi.get_stack(), PROJECT_DIR)
    routers = [key for key, model in stack.models.items() if model.on_demand is not None]
    if routers and not provider_flag(CONFIGMAP_MUTABLE):
        pulumi.log.warn(
            f"{CONFIGMAP_MUTABLE} is not true: adding or removing a model of models.{routers[0]}.on_demand "
            f"replaces its ConfigMap, deleted first; run: pulumi config set {CONFIGMAP_MUTABLE} true"
        )
    for key in sorted(set(structured) & secret_keys):
        problems.append((key, "structured config must not be secret; keep credentials in their own keys"))
    if problems:
        raise ConfigError(problems)
    _warn_moving_revisions(stack)
    for suggestion in config_warnings(stack):
        pulumi.log.warn(suggestion)
    return stack


def _top_level_typos(values: dict[str, Any]) -> list[tuple[str, str]]:
    """Unknown keys that are a near spelling of a top-level key the config does not set."""
    problems = []
    for key in sorted(set(values) - set(TOP_LEVEL_KEYS)):
        near = difflib.get_close_matches(key, [k for k in TOP_LEVEL_KEYS if k not in values], n=1, cutoff=0.6)
        if near:
            problems.append((path_part(key), f"unknown config key; did you mean {near[0]}?"))
    return problems


def _warn_moving_revisions(stack: StackConfig) -> None:
    import pulumi

    for key, model in stack.models.items():
        if model.prefetch is not None and not COMMIT_ID.fullmatch(model.prefetch.revision):
            pulumi.log.warn(
                f"models.{key}.prefetch.revision {model.prefetch.revision!r} is a branch or tag, not a commit: each pod "
                "start asks the Hub and downloads where it has moved, beside the old files (no preview sees that "
                "coming); pin a 40-hex commit to start offline"
            )


def _secret_key_problems(stack: StackConfig, values: dict[str, Any], secret_keys: set[str]) -> list[tuple[str, str]]:
    refs = stack.secret_config_refs()
    allowed_secrets = set(refs)
    problems: list[tuple[str, str]] = []
    misnamed: set[str] = set()
    for key in sorted(set(values) - set(TOP_LEVEL_KEYS)):
        if key in allowed_secrets:
            continue
        near = difflib.get_close_matches(key, [*TOP_LEVEL_KEYS, *allowed_secrets], n=1, cutoff=0.6)
        if near and near[0] in refs and near[0] not in values and key in secret_keys:
            # A secret that is set, and a setting naming a near spelling that is not: the setting
            # is the typo (renaming the secret to match it would keep the typo forever).
            misnamed.add(near[0])
            problems.append((refs[near[0]], f"no secret {near[0]!r} is set; did you mean {key}, which is?"))
        elif near:
            problems.append((path_part(key), f"unknown config key; did you mean {near[0]}?"))
        elif key in secret_keys:
            # Typically left behind when a section that named it (the gateway, an api_key) was removed.
            problems.append((path_part(key), f"a secret no setting names any more; remove it: pulumi config rm {key}"))
        else:
            problems.append((path_part(key), f"unknown config key; known keys: {', '.join(TOP_LEVEL_KEYS)}"))
    for key in sorted(allowed_secrets - misnamed):
        if key not in values:
            problems.append((key, f"not set; run: pulumi config set --secret {key} <value> (to render without Pulumi: "
                                  f"add `{PROJECT}:{key}: {{secure: v1:placeholder}}` under config:, and create its Secret "
                                  "in the cluster as the render's SECRETS.md says)"))
        elif key not in secret_keys:
            problems.append((key, f"holds a credential in plain text; run: pulumi config set --secret {key} <value>"))
    # One credential, one role, by value too: two config keys holding the same key (a provider's account key
    # pasted as a server's LAN key, one client's key as another's).
    by_value: dict[str, tuple[str, str, str]] = {}
    for key, role, path in credential_roles(stack)[1]:
        value = values.get(key)
        if not isinstance(value, str) or value == OFFLINE_SECRET_PLACEHOLDER:
            continue  # offline, every secret reads the same placeholder: their real values differ
        for line in (v for v in value.split("\n") if v and not v.startswith("#")):  # a key file: one key a line
            if line in by_value and by_value[line][0] != key and (by_value[line][1] != role or role.startswith("gateway client")):
                problems.append((path, f"{key} holds the same key as {by_value[line][2]} ({by_value[line][1]}); "
                                 "give each its own"))
                break
            by_value.setdefault(line, (key, role, path))
    return problems
