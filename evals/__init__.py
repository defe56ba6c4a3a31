"""Benchmarks, graded automatically: suites, targets, the runner, outcome tables, offline replay, reports.

    link eval run --suite gsm8k --split test --limit 200 --target smollm2-135m-instruct --target gemma-3-270m
    link eval replay routerbench:test --policy gpt-4-1106-preview
    link eval report RUN_ID... --out report/

The pieces (one file each):

    base.py           Item, Answer, Grade, the Suite base class and its registry (`make_suite`)
    targets.py        Completion, the Target protocol, Prices
    target_factory.py `resolve_targets`: --target names -> gateway or LiteLLM targets
    target_errors.py  client errors -> TargetError (retryable or not), for both kinds of target
    target_gateway.py the gateway as a target: in-process (ASGI, no port) or --base-url
    target_litellm.py closed models through LiteLLM (a missing key fails before anything runs)
    suites/           gsm8k, mmlu, humaneval, mt_bench, alpaca_eval, bfcl, jsonl (a user's own file)
    graders.py        answer extraction (numbers, letters) and graders by name (the JSONL suite picks one per row)
    sandbox.py        generated code run in a subprocess: timeout, memory/CPU/file limits, no network
    bfcl_schema.py, bfcl_match.py   BFCL functions -> OpenAI tools; AST matching of calls against possible answers
    judge.py          LLM-as-judge prompts and verdict parsing (MT-Bench 1-10, pairwise A/B both orders)
    runner.py         run_eval(): concurrency, the response cache, outcome files, run records
    cost_guard.py     --max-cost reservations and retries with backoff
    progress.py       the Rich progress bars (live accuracy and spend)
    cache.py          EvalStore: cached responses, runs and reports in the gateway's database
    outcomes.py       the outcome-table format that the routers train on
    recorded.py, prices.py   RouterBench, RouteLLM and AlpacaEval records as outcome tables (estimated costs)
    replay.py, policy_spec.py   a routing policy evaluated on outcome tables without calling any model
    stats.py          confidence intervals, length-controlled win rate
    report.py, plot.py   score with 95% CI, cost, latency; Markdown, JSON and a quality-cost PNG

`evals` uses `link` like any client does (its public Python API or HTTP); nothing in `link` imports
`evals` except the CLI, which mounts `evals.cli.eval_app` as `link eval`.
"""
