r"""PII redaction of trajectories before anything is stored or published downstream.

Why here: the reward service is the first consumer that keeps anything derived from a
trajectory (scores, reasons, extracted code, custom-function inputs), so it scrubs every string
first. Producers redact too, before publishing (`redact_event`: the rollout worker, the
publishing helper and the Agent Zero plugin call it), so raw PII never reaches the trajectory
stream; the reward service stays the second line. The kinds (seed 000, "Security &
Privacy", widened after a review): e-mail addresses (non-ASCII too), API keys and tokens
(provider prefixes, bearer and Basic credentials, JWTs signed or not, 32+ hex keys next to a
key word, long high-entropy secrets), password assignments (multi-word after "Password:",
"my password is ..."), phone numbers, Luhn-valid card numbers (spaces, dashes, dots, mixed),
US social security numbers, IBANs (mod-97 checked) and IPv4/IPv6 addresses (not loopback).

Speed: most strings contain no PII, so all strings of a payload are joined and scanned once with
cheap byte operations; only when that finds a candidate are the strings redacted one by one.
Joining cannot hide a match (a match inside one string is a match of the joined text), so the
pre-scan only ever costs false positives, never misses. On raw JSON the pre-scan is sound for
every valid encoding: a payload with `\u` or `\/` escapes is decoded first (`candidates_json`).
"""

from __future__ import annotations

import bisect
import functools
import ipaddress
import json
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

# Order matters: specific kinds first, so a card number is not half-eaten as a phone number and
# a provider key is counted as an API key rather than as an anonymous high-entropy secret.
KINDS = (
    "private_key",
    "bearer_token",
    "api_key",
    "jwt",
    "password",
    "email",
    "iban",
    "credit_card",
    "ssn",
    "ip_address",
    "phone",
    "high_entropy_secret",
)

_PROVIDER_KEY = (
    r"(?:sk-(?:proj-|ant-(?:api\d\d-)?|or-v1-|svcacct-)?[A-Za-z0-9_\-]{20,}"  # OpenAI, Anthropic, OpenRouter
    r"|(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{16,}"  # Stripe
    r"|gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{40,}"  # GitHub
    r"|glpat-[A-Za-z0-9_\-]{20,}"  # GitLab
    r"|xox[abprs]-[A-Za-z0-9\-]{15,}"  # Slack
    r"|(?:AKIA|ASIA)[0-9A-Z]{16}"  # AWS access key id
    r"|AIza[0-9A-Za-z_\-]{35}"  # Google
    r"|hf_[A-Za-z0-9]{30,}"  # Hugging Face
    r"|npm_[A-Za-z0-9]{36}|pypi-[A-Za-z0-9_\-]{50,}"  # npm, PyPI
    r"|key-[0-9a-z]{32}"  # Mailgun
    r"|SG\.[A-Za-z0-9_\-]{22}\.[A-Za-z0-9_\-]{43})"  # SendGrid
)

_PATTERNS: dict[str, str] = {
    "private_key": r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z ]*PRIVATE KEY-----|\Z)",
    # Bearer tokens, and HTTP Basic credentials after "Authorization:" ("basic" alone is a word).
    "bearer_token": (
        r"(?i:\bbearer)\s+[A-Za-z0-9\-._~+/]{8,}=*"
        r"|(?i:authorization[\"']?[ \t]{0,4}[:=][ \t]{0,4}[\"']?basic)[ \t]+(?P<v>[A-Za-z0-9+/]{6,}={0,2})"
    ),
    # key = value, key: value, "key": "value"; the key names say it is a secret. After a
    # password word and ':' the value may be several words (up to the end of the line or a
    # quote); "my password is X" counts too.
    "password": (
        r"(?i:(?P<k2>password|passwd|passphrase))[\"']?[ \t]{0,4}:[ \t]{0,4}(?![\"'\s,}]|\[REDACTED)"
        r"(?P<v3>[^\s\"',;}&]{3,}(?:[ \t]+[^\s\"',;}&]+){0,8})"
        r"|(?i:(?P<k>password|passwd|pwd|passphrase|secret|api[_-]?key|access[_-]?token|auth[_-]?token"
        r"|refresh[_-]?token|token|private[_-]?key))"
        r"[\"']?[ \t]{0,4}[:=][ \t]{0,4}[\"']?(?![\"'\s,}]|\[REDACTED)(?P<v>[^\s\"',;}&]{3,})"
        r"|(?i:\b(?:my|the|our|your)\s+(?:password|passphrase|passcode|pin)\s+(?:is|was)\s*:?\s+)"
        r"[\"']?(?!\[REDACTED|(?i:not|required|incorrect|wrong|invalid|missing|expired|too|empty"
        r"|set|correct|changed|reset|needed|stored|hashed|bent|the|a|an|for|in|on|at|to|being)\b)"
        r"(?P<v2>[^\s\"',;]{3,})"
    ),
    "api_key": (
        rf"(?<![A-Za-z0-9]){_PROVIDER_KEY}(?![A-Za-z0-9])"
        # 32-64 hex characters near a key word: a hash alone is not a key, "API key: <hex>" is.
        r"|(?i:\b(?:api|key|token|secret|apikey|access)\w{0,10})[^\n]{0,30}?(?<![0-9A-Za-z])"
        r"(?P<v>[0-9a-fA-F]{32,64})(?![0-9A-Za-z])"
    ),
    # Signed (three segments) or unsigned (alg "none": the third segment is empty).
    "jwt": r"\beyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.(?:[A-Za-z0-9_\-]{8,}|(?![A-Za-z0-9_\-]))",
    # ASCII and internationalised addresses (letters of any script).
    "email": r"(?<![\w.+-])[\w.%+\-]{1,64}@[^\W_](?:[\w\-]*[^\W_])?(?:\.[^\W_](?:[\w\-]*[^\W_])?)*\.[^\W\d_]{2,}\b(?!:[\w~/])",
    # Country, check digits, 11-30 letters/digits (optionally in groups); mod-97 checked below.
    "iban": r"\b[A-Z]{2}\d{2}(?:[ ]?[A-Z0-9]){11,30}\b",
    # 13-19 digits, optionally grouped by spaces, dashes or dots (mixed too); Luhn-checked below.
    # Not glued to letters: digit groups inside UUIDs and hex ids are not cards.
    "credit_card": r"(?<![0-9A-Za-z\-.])\d(?:[ \-.]?\d){12,18}(?![0-9A-Za-z\-]|\.\d)",
    # US social security numbers: area-group-serial with dashes, or 9 digits after "SSN".
    "ssn": (
        r"(?<![\d\-])(?!000|666|9\d\d)\d{3}-(?!00)\d{2}-(?!0000)\d{4}(?![\d\-])"
        r"|(?i:\b(?:ssn|social security(?: number| no\.?)?)\b)\W{0,6}(?P<v>\d{9})(?!\d)"
    ),
    # IPv4 and IPv6 (validated by the ipaddress module; loopback and unspecified are kept).
    "ip_address": (
        r"(?<![\w.])(?<!v)(?<![vV]ersion )(?:\d{1,3}\.){3}\d{1,3}(?!\.?\d)(?![\w.]*\.\d)"
        r"|(?<![\w:.])(?=[0-9A-Fa-f:.]*::|(?:[0-9A-Fa-f]{1,4}:){7})[0-9A-Fa-f:.]{2,45}(?![\w:])"
    ),
    # International (+CC ...) or NANP with separators; a bare run of digits (ids, epoch seconds)
    # is deliberately not a phone number.
    "phone": (
        r"(?<![\w+])(?:\+\d{1,3}[ .\-]?(?:\(\d{1,4}\)[ .\-]?)?\d{1,4}(?:[ .\-]?\d{2,4}){2,4}"
        r"|\(\d{3}\)[ .\-]?\d{3}[ .\-]\d{4}|\d{3}[ .\-]\d{3}[ .\-]\d{4})(?![\w])"
    ),
    # Long tokens made of base64/url-safe characters; the entropy check below decides.
    "high_entropy_secret": r"(?<![A-Za-z0-9+/_\-])[A-Za-z0-9+/_\-]{32,}={0,2}(?![A-Za-z0-9+/_\-])",
}

