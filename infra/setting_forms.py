"""The form each text setting must have where it ends up.

A stack's settings become object names in the bucket, words in the nodes' setup commands, scalars
in the Ray cluster file, IAM members and image references. Each check here holds a value to the
form of the place it goes, whole (``fullmatch``: a pattern ending in ``$`` still lets a trailing
newline through), so a value cannot leave its place: a prefix cannot climb into another bucket, a
version cannot end a shell command, a name cannot start a new line of YAML, a member cannot be
everyone. Each returns why a value is refused, or ``None``; :mod:`infra.settings` names the field.
"""

from __future__ import annotations

import re
import unicodedata

# Object-name prefixes: a conservative subset of what Cloud Storage allows, safe in URLs and shells.
_PREFIX_SEGMENT = re.compile(r"[A-Za-z0-9._-]+")
MAX_PREFIX_LENGTH = 512  # object names are at most 1024 bytes; leave room for the step folders under it
_DOMAIN = re.compile(r"(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]{2,63}", re.IGNORECASE)
_EMAIL_LOCAL = re.compile(r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*")
_PROJECT_ID = r"(?:[a-z0-9.-]+:)?[a-z][a-z0-9-]{4,28}[a-z0-9]"  # optionally domain-scoped ("example.com:proj")
_IMAGE = re.compile(rf"(?:https://www\.googleapis\.com/compute/v1/)?projects/{_PROJECT_ID}/global/images/"
                    r"(?:family/)?[a-z](?:[a-z0-9-]{0,61}[a-z0-9])?")
# registry host[:port], then lowercase path components, then an optional tag and digest.
_CONTAINER_IMAGE = re.compile(r"[a-z0-9](?:[a-z0-9.-]*[a-z0-9])?(?::[0-9]{1,5})?"
                              r"(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)+"
                              r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?")
_PYTHON_VERSION = re.compile(r"3\.[0-9]{1,2}(?:\.[0-9]{1,2})?")
_USER_NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
_NAME = re.compile(r"[a-z0-9](?:[a-z0-9.-]{0,62}[a-z0-9])?")
_REGION = re.compile(r"[a-z]+-[a-z]+[0-9]{1,2}")
_CPU = re.compile(r"(?:[0-9]+(?:\.[0-9]+)?|[0-9]+m)")
_MEMORY = re.compile(r"[1-9][0-9]*(?:Mi|Gi)")

# Members that are everyone, and email domains anyone can sign up to: a grant to `domain:gmail.com`
# is a grant to every Gmail account. The list names the common consumer providers; it cannot be
# complete, which is why only user:, group: and serviceAccount: members name people for certain.
PUBLIC_MEMBERS = ("allUsers", "allAuthenticatedUsers")
CONSUMER_EMAIL_DOMAINS = frozenset({
    "gmail.com", "googlemail.com", "outlook.com", "hotmail.com", "live.com", "msn.com", "yahoo.com",
    "icloud.com", "me.com", "mac.com", "aol.com", "proton.me", "protonmail.com", "gmx.com", "gmx.net",
    "mail.com", "yandex.com", "yandex.ru", "qq.com", "163.com", "126.com",
})
MEMBER_KINDS = ("user:", "group:", "serviceAccount:", "domain:")


def control_character(value: str) -> str | None:
    """Why ``value`` cannot be a setting's text: a control, format or line-separator character.

    Such a character ends a YAML line or comment (YAML also breaks lines at U+0085, U+2028 and
    U+2029), a shell command, or reorders what a reader sees (U+202E); no setting needs one.
    """
    for position, character in enumerate(value):
        category = unicodedata.category(character)
        if category.startswith("C") or category in ("Zl", "Zp"):
            return (f"holds the control character U+{ord(character):04X} at position {position}; "
                    "settings are plain text.")
    return None


def object_prefix(value: str) -> str | None:
    """An object-name prefix inside the bucket: '/'-separated segments, none empty, '.' or '..'."""
    if value == "":
        return None  # the whole bucket
    if len(value) > MAX_PREFIX_LENGTH:
        return f"is {len(value)} characters; a prefix is at most {MAX_PREFIX_LENGTH}."
    for segment in value.split("/"):
        if segment == "":
            return (f"{value!r} has an empty path segment (a leading, trailing or doubled '/'); write it as "
                    "segments joined by single slashes, e.g. 'marin' or 'lab/marin'.")
        if segment in (".", ".."):
            return f"{value!r} has the path segment {segment!r}; the prefix must stay inside the bucket."
        if not _PREFIX_SEGMENT.fullmatch(segment):
            return f"{value!r}: each path segment may hold only letters, digits, '.', '_' and '-'."
    return None


def iam_member(value: str, allow_public: bool) -> str | None:
    """An IAM member as Google Cloud writes one; public and consumer-wide members only if allowed."""
    if value in PUBLIC_MEMBERS:
        if allow_public:
            return None
        return (f"{value!r} would make the web view public; name users or groups ('user:you@example.com', "
                "'group:lab@example.com'), or set web.allow_public_invokers: true to mean it.")
    kind, _, rest = value.partition(":")
    kind += ":"
    malformed = (f"{value!r} is not an IAM member; write it as one of "
                 f"{', '.join(k + '...' for k in MEMBER_KINDS)} with an email address (a domain for domain:).")
    if kind not in MEMBER_KINDS or not rest:
        return malformed
    if kind == "domain:":
        if not _DOMAIN.fullmatch(rest):
            return malformed
        if rest.lower() in CONSUMER_EMAIL_DOMAINS and not allow_public:
            return (f"{value!r} is a consumer email domain: anyone can make an account there. Name users or "
                    "groups, or set web.allow_public_invokers: true to mean it.")
        return None
    local, at, domain = rest.rpartition("@")
    if not at or not _EMAIL_LOCAL.fullmatch(local) or len(local) > 64 or not _DOMAIN.fullmatch(domain):
        return malformed
    if kind == "serviceAccount:" and not domain.lower().endswith("gserviceaccount.com"):
        return f"{value!r}: a service account's address ends in gserviceaccount.com."
    return None


def python_version(value: str) -> str | None:
    if _PYTHON_VERSION.fullmatch(value):
        return None
    return f"{value!r} is not a Python version such as '3.11' or '3.12.4'."


def requirement(value: str) -> str | None:
    """What pip installs: a requirement, never an option (``--index-url`` would change where from)."""
    if not value.strip():
        return ("is empty; say what every node installs, e.g. "
                "\"marin[ray,gcs] @ git+https://github.com/<your org>/marin.git@<commit>\".")
    if value.lstrip().startswith("-"):
        return f"{value!r} starts with '-', which pip reads as an option; give a requirement."
    return None


def user_name(value: str) -> str | None:
    if _USER_NAME.fullmatch(value):
        return None
    return f"{value!r} is not a user name (lowercase letters, digits, '_' and '-', at most 32)."


def compute_image(value: str) -> str | None:
    if _IMAGE.fullmatch(value):
        return None
    return (f"{value!r} is not a Compute Engine image; write projects/<project>/global/images/<image> "
            "or projects/<project>/global/images/family/<family>.")


def container_image(value: str) -> str | None:
    if value == "" or (_CONTAINER_IMAGE.fullmatch(value) and "/" in value):
        return None
    return (f"{value!r} is not a container image reference such as "
            "'us-central1-docker.pkg.dev/<project>/<repository>/<image>:<tag>'.")


def resource_name(value: str) -> str | None:
    """A name the cloud APIs take as written (a TPU runtime version, for one)."""
    if _NAME.fullmatch(value):
        return None
    return f"{value!r} is not a name (lowercase letters, digits, '.' and '-')."


def region(value: str) -> str | None:
    if _REGION.fullmatch(value):
        return None
    return f"{value!r} is not a region such as 'us-central1' or 'europe-west4'."


def cpu_limit(value: str) -> str | None:
    if _CPU.fullmatch(value) and float(value.rstrip("m") or 0) > 0:
        return None
    return f"{value!r} is not a CPU limit such as '1', '2' or '1000m'."


def memory_limit(value: str) -> str | None:
    if _MEMORY.fullmatch(value):
        return None
    return f"{value!r} is not a memory limit such as '512Mi' or '2Gi'."


__all__ = ["CONSUMER_EMAIL_DOMAINS", "MAX_PREFIX_LENGTH", "MEMBER_KINDS", "PUBLIC_MEMBERS", "compute_image",
           "container_image", "control_character", "cpu_limit", "iam_member", "memory_limit", "object_prefix",
           "python_version", "region", "requirement", "resource_name", "user_name"]
