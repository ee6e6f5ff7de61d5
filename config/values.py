"""Value types: what a single field may hold. Relations between fields live in checks.py; reading
Pulumi config lives in load.py."""

from __future__ import annotations

import ipaddress
import re
import unicodedata
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from common.quantity import Quantity, parse_quantity
from common.constants import PINNED_IMAGE

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_NAME = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# A top-level domain: letters, or an internationalised one in its ASCII form (xn--p1ai is .рф).
_TLD = r"([a-z]{2,63}|xn--[a-z0-9-]{1,59})"
_HOSTNAME = re.compile(rf"^(?=.{{1,253}}$)([a-z0-9]([-a-z0-9]{{0,61}}[a-z0-9])?\.)+{_TLD}$")
_FQDN_PATTERN = re.compile(rf"^(\*\.)?([a-z0-9]([-a-z0-9]{{0,61}}[a-z0-9])?\.)+{_TLD}$")
LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
_HF_REPO = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9_.]*/[A-Za-z0-9][-A-Za-z0-9_.]*:[A-Za-z0-9_]+$")
_DURATION = re.compile(r"^([0-9]+(ms|s|m|h))+$")
_CONFIG_KEY = re.compile(r"^[a-z][a-z0-9_]*$")


def matches(pattern: re.Pattern[str], what: str) -> AfterValidator:
    def check(value: str) -> str:
        if not pattern.fullmatch(value):
            raise ValueError(f"{value!r} is not {what}")
        return value

    return AfterValidator(check)


def printable_line(value: str) -> str:
    """One line of printable characters (str.isprintable: no control, format, line or paragraph separator, no
    space but U+0020), so that no reader splits it: not llama.cpp's preset parser (\\r, \\n), not
    str.splitlines() (U+2028, U+0085, U+001C ...), not a terminal (escapes, bidirectional overrides). Every
    free-form string that reaches a file, an argv or the summary is held to it, here, once."""
    for character in value:
        if not character.isprintable():
            name = unicodedata.name(character, "a control character")
            raise ValueError(f"holds {name} (U+{ord(character):04X}); write one line of printable characters")
    return value


def _reason(value: str) -> str:
    """An acknowledgement says why: at least three words of letters, not ten spaces or a placeholder."""
    if len(re.findall(r"[^\W\d_]{2,}", value)) < 3:
        raise ValueError(f"{value!r} does not say why: write the reason in a few words")
    return value


def _idna(value: str) -> str:
    """Each xn-- label (an internationalised name in its ASCII form) is valid punycode."""
    for label in value.split("."):
        if label.startswith("xn--"):
            try:
                label.encode("ascii").decode("idna")
            except UnicodeError:
                raise ValueError(f"{label!r} in {value!r} is not a valid internationalised (xn--) label") from None
    return value


def _memory(value: str) -> Quantity:
    parse_quantity(value)
    if not re.fullmatch(r"[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti)", value):
        raise ValueError(f"{value!r}: write memory with a binary suffix, e.g. 24Gi or 512Mi")
    return Quantity(value)


def _cpu(value: str) -> Quantity:
    if not re.fullmatch(r"([0-9]+m|[0-9]+(\.[0-9]+)?)", value):
        raise ValueError(f"{value!r} is not a CPU quantity (examples: 500m, 2)")
    return Quantity(value)


# The values the kubelet writes for its well-known labels (Go's names: GOARCH, GOOS): a node selector with
# any other never matches, and the pod stays Pending with no error (x86_64 is amd64, aarch64 arm64).
WELL_KNOWN_LABELS = {
    "kubernetes.io/arch": ("amd64", "arm64", "arm", "ppc64le", "s390x", "riscv64"),
    "kubernetes.io/os": ("linux", "windows"),
}
_ARCH_ALIASES = {"x86_64": "amd64", "x86-64": "amd64", "x64": "amd64", "aarch64": "arm64", "armv8": "arm64",
                 "armhf": "arm", "armv7l": "arm"}


def _labels(value: dict[str, str]) -> dict[str, str]:
    for key, label in value.items():
        if not LABEL_KEY.fullmatch(key) or not _LABEL_VALUE.fullmatch(label):
            raise ValueError(f"{key}={label!r} is not a valid Kubernetes label")
        known = WELL_KNOWN_LABELS.get(key)
        if known is not None and label not in known:
            hint = f"; {label} is {_ARCH_ALIASES[label.lower()]}" if label.lower() in _ARCH_ALIASES else ""
            raise ValueError(f"{key}={label!r}: the kubelet writes one of {', '.join(known)}{hint} (kubectl get nodes "
                             f"-L {key}), and a selector on any other value leaves the pod Pending")
    return value