_VALUE_GROUPS = ("v", "v2", "v3")
_UUID = re.compile(r"^[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$")
_HEX = re.compile(r"^[0-9a-fA-F]+$")


def luhn_ok(digits: str) -> bool:
    """The Luhn checksum every payment card number satisfies."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2 == 1:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


def shannon_entropy(text: str) -> float:
    """Bits per character of `text`'s own character distribution."""
    n = len(text)
    return -sum(c / n * math.log2(c / n) for c in Counter(text).values())


_CARD_SEP = re.compile(r"[ \-.]")


def _accept_card(match: str) -> bool:
    """Luhn-valid, 13-19 digits; grouped numbers need card-like groups (3-6 digits), so a
    decimal such as 3.14159265358979 is not a card."""
    groups = _CARD_SEP.split(match)
    digits = "".join(groups)
    if not 13 <= len(digits) <= 19 or len(set(digits)) < 2:
        return False
    if len(groups) > 1 and not all(3 <= len(g) <= 6 for g in groups):
        return False
    return luhn_ok(digits)


def iban_ok(text: str) -> bool:
    """ISO 13616 mod-97 check of an IBAN (spaces allowed)."""
    compact = text.replace(" ", "").upper()
    if not 15 <= len(compact) <= 34 or not compact[:2].isalpha() or not compact[2:4].isdigit():
        return False
    moved = compact[4:] + compact[:4]
    try:
        number = int("".join(str(int(ch, 36)) for ch in moved))
    except ValueError:
        return False
    return number % 97 == 1


def _accept_iban(match: str) -> bool:
    return iban_ok(match)


def _accept_ip(match: str) -> bool:
    """A valid IPv4/IPv6 address that is not loopback or unspecified (0.0.0.0, ::1, ::)."""
    core = match.rstrip(".")
    try:
        addr = ipaddress.ip_address(core)
    except ValueError:
        return False
    if addr.is_loopback or addr.is_unspecified:
        return False
    if ":" in core and not any(c.isdigit() for c in core):
        return False  # a::b, dead::beef: Rust/C++ paths far more often than addresses
    return ":" not in core or "::" in core or core.count(":") == 7


def _accept_ssn(match: str) -> bool:
    digits = "".join(ch for ch in match if ch.isdigit())[-9:]
    return len(digits) == 9 and digits[:3] not in ("000", "666") and digits[0] != "9"


def _accept_phone(match: str) -> bool:
    n = sum(ch.isdigit() for ch in match)
    return 10 <= n <= 15 if not match.startswith("+") else 9 <= n <= 15


def _accept_secret(match: str) -> bool:
    """A long token is a secret when it mixes classes and is random enough (not a hash or id)."""
    core = match.rstrip("=")
    if _UUID.match(core) or _HEX.match(core) or core.startswith("[REDACTED"):
        return False
    if "/" in core and core.count("/") >= 3:  # a file path, not a key
        return False
    classes = sum(
        (
            any(c.islower() for c in core),
            any(c.isupper() for c in core),
            any(c.isdigit() for c in core),
        )
    )
    return classes >= 3 and shannon_entropy(core) >= 4.0


