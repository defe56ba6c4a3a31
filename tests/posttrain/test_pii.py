"""The personal-data filter: each detector on hand-checked positives and negatives (published Luhn and IBAN
examples), redaction and dropping of whole traces with their report, user patterns, configuration errors.

    .venv/bin/python -m pytest -q tests/posttrain/test_pii.py
"""

from __future__ import annotations

import json

import pytest

from posttrain.errors import PosttrainDataError
from posttrain.pii import PiiConfig, filter_traces, find_pii, iban_ok, luhn_ok, redact_text
from posttrain.traces import Trace, check_trace


def _names(text, config=PiiConfig()):
    return [(m.name, m.text) for m in find_pii(text, config)]


def test_luhn_and_iban_checks_on_published_examples():
    # 79927398713: the worked example of the Luhn algorithm (ISO/IEC 7812-1); 4111...1111: Visa's test number.
    assert luhn_ok("79927398713") and luhn_ok("4111111111111111") and luhn_ok("5555555555554444")
    assert not luhn_ok("79927398710") and not luhn_ok("4111111111111112") and not luhn_ok("1234567812345678")
    # ISO 13616 examples (UK, Germany); changing the last digit breaks the mod-97 check.
    assert iban_ok("GB82 WEST 1234 5698 7654 32") and iban_ok("DE89370400440532013000")
    assert not iban_ok("GB82 WEST 1234 5698 7654 33") and not iban_ok("GB82 WEST")


@pytest.mark.parametrize("text, expected", [
    ("write to john.doe+tag@mail.example.co.uk.", [("email", "john.doe+tag@mail.example.co.uk")]),
    ("card 4111 1111 1111 1111, amex 3782-822463-10005", [("credit_card", "4111 1111 1111 1111"),
                                                          ("credit_card", "3782-822463-10005")]),
    ("pay 5555555555554444 now", [("credit_card", "5555555555554444")]),
    ("IBAN GB82 WEST 1234 5698 7654 32 or DE89370400440532013000", [("iban", "GB82 WEST 1234 5698 7654 32"),
                                                                     ("iban", "DE89370400440532013000")]),
    ("from 192.168.0.1. to 10.0.0.255", [("ipv4", "192.168.0.1"), ("ipv4", "10.0.0.255")]),
    ("+44 20 7946 0958, (415) 555-2671, 415.555.2671 and 020 7946 0958",
     [("phone", "+44 20 7946 0958"), ("phone", "(415) 555-2671"), ("phone", "415.555.2671"), ("phone", "020 7946 0958")]),
    ("+1 (415) 555-2671 (mail: a@b.io)", [("phone", "+1 (415) 555-2671"), ("email", "a@b.io")]),
])
def test_detectors_find_hand_checked_positives(text, expected):
    assert _names(text) == expected


@pytest.mark.parametrize("text", [
    "4111 1111 1111 1112 fails the Luhn check",          # 16 digits, grouped like a card, but not one
    "1234567812345678 and 79927398710",
    "GB82 WEST 1234 5698 7654 33",                       # IBAN shape, wrong check digits
    "256.1.1.1, 1.2.3 and 1.2.3.4.5",                    # an octet above 255; three or five parts
    "on 2024-01-15 pay 1000000 dollars for 3.14159 kg, order 123456, sizes 100 200 300, ext 555-2671",
    "user@localhost and @handle",                        # no top-level domain; no local part
])
def test_detectors_ignore_hand_checked_negatives(text):
    assert _names(text) == []


def test_redact_text_replaces_every_match_and_counts():
    text, counts = redact_text("Mail a@b.io or c@d.org, card 4111-1111-1111-1111, host 8.8.8.8")
    assert text == "Mail <EMAIL> or <EMAIL>, card <CREDIT_CARD>, host <IPV4>"
    assert counts == {"email": 2, "credit_card": 1, "ipv4": 1}
    only_email = PiiConfig(detectors=("email",))
    assert redact_text("a@b.io at 8.8.8.8", only_email)[0] == "<EMAIL> at 8.8.8.8"


def _trace(trace_id, user_text, card_argument, tool_result, reply="Paid."):
    tools = [{"type": "function", "function": {"name": "pay", "parameters": {"type": "object", "properties": {}}}}]
    arguments = json.dumps({"card": card_argument, "note": "ok", "amount": 20})
    return Trace(trace_id, [
        {"role": "user", "content": user_text},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
                                                                "function": {"name": "pay", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "c1", "content": tool_result},
        {"role": "assistant", "content": [{"type": "text", "text": reply}]},
    ], tools, {"source": "log"})


def test_filter_traces_redacts_text_arguments_and_results():
    dirty = _trace("dirty", "I am jo@x.com, pay with my card", 4111111111111111, "receipt for +33 1 23 45 67 89",
                   "Paid. Receipt sent to a@b.io.")
    clean = _trace("clean", "Pay 20 dollars", "the usual one", "done")
    kept, report = filter_traces([dirty, clean], PiiConfig(action="redact"))
    assert report.num_traces == 2 and report.num_dropped == 0 and report.num_redacted == 1
    assert report.counts == {"email": 2, "credit_card": 1, "phone": 1}
    assert report.summary() == "2 traces: 0 dropped, 1 redacted (credit_card 1, email 2, phone 1)"
    redacted, same = kept
    assert same is clean
    assert redacted.messages[0]["content"] == "I am <EMAIL>, pay with my card"
    assert json.loads(redacted.messages[1]["tool_calls"][0]["function"]["arguments"]) == {
        "card": "<CREDIT_CARD>", "note": "ok", "amount": 20}
    assert redacted.messages[2]["content"] == "receipt for <PHONE>"
    assert redacted.messages[3]["content"] == [{"type": "text", "text": "Paid. Receipt sent to <EMAIL>."}]
    assert redacted.meta == {"source": "log", "pii_redacted": {"email": 2, "credit_card": 1, "phone": 1}}
    assert dirty.messages[0]["content"] == "I am jo@x.com, pay with my card"  # the input is not modified
    check_trace(redacted)


def test_filter_traces_drops_and_user_patterns():
    config = PiiConfig(action="drop", detectors=(), patterns=(("ticket", r"TCK-\d{6}"),))
    flagged = _trace("t1", "about TCK-123456", "n/a", "ok")
    kept, report = filter_traces([flagged, _trace("t2", "jo@x.com", "n/a", "ok")], config)
    assert [t.id for t in kept] == ["t2"]  # emails are not looked for with detectors=()
    assert report.num_dropped == 1 and report.counts == {"ticket": 1}
    assert redact_text("see TCK-123456", config)[0] == "see <TICKET>"


@pytest.mark.parametrize("kwargs, message", [
    ({"action": "mask"}, "PII action must be 'drop' or 'redact'"),
    ({"detectors": ("email", "ssn")}, "unknown PII detectors \\['ssn'\\]"),
    ({"patterns": (("bad", "(unclosed"),)}, "PII pattern 'bad' is not a valid regular expression"),
    ({"patterns": ("TCK-\\d+",)}, "must be a \\(name, regex\\) pair"),
])
def test_config_errors(kwargs, message):
    with pytest.raises(PosttrainDataError, match=message):
        PiiConfig(**kwargs)