def _number_as_quantity(value: Any) -> Any:
    """`pulumi config set --path x.cpu_limit 6` stores the number 6: a whole number is the quantity "6"."""
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


_DECIMAL = re.compile(r"[0-9]+(?:\.[0-9]+)?")


def _decimal_text(value: Any) -> Any:
    """`pulumi config set --path x.load_mib_per_s 12.5` stores the string "12.5" (the CLI types only
    whole numbers and true/false): a plain decimal string is that number."""
    return float(value) if isinstance(value, str) and _DECIMAL.fullmatch(value) else value


def _cidr(value: str) -> str:
    if "/" not in value:
        try:
            address = ipaddress.ip_address(value)
        except ValueError:
            address = None
        if address is not None:
            one = 32 if address.version == 4 else 128
            lan = ipaddress.ip_network(f"{value}/{24 if address.version == 4 else 64}", strict=False)
            raise ValueError(f"{value!r} is one address, not a range: write {value}/{one} to admit that one host, or its "
                             f"LAN's range such as {lan}")
    try:
        network = ipaddress.ip_network(value, strict=True)
    except ValueError:
        raise ValueError(f"{value!r} is not an address range in CIDR form, such as 192.168.0.0/16 (host bits zero)") from None
    return str(network)


Cidr = Annotated[str, AfterValidator(_cidr)]


# A fractional number, as written in a stack file or stored by `pulumi config set --path`.
Number = Annotated[float, BeforeValidator(_decimal_text)]
DnsLabel = Annotated[str, matches(_DNS_LABEL, "a DNS label (lower-case letters, digits, '-', at most 63)")]
DnsName = Annotated[str, matches(_DNS_NAME, "a DNS subdomain name (lower-case letters, digits, '-', '.')")]
Hostname = Annotated[str, matches(_HOSTNAME, "a fully qualified host name such as llm.example.org"), AfterValidator(_idna)]
FqdnPattern = Annotated[str, matches(_FQDN_PATTERN, "a host name or a '*.' wildcard host name"), AfterValidator(_idna)]
# llama.cpp's file types, the names its quantizer gives a GGUF and repos tag their files with
# (tools/quantize/quantize.cpp QUANT_OPTIONS, b10729), and MXFP4 (gpt-oss' own).
LLAMACPP_FILE_TYPES = (
    "Q1_0", "Q2_0", "Q4_0", "Q4_1", "MXFP4_MOE", "MXFP4", "Q5_0", "Q5_1", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M",
    "IQ1_S", "IQ1_M", "TQ1_0", "TQ2_0", "Q2_K", "Q2_K_S", "IQ3_XXS", "IQ3_S", "IQ3_M", "Q3_K", "IQ3_XS", "Q3_K_S",
    "Q3_K_M", "Q3_K_L", "IQ4_NL", "IQ4_XS", "Q4_K", "Q4_K_S", "Q4_K_M", "Q5_K", "Q5_K_S", "Q5_K_M", "Q6_K", "Q8_0",
    "F16", "BF16", "F32",
)
# Repackagers' variants: bartowski's <type>_L and unsloth's <K-quant>_XL (embedding and output kept at Q8_0).
_VARIANT = re.compile(r"^(Q[2-8]_K(_[SML])?|Q[458]_[01]|IQ[1-4]_[A-Z]+)_X{0,2}L$")


def _edits(a: str, b: str) -> int:
    """Levenshtein distance (small strings)."""
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        previous, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (ca != cb))
    return row[-1]


def _quant_tag(value: str) -> str:
    """A tag one edit or two from a llama.cpp file type, and none itself, is a typo: llama.cpp would find no
    file for it, an hour into the pod's start. Any other tag passes (repos name files their own way)."""
    tag = value.rsplit(":", 1)[1].upper()
    if tag in LLAMACPP_FILE_TYPES or _VARIANT.match(tag):
        return value
    near = sorted((_edits(tag, known), known) for known in LLAMACPP_FILE_TYPES)
    close = [known for distance, known in near if distance <= 2 and distance == near[0][0]]
    if close and len(tag) >= 3:
        raise ValueError(f"quant {value.rsplit(':', 1)[1]!r} is not one of llama.cpp's file types; did you mean "
                         f"{' or '.join(close)}? (the repo's file names show its quants)")
    return value


