"""A configurable filter for personal data in traces, applied to logged conversations before training.

Detectors (each a regular expression, the numeric ones confirmed by a checksum so that arbitrary numbers pass):

- "email": local@domain.tld.
- "iban": an International Bank Account Number, 15-34 characters, optionally in groups of four, accepted only
  when its ISO 13616 / ISO 7064 mod-97 check gives 1 ("GB82 WEST 1234 5698 7654 32").
- "credit_card": 13-19 digits, optionally grouped by single spaces or dashes, accepted only when the Luhn
  check passes (ISO/IEC 7812-1, Annex B): "4111 1111 1111 1111" is one, "4111 1111 1111 1112" is not.
- "ipv4": four dotted numbers 0-255 ("192.168.0.1"; a dotted version number of that shape counts too).
- "phone": a number written with a leading + (8-15 digits: "+44 20 7946 0958"), a North American number with
  separators ("415-555-2671", "(415) 555-2671"), or a national number with a trunk 0 and separators
  ("020 7946 0958"); bare runs of digits are not phone numbers (they are too often quantities).
- user patterns: (name, regex) pairs in `PiiConfig.patterns`, placeholder "<NAME>".

Scanned: message text (system, user, assistant, tool results) and the string (and integer) values inside tool
call arguments. Not scanned: the tool schemas (the harness author's text, not a user's). Action "drop" drops a
trace with any match; "redact" replaces each match by its placeholder ("<EMAIL>", "<PHONE>", ...).

    kept, report = filter_traces(traces, PiiConfig(action="redact", patterns=(("ticket", r"TCK-\\d{6}"),)))
    print(report.summary())    # "1000 traces: 0 dropped, 12 redacted (email 9, phone 4)"
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from posttrain.errors import PosttrainDataError
from posttrain.traces import Trace

_EMAIL = r"(?<![\w.+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}(?![\w-])"
_IBAN = r"(?<![A-Za-z0-9])[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,4})?(?![A-Za-z0-9])"
_CARD = r"(?<![\d-])\d(?:[ -]?\d){12,18}(?![\d])"
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_IPV4 = rf"(?<![\d.]){_OCTET}(?:\.{_OCTET}){{3}}(?!\.?\d)"
_PHONE = (r"(?<![\w+])(?:"
          r"\+\d{1,3}(?:[ .-]?\(?\d{1,4}\)?){2,6}"                       # international, leading +
          r"|(?:1[ .-])?(?:\(\d{3}\) ?|\d{3}[ .-])\d{3}[ .-]\d{4}"        # North American, with separators
          r"|\(?0\d{1,4}\)?[ /-]\d{3,4}(?:[ -]?\d{2,4}){0,2}"            # national, trunk 0, with a separator
          r")(?![\w])")


def luhn_ok(digits: str) -> bool:
    """The Luhn check (ISO/IEC 7812-1 Annex B): double every second digit from the right (minus 9 above 9);
    the sum is a multiple of 10."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2 == 1:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def iban_ok(text: str) -> bool:
    """The IBAN check (ISO 13616, mod 97-10 of ISO 7064): move the first four characters to the end, read
    letters as 10..35; the number mod 97 is 1."""
    s = text.replace(" ", "")
    if not 15 <= len(s) <= 34:
        return False
    number = "".join(str(int(ch, 36)) for ch in s[4:] + s[:4])
    return int(number) % 97 == 1


def _digits(text: str) -> str:
    return re.sub(r"\D", "", text)


# name -> (regex, extra check on the matched text)
DETECTORS: dict[str, tuple[str, Callable[[str], bool]]] = {
    "email": (_EMAIL, lambda s: True),
    "iban": (_IBAN, iban_ok),
    "credit_card": (_CARD, lambda s: 13 <= len(_digits(s)) <= 19 and luhn_ok(_digits(s))),
    "ipv4": (_IPV4, lambda s: True),
    "phone": (_PHONE, lambda s: 8 <= len(_digits(s)) <= 15),
}


@dataclass(frozen=True)
class PiiConfig:
    """What to look for and what to do with it.

    Attributes:
        action: "drop" (leave out every trace with a match) or "redact" (replace each match by "<NAME>").
        detectors: built-in detectors to run, among `DETECTORS` (order does not matter; they run in a fixed
            order, emails first, so an email's digits are not read as a phone number).
        patterns: user detectors, (name, Python regex) pairs; they run after the built-in ones.
    Raises:
        PosttrainDataError: an unknown action or detector, or a pattern that does not compile.
    """

    action: str = "redact"
    detectors: tuple[str, ...] = tuple(DETECTORS)
    patterns: tuple[tuple[str, str], ...] = ()
    _compiled: tuple = field(init=False, repr=False, compare=False, default=())

    def __post_init__(self) -> None:
        if self.action not in ("drop", "redact"):
            raise PosttrainDataError(f"PII action must be 'drop' or 'redact', got {self.action!r}")
        unknown = [d for d in self.detectors if d not in DETECTORS]
        if unknown:
            raise PosttrainDataError(f"unknown PII detectors {unknown}; known: {', '.join(DETECTORS)}")
        compiled = [(name, re.compile(rx), ok) for name, (rx, ok) in DETECTORS.items() if name in self.detectors]
        for item in self.patterns:
            if not (isinstance(item, tuple) and len(item) == 2 and all(isinstance(x, str) and x for x in item)):
                raise PosttrainDataError(f"a PII pattern must be a (name, regex) pair of strings, got {item!r}")
            name, rx = item
            try:
                compiled.append((name, re.compile(rx), lambda s: True))
            except re.error as exc:
                raise PosttrainDataError(f"PII pattern {name!r} is not a valid regular expression: {exc}") from None
        object.__setattr__(self, "_compiled", tuple(compiled))


