"""The TogetherLink platform: settings, model registry, backends, policies, the gateway and the `link` CLI."""