HfRepo = Annotated[str, matches(_HF_REPO, "a Hugging Face repo with a quant, such as org/Model-GGUF:Q4_K_M"),
                   AfterValidator(_quant_tag)]
RepoId = Annotated[str, Field(pattern=r"^[A-Za-z0-9][-A-Za-z0-9_.]*/[A-Za-z0-9][-A-Za-z0-9_.]*$")]
Duration = Annotated[str, matches(_DURATION, "a duration such as 600s, 5m or 1h")]
HttpPath = Annotated[str, Field(pattern=r"^/[A-Za-z0-9._~/-]*$")]
# The policy pack's definition of a pinned image, so that config and policy never disagree.
PinnedImage = Annotated[
    str, matches(PINNED_IMAGE, "a pinned image: registry/name:<build or version tag, e.g. b10731> or @sha256:<digest>")
]
Memory = Annotated[str, BeforeValidator(_number_as_quantity), AfterValidator(_memory)]
Cpu = Annotated[str, BeforeValidator(_number_as_quantity), AfterValidator(_cpu)]
Labels = Annotated[dict[str, str], AfterValidator(_labels)]
ConfigKey = Annotated[str, matches(_CONFIG_KEY, "a config key name (lower-case, digits, '_')")]


def _secret_data_key(value: str) -> str:
    """A key of a Secret's data, as the API server validates it (IsConfigMapKey): letters, digits, '-', '_',
    '.', at most 253, not '.' or '..' and not starting with '..' (the kubelet's own names in a mounted volume)."""
    if not re.fullmatch(r"[-._a-zA-Z0-9]{1,253}", value) or value in (".", "..") or value.startswith(".."):
        raise ValueError(f"{value!r} is not a Secret key the API server takes (letters, digits, '-', '_', '.'; "
                         "not '.', '..' or starting with '..')")
    return value


SecretDataKey = Annotated[str, AfterValidator(_secret_data_key)]
ResourceName = Annotated[str, matches(LABEL_KEY, "a resource name such as gpu.intel.com/i915")]
Positive = Annotated[int, Field(gt=0)]


def _count_key(value: object) -> object:
    """A mapping's keys reach the program as text (Pulumi stores config objects as JSON): a whole number
    written as a key ({8: 49}) is that number."""
    return int(value) if isinstance(value, str) and value.isdigit() else value


# A thread count used as a mapping key (memory_bandwidth_by_threads).
ThreadCount = Annotated[int, BeforeValidator(_count_key), Field(gt=0, le=1024)]
# llama.cpp server settings, with the bounds a model server and an on-demand model share.
LayerCount = Annotated[int, Field(ge=0, le=999)]  # --n-gpu-layers, --n-cpu-moe
ContextTokens = Annotated[int, Field(gt=0, le=4_194_304)]  # --ctx-size
MicroBatch = Annotated[int, Field(gt=0, le=65536)]  # --ubatch-size
Slots = Annotated[int, Field(gt=0, le=256)]  # --parallel
# Free-form text: one printable line, bounded.
Line = Annotated[str, AfterValidator(printable_line)]
# Why a risky setting is accepted: said in the summary (quoted, so it cannot pass for a line of it).
Reason = Annotated[str, Field(min_length=10, max_length=500), AfterValidator(printable_line), AfterValidator(_reason)]
Args = Annotated[list[Annotated[str, Field(max_length=4096), AfterValidator(printable_line)]], Field(max_length=64)]
# A qualified name as the API server validates label and annotation keys, load-balancer classes and
# resource names: an optional DNS-subdomain prefix and '/', then at most 63 characters.
QualifiedName = Annotated[str, matches(LABEL_KEY, "a qualified name such as example.com/name (letters, digits, '-', "
                                                  "'_', '.'; an optional DNS prefix and '/')")]


class Strict(BaseModel):
    """Unknown keys are errors, types are not coerced, and a validated config never changes."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


def doc(text: str, **constraints) -> object:
    """A field with its description (what docs/configuration.md's generated reference prints) and constraints."""
    return Field(description=text, **constraints)