_ACCEPT: dict[str, Callable[[str], bool]] = {
    "credit_card": _accept_card,
    "iban": _accept_iban,
    "ip_address": _accept_ip,
    "ssn": _accept_ssn,
    "phone": _accept_phone,
    "high_entropy_secret": _accept_secret,
}


@dataclass
class RedactionReport:
    """What one redaction pass removed, counted per kind."""

    counts: Counter[str] = field(default_factory=Counter)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def merge(self, other: RedactionReport) -> None:
        self.counts.update(other.counts)


class Redactor:
    """Compiled patterns plus the walk over nested JSON-like values."""

    def __init__(
        self,
        kinds: Iterable[str] = KINDS,
        placeholder: str = "[REDACTED:{kind}]",
        *,
        string_gate: bool = True,
    ) -> None:
        wanted = set(kinds)
        unknown = wanted - set(KINDS)
        if unknown:
            raise ValueError(f"unknown PII kinds {sorted(unknown)}; choose from {list(KINDS)}")
        self.kinds = tuple(k for k in KINDS if k in wanted)
        self.placeholder = placeholder
        self._compiled = {k: re.compile(_PATTERNS[k]) for k in self.kinds}
        # Per (string, kinds): the kinds `_string_gate` lets through. Redacted payloads
        # repeat most of their strings (tool names, field values, templated text), and
        # the gate is most of the walk's cost. `string_gate=False` turns the cache off
        # (the tests compare both).
        self._gate_cache: dict[tuple[str, frozenset[str]], frozenset[str]] | None = (
            {} if string_gate else None
        )

    def candidates(self, text: str | bytes) -> frozenset[str]:
        """Kinds that might occur in `text` (a string, or the raw JSON bytes of a payload).

        Mostly C-speed byte operations plus the real patterns on a few short slices: an empty
        answer means certainly no PII; a kind in the answer may be a false alarm that the real
        pattern then rejects. Valid on JSON text without `\\u` / `\\/` escapes too (no PII
        pattern matches a character JSON must escape, and the password check allows escaped
        whitespace in its gap); for any JSON use `candidates_json`.
        """
        raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
        found: set[str] = set()
        if b"@" in raw and _email_near_at(raw):
            found.add("email")
        runs = raw.translate(_TOKEN_MAP)
        pos = runs.find(_RUN20)
        while pos != -1:  # each run of >= 20 key characters
            end = runs.find(b" ", pos)
            end = len(runs) if end == -1 else end
            token = raw[pos:end]
            if not (
                _UUID_B.fullmatch(token)
                or (
                    _WORDS_B.fullmatch(token)
                    and not _KEY_PREFIX_B.search(token)
                    and not _HEXISH_B.search(token)
                )
            ):
                found.add("api_key")
                if end - pos >= 32:
                    found.add("high_entropy_secret")
            pos = runs.find(_RUN20, end)
        if b"eyJ" in raw:
            found.add("jwt")
        if b"-----BEGIN" in raw:
            found.add("private_key")
        # (Slack's xox… tokens are >= 20 key characters: the run check above finds them.)
        low = raw.lower()
        if b"bearer" in low or (b"basic" in low and b"authorization" in low):
            found.add("bearer_token")
        if _secret_assignment(low):
            found.add("password")
        if b"0" * 9 in raw.translate(_DIGIT_MAP, _DIGIT_SEPARATORS):
            found.update(_numbers_near_runs(raw))
        if "ip_address" in self._compiled and _address_shape(raw):
            found.add("ip_address")
        return frozenset(k for k in found if k in self._compiled)

    def candidates_json(self, raw: bytes) -> frozenset[str]:
        """`candidates` for a JSON document in any valid encoding.

        An escape can spell any character (`\\u0040` is "@", `\\/` is "/"), which the byte
        scan cannot see through; such documents are decoded and their strings (and keys)
        scanned instead. Escape-free JSON, the common case, keeps the byte fast path."""
        if b"\\" not in raw or (b"\\u" not in raw and b"\\/" not in raw):
            return self.candidates(raw)
        strings: list[str] = []
        keys: list[str] = []
        _collect(json.loads(raw), strings, keys)
        todo = self.candidates("\n".join(strings)) if strings else frozenset()
        if "password" in self._compiled and any(_secret_key(k) for k in keys):
            todo = todo | {"password"}
        return todo

    def candidates_batch(self, raws: Sequence[bytes]) -> list[frozenset[str]]:
        """`[self.candidates_json(r) for r in raws]` for a batch of JSON documents, at a
        fraction of the cost: the cheap necessary conditions of `candidates` run once over
        the batch joined into one buffer (a few C-speed passes), and only the documents
        they flag get the per-document scan. A document no condition flags would get an
        empty answer from `candidates_json` too, so the result is the same list.

        The documents are joined with NUL, which valid JSON never contains raw and which
        no pattern or byte class here accepts, so nothing can match across two documents
        and every window is clipped to its own document.
        """
        n = len(raws)
        if n == 0:
            return []
        if n == 1:
            return [self.candidates_json(raws[0])]
        found = _batch_candidates(raws)
        out: list[frozenset[str]] = []
        for i, kinds in enumerate(found):
            if kinds is None:  # escapes: decode, as `candidates_json` does
                out.append(self.candidates_json(raws[i]))
            else:
                out.append(frozenset(k for k in kinds if k in self._compiled))
        return out

    def redact_text(
        self,
        text: str,
        report: RedactionReport | None = None,
        kinds: Iterable[str] | None = None,
    ) -> str:
        """`text` with every PII match replaced by a placeholder naming its kind."""
        todo = self.candidates(text) if kinds is None else frozenset(kinds)
        if not todo:
            return text
        return self._apply(text, todo, self._replacers(todo, report))

    def _apply(
        self, text: str, todo: frozenset[str], replacers: dict[str, Callable[[re.Match[str]], str]]
    ) -> str:
        for kind in self.kinds:
            if kind in todo:
                text = self._compiled[kind].sub(replacers[kind], text)
        return text

    def _replacers(
        self, kinds: Iterable[str], report: RedactionReport | None
    ) -> dict[str, Callable[[re.Match[str]], str]]:
        return {k: self._replacer(k, report) for k in kinds}

    def _replacer(
        self, kind: str, report: RedactionReport | None
    ) -> Callable[[re.Match[str]], str]:
        accept = _ACCEPT.get(kind)
        replacement = self.placeholder.format(kind=kind.upper())

        def _sub(m: re.Match[str]) -> str:
            if accept is not None and not accept(m.group(0)):
                return m.group(0)
            groups = m.re.groupindex
            if "k" in groups and (m.group("k") or "").lower() == "token" and m.group("v").isdigit():
                return m.group(0)  # "token: 1500" counts tokens, it is not a secret
            if report is not None:
                report.counts[kind] += 1
            for name in _VALUE_GROUPS:  # keep the key name of `password = value`
                if name in groups and m.group(name) is not None:
                    start, end = m.span(name)
                    whole = m.group(0)
                    offset = m.start()
                    return whole[: start - offset] + replacement + whole[end - offset :]
            return replacement

        return _sub

    def redact(
        self,
        value: Any,
        report: RedactionReport | None = None,
        skip_keys: frozenset[str] = frozenset(),
        kinds: Iterable[str] | None = None,
    ) -> Any:
        """A copy of a nested dict/list/str value with every string (keys too) redacted.

        Values under a top-level key in `skip_keys` (e.g. the trajectory id) are kept. `kinds`
        are the candidates if already known (e.g. from `candidates()` on the raw JSON). Returns
        the same object when nothing was found, so the common case allocates nothing.
        """
        if kinds is None:
            strings: list[str] = []
            keys: list[str] = []
            _collect(value, strings, keys)
            todo = self.candidates("\n".join(strings)) if strings else frozenset()
            if "password" in self._compiled and any(_secret_key(k) for k in keys):
                todo = todo | {"password"}
        else:
            todo = frozenset(kinds) & frozenset(self._compiled)
        if not todo:
            return value
        replacers = self._replacers(todo, report if report is not None else RedactionReport())
        if isinstance(value, dict) and skip_keys:
            return {
                k: (v if k in skip_keys else self._walk(v, todo, replacers))
                for k, v in value.items()
            }
        return self._walk(value, todo, replacers)

    def _walk(
        self, value: Any, todo: frozenset[str], replacers: dict[str, Callable[[re.Match[str]], str]]
    ) -> Any:
        kind = type(value)
        if kind is str:
            if len(value) < 6:
                return value
            cache = self._gate_cache
            if cache is None or len(value) > 512:
                here = _string_gate(value, todo)
            else:
                key = (value, todo)
                here = cache.get(key)  # type: ignore[assignment]
                if here is None:
                    if len(cache) >= 100_000:
                        cache.clear()
                    here = cache[key] = _string_gate(value, todo)
            return self._apply(value, here, replacers) if here else value
        if kind is dict:
            keys_matter = "password" in todo
            out: dict[Any, Any] = {}
            for k, v in value.items():
                if type(k) is str:
                    if keys_matter and type(v) is str and v and _secret_key(k):
                        out[k] = replacers["password"](_WHOLE.match(v))  # type: ignore[arg-type]
                        continue
                    if len(k) >= 6 and self._key_hit(k, todo):
                        k = self._apply(k, todo, replacers)
                out[k] = self._walk(v, todo, replacers)
            return out
        if kind is list or kind is tuple:
            return [self._walk(v, todo, replacers) for v in value]
        return value

    @functools.lru_cache(maxsize=8192)  # noqa: B019 - keys repeat (schema field names)
    def _key_hit(self, key: str, todo: frozenset[str]) -> bool:
        """Whether a dict key holds PII (cached: keys are mostly the same field names)."""
        here = _string_gate(key, todo)
        return bool(here) and self._apply(key, here, self._replacers(here, None)) != key


