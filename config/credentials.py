"""The credentials a stack names, each with its one role: every Secret a setting names and every secret
config key (``credential_roles``, which config/load.py also reads to check values), and the check that no
two roles share one (``one_role_each``, run with the other checks of config/checks.py)."""

from __future__ import annotations

from .types import StackConfig

Problem = tuple[str, str]


def credential_roles(stack: StackConfig) -> tuple[list[tuple[str, str, str, bool]], list[tuple[str, str, str]]]:
    """Every Secret a setting names, as (Secret name, role, setting path, whether the render writes it), and
    every secret config key, as (config key, role, setting path): the credentials each has one role."""
    secrets: list[tuple[str, str, str, bool]] = []
    keys: list[tuple[str, str, str]] = []
    for key, model in stack.models.items():
        if model.api_key is not None:
            path = f"models.{key}.api_key"
            secrets.append((model.api_key.secret_name, "a server's API key (LAN clients hold it)", f"{path}.secret_name",
                            model.api_key.from_config is not None))
            if model.api_key.from_config:
                keys.append((model.api_key.from_config, "a server's API key (LAN clients hold it)", f"{path}.from_config"))
        if model.exposure is not None:
            secrets.append((model.exposure.tls_secret, "a TLS certificate cert-manager writes",
                            f"models.{key}.exposure.tls_secret", True))
    if stack.model_cache.hub_token is not None:
        secrets.append((stack.model_cache.hub_token.secret_name, "the Hugging Face token",
                        "model_cache.hub_token.secret_name", False))
    gateway = stack.gateway
    if gateway is not None:
        secrets.append((gateway.tls_secret, "a TLS certificate cert-manager writes", "gateway.tls_secret", True))
        if gateway.client_ca_secret:
            secrets.append((gateway.client_ca_secret, "the gateway's client CA", "gateway.client_ca_secret", False))
        secrets.append((f"{gateway.name}-api-keys", "the gateway's client keys", "gateway.name", True))
        secrets.append((f"{gateway.name}-llamacpp-credential", "the gateway's key to the local servers", "gateway.name", True))
        if gateway.master_key_config:
            keys.append((gateway.master_key_config, "the gateway's master key (every client key derives from it)",
                         "gateway.master_key_config"))
        for name, client in gateway.clients.items():
            if client.key_config:
                keys.append((client.key_config, f"gateway client {name}'s key", f"gateway.clients.{name}.key_config"))
        for name, tier in gateway.tiers.items():
            if tier.remote is not None:
                secrets.append((f"{name}-provider-key", "a remote provider's account key", f"gateway.tiers.{name}", True))
                if tier.remote.api_key_config:
                    keys.append((tier.remote.api_key_config, f"a remote provider's account key ({tier.remote.host})",
                                 f"gateway.tiers.{name}.remote.api_key_config"))
    return secrets, keys


def one_role_each(stack: StackConfig) -> list[Problem]:
    """One Secret, one role; one secret config key, one role. A server's LAN key in the same Secret or config
    key as a provider's account key hands the account to every LAN client and the scraper; a Secret the render
    writes twice, or one the render writes under a name a setting reads for something else, is another's."""
    secrets, keys = credential_roles(stack)
    problems: list[Problem] = []
    seen: dict[str, tuple[str, str, bool]] = {}
    for name, role, path, written in secrets:
        if name in seen:
            other_role, other_path, other_written = seen[name]
            if other_role != role or (written and other_written):
                problems.append((path, f"Secret {name} is also {other_role} ({other_path}): one Secret, one role; "
                                 "name this one differently"))
                continue
        seen[name] = (role, path, written)
    by_key: dict[str, tuple[str, str]] = {}
    for key, role, path in keys:
        if key in by_key and (by_key[key][0] != role or role.startswith("gateway client")):
            problems.append((path, f"config key {key} is also {by_key[key][0]} ({by_key[key][1]}): one credential, "
                             "one role; set a key of its own"))
            continue
        by_key.setdefault(key, (role, path))
    return problems
