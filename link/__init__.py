"""The TogetherLink gateway platform: settings, model registry, backends, policies, the gateway and its database.

The `link` command is cli/ (which imports `link`); `link` itself imports no `cli`, `evals`, `posttrain` or `web`.
"""
