"""PII redaction: one positive and one negative case per kind, counts, the JSON pre-scan."""

from __future__ import annotations

import asyncio
import json
import random
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.bench.redaction import score_corpus
from agentrl.contracts.samples import sample_trajectory
from agentrl.contracts.trajectory import TrajectoryEvent
from agentrl.rewards import RewardConfig
from agentrl.rewards.pipeline import Preparer
from agentrl.rewards.redact import (
    KINDS,
    RedactionReport,
    Redactor,
    iban_ok,
    luhn_ok,
    redact_event,
    redact_payload,
)

R = Redactor()
PREPARER = Preparer(RewardConfig())

POSITIVE = {
    "email": ("write to jane.doe+rl@example.co.uk today", "jane.doe+rl@example.co.uk"),
    "api_key": (
        "use sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv1w now",
        "sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv1w",
    ),
    "bearer_token": ("Authorization: Bearer abc123.def456-ghi789", "abc123.def456-ghi789"),
    "jwt": (
        "token eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
        "dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    ),
    "password": ('db_password = "hunter2!x"', "hunter2!x"),
    "phone": ("call me on +1 415-555-0132 tomorrow", "415-555-0132"),
    "credit_card": ("paid with 4111 1111 1111 1111, thanks", "4111 1111 1111 1111"),
    "high_entropy_secret": (
        "secret blob wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY end",
        "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    ),
    "private_key": (
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEabc\n-----END RSA PRIVATE KEY-----",
        "MIIEabc",
    ),
    "iban": ("wire it to DE89 3704 0044 0532 0130 00 today", "DE89 3704 0044 0532 0130 00"),
    "ssn": ("SSN 536-22-1234 on file", "536-22-1234"),
    "ip_address": ("ssh root@192.168.1.20 -p 22", "192.168.1.20"),
}

# The review's gaps: each must be redacted (issue 11, defect 5).
GAPS = [
    ("card with dots 4111.1111.1111.1111 end", "4111.1111.1111.1111", "credit_card"),
    ("card mixed 4111 1111-1111.1111 end", "4111 1111-1111.1111", "credit_card"),
    ("Password: correct horse battery staple", "correct horse battery staple", "password"),
    ("Authorization: Basic dXNlcjpwYXNzd29yZA==", "dXNlcjpwYXNzd29yZA==", "bearer_token"),
    (
        "my API key is 5f4dcc3b5aa765d61d8327deb882cf99",
        "5f4dcc3b5aa765d61d8327deb882cf99",
        "api_key",
    ),
    ("my password is qwerty123", "qwerty123", "password"),
    ("jwt eyJhbGciOiJub25lIn0.eyJzdWIiOiJhZG1pbiJ9. here", "eyJzdWIiOiJhZG1pbiJ9", "jwt"),
    ("v6 2001:db8::8a2e:370:7334 reached", "2001:db8::8a2e:370:7334", "ip_address"),
    ("Kontakt: jürgen.müller@bücher.de", "jürgen.müller@bücher.de", "email"),
    ("邮箱 用户@例子.广告 谢谢", "用户@例子.广告", "email"),
    ("IBAN GB82WEST12345698765432", "GB82WEST12345698765432", "iban"),
]

NEGATIVE = {
    "email": "decorators like @reward_function and user@localhost are not addresses",
    "api_key": "task-sk-value and sk-short are not keys; neither is completed_successfully_and_more",
    "bearer_token": "the bearer of bad news",
    "jwt": "eyJ alone is not a token",
    "password": "the password is required (see docs)",
    "phone": "epoch 1733659200, order 1234567890 and the date 2025-12-08",
    "credit_card": "4111 1111 1111 1112 fails the Luhn check",
    "high_entropy_secret": "uuid 123e4567-e89b-12d3-a456-426614174000 and sha 3f786850e387550fdab836ed7e6dc881de23001b",
    "private_key": "a PRIVATE KEY is mentioned but not included",
    "iban": "DE89370400440532013001 has a bad checksum",
    "ssn": "000-12-3456 and 666-12-3456 are not valid",
    "ip_address": "loopback 127.0.0.1, python 3.11.7, 12:30:45 and std::vector",
}


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_is_redacted_and_counted(kind: str) -> None:
    text, secret = POSITIVE[kind]
    report = RedactionReport()
    out = R.redact_text(text, report)
    assert secret not in out
    assert f"[REDACTED:{kind.upper()}]" in out
    assert report.counts[kind] >= 1
    # the pre-scan on the JSON text of a payload finds it too
    assert kind in R.candidates(json.dumps({"content": text}).encode())


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_leaves_lookalikes_alone(kind: str) -> None:
    text = NEGATIVE[kind]
    report = RedactionReport()
    assert R.redact_text(text, report) == text
    assert report.total == 0


@pytest.mark.parametrize(("text", "secret", "kind"), GAPS)
def test_gaps_found_by_the_review_are_redacted(text: str, secret: str, kind: str) -> None:
    report = RedactionReport()
    out = R.redact_text(text, report)
    assert secret not in out and f"[REDACTED:{kind.upper()}]" in out, out
    assert report.counts[kind] >= 1


def test_checksums_keep_false_positives_down() -> None:
    assert iban_ok("DE89 3704 0044 0532 0130 00") and not iban_ok("DE89370400440532013001")
    assert R.redact_text("pi 3.14159265358979 and ISBN 978-3-16-148410-0").startswith("pi 3.14")
    assert "REDACTED" not in R.redact_text("ISBN 978-3-16-148410-0, build 20251208")


def test_labelled_corpus_precision_and_recall() -> None:
    scores = score_corpus(R)
    assert scores["strings"] >= 200
    assert scores["positives"] >= 100 and scores["negatives"] >= 100
    assert scores["precision"] >= 0.97, scores["false_alarms"]
    assert scores["recall"] >= 0.97, scores["misses"]
    assert set(scores["per_kind"]) == set(KINDS)  # every kind is measured


def test_password_assignment_keeps_the_key_name() -> None:
    assert R.redact_text("password=s3cr3t&user=bob") == "password=[REDACTED:PASSWORD]&user=bob"
    assert R.redact_text('{"api_key": "abc123def"}') == '{"api_key": "[REDACTED:PASSWORD]"}'


def test_luhn() -> None:
    assert luhn_ok("4111111111111111") and luhn_ok("5500005555555559")
    assert not luhn_ok("4111111111111112")


def test_nested_payload_every_string_and_key_with_counts() -> None:
    payload = {
        "trajectory_id": "id-with-bob@example.com",
        "turns": [
            {"observation": {"content": "mail bob@example.com or alice@example.org"}},
            {"action": {"tool_args": {"bob@example.com": ["call 212-555-0101", 42, None]}}},
        ],
        "raw": ("token=abcdef123",),
    }
    out, report = R.redact(payload, RedactionReport(), skip_keys=frozenset({"trajectory_id"})), None
    text = json.dumps(out)
    assert out["trajectory_id"] == "id-with-bob@example.com"  # ids are kept
    assert "bob@example.com" not in text.replace("id-with-bob@example.com", "")
    assert (
        "alice@example.org" not in text and "212-555-0101" not in text and "abcdef123" not in text
    )
    assert out["turns"][1]["action"]["tool_args"]["[REDACTED:EMAIL]"][1:] == [42, None]
    cleaned, rep = redact_payload(payload)
    assert rep.counts == {"email": 4, "phone": 1, "password": 1}
    assert report is None and cleaned is not payload


def test_clean_payload_is_returned_as_is() -> None:
    payload = {"a": ["plain text", {"b": "more text 2025-12-08"}]}
    assert R.redact(payload) is payload


def test_only_selected_kinds() -> None:
    only_mail = Redactor(kinds=["email"])
    assert only_mail.redact_text("x@example.com 415-555-0132") == "[REDACTED:EMAIL] 415-555-0132"
    with pytest.raises(ValueError, match="unknown PII kinds"):
        Redactor(kinds=["shoe_size"])


_SAMPLES = [POSITIVE[k][0] for k in KINDS]


@settings(max_examples=80, deadline=None)
@given(
    prefix=st.text(max_size=30),
    suffix=st.text(max_size=30),
    sample=st.sampled_from(_SAMPLES),
    escape_ws=st.booleans(),
)
def test_prescan_on_json_never_misses_what_redaction_finds(
    prefix: str, suffix: str, sample: str, escape_ws: bool
) -> None:
    text = f"{prefix} {sample}\t{suffix}" if escape_ws else f"{prefix} {sample} {suffix}"
    report = RedactionReport()
    R.redact_text(text, report, kinds=KINDS)
    found = {k for k, n in report.counts.items() if n}
    for raw in (
        json.dumps({"s": text}).encode(),
        json.dumps({"s": text}, ensure_ascii=False).encode(),
    ):
        assert found <= R.candidates(raw)


# ---- the JSON pre-scan is sound for every valid encoding (issue 11, defect 4) ------------
def escaped_json(value: object, rnd: random.Random, p: float) -> str:
    """JSON text of `value` in which each character of each string is written as a \\u
    escape (surrogate pairs beyond the BMP) with probability `p`, and '/' as '\\/' half
    the time: all valid encodings of the same document."""
    if isinstance(value, dict):
        return (
            "{"
            + ",".join(
                f"{escaped_json(k, rnd, p)}:{escaped_json(v, rnd, p)}" for k, v in value.items()
            )
            + "}"
        )
    if isinstance(value, list):
        return "[" + ",".join(escaped_json(v, rnd, p) for v in value) + "]"
    if not isinstance(value, str):
        return json.dumps(value)
    out = []
    for ch in value:
        code = ord(ch)
        if ch in '"\\' or code < 0x20 or rnd.random() < p:
            if code > 0xFFFF:
                code -= 0x10000
                out.append(f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}")
            else:
                out.append(f"\\u{code:04x}" if rnd.random() < 0.5 else f"\\u{code:04X}")
        elif ch == "/" and rnd.random() < 0.5:
            out.append("\\/")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


_ALL = [POSITIVE[k] for k in KINDS] + [(t, s) for t, s, _ in GAPS]


@settings(max_examples=120, deadline=None)
@given(
    case=st.sampled_from(_ALL),
    seed=st.integers(0, 2**32 - 1),
    p=st.sampled_from([0.05, 0.3, 1.0]),
    prefix=st.text(max_size=20),
)
def test_escaped_json_never_lets_pii_through_the_service_path(
    case: tuple[str, str], seed: int, p: float, prefix: str
) -> None:
    """The reward service's own path (`Preparer.prepare` on the message bytes as sent)."""
    text, secret = case
    doc = sample_trajectory(1, trajectory_id=str(uuid.uuid4()))
    doc["turns"][0]["observation"]["content"] = f"{prefix} {text} end"
    raw = escaped_json(doc, random.Random(seed), p).encode()
    assert json.loads(raw) == doc  # the same document
    event = TrajectoryEvent.model_validate_json(raw)
    batch = asyncio.run(PREPARER.prepare([event], [raw]))
    assert secret not in batch.inputs[0].trajectory.model_dump_json()


def test_redact_event_for_producers() -> None:
    doc = sample_trajectory(3, trajectory_id=str(uuid.uuid4()), pii=True)
    event = TrajectoryEvent.model_validate(doc)
    cleaned, counts = redact_event(event)
    assert isinstance(cleaned, TrajectoryEvent)
    assert cleaned.trajectory_id == event.trajectory_id
    assert "jane.doe3@example.com" not in cleaned.model_dump_json()
    assert {"email", "phone"} <= set(counts) and all(n > 0 for n in counts.values())
    clean_event = TrajectoryEvent.model_validate(sample_trajectory(4))
    assert redact_event(clean_event) == (clean_event, {})  # the same object, nothing found
    as_dict, counts = redact_event({"note": "Password: correct horse battery staple"})
    assert as_dict == {"note": "Password: [REDACTED:PASSWORD]"} and counts == {"password": 1}


def test_clean_trajectories_take_the_fast_path() -> None:
    """The pre-scan must stay quiet on ordinary trajectories (timestamps, floats, "Task 100:",
    code), or every message pays the full redaction walk."""
    rng = random.Random(5)
    for i in range(300):
        raw = json.dumps(sample_trajectory(i, rng=rng, code=i % 3 == 0)).encode()
        assert R.candidates_json(raw) == frozenset(), raw[:200]
