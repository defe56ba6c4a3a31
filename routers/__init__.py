"""Choosing and combining models: features, learned routers, calibration, cascade, Mixture-of-Agents.

Routers never import `link`: what they need to call models is a small protocol defined here and
implemented by the gateway. (Built in the routing issue.)
"""
