"""Routing shares: which model a router file's gateway policy picks for real benchmark requests, per suite.

    python benchmarks/routing_share.py --router routers/trained/link-auto.safetensors \
        --router ~/.link/link-auto-bfcl.safetensors --suite gsm8k:test:200 --suite mmlu:test:200 \
        --suite bfcl:test --items bfcl=runs/bfcl/split.json:val --json shares.json

Each item becomes the request body the eval runner sends through the gateway (the suite's `request`: chat
messages with their `tools` for BFCL, so the router sees has_tools as in serving) and is decided by
`RouterPolicy.decide`, the gateway's router policy over every model of the file. Printed per suite: each
router's share of picks per model, and for each router after the first the share of requests whose pick is
the same as the first router's (adding a model should leave the other traffic where it was).

Suite specs are NAME:SPLIT[:LIMIT] (a seeded sample of LIMIT items, seed 0 as `link eval run --limit`);
`--items NAME=FILE[:PART]` keeps only the listed item ids (a posttrain split.json's val part).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from routing_latency import default_data_dir, router_policy, write_json  # noqa: E402  (the gateway's router policy)
from routers.request import RoutingRequest  # noqa: E402


def suite_requests(spec: str, items_file: str | None, data_dir: Path) -> tuple[str, list[dict]]:
    """(label, [request bodies]) of a NAME:SPLIT[:LIMIT] suite spec, as `link eval run` would send them."""
    from evals.base import make_suite
    from evals.cli_run import select_items

    name, split, *rest = spec.split(":")
    suite = make_suite(name, data_dir)
    items = suite.load(split)
    if items_file:
        items = select_items(items, items_file)
    items = suite.sample(items, int(rest[0]) if rest else None)
    bodies = []
    for item in items:
        style, request = suite.request(item)
        params = request.get("params") or {}
        content = {"messages": request["messages"]} if style == "chat" else {"prompt": request["prompt"]}
        bodies.append({**content, **params})
    return spec, bodies


def shares(picks: list[str]) -> dict[str, float]:
    counts = Counter(picks)
    return {model: counts[model] / len(picks) for model in sorted(counts, key=lambda m: -counts[m])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--router", type=Path, action="append", required=True, help="a router file (repeatable)")
    parser.add_argument("--suite", action="append", required=True, help="NAME:SPLIT[:LIMIT] (repeatable)")
    parser.add_argument("--items", action="append", default=[], help="NAME=FILE[:PART]: only these item ids")
    parser.add_argument("--data-dir", type=Path, default=None, help="default: LINK_DATASETS_DIR, else ../shared/data")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    data_dir = args.data_dir or default_data_dir()
    items_for = dict(spec.split("=", 1) for spec in args.items)
    policies = [router_policy(path) for path in args.router]
    result = {"command": " ".join(["python", *sys.argv]), "routers": [str(p) for p in args.router], "suites": {}}
    for spec in args.suite:
        label, bodies = suite_requests(spec, items_for.get(spec.split(":")[0]), data_dir)
        requests = [RoutingRequest.from_body(body) for body in bodies]
        picks = [[policy.decide(request)["chosen"] for request in requests] for policy in policies]
        entry = {"num_requests": len(bodies), "has_tools": sum(bool(b.get("tools")) for b in bodies),
                 "shares": [shares(p) for p in picks],
                 "same_as_first": [sum(a == b for a, b in zip(picks[0], p)) / len(bodies) for p in picks[1:]]}
        result["suites"][label] = entry
        print(f"{label}: {len(bodies)} requests ({entry['has_tools']} with tools)")
        for path, share in zip(args.router, entry["shares"]):
            print(f"  {path.name}: " + ", ".join(f"{m} {s:.1%}" for m, s in share.items()))
        for path, same in zip(args.router[1:], entry["same_as_first"]):
            print(f"  {path.name}: same pick as {args.router[0].name} on {same:.1%}")
    if args.json:
        write_json(args.json, result)


if __name__ == "__main__":
    main()
