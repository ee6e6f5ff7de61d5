"""The guardrails as CrossGuard policies, every one mandatory."""

from __future__ import annotations

from pulumi_policy import (
    EnforcementLevel,
    PolicyConfigSchema,
    ResourceValidationPolicy,
    StackValidationPolicy,
)

try:
    from .rules import RESOURCE_RULES, STACK_RULES, Rule
except ImportError:  # run by the Pulumi CLI from this folder
    from rules import RESOURCE_RULES, STACK_RULES, Rule  # type: ignore[no-redef]

CONFIG_SCHEMA = PolicyConfigSchema(
    properties={"publicDnsLabels": {"type": "array", "items": {"type": "string"}, "default": []}}
)


def _is_kubernetes(resource_type: str) -> bool:
    return resource_type.startswith("kubernetes:")


def _resource_policy(rule: Rule) -> ResourceValidationPolicy:
    def validate(args, report_violation):
        if _is_kubernetes(args.resource_type):
            rule.check(args.props, report_violation, args.get_config())

    return ResourceValidationPolicy(
        name=rule.name,
        description=rule.description,
        validate=validate,
        enforcement_level=EnforcementLevel.MANDATORY,
        config_schema=CONFIG_SCHEMA,
    )


def _stack_policy(rule: Rule) -> StackValidationPolicy:
    def validate(args, report_violation):
        props = [r.props for r in args.resources if _is_kubernetes(r.resource_type)]
        rule.check(props, report_violation, args.get_config())

    return StackValidationPolicy(
        name=rule.name,
        description=rule.description,
        validate=validate,
        enforcement_level=EnforcementLevel.MANDATORY,
        config_schema=CONFIG_SCHEMA,
    )


POLICIES = [_resource_policy(r) for r in RESOURCE_RULES] + [_stack_policy(r) for r in STACK_RULES]
