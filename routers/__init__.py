"""Choosing and combining models: features, learned routers, the decision rule, cascade, Mixture-of-Agents;
their offline evaluation and calibration on recorded outcomes in `routers.offline`.

Routers never import `link`: what they need to call models is a small protocol defined here and
implemented by the gateway.
"""