@functools.lru_cache(maxsize=8192)
def _secret_key(key: str) -> bool:
    return _SECRET_KEY.fullmatch(key) is not None


_TOKEN_CHARS = set(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/_-")
_TOKEN_MAP = bytes(ord("a") if i in _TOKEN_CHARS else ord(" ") for i in range(256))
# Digits become "0", separators vanish, everything else breaks a run: nine zeros in a row is
# the shortest phone number (cards are longer).
_DIGIT_MAP = bytes(ord("0") if 48 <= i <= 57 else ord(" ") for i in range(256))
_DIGIT_SEPARATORS = b" .-()+"
_DIGSEP_MAP = bytes(
    ord("0") if 48 <= i <= 57 or i in _DIGIT_SEPARATORS else ord(" ") for i in range(256)
)
_RUN9 = b"0" * 9
_NON_DIGITS = bytes(i for i in range(256) if not 48 <= i <= 57)
_RUN20 = b"a" * 20
_HEX_DIGITS = b"0123456789abcdefABCDEF"
_ADDR_MAP = bytes(
    ord("0") if i in _HEX_DIGITS else i if i in (ord("."), ord(":")) else ord(" ")
    for i in range(256)
)
_HEXISH_B = re.compile(rb"^[0-9a-fA-F]{32,}$")
_UUID_B = re.compile(rb"[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}")
_WORDS_B = re.compile(rb"[a-z_\-]+")  # snake/kebab-case words: names, not keys ...
_KEY_PREFIX_B = re.compile(
    rb"sk-|sk_|rk_|pk_|gh[pousr]_|github_pat_|glpat-|hf_|npm_|pypi-|xox[abprs]-|key-"
)  # ... unless
_SECRET_WORDS = (b"pass", b"pwd", b"secret", b"key", b"token")
_SECRET_WORDS_S = tuple(w.decode() for w in _SECRET_WORDS)
_ASSIGN_OPENERS = frozenset((b'"', b"'", b"\\", b" ", b":", b"="))
_SECRET_NAMES = (
    r"password|passwd|pwd|passphrase|secret|client[_-]?secret|api[_-]?key|access[_-]?token"
    r"|auth[_-]?token|refresh[_-]?token|token|private[_-]?key|secret[_-]?key"
)
# A dict key that names a secret: its string value is redacted whole ({"password": "..."}).
_SECRET_KEY = re.compile(rf"(?i)(?:.*[_\-.])?(?:{_SECRET_NAMES})")
# On lower-cased text; the gap allows quotes and JSON-escaped whitespace before the ':' / '='.
_SECRET_ASSIGN_B = re.compile(
    rb"(?:" + _SECRET_NAMES.encode() + rb")(?:\\?[\"'])?(?: |\\t){0,4}[:=]"
)
_WHOLE = re.compile(r"[\s\S]+")
_CARD_B = re.compile(_PATTERNS["credit_card"].encode())
_PHONE_B = re.compile(_PATTERNS["phone"].encode())
_EMAIL_B = re.compile(_PATTERNS["email"].encode())
# (kind, bytes pattern, how far before / after a digit run a match may start / end)
_NUMBER_CHECKS = (
    ("credit_card", _CARD_B, 1, 1),
    ("phone", _PHONE_B, 1, 1),
    ("ssn", re.compile(_PATTERNS["ssn"].encode()), 40, 1),
    ("iban", re.compile(_PATTERNS["iban"].encode()), 40, 40),
)
_MY_PASSWORD_B = re.compile(rb"(?:password|passphrase|passcode|pin)\s+(?:is|was)\b")


def _numbers_near_runs(raw: bytes, limit: int = 64) -> set[str]:
    """Card/phone kinds confirmed by the real patterns, tried only on the runs of digits and
    separators that hold nine digits or more (digits and separators are never JSON-escaped)."""
    found: set[str] = set()
    runs = raw.translate(_DIGSEP_MAP)
    pos = runs.find(_RUN9)
    for _ in range(limit):
        if pos == -1:
            return found
        end = runs.find(b" ", pos)
        end = len(runs) if end == -1 else end
        if len(raw[pos:end].translate(None, _DIGIT_SEPARATORS)) >= 9:
            for kind, pattern, back, ahead in _NUMBER_CHECKS:
                if kind not in found:
                    accept = _ACCEPT[kind]
                    if any(
                        accept(m.group(0).decode(errors="replace"))
                        for m in pattern.finditer(raw, max(0, pos - back), end + ahead)
                    ):
                        found.add(kind)
        pos = runs.find(_RUN9, end)
    return {k for k, _, _, _ in _NUMBER_CHECKS}  # too many runs to check: let the patterns decide


_IPV4_NEAR = re.compile(rb"(?:\d{1,3}\.){3}\d{1,3}")
# Needles end with ':' (rare in the mapped text, where every hex digit is "0"), so the
# search skips fast: a 1-char or a 3-4-char group between colons, or four 2-char groups.
_COLON_GROUPS = (b"0:0:", b":000:", b":0000:", b"00:00:00:00:")


def _address_shape(raw: bytes, limit: int = 64) -> bool:
    """Whether `raw` may hold an IP address (a necessary condition, cheap when false).

    IPv4: some '.' has a digit on each side and another '.' within the next group (dots are
    rare, so this walks few positions; a float fails the second test), then the dotted-quad
    pattern decides. IPv6: "::", or, written out, hex groups before a colon that a clock time
    cannot show (a 1-char group followed by another colon, a 3-4-char group, or four 2-char
    groups) once hex digits are mapped to "0"; JSON's `"key": 4000` has no group before the
    colon."""
    if b"::" in raw:
        return True
    x = raw.translate(_ADDR_MAP)
    if any(g in x for g in _COLON_GROUPS):
        return True
    n = len(raw)
    pos = raw.find(b".", 1)
    checks = 0
    while pos != -1 and pos + 1 < n:
        if (
            48 <= raw[pos - 1] <= 57
            and 48 <= raw[pos + 1] <= 57
            and raw.find(b".", pos + 2, pos + 5) != -1
        ):
            if _IPV4_NEAR.search(raw, max(0, pos - 3), pos + 13):
                return True
            checks += 1
            if checks >= limit:
                return True
        pos = raw.find(b".", pos + 1)
    return False


def _secret_assignment(low: bytes, limit: int = 64) -> bool:
    """The assignment pattern, tried only around occurrences of the secret words (and
    "my password is ...")."""
    if b"pin " in low and _MY_PASSWORD_B.search(low):
        return True
    for word in _SECRET_WORDS:
        pos = low.find(word)
        if word == b"pass" and pos != -1 and _MY_PASSWORD_B.search(low, pos):
            return True
        # Every secret name but "pass..." ends with its word, so the next byte must open the
        # assignment (quote, escape, space, ':' or '='): "total_tokens" is skipped cheaply.
        check_next = word != b"pass"
        for _ in range(limit):
            if pos == -1:
                break
            after = pos + len(word)
            if (
                not check_next or low[after : after + 1] in _ASSIGN_OPENERS
            ) and _SECRET_ASSIGN_B.search(low, max(0, pos - 16), pos + 40):
                return True
            pos = low.find(word, pos + 1)
        else:
            return True
    return False


def _email_near_at(raw: bytes, limit: int = 64) -> bool:
    """The e-mail pattern, tried only on slices around the first `limit` '@' signs (an
    address with non-ASCII letters, which the bytes pattern cannot match, always counts)."""
    pos = raw.find(b"@")
    for _ in range(limit):
        if pos == -1:
            return False
        if _EMAIL_B.search(raw, max(0, pos - 65), pos + 256):
            return True
        if not raw[max(0, pos - 65) : pos + 256].isascii():
            return True
        pos = raw.find(b"@", pos + 1)
    return True


# ---- the batch pre-scan (Redactor.candidates_batch) ------------------------------------
# Multi-byte needles are found from one anchor byte each (numpy compares the whole batch
# with that byte at once, then checks the needle's other bytes at the few hits): one such
# pass costs a fraction of a `bytes.find` for a short needle, and needles share anchors.
_DIGIT_MAP_NUL = bytes(
    ord("0") if 48 <= i <= 57 else ord("X") if i == 0 else ord(" ") for i in range(256)
)  # as _DIGIT_MAP, with the documents' NUL separator kept as a marker ("X")
_IS_HEX = np.zeros(256, dtype=bool)
_IS_HEX[list(_HEX_DIGITS)] = True
_IS_DIGIT = np.zeros(256, dtype=bool)
_IS_DIGIT[48:58] = True
_IS_OPENER = np.zeros(256, dtype=bool)
_IS_OPENER[[b[0] for b in _ASSIGN_OPENERS]] = True
_IS_SPACE = np.zeros(256, dtype=bool)
_IS_SPACE[list(b" \t\n\r\x0b\x0c")] = True
_PASS_NEXT = np.zeros(256, dtype=bool)  # password, passphrase, passcode
_PASS_NEXT[list(b"wpc")] = True
_PAD = 16  # zero bytes around the batch: every offset looked at stays in the array
_RUN_CACHE: dict[bytes, bool] = {}


def _suspicious_run(token: bytes) -> bool:
    """The per-token test of `Redactor.candidates` (a run of >= 20 key characters that is
    not a UUID, nor a plain snake/kebab-case name), cached: names repeat across messages."""
    hit = _RUN_CACHE.get(token)
    if hit is None:
        hit = not (
            _UUID_B.fullmatch(token)
            or (
                _WORDS_B.fullmatch(token)
                and not _KEY_PREFIX_B.search(token)
                and not _HEXISH_B.search(token)
            )
        )
        if len(_RUN_CACHE) >= 50_000:
            _RUN_CACHE.clear()
        _RUN_CACHE[token] = hit
    return hit


class _Batch:
    """One batch joined with NUL separators, as padded numpy byte arrays (as sent and
    lower-cased), with the document each position belongs to."""

    def __init__(self, joined: bytes, starts: list[int]) -> None:
        self.joined = joined
        self.low = joined.lower()
        size = len(joined)
        self.size = size
        self.starts = np.asarray(starts, dtype=np.int64)
        self.ends = np.append(self.starts[1:] - 1, size)
        self.raw_a = np.zeros(size + 2 * _PAD, dtype=np.uint8)
        self.raw_a[_PAD : _PAD + size] = np.frombuffer(joined, dtype=np.uint8)
        self.low_a = np.zeros(size + 2 * _PAD, dtype=np.uint8)
        self.low_a[_PAD : _PAD + size] = np.frombuffer(self.low, dtype=np.uint8)
        self._anchors: dict[tuple[bool, int], NDArray[np.intp]] = {}

    def docs(self, pos: NDArray[np.intp]) -> NDArray[np.intp]:
        """The document of each position (positions in the unpadded batch)."""
        return np.searchsorted(self.starts, pos, side="right") - 1

    def anchor(self, byte: int, lower: bool = False) -> NDArray[np.intp]:
        """Padded positions of `byte` (in the lower-cased batch when `lower`)."""
        key = (lower, byte)
        hits = self._anchors.get(key)
        if hits is None:
            hits = np.flatnonzero((self.low_a if lower else self.raw_a) == byte)
            self._anchors[key] = hits
        return hits

    def find(self, needle: bytes, anchor_at: int, lower: bool = False) -> NDArray[np.intp]:
        """Unpadded start positions of `needle` (its byte `anchor_at` is looked up first;
        needles are shorter than the padding, so every offset stays in the array)."""
        arr = self.low_a if lower else self.raw_a
        cand = self.anchor(needle[anchor_at], lower) - anchor_at
        for j, byte in enumerate(needle):
            if j != anchor_at and cand.size:
                cand = cand[arr[cand + j] == byte]
        return cand - _PAD


def _batch_candidates(raws: Sequence[bytes]) -> list[set[str] | None]:
    """`Redactor.candidates` of each document (before the redactor's kind filter), or
    None for a document with `\\u` / `\\/` escapes (the caller decodes those). Each check of
    `candidates` runs once over the whole batch; the few that need a closer look per
    document (e-mail, numbers, IP addresses) call the very same function on that document
    only, so every answer equals the one-document scan."""
    n = len(raws)
    starts = [0] * n
    at = 0
    for i, r in enumerate(raws):
        starts[i] = at
        at += len(r) + 1
    b = _Batch(b"\0".join(raws), starts)
    joined, low, raw_a, low_a = b.joined, b.low, b.raw_a, b.low_a
    found: list[set[str]] = [set() for _ in range(n)]

    def docs_of(pos: NDArray[np.intp]) -> list[int]:
        return b.docs(pos).tolist() if pos.size else []

    def add(kind: str, docs: Iterable[int]) -> None:
        for d in docs:
            found[d].add(kind)

    if b"@" in joined:
        for d in set(docs_of(b.find(b"@", 0))):
            if _email_near_at(raws[d]):
                found[d].add("email")
    # runs of >= 20 key characters; UUIDs skip the cache
    runs = joined.translate(_TOKEN_MAP)
    pos = runs.find(_RUN20)
    while pos != -1:
        end = runs.find(b" ", pos)
        end = len(runs) if end == -1 else end
        token = joined[pos:end]
        if not (end - pos == 36 and _UUID_B.fullmatch(token)) and _suspicious_run(token):
            d = bisect.bisect_right(starts, pos) - 1
            found[d].add("api_key")
            if end - pos >= 32:
                found[d].add("high_entropy_secret")
        pos = runs.find(_RUN20, end)
    if b"J" in joined:
        add("jwt", docs_of(b.find(b"eyJ", 2)))
    if b"-----BEGIN" in joined:
        add("private_key", docs_of(b.find(b"-----BEGIN", 5)))
    add("bearer_token", docs_of(b.find(b"bearer", 0, lower=True)))
    basic = b.find(b"basic", 0, lower=True)
    if basic.size:
        auth = docs_of(b.find(b"authorization", 8, lower=True))
        add("bearer_token", set(docs_of(basic)) & set(auth))
    add("password", _secret_assignment_docs(b))
    # nine digits in a row once separators are dropped: `_numbers_near_runs` decides
    digits = joined.translate(_DIGIT_MAP_NUL, _DIGIT_SEPARATORS)
    if _RUN9 in digits:
        marks = [-1, *_each(digits, b"X")]
        pos = digits.find(_RUN9)
        while pos != -1:
            d = bisect.bisect_right(marks, pos) - 1
            found[d].update(_numbers_near_runs(raws[d]))
            nxt = marks[d + 1] if d + 1 < len(marks) else len(digits)
            pos = digits.find(_RUN9, nxt)
    # IP addresses: documents with a shape `_address_shape` may accept, which decides
    shaped: set[int] = set()
    colons = b.anchor(58)
    if colons.size:
        hx = _IS_HEX
        shaped.update(docs_of(colons[raw_a[colons + 1] == 58] - _PAD))  # "::"
        c = colons[hx[raw_a[colons + 1]]]  # a hex digit after the colon
        c1 = c[hx[raw_a[c - 1]] & (raw_a[c + 2] == 58)]  # "0:0:"
        c3 = c[hx[raw_a[c + 2]] & hx[raw_a[c + 3]]]
        c3a = c3[raw_a[c3 + 4] == 58]  # ":000:"
        c4 = c3[hx[raw_a[c3 + 4]] & (raw_a[c3 + 5] == 58)]  # ":0000:"
        c2 = c[hx[raw_a[c - 1]] & hx[raw_a[c - 2]] & hx[raw_a[c + 2]] & (raw_a[c + 3] == 58)]
        for k in (4, 7):  # "00:00:00:00:": two more two-digit groups, each before a ':'
            c2 = c2[hx[raw_a[c2 + k]] & hx[raw_a[c2 + k + 1]] & (raw_a[c2 + k + 2] == 58)]
        for group in (c1, c3a, c4, c2):
            shaped.update(docs_of(group - _PAD))
    dots = b.anchor(46)
    if dots.size:
        dg = _IS_DIGIT
        d1 = dots[dg[raw_a[dots + 1]]]
        d1 = d1[dg[raw_a[d1 - 1]]]
        near = (raw_a[d1 + 2] == 46) | (raw_a[d1 + 3] == 46) | (raw_a[d1 + 4] == 46)
        shaped.update(docs_of(d1[near] - _PAD))
    for d in shaped:
        if "ip_address" not in found[d] and _address_shape(raws[d]):
            found[d].add("ip_address")
    escaped: set[int] = set()
    if b"\\" in joined:
        escaped.update(docs_of(b.find(b"\\u", 0)))
        escaped.update(docs_of(b.find(b"\\/", 0)))
    del low, low_a
    return [None if i in escaped else found[i] for i in range(n)]


def _secret_assignment_docs(b: _Batch) -> set[int]:
    """The documents for which `_secret_assignment` (on the lower-cased bytes) is true."""
    starts, ends, low, low_a = b.starts, b.ends, b.low, b.low_a
    start_list = starts.tolist()
    out: set[int] = set()
    # "my password is ...": where `_MY_PASSWORD_B` can match, and whether
    # `_secret_assignment` would look there (after a "pin " anywhere in the document, or
    # at or after its first "pass")
    pin = b.find(b"pin", 0, lower=True)
    pin_space = set(b.docs(pin[low_a[pin + _PAD + 3] == 32]).tolist()) if pin.size else set()
    passes = b.find(b"pass", 0, lower=True)
    first_pass: dict[int, int] = {}
    for pos, d in zip(passes.tolist(), b.docs(passes).tolist(), strict=True):
        first_pass.setdefault(d, pos)
    maybe = np.concatenate(
        (pin[_IS_SPACE[low_a[pin + _PAD + 3]]], passes[_PASS_NEXT[low_a[passes + _PAD + 4]]])
    )
    for pos, d in zip(maybe.tolist(), b.docs(maybe).tolist(), strict=True):
        if d in out or not _MY_PASSWORD_B.match(low, pos, int(ends[d])):
            continue
        if d in pin_space or (d in first_pass and first_pass[d] <= pos):
            out.add(d)
    # assignments near the first 64 occurrences of each secret word (give up, true, at 64)
    n = len(start_list)
    for word, anchor_at in _SECRET_ANCHORS:
        at = b.find(word, anchor_at, lower=True)
        if not at.size:
            continue
        docs = b.docs(at)
        out.update(np.flatnonzero(np.bincount(docs, minlength=n) >= 64).tolist())
        if word != b"pass":
            keep = _IS_OPENER[low_a[at + _PAD + len(word)]]
            at, docs = at[keep], docs[keep]
        for pos, d in zip(at.tolist(), docs.tolist(), strict=True):
            if d not in out and _SECRET_ASSIGN_B.search(
                low, max(start_list[d], pos - 16), min(pos + 40, int(ends[d]))
            ):
                out.add(d)
    return out


_SECRET_ANCHORS = ((b"pass", 0), (b"pwd", 0), (b"secret", 2), (b"key", 0), (b"token", 2))


def _each(buf: bytes, needle: bytes) -> Iterator[int]:
    pos = buf.find(needle)
    while pos != -1:
        yield pos
        pos = buf.find(needle, pos + 1)


def _string_gate(text: str, todo: frozenset[str]) -> frozenset[str]:
    """The kinds of `todo` that could match in this one string (cheap necessary conditions)."""
    n = len(text)
    if n < 6:
        return frozenset()
    out = set()
    for kind in todo:
        need = _MIN_LEN.get(kind, 6)
        if n < need:
            continue
        if kind == "email" and "@" not in text:
            continue
        if kind == "jwt" and "eyJ" not in text:
            continue
        if kind == "private_key" and "-----BEGIN" not in text:
            continue
        if kind == "password":
            low = text.lower()
            if (
                "=" not in text and ":" not in text and "is" not in low and "was" not in low
            ) or not (any(w in low for w in _SECRET_WORDS_S) or "pin" in low):
                continue
        if kind == "bearer_token":
            low = text.lower()
            if "bearer" not in low and not ("basic" in low and "authorization" in low):
                continue
        if kind == "ip_address" and "." not in text and ":" not in text:
            continue
        if kind in _DIGIT_KINDS or kind in ("api_key", "high_entropy_secret"):
            raw = text.encode("utf-8", "surrogatepass")
            if kind in _DIGIT_KINDS and len(raw.translate(None, _NON_DIGITS)) < 9:
                continue
            if (
                kind == "api_key"
                and raw.translate(_TOKEN_MAP).find(_RUN20) == -1
                and "xox" not in text
            ):
                continue
            if (
                kind == "high_entropy_secret"
                and raw.translate(_TOKEN_MAP).find(_RUN20 + _RUN20[:12]) == -1
            ):
                continue
        out.add(kind)
    return frozenset(out)


_DIGIT_KINDS = frozenset(("phone", "credit_card", "ssn", "iban"))
_MIN_LEN = {
    "iban": 15,
    "ssn": 9,
    "ip_address": 4,
    "email": 6,
    "api_key": 20,
    "high_entropy_secret": 32,
    "jwt": 30,
    "private_key": 30,
    "bearer_token": 15,
    "password": 6,
    "credit_card": 13,
    "phone": 10,
}


def _collect(value: Any, out: list[str], keys: list[str]) -> None:
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, dict):
        for k, v in value.items():
            if isinstance(k, str):
                out.append(k)
                keys.append(k)
            _collect(v, out, keys)
    elif isinstance(value, list | tuple):
        for v in value:
            _collect(v, out, keys)