@dataclass(frozen=True)
class PiiMatch:
    """One detected piece: detector name, span [start, end) in the text, the matched text."""

    name: str
    start: int
    end: int
    text: str


def placeholder(name: str) -> str:
    """The redaction placeholder of a detector: "email" -> "<EMAIL>", "credit_card" -> "<CREDIT_CARD>"."""
    return f"<{name.upper()}>"


def find_pii(text: str, config: PiiConfig = PiiConfig()) -> list[PiiMatch]:
    """Every match in `text`, detector by detector, later detectors skipping spans an earlier one took."""
    found: list[PiiMatch] = []
    for name, rx, ok in config._compiled:
        for m in rx.finditer(text):
            if ok(m.group()) and m.end() > m.start() and not any(m.start() < f.end and f.start < m.end() for f in found):
                found.append(PiiMatch(name, m.start(), m.end(), m.group()))
    return sorted(found, key=lambda f: f.start)


def redact_text(text: str, config: PiiConfig = PiiConfig()) -> tuple[str, Counter]:
    """`text` with every match replaced by its placeholder, and the number of matches per detector."""
    matches = find_pii(text, config)
    for f in reversed(matches):
        text = text[:f.start] + placeholder(f.name) + text[f.end:]
    return text, Counter(f.name for f in matches)


@dataclass
class PiiReport:
    """What the filter did: traces seen, dropped and changed, and matches per detector."""

    num_traces: int = 0
    num_dropped: int = 0
    num_redacted: int = 0
    counts: Counter = field(default_factory=Counter)

    def summary(self) -> str:
        """One line: "1000 traces: 3 dropped, 0 redacted (email 2, phone 1)"."""
        detail = ", ".join(f"{name} {n}" for name, n in sorted(self.counts.items()))
        return (f"{self.num_traces} traces: {self.num_dropped} dropped, {self.num_redacted} redacted"
                + (f" ({detail})" if detail else ""))


class _Scrubber:
    """Walks one trace's texts, counting matches and (for "redact") building the redacted copy."""

    def __init__(self, config: PiiConfig):
        self.config, self.counts = config, Counter()

    def text(self, text: str) -> str:
        out, counts = redact_text(text, self.config)
        self.counts += counts
        return out

    def value(self, value: Any) -> Any:
        """A decoded JSON value with its strings (and integers that hold personal data) redacted."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, int) and not isinstance(value, bool):
            out = self.text(str(value))
            return value if out == str(value) else out
        if isinstance(value, list):
            return [self.value(v) for v in value]
        if isinstance(value, dict):
            return {k: self.value(v) for k, v in value.items()}
        return value

    def content(self, content: Any) -> Any:
        if isinstance(content, str):
            return self.text(content)
        if isinstance(content, list):
            return [{**p, "text": self.text(p["text"])} if isinstance(p, dict) and isinstance(p.get("text"), str) else p
                    for p in content]
        return content

    def call(self, call: dict) -> dict:
        fn = call.get("function") or {}
        try:
            arguments = json.dumps(self.value(json.loads(fn.get("arguments", "{}"))), ensure_ascii=False)
        except (TypeError, json.JSONDecodeError):
            arguments = self.text(fn["arguments"]) if isinstance(fn.get("arguments"), str) else fn.get("arguments")
        return {**call, "function": {**fn, "arguments": arguments}}

    def message(self, m: dict) -> dict:
        out = {**m, "content": self.content(m.get("content"))} if "content" in m else dict(m)
        if m.get("tool_calls"):
            out["tool_calls"] = [self.call(c) for c in m["tool_calls"]]
        return out


def filter_traces(traces: Sequence[Trace], config: PiiConfig = PiiConfig()) -> tuple[list[Trace], PiiReport]:
    """Drop or redact personal data in `traces` (see the module docstring for what is scanned).

    Returns:
        (the kept traces, redacted where they matched, in order; the report). Redacted traces get
        meta["pii_redacted"] = {detector: count}.
    """
    report = PiiReport(num_traces=len(traces))
    kept = []
    for trace in traces:
        scrub = _Scrubber(config)
        messages = [scrub.message(m) for m in trace.messages]
        report.counts += scrub.counts
        if not scrub.counts:
            kept.append(trace)
        elif config.action == "drop":
            report.num_dropped += 1
        else:
            report.num_redacted += 1
            kept.append(dataclasses.replace(trace, messages=messages,
                                            meta={**trace.meta, "pii_redacted": dict(scrub.counts)}))
    return kept, report
