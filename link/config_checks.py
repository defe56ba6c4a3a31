"""Every mistake in a `link.yaml`, found in one pass and described with its path in the file.

    problems = config_problems(data, exc, check_policy=policy_entry_problems, served_models=registered)
    # ["models[2].api_key_env (name 'gpt'): must be the NAME of an environment variable ...",
    #  "policies[0].models (name 'cheap'): unknown model(s) ['gtp-4o']; known: ['gpt', 'smol']", ...]
    # exc: model_validate's ValidationError or None; policy_entry_problems: link.policies.base's

Pydantic gathers the field errors of every entry, but the checks between entries (a policy over a model that
is not configured, a policy named like a model or twice) run only on a config whose fields are all valid, and a
policy type's option checks (`link.policies.base.Policy.check`) only when the gateway builds it. Here they run
on the raw data next to pydantic's errors, so three mistakes are reported by one start, not three. `link serve`
asks for the option checks (`load_config(path, check_policy=policy_entry_problems, served_models=...)`) with the
models registered in its database, which an option (a judge, an aggregator) may name; they import the policy's
module (a "moa" or "cascade" policy imports torch) and read a router's file header. The check is handed in by
the caller: the policies are built on this config module, so it cannot import them.
"""

from __future__ import annotations

from typing import Any, Callable

from pydantic import ValidationError

# (index in `policies`, the raw entry, the known model names) -> "policies[i].field (name 'x'): ..." lines
PolicyCheck = Callable[[int, Any, set[str]], list[str]]


def cross_check(model_names: set[str], policies: list[tuple[int, str | None, list]]) -> list[str]:
    """Problems between entries: policy names that clash with a model or an earlier policy, unknown models.

    Args:
        model_names: the configured public model names (replicas share one).
        policies: (index in `policies`, name or None, model names) per policy entry.
    Returns:
        "policies[i].field: what to fix" lines, in file order.
    """
    problems, first_at = [], {}
    for i, name, models in policies:
        if name is not None:
            if name in model_names:
                problems.append(f"policies[{i}].name: {name!r} is also a model name; rename the policy")
            elif name in first_at:
                problems.append(f"policies[{i}].name: {name!r} is already the name of policies[{first_at[name]}]; keep one")
            else:
                first_at[name] = i
        unknown = [m for m in models if isinstance(m, str) and m not in model_names]
        if unknown:
            problems.append(f"policies[{i}].models: unknown model(s) {unknown}; known: {sorted(model_names)}")
    return problems


def config_problems(data: dict, exc: ValidationError | None, *, check_policy: PolicyCheck | None = None,
                    served_models: tuple[str, ...] = ()) -> list[str]:
    """Every problem of the raw config `data`: pydantic's field errors (from `exc`), the cross-checks between
    entries and, given `check_policy`, each policy's option checks. Empty when the config is valid.

    Args:
        data: the parsed YAML mapping.
        exc: the ValidationError of `LinkConfig.model_validate(data)`, or None when it passed.
        check_policy: run on every policy entry that passed the checks above (`link.policies.base.policy_entry_problems`:
            its type's `Policy.check`); None skips the option checks.
        served_models: model names served besides the config's (registered in the database), for those checks.
    Returns:
        one "where: what to fix" line per problem, e.g. "models[1].timeout_s (name 'x'): Input should be ...".
    """
    models = data.get("models") if isinstance(data.get("models"), list) else []
    policies = data.get("policies") if isinstance(data.get("policies"), list) else []
    model_names = {m["name"] for m in models if isinstance(m, dict) and isinstance(m.get("name"), str)}
    entries = [(i, p.get("name") if isinstance(p.get("name"), str) else None,
                p.get("models") if isinstance(p.get("models"), list) else [])
               for i, p in enumerate(policies) if isinstance(p, dict)]
    crossed = cross_check(model_names, entries)
    # LinkConfig's own cross-check (an error without a location) says the same as `crossed`, once per start.
    problems = [describe(e, data) for e in (exc.errors() if exc else ()) if e.get("loc")]
    problems += [_with_name(line, data) for line in crossed]
    flagged = {int(line.split("]", 1)[0].removeprefix("policies[")) for line in crossed}
    for i, entry in enumerate(policies if check_policy is not None else ()):
        if i not in flagged:
            problems += check_policy(i, entry, model_names | set(served_models))
    return sorted(problems, key=_file_order)


def _file_order(line: str) -> tuple[int, int]:
    """Sort key: models before policies, entries by index (a stable sort keeps an entry's lines in order)."""
    section, _, rest = line.partition("[")
    index = rest.split("]", 1)[0]
    return ({"models": 0, "policies": 1}.get(section, -1), int(index) if index.isdigit() else -1)


def _with_name(line: str, data: dict) -> str:
    """"policies[1].models: ..." with the entry's name after its path: "policies[1].models (name 'p'): ..."."""
    path, _, message = line.partition(": ")
    section, _, rest = path.partition("[")
    name = _entry_name(data, section, int(rest.split("]", 1)[0]))
    return f"{path} (name {name!r}): {message}" if name and not path.endswith(".name") else line


def _entry_name(data: Any, section: str, index: int) -> str | None:
    try:
        name = data[section][index].get("name")
    except (KeyError, IndexError, TypeError, AttributeError):
        return None
    return name if isinstance(name, str) else None


def describe(error: dict, data: Any) -> str:
    """One pydantic error as "models[1].kind (name 'x'): <what to fix>"."""
    loc = list(error.get("loc", ()))
    path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
    name = _entry_name(data, loc[0], loc[1]) if len(loc) >= 2 and isinstance(loc[1], int) else None
    where = f"{path} (name {name!r})" if name else path
    message = error.get("msg", "invalid").removeprefix("Value error, ")
    if error.get("type") == "extra_forbidden":
        message = "unknown field; check its spelling against link.example.yaml"
    elif error.get("type") == "missing":
        message = "required field is missing"
    return f"{where}: {message}" if where else message