_DEFAULT: Redactor | None = None


def default_redactor() -> Redactor:
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = Redactor()
    return _DEFAULT


def redact_payload(
    payload: Any, skip_keys: frozenset[str] = frozenset()
) -> tuple[Any, RedactionReport]:
    """Redact any JSON-like payload (e.g. a trajectory dict) with the default patterns."""
    report = RedactionReport()
    return default_redactor().redact(payload, report, skip_keys), report


# Ids are machine-made and join events together (a GiGPO group is one session): never rewritten.
EVENT_ID_KEYS = frozenset(
    {"trajectory_id", "session_id", "feedback_id", "reward_id", "completion_id", "job_id"}
)


def redact_event(event: Any, redactor: Redactor | None = None) -> tuple[Any, dict[str, int]]:
    """Redact an event before it is published (the producer side of "PII is scrubbed before
    storage"): returns the event with every PII match replaced, and the counts per kind.

    `event` is a contract model (e.g. a `TrajectoryEvent`; the result is re-validated into the
    same class) or a JSON-like dict (the result is a dict). The same object comes back, with
    empty counts, when nothing was found, which is the common case and costs a byte scan of
    the serialised event. Top-level ids (`EVENT_ID_KEYS`) are kept as they are.
    """
    r = redactor or default_redactor()
    is_model = hasattr(event, "model_validate") and not isinstance(event, dict)
    if is_model:
        to_json = getattr(event, "to_json", None)
        raw = to_json() if callable(to_json) else event.model_dump_json().encode()
    else:
        raw = json.dumps(event, default=str).encode()
    kinds = r.candidates_json(raw)
    if not kinds:
        return event, {}
    report = RedactionReport()
    cleaned = r.redact(json.loads(raw), report, EVENT_ID_KEYS, kinds)
    if not report.total:
        return event, {}
    if is_model:
        return type(event).model_validate(cleaned), dict(report.counts)
    return cleaned, dict(report.counts)
